"""Neuron device memory: the caching allocator's API, name for name with ``torch.cuda``'s.

Every function takes an optional ``device``: None (the current device, 0),
an int, ``"neuron"``, ``"neuron:N"`` or ``torch.device("neuron", N)``. Each
device has one :class:`~torch_neuronx.memory.allocator.CachingAllocator`,
built on first use with the TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG knobs of
that moment and a capacity of TORCH_NEURONX_DEVICE_MEMORY_BYTES (0: the
host's RAM). Importing this module does no work and does not import torch.

Device code allocates through :func:`caching_allocator_alloc` /
:func:`caching_allocator_delete` (or :func:`device_allocator` directly) and
reaches the bytes zero-copy with :func:`block_view`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch_neuronx import config
from torch_neuronx.memory.segments import block_buffer, block_view
from torch_neuronx.process import device_index

if TYPE_CHECKING:
    from torch_neuronx.memory.allocator import CachingAllocator, OutOfMemoryError  # noqa: F401

__all__ = [
    "OutOfMemoryError", "block_buffer", "block_view", "caching_allocator_alloc", "caching_allocator_delete",
    "device_allocator", "empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "record_stream", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
]

_allocators: dict[int, CachingAllocator] = {}
_allocators_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    # OutOfMemoryError subclasses torch.OutOfMemoryError: resolve it lazily so that
    # importing this module does not import torch.
    if name == "OutOfMemoryError":
        from torch_neuronx.memory.allocator import OutOfMemoryError

        return OutOfMemoryError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_allocator(device: Any = None) -> CachingAllocator:
    """The caching allocator of ``device``, created (and configured, once) on first use."""
    index = device_index(device)
    allocator = _allocators.get(index)
    if allocator is None:
        from torch_neuronx.memory.allocator import CachingAllocator
        from torch_neuronx.memory.allocator_config import load
        from torch_neuronx.memory.segments import HostSegmentSource

        with _allocators_lock:
            allocator = _allocators.get(index)
            if allocator is None:
                capacity = config.get("TORCH_NEURONX_DEVICE_MEMORY_BYTES")
                allocator = CachingAllocator(index, load(), HostSegmentSource(capacity or None))
                _allocators[index] = allocator
    return allocator


def _selected(device: Any) -> list[CachingAllocator]:
    """The allocator of ``device``, or every existing one when ``device`` is None."""
    if device is None:
        return list(_allocators.values())
    return [device_allocator(device)]


# -- raw allocation ----------------------------------------------------------


_current_stream_id: Callable[[int], int] = lambda index: 0  # noqa: E731  (until streams register)


def set_current_stream_resolver(resolver: Callable[[int], int]) -> None:
    """Register how to find a device's current stream id (the runtime's streams do, at import).

    The allocator sits below the streams: it keys blocks by stream id and never imports them.
    """
    global _current_stream_id
    _current_stream_id = resolver


def set_queued_work_drain(drain: Callable[[int, int], bool]) -> None:
    """Register how to let a stream's queued work run before its pool grows (the streams do, at
    import): ``drain(index, stream_id)`` waits for it and returns whether there was any.

    Queued work keeps the memory of the tensors it uses until it has run: a loop issuing ops over
    big tensors faster than they run grew the pool by one output per queued op (12.8 GiB for a
    live set of 192 MiB) and raised OutOfMemoryError at a capacity its live tensors fit in.
    """
    from torch_neuronx.memory import allocator

    allocator.drain_queued_work = drain


def current_stream_id(index: int) -> int:
    """The id of the current stream of device ``index`` (0, the default stream, before streams exist)."""
    return _current_stream_id(index)


def _stream_id(stream: Any, index: int) -> int:
    if stream is None:
        return _current_stream_id(index)
    if isinstance(stream, int):
        return stream
    if stream.device_index != index:
        raise ValueError(f"{stream!r} belongs to neuron:{stream.device_index}, not neuron:{index}")
    return stream.id


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocate ``size`` bytes on ``device`` for ``stream`` (the current stream if None); the address.

    Raises :class:`OutOfMemoryError` when the device is full.
    """
    index = device_index(device)
    return device_allocator(index).malloc(size, _stream_id(stream, index))


