"""The segment-pool algorithm, rule by rule, with exact sizes."""

from __future__ import annotations

import re

import pytest
import torch

import torch_neuronx.memory as memory
from torch_neuronx.memory.allocator import CachingAllocator, OutOfMemoryError, round_size
from torch_neuronx.memory.allocator_config import parse
from torch_neuronx.memory.segments import HostSegmentSource

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30
EXAMPLE_CAP = "kMaxSplitSizeBytes=536870912,kMaxNonSplitRoundingBytes=67108864"
EXAMPLE_DIVISIONS = "kRoundupPower2Divisions=8"


class FakeSource:
    """Address space without memory, for multi-GB scenarios; records what was mapped."""

    def __init__(self, capacity: int = 64 * GB) -> None:
        self.capacity = capacity
        self.limit = None  # (SegmentSource: no memory fraction set)
        self.mapped = 0
        self.segments: dict[int, int] = {}
        self._next = 1 << 44

    def allocate(self, nbytes: int) -> int | None:
        if self.mapped + nbytes > self.capacity:
            return None
        address = self._next
        self._next += nbytes + 2 * MB  # a gap, so adjacent segments never look contiguous
        self.segments[address] = nbytes
        self.mapped += nbytes
        return address

    def release(self, address: int, nbytes: int) -> None:
        assert self.segments.pop(address) == nbytes
        self.mapped -= nbytes


def make(env: str = "", capacity: int = 64 * GB, host: bool = False) -> CachingAllocator:
    source = HostSegmentSource(capacity) if host else FakeSource(capacity)
    return CachingAllocator(0, parse(env), source)


def stat(allocator: CachingAllocator, key: str) -> int:
    return allocator.memory_stats()[key]


def block_of(allocator: CachingAllocator, address: int) -> dict:
    for segment in allocator.snapshot():
        for block in segment["blocks"]:
            if block["address"] == address:
                return block
    raise AssertionError(f"no block at {address:#x}")


def segment_of(allocator: CachingAllocator, address: int) -> dict:
    for segment in allocator.snapshot():
        if segment["address"] <= address < segment["address"] + segment["total_size"]:
            return segment
    raise AssertionError(f"no segment holds {address:#x}")


# -- RoundSize ---------------------------------------------------------------


@pytest.mark.parametrize(("size", "n1", "n4", "n8"), [
    (1, 256, 256, 256),
    (256, 256, 256, 256),
    (257, 512, 512, 512),
    (1000, 1024, 1024, 1024),
    (1024, 1024, 1024, 1024),
    (1025, 2048, 1280, 1280),
    (1200, 2048, 1280, 1280),
    (1537, 2048, 1792, 1792),
    (2049, 4096, 2560, 2304),
    (2100, 4096, 2560, 2304),
    (3000, 4096, 3072, 3072),
    (5000, 8192, 5120, 5120),
    (MB, MB, MB, MB),
    (MB + 1, 2 * MB, MB + 256 * KB, MB + 128 * KB),
    (2_200_000, 4 * MB, 2_621_440, 2_359_296),
    (17 * MB, 32 * MB, 20 * MB, 18 * MB),
    (600 * MB, 1024 * MB, 640 * MB, 640 * MB),
])
def test_round_size_power2_divisions(size, n1, n4, n8):
    assert round_size(size, 256, 1) == n1
    assert round_size(size, 256, 4) == n4
    assert round_size(size, 256, 8) == n8


