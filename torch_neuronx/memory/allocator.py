"""The Neuron caching allocator: one segment pool per device.

The algorithm of the specification, knob by knob (names as in
TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG):

* A request is rounded (:func:`round_size`): up to ``kMinRoundedSize``, then
  to the next of ``kRoundupPower2Divisions`` equal steps between two powers of
  two, as PyTorch's ``roundup_power2_divisions``.
* Rounded sizes below ``kPoolBoundary`` use the small pool, the rest the large
  pool; each pool keeps its own free blocks, per stream.
* The best-fitting free block (smallest size, then lowest address) serves the
  request. It is split when the remainder is at least ``kSmallSplitThreshold``
  (small pool) or ``kLargeSplitThreshold`` (large pool). A block larger than
  ``kMaxSplitSizeBytes`` is never split and serves only requests within
  ``kMaxNonSplitRoundingBytes`` of its size.
* Without a fitting block a new segment is mapped: ``kSmallSegmentSize`` for the
  small pool, ``kMediumSegmentSize`` for large requests below
  ``kMediumThreshold``, else one segment of the request rounded up to
  ``kSegmentAlignment``. If the device is full, cached free segments are given
  back and the mapping is tried once more before :class:`OutOfMemoryError`.
* Freed blocks coalesce with free neighbours; :meth:`CachingAllocator.empty_cache`
  returns wholly free segments to the segment source.
* Streams, as CUDA's allocator: a block freed while other streams used it
  (:meth:`CachingAllocator.record_stream`) is reused only once the work those
  streams had queued at free time has completed.

The hot path (``malloc``/``free``) is written for CPython speed: free lists are
sorted lists of single integers ``size << 64 | address`` searched with bisect,
knobs are copied into attributes, statistics are updated inline.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any, Protocol

import torch

from torch_neuronx import observe
from torch_neuronx.memory import stats as _stats
from torch_neuronx.memory.allocator_config import SIZE_MAX, AllocatorConfig, load
from torch_neuronx.memory.segments import HostSegmentSource, SegmentSource
from torch_neuronx.observe.events import state as _observing

#: ``drain(device_index, stream_id) -> bool``: wait for the stream's queued work (which holds the
#: memory of the tensors it uses), True if there was any (registered by the streams:
#: ``set_queued_work_drain``).
drain_queued_work: Callable[[int, int], bool] | None = None

_FREE, _ALLOCATED, _PENDING = 0, 1, 2  # a pending block was freed but another stream may still use it
_STATE_NAMES = {_FREE: "inactive", _ALLOCATED: "active_allocated", _PENDING: "active_pending_free"}
_SHIFT = 64  # free-list key: size << 64 | address sorts by (size, address) as one int
_ADDRESS_MASK = (1 << _SHIFT) - 1


class OutOfMemoryError(torch.OutOfMemoryError):
    """A neuron device has no memory left for an allocation (a ``torch.OutOfMemoryError``)."""


class StreamLike(Protocol):
    """What the allocator needs from a stream (``torch_neuronx.runtime.streams.Stream``)."""

    id: int

    def record_event(self) -> Any:
        """An event that completes once the work queued on the stream so far has run."""


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between two powers of 2.

    PyTorch's algorithm (c10/cuda/CUDACachingAllocator.cpp): with 4
    divisions, 1200 lies between 1024 and 2048 whose steps are 1024, 1280,
    1536, 1792, so the result is 1280. The step is the lower power of two
    shifted right by floor(log2(divisions)); 1 division gives pure powers of 2.
    """
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    return (size + step - 1) & -step