def caching_allocator_delete(address: int) -> None:
    """Free memory that :func:`caching_allocator_alloc` returned (on whichever device owns it)."""
    if not address:
        return
    for allocator in list(_allocators.values()):
        if address in allocator._blocks:
            allocator.free(address)
            return
    raise ValueError(f"address {address:#x} was not allocated by a neuron caching allocator")


def record_stream(address: int, stream: Any) -> None:
    """Mark the allocation at ``address`` as used by ``stream`` (``Tensor.record_stream``).

    After it is freed, the memory is reused only once the work queued on
    ``stream`` at free time has completed.
    """
    device_allocator(stream.device_index).record_stream(address, stream)


# -- statistics --------------------------------------------------------------


def memory_stats(device: Any = None) -> dict[str, Any]:
    """The allocator statistics of ``device``, keyed both as ``torch.cuda`` and as TorchNeuron key them.

    The flat keys of ``torch.cuda.memory_stats`` (``"allocated_bytes.all.current"``,
    ``"reserved_bytes.large_pool.peak"``, ``"num_ooms"``, ...) and, for code written for
    TorchNeuron, each statistic's ``all`` pool nested under its short name
    (``stats["allocated_bytes"]["current"]``, ``stats["reserved_bytes"]["peak"]``), read from
    the same snapshot, so both forms always agree.
    """
    from torch_neuronx.memory import stats

    return stats.with_nested(device_allocator(device).memory_stats())


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """The flat keys of :func:`memory_stats` nested at each ``.``, as ``torch.cuda.memory_stats_as_nested_dict``."""
    nested: dict[str, Any] = {}
    for key, value in device_allocator(device).memory_stats().items():
        node = nested
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def memory_allocated(device: Any = None) -> int:
    """Bytes currently allocated to tensors on ``device`` (rounded block sizes)."""
    return device_allocator(device).stats.all.allocated_bytes.current


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return device_allocator(device).stats.all.allocated_bytes.peak


def memory_reserved(device: Any = None) -> int:
    """Bytes of segments the caching allocator holds on ``device``."""
    return device_allocator(device).stats.all.reserved_bytes.current


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since start or :func:`reset_peak_memory_stats`."""
    return device_allocator(device).stats.all.reserved_bytes.peak


def reset_peak_memory_stats(device: Any = None) -> None:
    """Restart every ``peak`` statistic of ``device`` from its current value."""
    allocator = device_allocator(device)
    with allocator._lock:
        allocator.stats.reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Restart the ``allocated``/``freed`` sums and the event counters of ``device``."""
    allocator = device_allocator(device)
    with allocator._lock:
        allocator.stats.reset_accumulated()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Let the caching allocator of ``device`` reserve at most ``fraction`` (0 to 1) of its capacity,
    as ``torch.cuda.set_per_process_memory_fraction``: a request past it frees the cached segments
    and then raises ``OutOfMemoryError``."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    source = device_allocator(device).source
    source.limit = int(fraction * source.capacity)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction of ``device``'s capacity its caching allocator may reserve (1.0 unless set)."""
    source = device_allocator(device).source
    return 1.0 if source.limit is None else source.limit / source.capacity


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device``: capacity minus what the allocator reserved, and capacity."""
    return device_allocator(device).mem_get_info()


# -- cache and inspection ----------------------------------------------------


def empty_cache(device: Any = None) -> None:
    """Return wholly free cached segments to the device (every device's when ``device`` is None)."""
    for allocator in _selected(device):
        allocator.empty_cache()


def memory_snapshot(device: Any = None) -> list[dict[str, Any]]:
    """Segments and their blocks, as ``torch.cuda.memory_snapshot()`` (every device when None)."""
    return [segment for allocator in _selected(device) for segment in allocator.snapshot()]


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A human-readable table of :func:`memory_stats`, laid out like ``torch.cuda.memory_summary``."""
    from torch_neuronx.memory import stats

    index = device_index(device)
    return stats.summary(memory_stats(index), index, abbreviated)
