"""Collectives over the ``neuron`` c10d backend against gloo on CPU tensors, side by side in one run.

The target of the distributed issue's "Performance" item: bus bandwidth of all_reduce,
all_gather_into_tensor and reduce_scatter_tensor from 1 MB to 256 MB, on 2 and 4 local ranks
(torchrun, gloo over loopback), with the ``neuron`` backend's overhead at most 10% at 64 MB and
above and at most 20% at 1 MB. In each torchrun run, the same processes hold both competitors:

- ``neuron``: ``init_process_group("neuron")``'s group on neuron tensors, timed to completion
  (``torch.neuron.synchronize()`` inside the timed region, so queued work counts); the split
  variables unset (their documented default: split all-gather and reduce-scatter on the
  default stream);
- ``gloo``: a ``dist.new_group(backend="gloo")`` on CPU tensors.

Rounds alternate the competitors (and which goes first); a round times a few calls back to back
after a barrier, and a round's time is the slowest rank's. Times are medians of rounds; the
overhead is the median over rounds of ``neuron time / gloo time - 1``, each round's pair timed
back to back (on a 2-core host gloo's own time per call varies by 30% and more between rounds,
so a ratio of the two medians moves with the host's load; the table also gives the quartiles of
the per-round overheads). Bus bandwidth
as nccl-tests defines it: all_reduce ``size * 2 (n-1)/n / time``; all_gather and
reduce_scatter ``size * (n-1)/n / time``, size being the full (gathered, scattered) buffer.

Peak extra memory of all_gather_into_tensor and reduce_scatter_tensor (256 MB full buffer, 2
ranks) with NEURON_USE_SPLIT_ALLGATHER / NEURON_USE_SPLIT_REDUCE_SCATTER off and on, one fresh
torchrun per setting: the process's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs just before the call) minus its resident size before it, with glibc told
to map every allocation above 128 KB on its own (MALLOC_MMAP_THRESHOLD_) so that a freed
buffer leaves the resident set at once. This sees what the algorithms allocate on the host
(their ``torch.empty`` chunks and copies), gloo's own buffers (gloo's row for scale), and
nothing of the tensors allocated before the call.

Usage: ``python bench/collectives.py [--quick] [--sizes 1,64] [--ranks 2] [--no-memory]`` (runs
torchrun itself; ``--quick``: 1, 16 and 64 MB, fewer rounds; ``--sizes``: only these sizes of the
plan (MB); ``--ranks``: only these rank counts; ``--no-memory``: the timing table only). Each rank
runs torch with one thread (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

from common import isa  # bench/common.py (the scripts run from bench/ or by path)

OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: size in MB: (rounds, calls per round)
PLAN = {1: (31, 10), 4: (9, 5), 16: (9, 2), 64: (15, 1), 256: (7, 1)}
QUICK = {1: (21, 10), 16: (5, 2), 64: (5, 1)}
RANKS = (2, 4)
MEMORY_MB, MEMORY_RANKS = 256, 2
_RESULT = "RESULT "


def _bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


# -- the ranks ---------------------------------------------------------------------------------


def _tensors(op: str, mb: int, n: int, device: str):
    """(first, second) of ``op`` over a full buffer of ``mb`` MB of float32, touched."""
    import torch

    full = (mb << 20) // 4
    part = full // n

    def make(count: int):
        t = torch.ones(count)
        return t.to(device) if device != "cpu" else t
    if op == "all_reduce":
        return make(full), None
    if op == "all_gather":
        return make(full), make(part)  # output, input
    return make(part), make(full)  # output, input


def _call(op: str, a, b, group) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(a, group=group)
    elif op == "all_gather":
        dist.all_gather_single(a, b, group=group)
    else:
        dist.reduce_scatter_single(a, b, group=group)


def _time_worker(sizes: dict[int, tuple[int, int]]) -> None:
    import torch
    import torch.distributed as dist

    import torch_neuronx  # noqa: F401

    dist.init_process_group("neuron")
    gloo = dist.new_group(backend="gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for mb, (rounds, calls) in sizes.items():
        for op in OPS:
            competitors = {"gloo": (*_tensors(op, mb, n, "cpu"), gloo, lambda: None),
                           "neuron": (*_tensors(op, mb, n, "neuron"), None, torch.neuron.synchronize)}
            for a, b, group, sync in competitors.values():  # warm: first calls, buffers, threads
                _call(op, a, b, group)
                sync()
            times: dict[str, list[float]] = {name: [] for name in competitors}
            for r in range(rounds):
                for name in (list(competitors) if r % 2 == 0 else list(reversed(competitors))):
                    a, b, group, sync = competitors[name]
                    dist.barrier(group=gloo)
                    start = time.perf_counter()
                    for _ in range(calls):
                        _call(op, a, b, group)
                    sync()
                    times[name].append((time.perf_counter() - start) / calls)
            slowest = torch.tensor([times["gloo"], times["neuron"]], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
            results.append({"op": op, "mb": mb, "ranks": n, "gloo": slowest[0].tolist(),
                            "neuron": slowest[1].tolist()})
            del competitors, a, b
            gc.collect()
            torch.neuron.empty_cache()
    if rank == 0:
        print(_RESULT + json.dumps(results), flush=True)
    dist.destroy_process_group()


def _status(field: str) -> int:
    """A /proc/self/status field, bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _memory_worker() -> None:
    import torch
    import torch.distributed as dist

    import torch_neuronx  # noqa: F401

    dist.init_process_group("neuron")
    gloo = dist.new_group(backend="gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for name, device, group, sync in (("gloo", "cpu", gloo, lambda: None),
                                      ("neuron", "neuron", None, torch.neuron.synchronize)):
        for op in ("all_gather", "reduce_scatter"):
            _call(op, *_tensors(op, 1, n, device), group)  # first calls of this op (small)
            sync()
            a, b = _tensors(op, MEMORY_MB, n, device)
            sync()
            dist.barrier(group=gloo)
            gc.collect()
            before = _status("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the high-water mark back to the resident size now
            start = time.perf_counter()
            _call(op, a, b, group)
            sync()
            seconds = time.perf_counter() - start
            extra = torch.tensor([_status("VmHWM") - before, seconds], dtype=torch.float64)
            dist.all_reduce(extra, op=dist.ReduceOp.MAX, group=gloo)
            results.append({"competitor": name, "op": op, "extra": extra[0].item(), "seconds": extra[1].item()})
            del a, b
            gc.collect()
    if rank == 0:
        print(_RESULT + json.dumps(results), flush=True)
    dist.destroy_process_group()


# -- the launcher ------------------------------------------------------------------------------


def _torchrun(nproc: int, args: list[str], env: dict[str, str]) -> list:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **env}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NEURON_USE_SPLIT_ALLGATHER",
                 "NEURON_USE_SPLIT_REDUCE_SCATTER"):
        if name not in env:
            environment.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", os.path.abspath(__file__), *args],
                          capture_output=True, text=True, env=environment, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT)]
    if proc.returncode != 0 or not lines:
        sys.exit(f"torchrun {nproc} ranks {args} failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                 f"\n{proc.stderr[-4000:]}")
    return json.loads(lines[0][len(_RESULT):])


def _timing_table(rows: list[dict]) -> None:
    print("| op | size | ranks | gloo GB/s | neuron GB/s | overhead % | quartiles % | target |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in sorted(rows, key=lambda r: (OPS.index(r["op"]), r["ranks"], r["mb"])):
        mb, n = row["mb"], row["ranks"]
        gloo, neuron = statistics.median(row["gloo"]), statistics.median(row["neuron"])
        ratios = [(b / a - 1) * 100 for a, b in zip(row["gloo"], row["neuron"])]
        overhead = statistics.median(ratios)
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (overhead,) * 3
        bus = (mb << 20) * _bus_factor(row["op"], n) / 1e9
        limit = 10 if mb >= 64 else 20 if mb == 1 else None
        target = "-" if limit is None else f"≤{limit}%: {'met' if overhead <= limit else 'missed'}"
        spread = f"{low:+.0f} to {high:+.0f}"
        print(f"| {row['op']} | {mb} MB | {n} | {bus / gloo:.2f} | {bus / neuron:.2f} | {overhead:+.1f} | {spread} "
              f"| {target} |")


def _memory_table(runs: dict[str, list[dict]]) -> None:
    print(f"\nPeak extra host memory of one call, {MEMORY_MB} MB full buffer (float32), {MEMORY_RANKS} ranks, "
          "largest rank; MB (and ms of that one call):\n")
    print("| op | gloo (CPU tensors) | neuron, split off | neuron, split on |\n| --- | --- | --- | --- |")
    for op, variable in (("all_gather", "NEURON_USE_SPLIT_ALLGATHER"),
                         ("reduce_scatter", "NEURON_USE_SPLIT_REDUCE_SCATTER")):
        cells = []
        for setting, competitor in (("0", "gloo"), ("0", "neuron"), ("1", "neuron")):
            found = next(r for r in runs[setting] if r["op"] == op and r["competitor"] == competitor)
            cells.append(f"{found['extra'] / 2**20:.1f} ({found['seconds'] * 1e3:.0f} ms)")
        print(f"| {op} ({variable}) | " + " | ".join(cells) + " |")


def _without_ranks(args: list[str]) -> list[str]:
    """The launcher's arguments that its workers take too (not ``--ranks``, which picks the runs)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--ranks":
            skip = True
        elif not a.startswith("--ranks="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1, 16 and 64 MB, fewer rounds")
    parser.add_argument("--sizes", help="comma-separated sizes in MB, a subset of the plan's")
    parser.add_argument("--ranks", help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--worker", choices=("time", "memory"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else PLAN
    if args.sizes:
        plan = {mb: plan.get(mb, PLAN.get(mb, (5, 1))) for mb in map(int, args.sizes.split(","))}
    if args.worker:
        warnings.simplefilter("ignore")
        if args.worker == "time":
            _time_worker(plan)
        else:
            _memory_worker()
        return
    started = time.perf_counter()
    passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--no-memory",)]
    rows = []
    for n in (tuple(map(int, args.ranks.split(","))) if args.ranks else RANKS):
        rows.extend(_torchrun(n, [*_without_ranks(passed), "--worker", "time"], {}))
    memory = {} if args.no_memory else {setting: _torchrun(MEMORY_RANKS, ["--worker", "memory"], {
        "NEURON_USE_SPLIT_ALLGATHER": setting, "NEURON_USE_SPLIT_REDUCE_SCATTER": setting,
        "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}) for setting in ("0", "1")}
    print(f"CPU: {isa()}, {os.cpu_count()} cores, torch threads per rank: 1, gloo over loopback (torchrun "
          f"--standalone); bench/collectives.py {' '.join(passed)}, {time.perf_counter() - started:.0f} s\n")
    _timing_table(rows)
    if memory:
        _memory_table(memory)


if __name__ == "__main__":
    main()
