"""Random alloc/free sequences keep the pool's invariants (hypothesis)."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_neuronx.memory import block_buffer
from torch_neuronx.memory.allocator import CachingAllocator, OutOfMemoryError
from torch_neuronx.memory.allocator_config import parse
from torch_neuronx.memory.segments import HostSegmentSource

KB, MB = 1 << 10, 1 << 20
CONFIGS = [
    "",
    "kMaxSplitSizeBytes=536870912,kMaxNonSplitRoundingBytes=67108864",
    "kRoundupPower2Divisions=8",
    # small everything: many segments, splits and merges per example
    "kPoolBoundary=8192,kSmallSegmentSize=32768,kMediumSegmentSize=262144,kMediumThreshold=131072,"
    "kSegmentAlignment=65536,kMinRoundedSize=64,kRoundupPower2Divisions=2,kMaxSplitSizeBytes=262144,"
    "kMaxNonSplitRoundingBytes=65536",
]

sizes = st.one_of(
    st.integers(1, 4 * KB),
    st.integers(4 * KB, 1200 * KB),
    st.integers(1200 * KB, 20 * MB),
    st.integers(20 * MB, 80 * MB),
)
# ("alloc", size) or ("free", index into the live list, modulo its length)
operations = st.lists(st.one_of(st.tuples(st.just("alloc"), sizes),
                                st.tuples(st.just("free"), st.integers(0, 10**6))),
                      min_size=1, max_size=60)


def check_invariants(allocator: CachingAllocator, live: dict[int, tuple[int, int]]) -> None:
    """Tiling, no overlap, coalescing, every live allocation intact, statistics equal the live set."""
    segments = allocator.snapshot()
    allocated_blocks = {}
    previous_end = 0
    for segment in segments:  # sorted by address
        assert segment["address"] >= previous_end, "segments overlap"
        previous_end = segment["address"] + segment["total_size"]
        cursor = segment["address"]
        states = []
        for block in segment["blocks"]:
            assert block["address"] == cursor, "blocks do not tile the segment"
            assert block["size"] > 0 and block["address"] % 64 == 0
            cursor += block["size"]
            states.append(block["state"])
            if block["state"] == "active_allocated":
                allocated_blocks[block["address"]] = (block["size"], block["requested_size"])
        assert cursor == previous_end, "blocks do not cover the segment"
        assert all(not (a == b == "inactive") for a, b in zip(states, states[1:])), "free neighbours"
    assert set(allocated_blocks) == set(live)
    for address, (requested, tag) in live.items():
        size, recorded = allocated_blocks[address]
        assert recorded == requested and size >= allocator.round_size(requested)
        view = block_buffer(address, requested)
        assert (view[0], view[requested - 1]) == (tag, tag), "an allocation was overwritten"
    stats = allocator.memory_stats()
    split_free = sum(b["size"] for s in segments if len(s["blocks"]) > 1
                     for b in s["blocks"] if b["state"] == "inactive")
    assert stats["allocated_bytes.all.current"] == sum(size for size, _ in allocated_blocks.values())
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    assert stats["requested_bytes.all.current"] == sum(req for req, _ in live.values())
    assert stats["allocation.all.current"] == len(live)
    assert stats["reserved_bytes.all.current"] == sum(s["total_size"] for s in segments)
    assert stats["segment.all.current"] == len(segments)
    assert stats["inactive_split_bytes.all.current"] == split_free
    for pool, kind in (("small_pool", "small"), ("large_pool", "large")):
        assert stats[f"reserved_bytes.{pool}.current"] == sum(
            s["total_size"] for s in segments if s["segment_type"] == kind)
        assert stats[f"allocated_bytes.{pool}.current"] == sum(
            s["allocated_size"] for s in segments if s["segment_type"] == kind)
    for key, value in stats.items():
        if key.endswith(".current"):
            assert 0 <= value <= stats[key[: -len("current")] + "peak"]
            assert stats[key[: -len("current")] + "allocated"] - stats[key[: -len("current")] + "freed"] \
                == value


@pytest.mark.parametrize("env", CONFIGS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_random_alloc_free_sequences_keep_the_pool_consistent(env, ops):
    source = HostSegmentSource(capacity=400 * MB)
    allocator = CachingAllocator(0, parse(env), source)
    live: dict[int, tuple[int, int]] = {}  # address -> (requested size, tag byte written at both ends)
    for step, (kind, value) in enumerate(ops):
        if kind == "alloc":
            try:
                address = allocator.malloc(value)
            except OutOfMemoryError:
                assert allocator.memory_stats()["num_ooms"] >= 1
                continue
            tag = step % 251 + 1
            view = block_buffer(address, value)
            view[0] = view[value - 1] = tag
            live[address] = (value, tag)
        elif live:
            address = list(live)[value % len(live)]
            del live[address]
            allocator.free(address)
        check_invariants(allocator, live)
    for address in list(live):
        allocator.free(address)
    del live
    check_invariants(allocator, {})
    allocator.empty_cache()
    stats = allocator.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0 and stats["segment.all.current"] == 0
    assert allocator.snapshot() == [] and source.mapped == 0


def test_concurrent_threads_share_one_allocator_safely():
    allocator = CachingAllocator(0, parse(""), HostSegmentSource(capacity=1 << 30))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        live: dict[int, tuple[int, int]] = {}
        try:
            for step in range(1500):
                if live and rng.random() < 0.5:
                    address = rng.choice(list(live))
                    size, tag = live.pop(address)
                    view = block_buffer(address, size)
                    assert view[0] == view[size - 1] == tag, "an allocation was overwritten"
                    allocator.free(address)
                else:
                    size = rng.choice([64, 1000, 5000, 70_000, 1_500_000, 3_000_000])
                    address = allocator.malloc(size)
                    tag = (seed * 31 + step) % 251 + 1
                    view = block_buffer(address, size)
                    view[0] = view[size - 1] = tag
                    live[address] = (size, tag)
            for address in live:
                allocator.free(address)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    check_invariants(allocator, {})
    assert allocator.memory_stats()["allocation.all.allocated"] == allocator.memory_stats()[
        "allocation.all.freed"] > 0
    allocator.empty_cache()
    assert allocator.memory_stats()["reserved_bytes.all.current"] == 0
