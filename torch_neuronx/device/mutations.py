"""Ops that write into neuron tensors with no functional form: ``out=`` variants and ``resize_``.

An ``out=`` op may resize its output (``torch.arange(3, device="neuron")`` is
``arange.out`` into an empty tensor; ``torch.add(a, b, out=torch.empty(0, ...))``).
Run on the CPU over the neuron tensor's own memory, that resize would move the
values to host memory the device does not own and leave the neuron tensor's
shape as it was: such a tensor reported shape ``(0,)`` while holding three values.
Here each written neuron tensor is replaced by a CPU scratch copy for the op;
afterwards a neuron tensor whose shape changed gets device memory of the new
size (:func:`resize`), and the scratch's values are copied into it. The op
returns the neuron tensors it wrote, as torch's ``out=`` ops return their ``out``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx import observe
from torch_neuronx.device import overlap
from torch_neuronx.runtime.allocation import _contiguous_strides, allocate, count_writes
from torch_neuronx.runtime.tensor import NeuronTensor, rebind


def _set_wrapper_shape(t: NeuronTensor, size: Sequence[int], stride: Sequence[int], offset: int = 0) -> None:
    """Give the wrapper ``t`` ``size`` and ``stride`` without dispatching, as torch's
    ``return_and_correct_aliasing`` sets the metadata of wrapper subclasses (the op runs on the
    wrapper as on a meta tensor). Its storage, which holds no data (the values are ``_data``'s),
    becomes that of a new wrapper of the new size on the same device: ``resize_`` has no meta
    kernel for a wrapper, and ``set_`` refuses a storage of another device."""
    storage = torch.Tensor._make_wrapper_subclass(type(t), size, strides=stride, dtype=t.dtype,
                                                   device=t.device).untyped_storage()
    with torch.utils._mode_utils.no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            torch.ops.aten.set_.source_Storage_storage_offset(t, storage, offset, list(size), list(stride))
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)


def _format_strides(size: list[int], memory_format: torch.memory_format | None) -> list[int]:
    """The strides ``torch.empty(size, memory_format=...)`` has (contiguous for None)."""
    if memory_format is None or memory_format == torch.contiguous_format:
        return _contiguous_strides(size)
    if memory_format == torch.preserve_format:  # (torch's own error for resize_)
        raise RuntimeError("Unsupported memory format Preserve")
    return list(torch.empty(size, device="meta", memory_format=memory_format).stride())


def resize(t: NeuronTensor, size: Sequence[int], memory_format: torch.memory_format | None = None) -> NeuronTensor:
    """``t.resize_(size, memory_format=...)`` on the device, as torch resizes: ``t`` becomes the
    tensor of ``size`` in ``memory_format`` (contiguous when None; an unchanged size without one
    keeps its strides) at its storage offset in the same memory, which grows first when too small
    (the storage's resize: every tensor over it follows, as views of a CUDA storage do). Views of
    ``t`` keep seeing its writes. The caller synchronizes first (growing copies on the host)."""
    size = [int(s) for s in size]
    stride = _format_strides(size, memory_format)
    if list(t.shape) == size and (memory_format is None or list(t.stride()) == stride):
        return t
    allocation = t._allocation
    if allocation is None:  # a tensor without device memory of its own: new memory
        data, allocation = allocate(size, None, t.dtype, t._index)
        keep = min(data.numel(), t._data.numel())
        if keep:
            data.view(-1)[:keep].copy_(t._data.reshape(-1)[:keep])
        if list(data.stride()) != stride:
            data = data.as_strided(size, stride)
        rebind(t, data, allocation)
        _set_wrapper_shape(t, size, stride)
        return t
    from torch_neuronx.runtime import storage

    offset = t.storage_offset()
    numel = math.prod(size)
    needed = (offset + numel) * t.dtype.itemsize if numel else 0
    if needed > allocation.nbytes:
        storage.resize(allocation, needed)
    rebind(t, storage.view_of(allocation, t.dtype, offset, size, stride), allocation)
    _set_wrapper_shape(t, size, stride, offset)
    return t


def _suggested_format(t: torch.Tensor) -> torch.memory_format:
    """The memory format ``t``'s strides follow (torch's ``suggest_memory_format``, C++ only)."""
    for dim, memory_format in ((4, torch.channels_last), (5, torch.channels_last_3d)):
        if t.dim() == dim and not t.is_contiguous() and t.is_contiguous(memory_format=memory_format):
            return memory_format
    return torch.contiguous_format


def resize_op(args: Sequence[Any], kwargs: dict[str, Any]) -> NeuronTensor:
    """``aten.resize_`` of a neuron tensor, in its ``memory_format`` (contiguous by default)."""
    memory_format = args[2] if len(args) > 2 else kwargs.get("memory_format")
    t = resize(args[0], args[1], memory_format)
    count_writes((t,))
    return t


def resize_as_op(args: Sequence[Any], kwargs: dict[str, Any]) -> NeuronTensor:
    """``aten.resize_as_``: ``resize_`` to the template's shape, then (with a ``memory_format``;
    ``preserve_format``: the template's) restrided to that format, as torch's kernel does (which
    resized the wrapper's storage, holding no data: "Trying to resize storage that is not resizable")."""
    t, template = args[0], args[1]
    memory_format = args[2] if len(args) > 2 else kwargs.get("memory_format")
    if memory_format == torch.preserve_format:
        memory_format = _suggested_format(template)
    return resize_op((t, list(template.shape)), {"memory_format": memory_format})


def upload(target: torch.Tensor, values: torch.Tensor, index: int) -> None:
    """Copy host ``values`` into ``target``, device ``index``'s memory: a host-to-device transfer, as
    listeners see it."""
    if not observe.state.active:
        target.copy_(values)
        return
    with observe.span("transfer.host_to_device", values.nbytes, device=index):
        target.copy_(values)


def run_writing_on_cpu(func: Any, args: Sequence[Any], kwargs: dict[str, Any], written: Sequence[Any]) -> Any:
    """``func`` on the CPU with each neuron tensor of ``written`` (the arguments it writes) replaced by
    a scratch copy, then those neuron tensors resized to the scratch's shape where it changed and
    filled from it. Returns the op's result with the scratch tensors given back as the neuron tensors."""
    targets = {id(t): t for t in written if isinstance(t, NeuronTensor)}
    scratch: dict[int, torch.Tensor] = {}
    read = [a for a in pytree.tree_leaves((list(args), kwargs)) if isinstance(a, NeuronTensor) and id(a) not in targets]
    # A written tensor sharing memory with an argument it reads is written in place: the CPU kernel
    # then sees the overlap and refuses it or defines the result, as on the CPU (a scratch copy
    # hid it: ``torch.sort(x[:5], out=(x[2:7], i))`` computed with clone semantics).
    direct = {key for key, t in targets.items() if overlap.touches_any(t, read)}

    def to_cpu(value: Any) -> Any:
        if not isinstance(value, NeuronTensor):
            return value
        if id(value) not in targets or id(value) in direct:
            return value._data
        copy = scratch.get(id(value))
        if copy is None:
            copy = scratch[id(value)] = value._data.clone()
        return copy

    out = func(*pytree.tree_map(to_cpu, args), **pytree.tree_map(to_cpu, kwargs))
    back: dict[int, NeuronTensor] = {id(targets[key]._data): targets[key] for key in direct}
    for key, copy in scratch.items():
        target = targets[key]
        resize(target, copy.shape)
        upload(target._data, copy, target._index)
        back[id(copy)] = target
    if scratch or direct:
        count_writes(targets.values())
    return pytree.tree_map(lambda v: back.get(id(v), v) if isinstance(v, torch.Tensor) else v, out)


def host_factory_out(func: Any, args: Sequence[Any], kwargs: dict[str, Any],
                     write: Callable[[NeuronTensor, torch.Tensor], None]) -> NeuronTensor | None:
    """An ``out=`` factory (``arange``, ``eye``, ``linspace``, ``logspace``: values that depend on no
    tensor) into a neuron ``out`` that is
    empty or of the result's shape: the values computed on the host, ``out`` sized for them (an empty
    tensor holds no values to keep or wait for) and ``write`` queues them into it, with no
    synchronization. None when that does not apply (the caller takes the general route).

    ``torch.arange(n, device="neuron")`` reaches the device as ``arange.start_out`` into an empty
    tensor: every Hugging Face model makes its position ids this way, and the general route warned
    of a CPU fallback and waited for the stream on each call.
    """
    out = kwargs.get("out")
    if not isinstance(out, NeuronTensor) or any(isinstance(a, torch.Tensor) for a in args):
        return None
    values = func(*args, out=torch.empty(0, dtype=out.dtype))
    if tuple(out.shape) != tuple(values.shape):
        if out.numel():
            return None
        resize(out, values.shape)
    if values.numel():
        write(out, values)
    return out


def _set_to_live(t: NeuronTensor, source: Any, offset: int, size: list[int], stride: list[int]) -> bool:
    """``t.set_(x.untyped_storage(), ...)`` with a neuron tensor ``x``: ``t`` becomes a view of its
    memory (of ``t``'s dtype), as on CUDA. False for other storages."""
    from torch_neuronx.runtime import storage

    allocation = storage.allocation_of(source)
    if allocation is None:
        return False
    if allocation.index != t._index:
        raise RuntimeError(f"Attempted to set the storage of a tensor on device \"{t.device}\" to a storage on "
                           f"different device \"neuron:{allocation.index}\".  This is no longer allowed; the "
                           "devices must match.")
    rebind(t, storage.view_of(allocation, t.dtype, offset, size, stride), allocation)
    return True


def set_restored_storage(args: Sequence[Any], kwargs: dict[str, Any]) -> NeuronTensor | None:
    """``t.set_(storage, offset, size, stride)`` where ``storage`` is a checkpoint's storage restored
    into device memory (``torch.load(..., map_location="neuron")``): ``t`` becomes a view of it.
    None for other storages."""
    from torch_neuronx.runtime import serialization

    names = ("self", "source", "storage_offset", "size", "stride")
    bound = dict(zip(names, args), **kwargs)
    t, source = bound["self"], bound["source"]
    if not isinstance(t, NeuronTensor) or "size" not in bound:
        return None
    size = [int(s) for s in bound["size"]]
    stride = [int(s) for s in bound.get("stride") or _contiguous_strides(size)]
    offset = int(bound.get("storage_offset", 0))
    if not serialization.set_from_restored(t, source, offset, size, stride) and not _set_to_live(
            t, source, offset, size, stride):
        return None
    _set_wrapper_shape(t, size, stride, offset)
    return t

