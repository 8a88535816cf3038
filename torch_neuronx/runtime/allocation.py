"""The device memory of neuron tensors: a caching-allocator block (:class:`Memory`), the
:class:`Allocation` a tensor and its views share, and the host's wait for queued writers.

A neuron tensor's values live in a block of its device's caching allocator (host memory on the
cpu target), viewed zero-copy as a CPU tensor (:func:`allocate`). The block goes back to the
allocator when the last holder is gone: its allocation, or a CPU view that queued work holds.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from torch_neuronx import memory

__all__ = ["Allocation", "Memory", "PoisonedTensorError", "allocate", "count_writes", "wait_for_host"]


class Memory:
    """One caching-allocator block, given back when the last holder is gone.

    Held by its :class:`Allocation` and by every CPU view of the block (``block_view``'s owner),
    so queued work that still holds an inner tensor keeps the block allocated after its
    allocation let it go (a storage resized to 0 bytes, :mod:`.storage`).
    """

    __slots__ = ("address", "_allocator", "__weakref__")

    def __init__(self, allocator: Any, nbytes: int, index: int, stream: int | None = None) -> None:
        self._allocator = allocator
        self.address = allocator.malloc(nbytes, memory.current_stream_id(index) if stream is None else stream)

    def __del__(self) -> None:
        try:
            self._allocator.free(self.address)
        except Exception:  # interpreter shutdown: the allocator may already be gone
            pass


class Allocation:
    """The device memory of a neuron tensor and of its views: their storage.

    ``writer`` is the last queued op that writes into the block (a :class:`PendingWrite`, or
    None once nothing queued writes it); a host read waits for it (:func:`wait_for_host`).
    ``error`` is set when that op failed: the block's values are undefined, and reading them
    raises it (:class:`PoisonedTensorError`).

    The memory is a :class:`Memory` (``address``, ``nbytes``); ``untyped_storage().resize_()``
    (:mod:`.storage`) replaces it, or drops it at 0 bytes, and repoints in place every live inner
    tensor over the allocation (:meth:`track`): whatever assigns a neuron tensor's ``_data`` outside
    this module calls :func:`rebind` (or ``track``), or a resize would leave that tensor behind.
    """

    __slots__ = ("address", "nbytes", "index", "writer", "error", "memory", "storage", "_views", "_prune_at",
                 "__weakref__")

    def __init__(self, nbytes: int, index: int = 0, stream: int | None = None) -> None:
        self.nbytes = nbytes
        self.index = index
        self.writer: Any = None
        self.error: BaseException | None = None
        self.memory: Memory | None = Memory(memory.device_allocator(index), max(nbytes, 1), index, stream)
        self.address = self.memory.address
        self.storage: Any = None  # the torch.UntypedStorage of the tensors, made when first asked for
        self._views: list[weakref.ref] = []
        self._prune_at = 8

    def track(self, data: torch.Tensor) -> None:
        """Remember ``data``, the inner tensor of a neuron tensor over this memory, for a later resize.

        The inner tensors, not the neuron tensors, are held (weakly): ``torch.utils.swap_tensors``
        (``module.to("neuron")``) refuses a tensor that has weak references, and a resize repoints
        an inner tensor in place, which every neuron tensor holding it then sees.
        """
        views = self._views
        views.append(weakref.ref(data))
        if len(views) > self._prune_at:  # amortized: dead views are dropped when the list doubles
            views[:] = [r for r in views if r() is not None]
            self._prune_at = 2 * len(views) + 8

    def live_views(self) -> Iterator[torch.Tensor]:
        """The live inner tensors tracked over this memory (a tensor may come more than once), without
        the rebuild of the tracking list that :meth:`inner_tensors` makes."""
        for ref in self._views:
            view = ref()
            if view is not None:
                yield view

    def inner_tensors(self) -> list[torch.Tensor]:
        """The live inner tensors over this allocation's memory (each once)."""
        live = list({id(t): t for t in (r() for r in self._views) if t is not None}.values())
        self._views = [weakref.ref(t) for t in live]
        self._prune_at = 2 * len(live) + 8
        return live


def count_writes(tensors: Iterable[Any]) -> None:
    """Count a write into the device memory of each neuron tensor among ``tensors``: autograd's
    version counter of every live inner tensor over that memory moves, as the one counter torch's
    views of a tensor share would (inner views are made below autograd, each with a counter of its
    own). A compiled graph that keeps a parameter resident watches the parameter's inner tensor:
    aot_autograd's copy-back of a compiled update writes through a detached alias of it, and the
    graph kept serving the old weights."""
    inner: dict[int, torch.Tensor] = {}
    for t in tensors:
        data, allocation = getattr(t, "_data", None), getattr(t, "_allocation", None)
        if data is not None:
            inner[id(data)] = data
        if allocation is not None and len(allocation._views) > 1:
            inner.update((id(view), view) for view in allocation.live_views())
    counted = [v for v in inner.values() if not v.is_inference()]
    if counted:
        torch._C._increment_version(counted)


class PoisonedTensorError(RuntimeError):
    """A neuron tensor's values were to be written by a queued op that failed."""


def wait_for_host(tensors: Sequence[Any]) -> None:
    """Make the device memory of the neuron tensors among ``tensors`` safe to read on the host.

    Waits for the queued op that last writes each one (on whatever stream it was queued),
    and raises :class:`PoisonedTensorError` for memory whose producing op failed. The caller
    orders itself after its own stream's work (``Stream.run``); this covers the other streams.
    """
    for t in tensors:
        allocation = getattr(t, "_allocation", None)
        if allocation is None:
            continue
        if allocation.memory is None and t.numel():
            raise RuntimeError(f"a neuron tensor ({tuple(t.shape)}, {t.dtype}) has no device memory: its storage "
                               "was resized to 0 bytes (untyped_storage().resize_(0)); resize it back first")
        writer = allocation.writer
        if writer is not None:
            writer.wait()
            allocation.writer = None
        if allocation.error is not None:
            raise PoisonedTensorError(f"a neuron tensor ({tuple(t.shape)}, {t.dtype}) holds no values: "
                                      f"{allocation.error}") from allocation.error


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


def _overlapping(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether two elements of a tensor of ``size``/``stride`` can share memory (an expanded view)."""
    if any(s == 0 for s in size):
        return False
    reach = 0  # the largest offset the smaller-strided dimensions reach
    for st, s in sorted((st, s) for s, st in zip(size, stride) if s != 1):
        if st <= reach:
            return True
        reach += (s - 1) * st
    return False


def allocate(size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype,
             index: int = 0) -> tuple[torch.Tensor, Allocation]:
    """Memory of device ``index`` for a tensor of ``size``/``stride``: its CPU view and its allocation."""
    size = [int(s) for s in size]
    stride = list(stride) if stride is not None else _contiguous_strides(size)
    return _allocate(size, stride, dtype, _span_bytes(size, stride, dtype), index)


def _allocate(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, nbytes: int,
              index: int, stream: int | None = None) -> tuple[torch.Tensor, Allocation]:
    allocation = Allocation(nbytes, index, stream)
    if nbytes == 0:
        return torch.empty(size, dtype=dtype), allocation
    flat = memory.block_view(allocation.address, nbytes, owner=allocation.memory, dtype=dtype)
    return flat.as_strided(size, stride), allocation
