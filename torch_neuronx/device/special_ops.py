"""Neuron-tensor ops that are not computations: copies and host reads (:mod:`.copies`),
storage changes (``set_``, ``resize_``), ``is_set_to``, uninitialized tensors, ``out=`` factories,
``torch.equal``, and the nested-tensor entry points the device refuses.

:data:`HANDLERS` maps each such op to ``handler(args, kwargs)``; :mod:`.eager` dispatches them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx.device import mutations, queued
from torch_neuronx.device.copies import (
    copy_,
    empty_on_device,
    foreach_copy_,
    host_op,
    like_strides,
    local_scalar_dense,
    to_copy,
    wrote,
)
from torch_neuronx.device.fallback import run_without_functional_form
from torch_neuronx.runtime.tensor import NeuronTensor

aten = torch.ops.aten


def _host_factory_out(func: Any) -> Callable[[Sequence[Any], dict[str, Any]], Any]:
    """``func`` (an ``out=`` form of ``arange``, ``eye``, ``linspace`` or ``logspace``) through
    :func:`mutations.host_factory_out`, else the CPU route."""
    def write(out: NeuronTensor, values: torch.Tensor) -> None:
        queued.enqueue(out._index, str(func), [out], [out._allocation], mutations.upload, out._data.detach(), values,
                       out._index)
        wrote(out)

    def run(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        done = mutations.host_factory_out(func, args, kwargs, write)
        return done if done is not None else run_without_functional_form(func, args, kwargs)
    return run


def _set_storage(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``set_`` onto a storage: a loaded checkpoint's, restored into device memory (mutations.py), or
    the general route."""
    done = mutations.set_restored_storage(args, kwargs)
    return done if done is not None else run_without_functional_form(
        aten.set_.source_Storage_storage_offset, args, kwargs)