def test_n4_waste_is_at_most_a_quarter_of_the_lower_power_of_two():
    for size in range(1025, 70000, 7):
        rounded = round_size(size, 256, 4)
        floor = 1 << (size.bit_length() - 1)
        assert size <= rounded <= size + floor // 4
        assert rounded % (floor // 4) == 0


def test_min_rounded_size_is_the_floor():
    assert round_size(1, 512, 4) == 512
    assert round_size(600, 512, 4) == 1024  # up to min*N, multiples of the floor
    assert make("kMinRoundedSize=512").round_size(1) == 512


@pytest.mark.parametrize(("env", "size", "expected"), [
    ("", 2_200_000, 2_621_440),
    (EXAMPLE_DIVISIONS, 2_200_000, 2_359_296),
    ("kRoundupPower2Divisions=1", 2_200_000, 4 * MB),
])
def test_allocated_bytes_are_the_rounded_size(env, size, expected):
    allocator = make(env)
    allocator.malloc(size)
    assert stat(allocator, "allocated_bytes.all.current") == expected
    assert stat(allocator, "requested_bytes.all.current") == size


# -- pools and segments ------------------------------------------------------


def test_small_requests_use_the_small_pool_and_2mb_segments():
    allocator = make()
    address = allocator.malloc(1000)
    segment = segment_of(allocator, address)
    assert (segment["segment_type"], segment["total_size"]) == ("small", 2 * MB)
    assert stat(allocator, "allocated_bytes.small_pool.current") == 1024
    assert stat(allocator, "allocated_bytes.large_pool.current") == 0


def test_pool_is_chosen_by_the_rounded_size():
    allocator = make()
    below = allocator.malloc(786_432)  # rounds to itself (768 KiB): small
    at = allocator.malloc(MB - 1)  # rounds to 1 MiB = kPoolBoundary: large
    assert segment_of(allocator, below)["segment_type"] == "small"
    assert segment_of(allocator, at)["segment_type"] == "large"
    assert stat(allocator, "allocated_bytes.large_pool.current") == MB


def test_pools_keep_separate_free_sets():
    allocator = make()
    small = allocator.malloc(4 * KB)
    large = allocator.malloc(2 * MB)
    allocator.free(large)
    again = allocator.malloc(4 * KB)  # a free 64 MiB large block exists but is not eligible
    assert segment_of(allocator, again)["segment_type"] == "small"
    assert stat(allocator, "segment.all.current") == 2
    allocator.free(small)
    allocator.free(again)


def test_medium_requests_share_64mb_segments():
    allocator = make()
    first = allocator.malloc(3 * MB)
    second = allocator.malloc(12 * MB)  # 12 MiB < kMediumThreshold
    segment = segment_of(allocator, first)
    assert (segment["segment_type"], segment["total_size"]) == ("large", 64 * MB)
    assert segment_of(allocator, second)["address"] == segment["address"]
    assert second == first + 3 * MB
    assert stat(allocator, "reserved_bytes.all.current") == 64 * MB


def test_requests_at_the_medium_threshold_get_their_own_aligned_segment():
    allocator = make()
    exact = allocator.malloc(16 * MB)
    above = allocator.malloc(17 * MB)  # rounds to 20 MiB
    assert segment_of(allocator, exact)["total_size"] == 16 * MB
    assert segment_of(allocator, above)["total_size"] == 20 * MB
    assert stat(allocator, "segment.large_pool.current") == 2


def test_per_request_segments_round_up_to_the_alignment():
    allocator = make("kSegmentAlignment=8388608")
    address = allocator.malloc(17 * MB)  # 20 MiB block in a 24 MiB segment
    segment = segment_of(allocator, address)
    assert segment["total_size"] == 24 * MB
    assert [(b["size"], b["state"]) for b in segment["blocks"]] == [
        (20 * MB, "active_allocated"), (4 * MB, "inactive")]


def test_alignment_remainder_below_the_split_threshold_is_handed_out_whole():
    allocator = make("kRoundupPower2Divisions=64")
    address = allocator.malloc(17 * MB + 1)  # rounds to 17.25 MiB, segment 18 MiB
    assert segment_of(allocator, address)["total_size"] == 18 * MB
    assert block_of(allocator, address)["size"] == 18 * MB  # 768 KiB remainder < 1 MiB
    assert stat(allocator, "allocated_bytes.all.current") == 18 * MB


# -- best fit and splitting --------------------------------------------------


def test_best_fit_picks_the_smallest_sufficient_block():
    allocator = make()
    a = allocator.malloc(8 * KB)
    b = allocator.malloc(KB)
    c = allocator.malloc(4 * KB)
    allocator.malloc(KB)  # keeps c's hole separate from the tail
    allocator.free(a)  # 8 KiB hole
    allocator.free(c)  # 4 KiB hole
    assert allocator.malloc(3 * KB) == c
    assert allocator.malloc(6 * KB) == a
    assert b


def test_small_split_threshold():
    allocator = make("kSmallSplitThreshold=4096")
    a = allocator.malloc(8 * KB)
    allocator.malloc(KB)
    allocator.free(a)
    whole = allocator.malloc(6 * KB)  # remainder 2 KiB < 4 KiB: not split
    assert whole == a and block_of(allocator, a)["size"] == 8 * KB
    allocator.free(whole)
    split = allocator.malloc(4 * KB)  # remainder 4 KiB >= 4 KiB: split
    assert split == a and block_of(allocator, a)["size"] == 4 * KB
    assert block_of(allocator, a + 4 * KB)["state"] == "inactive"


def test_large_split_threshold_defaults_to_the_pool_boundary():
    allocator = make()
    a = allocator.malloc(4 * MB)
    allocator.malloc(2 * MB)
    allocator.free(a)
    whole = allocator.malloc(3 * MB + 512 * KB)  # remainder 512 KiB < 1 MiB
    assert whole == a and block_of(allocator, a)["size"] == 4 * MB
    allocator.free(whole)
    split = allocator.malloc(3 * MB)  # remainder exactly 1 MiB
    assert block_of(allocator, split)["size"] == 3 * MB
    assert block_of(allocator, a + 3 * MB) == {"address": a + 3 * MB, "size": MB, "requested_size": 0,
                                               "state": "inactive", "frames": []}


# -- kMaxSplitSizeBytes / kMaxNonSplitRoundingBytes (first example) ----------


def test_example_cap_reuses_an_oversize_block_within_the_tolerance():
    allocator = make(EXAMPLE_CAP)
    big = allocator.malloc(700 * MB)  # 768 MiB block and segment, above the 512 MiB cap
    allocator.free(big)
    again = allocator.malloc(650 * MB)  # rounds to 768 MiB: 0 bytes of waste
    assert again == big
    assert stat(allocator, "oversize_allocations.current") == 1
    assert stat(allocator, "oversize_segments.current") == 1
    assert stat(allocator, "max_split_size") == 512 * MB


def test_example_cap_never_splits_an_oversize_block():
    allocator = make(EXAMPLE_CAP)
    big = allocator.malloc(700 * MB)
    allocator.free(big)
    other = allocator.malloc(600 * MB)  # rounds to 640 MiB; 768 - 640 = 128 MiB > 64 MiB tolerance
    assert other != big
    small = allocator.malloc(4 * MB)  # a new medium segment, the 768 MiB block stays intact
    assert segment_of(allocator, small)["total_size"] == 64 * MB
    assert block_of(allocator, big) == {"address": big, "size": 768 * MB, "requested_size": 0,
                                        "state": "inactive", "frames": []}
    assert stat(allocator, "reserved_bytes.all.current") == (768 + 640 + 64) * MB


def test_tolerance_is_inclusive():
    allocator = make("kMaxSplitSizeBytes=536870912,kMaxNonSplitRoundingBytes=134217728")
    big = allocator.malloc(700 * MB)
    allocator.free(big)
    assert allocator.malloc(600 * MB) == big  # exactly 128 MiB of waste is allowed
    assert block_of(allocator, big)["size"] == 768 * MB


def test_without_a_cap_large_blocks_are_split():
    allocator = make()
    big = allocator.malloc(700 * MB)
    allocator.free(big)
    small = allocator.malloc(4 * MB)
    assert small == big and block_of(allocator, big)["size"] == 4 * MB
    assert stat(allocator, "reserved_bytes.all.current") == 768 * MB
    assert stat(allocator, "oversize_allocations.current") == 0


# -- coalescing and empty_cache ----------------------------------------------


def test_freed_neighbours_coalesce():
    allocator = make()
    a, b, c = (allocator.malloc(KB) for _ in range(3))
    assert (b - a, c - b) == (KB, KB)
    allocator.free(a)
    allocator.free(c)  # merges with the free tail
    blocks = allocator.snapshot()[0]["blocks"]
    assert [(blk["size"], blk["state"]) for blk in blocks] == [
        (KB, "inactive"), (KB, "active_allocated"), (2 * MB - 2 * KB, "inactive")]
    assert stat(allocator, "inactive_split_bytes.all.current") == 2 * MB - KB
    allocator.free(b)  # merges with both neighbours
    assert [(blk["size"], blk["state"]) for blk in allocator.snapshot()[0]["blocks"]] == [
        (2 * MB, "inactive")]
    assert stat(allocator, "inactive_split_bytes.all.current") == 0
    assert stat(allocator, "inactive_split.all.current") == 0
    assert allocator.malloc(3 * KB) == a


def test_empty_cache_releases_only_wholly_free_segments():
    allocator = make(host=True, capacity=GB)
    kept = allocator.malloc(KB)
    dropped = allocator.malloc(3 * MB)
    allocator.free(dropped)
    assert stat(allocator, "reserved_bytes.all.current") == 66 * MB
    allocator.empty_cache()
    assert stat(allocator, "reserved_bytes.all.current") == 2 * MB
    assert stat(allocator, "num_device_free") == 1
    assert allocator.source.mapped == 2 * MB
    allocator.free(kept)
    allocator.empty_cache()
    assert stat(allocator, "reserved_bytes.all.current") == 0 and allocator.snapshot() == []


# -- out of memory -----------------------------------------------------------


def test_allocation_failure_frees_cached_segments_and_retries():
    allocator = make(capacity=100 * MB)
    cached = allocator.malloc(3 * MB)
    allocator.free(cached)  # a free 64 MiB segment stays cached; too small for what follows
    address = allocator.malloc(80 * MB)  # an 80 MiB segment fits only once the cached one is released
    assert block_of(allocator, address)["size"] == 80 * MB
    assert stat(allocator, "num_alloc_retries") == 1
    assert stat(allocator, "num_ooms") == 0
    assert stat(allocator, "reserved_bytes.all.current") == 80 * MB
    assert allocator.source.mapped == 80 * MB


def test_out_of_memory_error_reports_the_state():
    allocator = make(capacity=64 * MB)
    a = allocator.malloc(3 * MB)
    allocator.malloc(3 * MB)
    allocator.malloc(3 * MB)
    allocator.free(a)  # free: 3 MiB hole + 55 MiB tail
    with pytest.raises(OutOfMemoryError) as info:
        allocator.malloc(60 * MB)  # rounds to 64 MiB: more than the 55 MiB tail
    message = str(info.value)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert "Tried to allocate 64.00 MiB" in message and "62914560 bytes requested" in message
    assert "total capacity of 64.00 MiB" in message and "0 B is free" in message
    assert "6.00 MiB is allocated" in message
    assert "58.00 MiB is reserved but unallocated" in message
    assert "largest free block is 55.00 MiB" in message
    assert re.search(r"5\.2% of the cached free memory is fragmented", message)
    assert "TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG" in message
    assert (stat(allocator, "num_ooms"), stat(allocator, "num_alloc_retries")) == (1, 1)
    assert stat(allocator, "allocated_bytes.all.current") == 6 * MB  # the failed request left no trace


def test_request_above_host_capacity_raises_out_of_memory():
    allocator = make(host=True, capacity=8 * MB)
    with pytest.raises(memory.OutOfMemoryError, match="neuron:0"):
        allocator.malloc(9 * MB)


# -- statistics, snapshot, API ---------------------------------------------------


def test_statistics_track_current_peak_and_totals():
    allocator = make()
    a = allocator.malloc(1000)
    b = allocator.malloc(3000)
    allocator.free(a)
    stats = allocator.memory_stats()
    assert stats["allocated_bytes.all.current"] == 3072
    assert stats["allocated_bytes.all.peak"] == 4096
    assert stats["allocated_bytes.all.allocated"] == 4096
    assert stats["allocated_bytes.all.freed"] == 1024
    assert stats["allocation.small_pool.current"] == 1 and stats["allocation.all.peak"] == 2
    assert stats["segment.all.current"] == 1 and stats["num_device_alloc"] == 1
    allocator.stats.reset_accumulated()
    stats = allocator.memory_stats()
    assert (stats["allocated_bytes.all.allocated"], stats["allocated_bytes.all.freed"]) == (0, 0)
    assert (stats["active_bytes.all.allocated"], stats["active_bytes.all.freed"]) == (0, 0)
    assert stats["allocated_bytes.all.current"] == 3072 and stats["num_device_alloc"] == 0
    allocator.free(b)
    stats = allocator.memory_stats()
    assert stats["allocated_bytes.all.freed"] == stats["active_bytes.all.freed"] == 3072
    allocator.stats.reset_peak()
    assert allocator.memory_stats()["allocated_bytes.all.peak"] == 0
    assert allocator.memory_stats()["active_bytes.all.peak"] == 0


def test_zero_size_and_bad_frees():
    allocator = make()
    assert allocator.malloc(0) == 0
    allocator.free(0)
    address = allocator.malloc(10)
    allocator.free(address)
    with pytest.raises(ValueError, match="freed twice"):
        allocator.free(address)
    with pytest.raises(ValueError):
        allocator.malloc(-1)


def test_block_view_is_zero_copy_over_an_allocation():
    allocator = make(host=True, capacity=GB)
    address = allocator.malloc(4096)
    view = memory.block_view(address, 4096)
    assert view.dtype == torch.uint8 and view.data_ptr() == address
    view.fill_(7)
    assert memory.block_buffer(address, 4096)[4095] == 7
    assert address % 64 == 0
    floats = memory.block_view(address, 4096, dtype=torch.float32)
    assert floats.shape == (1024,) and floats.data_ptr() == address
    floats[1023] = 1.0
    assert bytes(memory.block_buffer(address + 4092, 4)) == torch.tensor([1.0]).numpy().tobytes()
    allocator.free(address)
    allocator.empty_cache()


def test_public_api_matches_torch_cuda_names(monkeypatch):
    monkeypatch.setattr(memory, "_allocators", {})
    monkeypatch.setenv("TORCH_NEURONX_DEVICE_MEMORY_BYTES", str(128 * MB))
    address = memory.caching_allocator_alloc(5000, device="neuron:3")
    assert memory.memory_allocated(3) == 5120 and memory.max_memory_allocated("neuron:3") == 5120
    assert memory.memory_reserved(3) == 2 * MB and memory.max_memory_reserved(3) == 2 * MB
    assert memory.mem_get_info(3) == (126 * MB, 128 * MB)
    assert memory.memory_stats_as_nested_dict(3)["allocated_bytes"]["small_pool"]["current"] == 5120
    (segment,) = memory.memory_snapshot(3)
    assert segment["device"] == 3 and segment["blocks"][0]["address"] == address
    assert "Allocated memory" in memory.memory_summary(3)
    memory.caching_allocator_delete(address)
    memory.reset_peak_memory_stats(3)
    memory.empty_cache()
    assert memory.max_memory_allocated(3) == 0 and memory.memory_reserved(3) == 0
    with pytest.raises(ValueError, match="neuron"):
        memory.memory_allocated("cuda:0")
    with pytest.raises(memory.OutOfMemoryError):
        memory.caching_allocator_alloc(129 * MB, device=3)