def round_size(size: int, min_rounded: int, divisions: int) -> int:
    """RoundSize: the block size that serves a request of ``size`` bytes.

    Below ``min_rounded`` the floor; up to ``min_rounded * divisions`` a
    multiple of ``min_rounded`` (divisions that fine would be smaller than the
    floor); above, :func:`roundup_power2_next_division`.
    """
    if size < min_rounded:
        return min_rounded
    if size > min_rounded * divisions:
        return roundup_power2_next_division(size, divisions)
    return -(-size // min_rounded) * min_rounded


class Segment:
    """One mapping from the segment source, carved into a linked list of blocks."""

    __slots__ = ("address", "size", "is_small", "stream", "free_list", "stats")

    def __init__(self, address: int, size: int, is_small: bool, stream: int,
                 free_list: list[int], stats: _stats.PoolStats) -> None:
        self.address = address
        self.size = size
        self.is_small = is_small
        self.stream = stream
        self.free_list = free_list  # the sorted free keys of this segment's pool and stream
        self.stats = stats  # this segment's pool's statistics


class Block:
    """A run of bytes inside a segment: free, allocated, or freed-pending-events."""

    __slots__ = ("address", "size", "requested", "segment", "prev", "next", "state", "stream_uses")

    def __init__(self, address: int, size: int, segment: Segment,
                 prev: Block | None, next_: Block | None) -> None:
        self.address = address
        self.size = size
        self.requested = 0
        self.segment = segment
        self.prev = prev
        self.next = next_
        self.state = _FREE
        self.stream_uses: set[StreamLike] | None = None


class CachingAllocator:
    """The segment pool of one device (the specification's NeuronSegmentPool).

    ``config`` is snapshotted at construction (by default from
    TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG, parsed once per process) and
    never re-read. Thread safe.
    """

    def __init__(self, device: int = 0, config: AllocatorConfig | None = None,
                 source: SegmentSource | None = None) -> None:
        self.device = device
        self.config = config if config is not None else load()
        self.source = source if source is not None else HostSegmentSource()
        self.stats = _stats.AllocatorStats()
        self._all_stats = self.stats.all
        c = self.config
        # Hot-path copies of the knobs: an attribute load per use, no config lookups.
        self._pool_boundary = c.pool_boundary
        self._small_split = c.small_split_threshold
        self._large_split = c.large_split_threshold
        self._max_split = c.max_split_size
        self._max_non_split_rounding = c.max_non_split_rounding
        self._lock = threading.Lock()
        self._blocks: dict[int, Block] = {}  # every block, by address
        self._segments: dict[int, Segment] = {}
        self._free_small: dict[int, list[int]] = {}  # stream id -> sorted free keys
        self._free_large: dict[int, list[int]] = {}
        self._pending: list[tuple[Block, list[Any]]] = []  # freed blocks waiting for stream events
        self._round_cache: dict[int, int] = {}

    # -- allocation ------------------------------------------------------------

    def round_size(self, size: int) -> int:
        """RoundSize with this pool's knobs (cached: training steps repeat their sizes)."""
        rounded = self._round_cache.get(size)
        if rounded is None:
            if len(self._round_cache) > 65536:
                self._round_cache.clear()
            rounded = round_size(size, self.config.min_rounded_size, self.config.roundup_power2_divisions)
            self._round_cache[size] = rounded
        return rounded

    def segment_size(self, rounded: int) -> int:
        """The size of a new segment for a block of ``rounded`` bytes."""
        c = self.config
        if rounded < c.pool_boundary:
            # max(): the knobs allow kSmallSegmentSize below kPoolBoundary (and medium alike).
            return max(c.small_segment_size, rounded)
        if rounded < c.medium_threshold:
            return max(c.medium_segment_size, rounded)
        return -(-rounded // c.segment_alignment) * c.segment_alignment

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes for use on stream ``stream`` (an id); returns the address.

        Size 0 returns address 0 without allocating, like CUDA's allocator.
        Raises :class:`OutOfMemoryError` when the device is full even after
        giving back cached segments.
        """
        if size <= 0:
            if size == 0:
                return 0
            raise ValueError(f"cannot allocate a negative number of bytes ({size})")
        with self._lock:
            block = self._cached_block(size, stream)
            if block is None:
                address = 0
            else:
                rounded = self._round_cache[size]
                address = self._hand_out(block, rounded, size, rounded < self._pool_boundary)
        if not address:
            # The large pool would grow: first let queued work run, which frees what it holds
            # (small blocks are not waited for: a queue of them holds little, and waiting costs
            # the overlap of issuing and running).
            drained = (drain_queued_work is not None and size >= self._pool_boundary
                       and drain_queued_work(self.device, stream))
            with self._lock:
                block = self._cached_block(size, stream) if drained else None
                rounded = self._round_cache.get(size) or self.round_size(size)
                small = rounded < self._pool_boundary
                if block is None:
                    block = self._new_segment(rounded, size, small, stream)
                address = self._hand_out(block, rounded, size, small)
        if _observing.active:
            observe.emit("memory.malloc", size, device=self.device, stream=stream, address=address,
                         allocated=self._all_stats.allocated_bytes.current,
                         reserved=self._all_stats.reserved_bytes.current)
        return address

    def _cached_block(self, size: int, stream: int) -> Block | None:
        """A free block of the pool for ``size`` bytes on ``stream`` (taken off its free list), or None."""
        if self._pending:
            self._process_events()
        rounded = self._round_cache.get(size) or self.round_size(size)
        keys = (self._free_small if rounded < self._pool_boundary else self._free_large).get(stream)
        return self._take_free_block(keys, rounded) if keys else None

    def _take_free_block(self, keys: list[int], rounded: int) -> Block | None:
        """Best fit: the smallest free block that is large enough, lowest address first."""
        i = bisect_left(keys, rounded << _SHIFT)
        if i == len(keys):
            return None
        key = keys[i]
        size = key >> _SHIFT
        if size > self._max_split and size - rounded > self._max_non_split_rounding:
            # Every later block is larger still, so none is within the non-split tolerance.
            return None
        del keys[i]
        return self._blocks[key & _ADDRESS_MASK]

    def _hand_out(self, block: Block, rounded: int, requested: int, small: bool) -> int:
        """Split ``block`` if the remainder is worth keeping, mark it allocated, count it."""
        seg = block.segment
        size = block.size
        split_count = split_bytes = 0
        if block.prev is not None or block.next is not None:  # it was an inactive split block
            split_count, split_bytes = -1, -size
        remaining = size - rounded
        if remaining and remaining >= (self._small_split if small else self._large_split) \
                and size <= self._max_split:
            rest = Block(block.address + rounded, remaining, seg, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size = rounded
            self._blocks[rest.address] = rest
            insort(seg.free_list, (remaining << _SHIFT) | rest.address)
            split_count += 1
            split_bytes += remaining
        block.state = _ALLOCATED
        block.requested = requested
        for ps in (seg.stats, self._all_stats):
            st = ps.allocation
            c = st.current = st.current + 1
            if c > st.peak:
                st.peak = c
            st = ps.allocated_bytes
            c = st.current = st.current + size
            if c > st.peak:
                st.peak = c
            st = ps.requested_bytes
            c = st.current = st.current + requested
            if c > st.peak:
                st.peak = c
            # Stat.add inlined (net changes, as PyTorch): this runs on most calls.
            if split_bytes:
                st = ps.inactive_split_bytes
                c = st.current = st.current + split_bytes
                if split_bytes > 0:
                    if c > st.peak:
                        st.peak = c
                else:
                    st.freed -= split_bytes
            if split_count:
                st = ps.inactive_split
                c = st.current = st.current + split_count
                if split_count > 0:
                    if c > st.peak:
                        st.peak = c
                else:
                    st.freed -= split_count
        if self._pending:  # active = allocated + pending: its peak needs noting only now
            for ps in (seg.stats, self._all_stats):
                ps.active.note_peak()
                ps.active_bytes.note_peak()
        if size > self._max_split:
            self.stats.oversize_allocations.add(1)
        return block.address

    def _new_segment(self, rounded: int, requested: int, small: bool, stream: int) -> Block:
        """Map a segment for a block of ``rounded`` bytes; give back cached segments and retry once."""
        seg_size = self.segment_size(rounded)
        address = self.source.allocate(seg_size)
        if address is None:
            self.stats.num_alloc_retries += 1
            self._release_cached_segments()
            address = self.source.allocate(seg_size)
            if address is None:
                self.stats.num_ooms += 1
                raise OutOfMemoryError(self._oom_message(rounded, requested, seg_size))
        free_lists = self._free_small if small else self._free_large
        pool_stats = self.stats.small_pool if small else self.stats.large_pool
        seg = Segment(address, seg_size, small, stream, free_lists.setdefault(stream, []), pool_stats)
        block = Block(address, seg_size, seg, None, None)
        self._segments[address] = seg
        self._blocks[address] = block
        for ps in (pool_stats, self.stats.all):
            ps.segment.add(1)
            ps.reserved_bytes.add(seg_size)
        self.stats.num_device_alloc += 1
        if seg_size > self._max_split:
            self.stats.oversize_segments.add(1)
        self._follow_pinned_bytes()
        return block

    def _follow_pinned_bytes(self) -> None:
        """Bring ``pinned_bytes`` to the segment source's page-locked bytes (TORCH_NEURONX_USE_PINNED_MALLOC)."""
        change = getattr(self.source, "pinned_bytes", 0) - self.stats.pinned_bytes.current
        if change:
            self.stats.pinned_bytes.add(change)

    # -- freeing ---------------------------------------------------------------

    def free(self, address: int) -> None:
        """Free an allocation made by :meth:`malloc` (address 0 is ignored)."""
        if not address:
            return
        with self._lock:
            block = self._blocks.get(address)
            if block is None or block.state != _ALLOCATED:
                raise ValueError(
                    f"address {address:#x} is not a live allocation of the neuron:{self.device} caching "
                    "allocator (freed twice, or not allocated by it)")
            size = block.size
            requested = block.requested
            for ps in (block.segment.stats, self._all_stats):
                st = ps.allocation
                st.current -= 1
                st.freed += 1
                st = ps.allocated_bytes
                st.current -= size
                st.freed += size
                st = ps.requested_bytes
                st.current -= requested
                st.freed += requested
            if size > self._max_split:
                self.stats.oversize_allocations.add(-1)
            if block.stream_uses:
                self._defer_free(block)
            else:
                self._free_block(block)
        if _observing.active:
            observe.emit("memory.free", requested, device=self.device, address=address,
                         allocated=self._all_stats.allocated_bytes.current,
                         reserved=self._all_stats.reserved_bytes.current)

    def _free_block(self, block: Block) -> None:
        """Return a block to its free list, merged with free neighbours (coalescing)."""
        seg = block.segment
        keys = seg.free_list
        blocks = self._blocks
        split_count = split_bytes = 0
        prev = block.prev
        if prev is not None and prev.state == _FREE:
            del keys[bisect_left(keys, (prev.size << _SHIFT) | prev.address)]
            split_count -= 1
            split_bytes -= prev.size
            prev.size += block.size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            del blocks[block.address]
            block = prev
        nxt = block.next
        if nxt is not None and nxt.state == _FREE:
            del keys[bisect_left(keys, (nxt.size << _SHIFT) | nxt.address)]
            split_count -= 1
            split_bytes -= nxt.size
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            del blocks[nxt.address]
        block.state = _FREE
        block.requested = 0
        insort(keys, (block.size << _SHIFT) | block.address)
        if block.prev is not None or block.next is not None:
            split_count += 1
            split_bytes += block.size
        for ps in (seg.stats, self._all_stats):
            # Stat.add inlined (net changes, as PyTorch): this runs on most calls.
            if split_bytes:
                st = ps.inactive_split_bytes
                c = st.current = st.current + split_bytes
                if split_bytes > 0:
                    if c > st.peak:
                        st.peak = c
                else:
                    st.freed -= split_bytes
            if split_count:
                st = ps.inactive_split
                c = st.current = st.current + split_count
                if split_count > 0:
                    if c > st.peak:
                        st.peak = c
                else:
                    st.freed -= split_count

    # -- streams ---------------------------------------------------------------

    def record_stream(self, address: int, stream: StreamLike) -> None:
        """Mark the allocation at ``address`` as used by ``stream`` (``Tensor.record_stream``).

        When it is freed, it is not reused until the work queued on ``stream``
        at that moment has completed.
        """
        with self._lock:
            block = self._blocks.get(address)
            if block is None or block.state != _ALLOCATED:
                raise ValueError(f"address {address:#x} is not a live allocation of the "
                                 f"neuron:{self.device} caching allocator")
            if stream.id == block.segment.stream and getattr(stream, "device_index", self.device) == self.device:
                return  # work on the allocation's own stream is ordered before any reuse
            if block.stream_uses is None:
                block.stream_uses = set()
            block.stream_uses.add(stream)

    def _defer_free(self, block: Block) -> None:
        events = [stream.record_event() for stream in block.stream_uses]
        block.stream_uses = None
        block.state = _PENDING
        self._pending.append((block, events))
        for ps in (block.segment.stats, self._all_stats):
            ps.active.pending.add(1)
            ps.active_bytes.pending.add(block.size)

    def _process_events(self) -> None:
        """Free the pending blocks whose streams have finished with them (never blocks)."""
        waiting = []
        for block, events in self._pending:
            if all(event.query() for event in events):
                for ps in (block.segment.stats, self._all_stats):
                    ps.active.pending.add(-1)
                    ps.active_bytes.pending.add(-block.size)
                self._free_block(block)
            else:
                waiting.append((block, events))
        self._pending = waiting

    def synchronize_pending(self) -> None:
        """Wait for every stream event that holds back a freed block, then free those blocks."""
        with self._lock:
            events = [event for _, pending in self._pending for event in pending]
        # Wait without the lock: work on those streams may itself allocate.
        for event in events:
            event.synchronize()
        with self._lock:
            self._process_events()

    # -- giving memory back ----------------------------------------------------

    def empty_cache(self) -> None:
        """Return every wholly free segment to the segment source (after pending frees complete)."""
        self.synchronize_pending()
        with self._lock:
            self.stats.num_sync_all_streams += 1
            self._release_cached_segments()

    def _release_cached_segments(self) -> None:
        for seg in list(self._segments.values()):
            block = self._blocks[seg.address]
            if block.state == _FREE and block.next is None:
                self._release_segment(seg, block)

    def _release_segment(self, seg: Segment, block: Block) -> None:
        keys = seg.free_list
        del keys[bisect_left(keys, (block.size << _SHIFT) | block.address)]
        del self._blocks[block.address]
        del self._segments[seg.address]
        self.source.release(seg.address, seg.size)
        for ps in (seg.stats, self.stats.all):
            ps.segment.add(-1)
            ps.reserved_bytes.add(-seg.size)
        self.stats.num_device_free += 1
        if seg.size > self._max_split:
            self.stats.oversize_segments.add(-1)
        self._follow_pinned_bytes()

    # -- inspection ------------------------------------------------------------

    def memory_stats(self) -> dict[str, Any]:
        """``torch.cuda.memory_stats``-style flat dictionary."""
        with self._lock:
            return self.stats.as_dict(self._max_split)

    def snapshot(self) -> list[dict[str, Any]]:
        """Segments and their blocks, in the format of ``torch.cuda.memory_snapshot``."""
        with self._lock:
            result = []
            for address in sorted(self._segments):
                seg = self._segments[address]
                blocks = []
                block = self._blocks[address]
                while block is not None:
                    blocks.append(_stats.block_record(block.address, block.size, block.requested,
                                                      _STATE_NAMES[block.state]))
                    block = block.next
                result.append(_stats.segment_record(self.device, address, seg.size, seg.stream,
                                                    seg.is_small, blocks))
            return result

    def largest_free_block(self) -> int:
        """The size of the largest cached free block, over both pools and all streams."""
        sizes = [keys[-1] >> _SHIFT for pool in (self._free_small, self._free_large)
                 for keys in pool.values() if keys]
        return max(sizes, default=0)

    def _oom_message(self, rounded: int, requested: int, seg_size: int) -> str:
        free_cached = sum(key >> _SHIFT for pool in (self._free_small, self._free_large)
                          for keys in pool.values() for key in keys)
        return _stats.oom_message(
            device=self.device, rounded=rounded, requested=requested, segment_size=seg_size,
            capacity=self.source.capacity, limit=self.source.limit,
            reserved=self.stats.all.reserved_bytes.current,
            allocated=self.stats.all.allocated_bytes.current, largest_free=self.largest_free_block(),
            free_cached=free_cached)

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device as this allocator sees it."""
        with self._lock:
            capacity = self.source.capacity
            return max(capacity - self.stats.all.reserved_bytes.current, 0), capacity


__all__ = ["SIZE_MAX", "Block", "CachingAllocator", "OutOfMemoryError", "Segment", "round_size",
           "roundup_power2_next_division"]