def _set_whole_storage(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``t.set_(storage)``: ``t`` over all of ``storage``, as one dimension of its elements."""
    target, storage = args[0], args[1]
    return _set_storage((target, storage, 0, [storage.nbytes() // target.element_size()], [1]), {})


def _set_tensor(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``t.set_(source)``: ``t`` over ``source``'s storage with its offset, sizes and strides."""
    target, source = args[0], args[1]
    if not isinstance(source, NeuronTensor):
        return run_without_functional_form(aten.set_.source_Tensor, args, kwargs)
    return _set_storage((target, source.untyped_storage(), source.storage_offset(), list(source.shape),
                         list(source.stride())), {})


def _set_empty(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``t.set_()``: ``t`` over a new storage of no bytes, of size (0,)."""
    target = args[0]
    return target.set_(torch.empty(0, dtype=target.dtype, device=target.device))


def _is_set_to(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """``a.is_set_to(b)``: the same storage, offset, sizes and strides (the CPU's rule)."""
    a, b = args[0], args[1]
    if not isinstance(b, NeuronTensor):
        return False
    mine, theirs = a.untyped_storage(), b.untyped_storage()
    return (mine.data_ptr() == theirs.data_ptr() and mine.nbytes() == theirs.nbytes()
            and a.storage_offset() == b.storage_offset() and a.shape == b.shape and a.stride() == b.stride())


def _new_empty_strided(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """``new_empty_strided``: uninitialized memory of the size and strides asked (no kernel: it
    had one that failed to lower, and ran on the CPU at every channels-last backward)."""
    source, size, stride = args[0], args[1], args[2]
    dtype = kwargs.get("dtype") or source.dtype
    device = torch.device(kwargs["device"]) if kwargs.get("device") is not None else source.device
    if device.type != "neuron":
        return torch.empty_strided(size, stride, dtype=dtype, device=device)
    return empty_on_device(size, stride, dtype, device)


def _empty_like(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """``empty_like``: uninitialized memory with the strides torch gives it (a transposed or
    channels-last tensor's own layout under ``preserve_format``; it was row-major)."""
    source = args[0]
    dtype = kwargs.get("dtype") or source.dtype
    device = torch.device(kwargs["device"]) if kwargs.get("device") is not None else source.device
    return empty_on_device(source.shape, like_strides(source, dtype, kwargs.get("memory_format")), dtype, device)


def _no_nested_fast_path(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """``torch._nested_tensor_from_mask_left_aligned`` on neuron tensors: False, so that
    ``nn.TransformerEncoder`` in eval with a padding mask takes its dense path (same values) instead
    of the nested-tensor fast path, which neuron tensors cannot hold ("NestedTensorImpl doesn't
    support sizes")."""
    return False


def _no_nested_tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    raise NotImplementedError("nested tensors are not supported on the neuron device (torch._nested_tensor_"
                              "from_mask); nn.TransformerEncoder: keep mask_check=True or pass "
                              "enable_nested_tensor=False")


def _equal(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """``torch.equal``: same shape and equal values (in the promoted type; NaN equals nothing),
    computed on the device and read once (it ran on the CPU with a fallback warning: a common
    check in training code)."""
    a, b = args
    if a.shape != b.shape:
        return False
    return bool(aten.eq.Tensor(a, b).all().item())


def _allclose(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """``torch.allclose``: ``isclose`` (torch's checks and broadcasting) on the device, read once (it
    ran on the CPU with a fallback warning: its kernel branches on the values)."""
    return bool(aten.isclose.default(*args, **kwargs).all().item())


def _on_meta(func: Any) -> Callable[[Sequence[Any], dict[str, Any]], Any]:
    """An op that answers from its tensors' metadata alone (``result_type``: a dtype), run on meta
    tensors: no kernel (the backward of ``pow(x, 3.0)`` compiled one per shape of ``x``)."""

    def meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return value

    def run(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        return func(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})

    return run


def _pin_memory(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``pin_memory()`` of a neuron tensor: refused as CUDA refuses its own tensors' (it ran on the
    CPU with a fallback warning and returned the neuron tensor unpinned)."""
    raise RuntimeError(f"cannot pin '{args[0].type()}' only dense CPU tensors can be pinned")


#: The handler of each op that is not a computation (copies, storage changes, host reads).
HANDLERS: dict[Any, Callable[[Sequence[Any], dict[str, Any]], Any]] = {
    **{op: _on_meta(op) for op in (aten.result_type.Tensor, aten.result_type.Scalar, aten.result_type.Scalar_Tensor)},
    aten.equal.default: _equal,
    aten.allclose.default: _allclose,
    aten._nested_tensor_from_mask_left_aligned.default: _no_nested_fast_path,
    aten._nested_tensor_from_mask.default: _no_nested_tensors,
    aten.set_.source_Storage_storage_offset: _set_storage,
    aten.set_.source_Storage: _set_whole_storage,
    aten.set_.source_Tensor: _set_tensor,
    aten.set_.default: _set_empty,
    aten.is_set_to.default: _is_set_to,
    aten.new_empty_strided.default: _new_empty_strided,
    aten.empty_like.default: _empty_like,
    aten.arange.out: _host_factory_out(aten.arange.out),
    aten.arange.start_out: _host_factory_out(aten.arange.start_out),
    aten.eye.out: _host_factory_out(aten.eye.out),
    aten.eye.m_out: _host_factory_out(aten.eye.m_out),
    aten.linspace.out: _host_factory_out(aten.linspace.out),
    aten.logspace.out: _host_factory_out(aten.logspace.out),
    aten._foreach_copy_.default: foreach_copy_,
    aten._to_copy.default: to_copy,
    aten.copy_.default: copy_,
    aten._local_scalar_dense.default: host_op(local_scalar_dense),
    # ``item`` decomposes into ``_local_scalar_dense`` above autograd; code running below it
    # (a higher-order op's rule, a custom autograd Function's forward) reaches it as is.
    aten.item.default: host_op(local_scalar_dense),
    aten._pin_memory.default: _pin_memory,
    aten.resize_.default: host_op(mutations.resize_op),
    aten.resize_as_.default: host_op(mutations.resize_as_op),
}
