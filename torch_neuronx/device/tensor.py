"""``neuron`` tensors: device memory from the caching allocator, ops through :mod:`~torch_neuronx.device.eager`.

A :class:`NeuronTensor` is a wrapper subclass whose ``device`` is ``neuron:N``.
Its values live in a block of the caching allocator (host memory on the cpu
target), viewed zero-copy as a CPU tensor, ``_data``. Views share the block
(``_allocation``), which goes back to the allocator when the last tensor over
it dies. Factories (``torch.empty(..., device="neuron")``) and copies between
devices are registered for PrivateUse1 with ``torch.library``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import memory


class Allocation:
    """One caching-allocator block; freed when the last tensor holding it is gone."""

    __slots__ = ("address", "nbytes", "__weakref__")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.address = memory.caching_allocator_alloc(max(nbytes, 1))

    def __del__(self) -> None:
        try:
            memory.caching_allocator_delete(self.address)
        except Exception:  # interpreter shutdown: the allocator may already be gone
            pass


def _span_bytes(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> int:
    if any(s == 0 for s in size):
        return 0
    return (sum((s - 1) * st for s, st in zip(size, stride)) + 1) * dtype.itemsize


def _contiguous_strides(size: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for s in reversed(size):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


def allocate(size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype) -> tuple[torch.Tensor, Allocation]:
    """Device memory for a tensor of ``size``/``stride``: its CPU view and its allocation."""
    size = [int(s) for s in size]
    stride = list(stride) if stride is not None else _contiguous_strides(size)
    nbytes = _span_bytes(size, stride, dtype)
    allocation = Allocation(nbytes)
    if nbytes == 0:
        return torch.empty(size, dtype=dtype), allocation
    flat = memory.block_view(allocation.address, nbytes)
    return flat.view(dtype).as_strided(size, stride), allocation


class NeuronTensor(torch.Tensor):
    """A tensor on the ``neuron`` device (see the module docstring)."""

    _data: torch.Tensor
    _allocation: Allocation | None

    @staticmethod
    def __new__(cls, data: torch.Tensor, allocation: Allocation | None, requires_grad: bool = False,
                index: int = 0) -> NeuronTensor:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            device=torch.device("neuron", index), requires_grad=requires_grad)
        wrapper._data = data
        wrapper._allocation = allocation
        return wrapper

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"{self._data!r}"[:-1] + f", device='{self.device}')"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None) -> Any:
        from torch_neuronx.device import eager

        return eager.dispatch(func, args, kwargs or {})


def from_cpu(t: torch.Tensor) -> NeuronTensor:
    """A new neuron tensor holding a copy of the CPU tensor ``t`` (contiguous)."""
    data, allocation = allocate(t.shape, None, t.dtype)
    data.copy_(t)
    return NeuronTensor(data, allocation)


def alias(data: torch.Tensor, source: NeuronTensor) -> NeuronTensor:
    """A neuron tensor over ``data``, a view of ``source``'s memory."""
    return NeuronTensor(data, source._allocation)

