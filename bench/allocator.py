"""Replay a real training step's allocation trace through the Neuron caching allocator.

The trace is recorded from nn.TransformerEncoderLayer (d_model 512, nhead 8,
batch 32, seq 128) forward + backward + zero_grad on CPU: a TorchDispatchMode
notes each new output storage (its nbytes, at creation) and a
weakref.finalize on the storage notes its free. Parameters and the input batch
are allocated first and live throughout, as on a device.

The trace is replayed through one CachingAllocator per configuration (the
default and the specification's two examples): a few steps for the memory
figures (peak reserved / peak allocated, target <= 1.15), then repeatedly for
throughput (alloc+free pairs per second, target >= 200,000). The same trace
through torch's own CPU allocator (UntypedStorage create/delete, no caching)
is shown for comparison.

    .venv/bin/python bench/allocator.py [--steps 3] [--seconds 2]
"""

from __future__ import annotations

import argparse
import gc
import time
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from torch_neuronx.memory.allocator import CachingAllocator
from torch_neuronx.memory.allocator_config import parse
from torch_neuronx.memory.segments import HostSegmentSource

CONFIGS = {
    "default": "",
    "kMaxSplitSizeBytes=512MiB,kMaxNonSplitRoundingBytes=64MiB":
        "kMaxSplitSizeBytes=536870912,kMaxNonSplitRoundingBytes=67108864",
    "kRoundupPower2Divisions=8": "kRoundupPower2Divisions=8",
}

# A trace event: (storage id, nbytes) for an allocation, (storage id, 0) for a free.
Trace = list[tuple[int, int]]


class _StorageTracer(TorchDispatchMode):
    """Notes every storage an op creates, and when it is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.events: Trace = []
        self._tracked: dict[int, int] = {}  # id(storage object) -> trace id (0: not ours)
        self._next_id = 1

    def _forget(self, key: int, trace_id: int) -> None:
        if self._tracked.get(key) == trace_id:
            del self._tracked[key]
        if trace_id > 0:
            self.events.append((trace_id, 0))

    def _track(self, storage: torch.UntypedStorage, new: bool) -> None:
        key = id(storage)
        if key in self._tracked:
            return
        trace_id = self._next_id if new else -self._next_id  # negative: seen, allocated elsewhere
        self._next_id += 1
        self._tracked[key] = trace_id
        if new:
            self.events.append((trace_id, storage.nbytes()))
        weakref.finalize(storage, self._forget, key, trace_id)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for arg in tree_leaves((args, kwargs or {})):
            if isinstance(arg, torch.Tensor) and arg.untyped_storage().nbytes():
                self._track(arg.untyped_storage(), new=False)
        out = func(*args, **(kwargs or {}))
        for result in tree_leaves(out):
            if isinstance(result, torch.Tensor) and result.untyped_storage().nbytes():
                self._track(result.untyped_storage(), new=True)
        return out


def record_training_step() -> tuple[list[int], Trace]:
    """The persistent allocations (parameters, input) and one step's trace."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True)
    batch = torch.randn(32, 128, 512)
    persistent = [p.untyped_storage().nbytes() for p in layer.parameters()] + [batch.untyped_storage().nbytes()]
    layer(batch).sum().backward()  # warm-up outside the trace
    layer.zero_grad(set_to_none=True)
    tracer = _StorageTracer()
    with tracer:
        loss = layer(batch).sum()
        loss.backward()
        del loss
        layer.zero_grad(set_to_none=True)
        gc.collect()
    return persistent, tracer.events


def _step_ops(trace: Trace) -> list[tuple[int, int]]:
    """Only allocations whose free is in the trace: pairs that the replay can repeat."""
    freed = {key for key, size in trace if size == 0}
    allocated = {key for key, size in trace if size}
    return [(key, size) for key, size in trace if key in freed and key in allocated]


def replay_memory(env: str, persistent: list[int], ops: list[tuple[int, int]], steps: int) -> dict:
    allocator = CachingAllocator(0, parse(env), HostSegmentSource())
    held = [allocator.malloc(size) for size in persistent]
    addresses: dict[int, int] = {}
    for _ in range(steps):
        for key, size in ops:
            if size:
                addresses[key] = allocator.malloc(size)
            else:
                allocator.free(addresses.pop(key))
    stats = allocator.memory_stats()
    for address in held:
        allocator.free(address)
    allocator.empty_cache()
    return stats


def _pairs_per_second(ops: list[tuple[int, int]], seconds: float, alloc, free) -> float:
    """Replay the trace in a loop through ``alloc(size) -> handle`` / ``free(handle)``."""
    live: dict[int, object] = {}
    pairs = sum(1 for _, size in ops if size)
    done, elapsed = 0, 0.0
    while elapsed < seconds:
        start = time.perf_counter()
        for key, size in ops:
            if size:
                live[key] = alloc(size)
            else:
                free(live.pop(key))
        elapsed += time.perf_counter() - start
        done += pairs
    return done / elapsed


def replay_speed(env: str, ops: list[tuple[int, int]], seconds: float) -> float:
    """Alloc+free pairs per second of the step trace, replayed in a loop."""
    allocator = CachingAllocator(0, parse(env), HostSegmentSource())
    speed = _pairs_per_second(ops, seconds, allocator.malloc, allocator.free)
    allocator.empty_cache()
    return speed


def torch_cpu_speed(ops: list[tuple[int, int]], seconds: float) -> float:
    """The same trace through torch's CPU allocator (UntypedStorage create/delete; no caching)."""
    return _pairs_per_second(ops, seconds, torch.UntypedStorage, lambda storage: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps replayed for the memory figures")
    parser.add_argument("--seconds", type=float, default=2.0, help="replay time per throughput figure")
    args = parser.parse_args()
    torch.set_num_threads(1)

    persistent, trace = record_training_step()
    ops = _step_ops(trace)
    pairs = sum(1 for _, size in ops if size)
    step_bytes = sum(size for _, size in ops)
    print(f"trace: {len(persistent)} persistent allocations ({sum(persistent) / 2**20:.1f} MiB), "
          f"{pairs} alloc/free pairs per step ({step_bytes / 2**20:.1f} MiB allocated per step), "
          f"{len(trace) - len(ops)} events without a partner dropped")
    header = (f"{'config':<58} {'peak alloc MiB':>14} {'peak rsrvd MiB':>14} {'rsrvd/alloc':>11} "
              f"{'round waste':>11} {'pairs/s':>10}")
    print(header)
    print("-" * len(header))
    for name, env in CONFIGS.items():
        stats = replay_memory(env, persistent, ops, args.steps)
        allocated, reserved = stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]
        # Rounding waste: bytes handed out beyond the requests, over the whole replay.
        waste = stats["allocated_bytes.all.allocated"] / stats["requested_bytes.all.allocated"] - 1
        speed = replay_speed(env, ops, args.seconds)
        print(f"{name:<58} {allocated / 2**20:>14.1f} {reserved / 2**20:>14.1f} "
              f"{reserved / allocated:>11.3f} {waste:>11.2%} {speed:>10,.0f}")
    print(f"{'torch CPU allocator (UntypedStorage, no caching)':<58} {'':>14} {'':>14} {'':>11} {'':>11} "
          f"{torch_cpu_speed(ops, args.seconds):>10,.0f}")


if __name__ == "__main__":
    main()
