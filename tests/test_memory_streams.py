"""Per-stream free lists and record_stream, with real streams running slow work."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import torch_neuronx.memory as memory
from torch_neuronx.memory.allocator import CachingAllocator
from torch_neuronx.memory.allocator_config import parse
from torch_neuronx.memory.segments import HostSegmentSource
from torch_neuronx.runtime import streams
from torch_neuronx.runtime.streams import Stream

WAIT = 10.0
SIZE = 4096


@pytest.fixture
def allocator():
    allocator = CachingAllocator(0, parse(""), HostSegmentSource(1 << 30))
    yield allocator
    allocator.empty_cache()


def blocked(stream: Stream) -> threading.Event:
    gate = threading.Event()
    stream.submit(gate.wait, WAIT)
    return gate


def test_blocks_are_reused_only_on_the_stream_that_freed_them(allocator):
    side = Stream()
    address = allocator.malloc(SIZE, stream=side.id)
    allocator.free(address)
    assert allocator.malloc(SIZE, stream=0) != address  # another stream's cache is not eligible
    assert allocator.malloc(SIZE, stream=side.id) == address
    assert {s["stream"] for s in allocator.snapshot()} == {0, side.id}


def test_without_record_stream_memory_is_reused_at_once(allocator):
    side = Stream()
    gate = blocked(side)
    address = allocator.malloc(SIZE)
    allocator.free(address)
    assert allocator.malloc(SIZE) == address
    gate.set()


def test_record_stream_holds_memory_until_the_streams_work_completes(allocator):
    side = Stream()
    address = allocator.malloc(SIZE)  # on the default stream
    buffer = memory.block_view(address, SIZE)
    gate = blocked(side)
    side.submit(buffer.fill_, 7)  # slow work on another stream still writes the block
    allocator.record_stream(address, side)
    allocator.free(address)

    stats = allocator.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["active_bytes.all.current"] == SIZE  # freed, but pending the side stream
    assert [b["state"] for b in allocator.snapshot()[0]["blocks"]][0] == "active_pending_free"

    other = allocator.malloc(SIZE)
    assert other != address
    stats = allocator.memory_stats()
    assert stats["allocated_bytes.all.peak"] == SIZE  # never two allocations at once...
    assert stats["active_bytes.all.peak"] == 2 * SIZE  # ...but two blocks in use
    assert stats["active_bytes.all.freed"] == 0
    fresh = memory.block_view(other, SIZE)
    fresh.fill_(1)
    gate.set()
    side.synchronize(timeout=WAIT)
    assert int(fresh.min()) == int(fresh.max()) == 1  # the side stream's write did not land here
    assert allocator.malloc(SIZE) == address  # reused once the recorded work completed
    stats = allocator.memory_stats()
    assert stats["active_bytes.all.current"] == 2 * SIZE and stats["active_bytes.all.freed"] == SIZE
    assert stats["active_bytes.all.allocated"] == 3 * SIZE


def test_work_submitted_after_the_free_does_not_hold_the_block(allocator):
    side = Stream()
    address = allocator.malloc(SIZE)
    allocator.record_stream(address, side)
    allocator.free(address)  # the side stream is idle: its event is complete at free time
    gate = blocked(side)  # later work on the side stream is not waited for
    assert allocator.malloc(SIZE) == address
    gate.set()


def test_record_stream_on_the_allocation_stream_is_a_no_op(allocator):
    address = allocator.malloc(SIZE)
    gate = blocked(streams.default_stream())
    allocator.record_stream(address, streams.default_stream())
    allocator.free(address)
    assert allocator.malloc(SIZE) == address
    gate.set()


def test_empty_cache_waits_for_pending_frees(allocator):
    side = Stream()
    address = allocator.malloc(SIZE)
    gate = blocked(side)
    allocator.record_stream(address, side)
    allocator.free(address)
    threading.Timer(0.05, gate.set).start()
    allocator.empty_cache()  # returns only after the side stream released the block
    assert side.query()
    assert allocator.memory_stats()["reserved_bytes.all.current"] == 0


def test_api_uses_the_current_stream(monkeypatch):
    monkeypatch.setattr(memory, "_allocators", {})
    side = Stream()
    with streams.stream(side):
        address = memory.caching_allocator_alloc(SIZE)
    assert memory.memory_snapshot(0)[0]["stream"] == side.id
    memory.caching_allocator_delete(address)
    assert memory.caching_allocator_alloc(SIZE, stream=side) == address
    gate = blocked(side)
    other = memory.caching_allocator_alloc(SIZE)
    memory.record_stream(other, side)
    memory.caching_allocator_delete(other)
    assert memory.caching_allocator_alloc(SIZE) != other
    gate.set()
    memory.empty_cache()


def test_disabled_streams_share_one_free_list(monkeypatch, allocator):
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", "0")
    side = Stream()
    address = allocator.malloc(SIZE, stream=side.id)
    allocator.free(address)
    assert allocator.malloc(SIZE, stream=streams.default_stream().id) == address


_QUEUED_LOOP = """
import sys, torch, torch_neuronx
M = 1 << 20
a = torch.randn(16 * M // 4, device="neuron")
torch.neuron.synchronize()
torch.neuron.reset_peak_memory_stats()
for i in range(60):
    y = a * 2
    z = y + 1
torch.neuron.synchronize()
torch.testing.assert_close(z.cpu(), a.cpu() * 2 + 1)
print(torch.neuron.max_memory_allocated() // M)
"""


@pytest.mark.parametrize("capacity", ["0", str(80 << 20)])
def test_queued_work_runs_before_the_pool_grows(capacity):
    """Queued ops keep the memory of the tensors they use until they run: a loop issuing ops over
    16 MiB tensors faster than they ran grew the pool by an output per queued op (12.8 GiB for a
    live set of 192 MiB with 64 MiB tensors), and at a capacity of 5 tensors raised
    OutOfMemoryError although at most 4 were alive. The allocator lets queued work run first."""
    env = {**os.environ, "TORCH_NEURONX_DEVICE_MEMORY_BYTES": capacity}
    out = subprocess.run([sys.executable, "-c", _QUEUED_LOOP], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) <= 4 * 16  # a, the y and z alive, one new result
