"""Copies and host reads of neuron tensors: ``copy_``, ``_to_copy`` (``.to``), ``item``,
transfers between host and device memory, and new uninitialized device tensors.

A copy between two tensors of one device is queued on the current stream like any op; one
that crosses between host and device memory runs on the host as a synchronization
(:func:`.queued.on_host`), as a ``transfer.*`` span when observed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx import observe
from torch_neuronx.device import kernels, lazy, overlap, queued
from torch_neuronx.device.queued import on_host
from torch_neuronx.process import checked_device_index
from torch_neuronx.runtime.allocation import count_writes
from torch_neuronx.runtime.device import current_index as current_device
from torch_neuronx.runtime.tensor import NeuronTensor, allocate, from_cpu

aten = torch.ops.aten
_cpu = kernels.host_view


def host_op(fn: Callable[[Sequence[Any], dict[str, Any]], Any]) -> Callable[[Sequence[Any], dict[str, Any]], Any]:
    """``fn(args, kwargs)``, which touches device memory on the host, run as a synchronization."""
    return lambda args, kwargs: queued.synchronized(args, kwargs, fn, args, kwargs)


def host_read(t: NeuronTensor) -> None:
    """Wait until ``t``'s memory can be read on the host (printing reads it outside the dispatcher)."""
    on_host(t._index, [t], lambda: None)


_PLAIN_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def to_copy(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    source = args[0]
    device = kwargs.get("device")
    same_device = device is None or torch.device(device) == source.device
    if (same_device and len(args) == 1 and kwargs.get("layout") in (None, torch.strided)
            and not kwargs.get("pin_memory")):
        # A dtype conversion or copy on the device: queued, as any op.
        dtype = kwargs.get("dtype") or source.dtype
        out = empty_on_device(source.shape, like_strides(source, dtype, kwargs.get("memory_format")), dtype,
                              source.device)
        queue_copy(out, source, "aten::_to_copy")
        return out
    return on_host(source._index, [source], _to_copy_on_host, args, kwargs)


def like_strides(source: torch.Tensor, dtype: torch.dtype,
                 memory_format: torch.memory_format | None) -> list[int] | None:
    """The strides torch gives a new tensor like ``source`` in ``memory_format`` (preserve: a dense
    ``source``'s own, a transposed one's transposed); None for row-major."""
    if memory_format in _PLAIN_FORMATS and source.is_contiguous():
        return None
    meta = torch.empty_strided(source.shape, source.stride(), dtype=source.dtype, device="meta")
    return list(torch.empty_like(meta, dtype=dtype, memory_format=memory_format or torch.preserve_format).stride())


def queue_copy(dst: NeuronTensor, src: NeuronTensor, name: str) -> None:
    """Queue ``dst.copy_(src)`` (both neuron tensors of one device) on the current stream.

    What torch checks before copying is checked here, where the op is called: a shape that
    does not broadcast raises torch's own error (from the same copy on meta tensors).
    """
    if src.shape != dst.shape:
        torch.empty(dst.shape, dtype=dst.dtype, device="meta").copy_(torch.empty(src.shape, dtype=src.dtype,
                                                                                 device="meta"))
    queued.enqueue(dst._index, name, [src, dst], [dst._allocation], dst._data.detach().copy_, src._data.detach())
    wrote(dst)


def _to_copy_on_host(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    source = args[0]
    device = kwargs.get("device")
    plain = {k: v for k, v in kwargs.items() if k != "device"}
    if device is not None and torch.device(device).type != "neuron":  # leaves device memory
        if not observe.state.active:
            return aten._to_copy.default(_cpu(source), **plain).to(device)
        with observe.span("transfer.device_to_host", source._data.nbytes, device=source._index):
            return aten._to_copy.default(_cpu(source), **plain).to(device)
    copied = aten._to_copy.default(_cpu(source), **plain)
    index = torch.device(device).index if device is not None else None
    return from_cpu(copied, index=source._index if index is None else checked_device_index(index))


def wrote(*tensors: Any) -> None:
    """Count a write into the device memory of each neuron tensor among ``tensors`` (lists too).

    Inside ``__torch_dispatch__`` autograd's version counting is off for the inner tensors
    an op writes through, so their version counters would never move; compiled graphs
    that keep weights resident watch those counters to see in-place updates.
    """
    count_writes(t for t in pytree.tree_leaves(tensors) if isinstance(t, NeuronTensor))


def copy_(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    dst, src = args[0], args[1]
    if isinstance(dst, NeuronTensor) and isinstance(src, NeuronTensor) and dst._index == src._index:
        overlap.refuse_internal_overlap(dst)
        overlap.refuse_partial_overlap(dst, (src,))
        queue_copy(dst, src, "aten::copy_")  # device to device: queued
        return dst
    return host_op(_copy_on_host)(args, kwargs)


def _copy_on_host(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    dst, src = args[0], args[1]
    transfer(dst, src, **kwargs)
    if isinstance(dst, NeuronTensor) and not isinstance(src, NeuronTensor):
        lazy.mark_moved(src, dst)  # a lazy module's placeholder stays one (``.to("neuron")``)
    return dst


def transfer(dst: torch.Tensor, src: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``dst.copy_(src)`` over the host views of neuron tensors, on the calling thread (the caller
    synchronizes); a ``transfer.*`` span when it crosses between host and device memory."""
    to_device, from_device = isinstance(dst, NeuronTensor), isinstance(src, NeuronTensor)
    if observe.state.active and to_device != from_device:  # a transfer (``x.to("neuron")``, ``.copy_``)
        neuron = dst if to_device else src
        with observe.span("transfer.host_to_device" if to_device else "transfer.device_to_host",
                          dst.nbytes, device=neuron._index):
            _cpu(dst).copy_(_cpu(src), **kwargs)
    else:
        _cpu(dst).copy_(_cpu(src), **kwargs)
    wrote(dst)
    return dst


def local_scalar_dense(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    if not observe.state.active:
        return _cpu(args[0]).item()
    with observe.span("transfer.device_to_host", args[0].element_size(), device=args[0]._index):
        return _cpu(args[0]).item()


def foreach_copy_(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """``foreach_copy_(dsts, srcs)`` (FSDP2's all-gather copy-in): queued copies when every pair is on
    one device, otherwise each pair copied as ``copy_`` does."""
    for dst, src in zip(args[0], args[1], strict=True):
        copy_((dst, src), {})


def empty_on_device(size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype | None,
                    device: Any = None) -> NeuronTensor:
    """A new uninitialized neuron tensor on ``device`` (``neuron:N``; no index: the current device)."""
    index = device.index if isinstance(device, torch.device) and device.index is not None else current_device()
    data, allocation = allocate(size, stride, dtype or torch.get_default_dtype(), checked_device_index(index))
    return NeuronTensor(data, allocation, index=index)
