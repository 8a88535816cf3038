"""Sweep of PyTorch's OpInfo database through ``torch.compile(backend="neuron")``.

Every op of ``op_db`` whose CPU variant supports the dtype (``--dtype``, default float32; no
CUDA-only jiterator ops, no sparse layouts) runs its first ``--samples`` samples (default 2; 0: all)
on the CPU and through one of two routes (``--mode``), and is classified:

- ``compile`` (default): ``torch.compile(backend="neuron", fullgraph=False)`` of the op on CPU
  tensors, a fresh ``torch._dynamo.reset()`` per op;
- ``eager``: the op on the eager ``neuron`` device, its sample's tensors copied there (outputs
  that are neuron tensors are read back, inputs the op wrote into compared too), each sample
  run twice: the second call takes the launch plans the first left and must give the first's
  results bit for bit. With
  ``--dynamic-first`` every op family gets its dynamic-shape kernel at once (no kernels of its
  first shapes' own), so the samples test those kernels.

- ``correct``: every output matches eager (``assert_close`` with the op's float32 tolerance
  overrides, at least rtol=1e-4 / atol=1e-5, ``equal_nan=True``), or, where it does not, lies
  at least as near the op's float64 result as eager's float32 result does (within a factor of 2);
- ``wrong``: some value differs (the maximum difference is recorded);
- ``error``: the compiled call raised (type, first line, and the ``NeuronCompileError`` stage);
- ``death``: the worker process died (its signal); ``timeout``: it ran past ``--timeout``;
- ``skipped``: nothing comparable: no usable sample, or eager itself failed.

Random ops count as correct when they give eager's draws under one seed or, where their kernels
sample differently, are reproducible and follow eager's distribution; ops returning uninitialized
memory (``empty*``) when shapes, dtypes and strides match; eigenvectors are compared up to sign,
and indices of tied elements (``topk``, ``kthvalue``) by the values they select
(``bench/opinfo_compare.py``).

Ops run one at a time in worker processes (``--jobs``); each result is a JSON line of ``--out``,
written as it arrives. A worker that dies or times out is replaced for the remaining ops.
Compiles use a throwaway cache and artifact directory unless ``--cache`` is given.

Usage::

    python bench/opinfo_sweep.py [--ops add,sin] [--jobs 1] [--timeout 120] [--limit N]
        [--out results.jsonl] [--resume] [--report] [--markdown summary.md] [--cache]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait

from opinfo_compare import (
    as_accurate_as_eager,
    canonical,
    compare,
    compare_random,
    compare_uninitialized,
    first_line,
    tie_broken_otherwise,
    widened,
)

CLASSES = ("correct", "wrong", "error", "death", "timeout", "skipped")
SAMPLES = int(os.environ.get("OPINFO_SWEEP_SAMPLES", "2")) or None  # None: every sample
DTYPE = os.environ.get("OPINFO_SWEEP_DTYPE", "float32")
MODE = os.environ.get("OPINFO_SWEEP_MODE", "compile")
DYNAMIC_FIRST = os.environ.get("OPINFO_SWEEP_DYNAMIC_FIRST") == "1"
DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-5
#: Ops returning uninitialized memory, and random ops (prefixes of OpInfo names).
UNINITIALIZED = ("empty", "new_empty")
RANDOM = ("rand", "normal", "bernoulli", "multinomial", "uniform", "cauchy", "exponential", "geometric",
          "log_normal", "nn.functional.dropout", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
          "nn.functional.rrelu", "nn.functional.gumbel_softmax")
#: The cache and artifact variables a throwaway run points at a temporary directory.
CACHE_VARIABLES = ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_HLO_CACHE_DIR",
                   "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR")


def op_key(op) -> str:
    """The op's name, with its variant (``name.variant``) when it has one."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def load_ops() -> dict:
    """The sweepable OpInfos by key: :data:`DTYPE` on CPU, no jiterator ops, no sparse layouts."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    dtype = getattr(torch, DTYPE)
    return {op_key(op): op for op in op_db
            if dtype in op.supported_dtypes("cpu") and "jiterator" not in op.name and "sparse" not in op.name}


def select(keys: list[str], wanted: str | None) -> list[str]:
    """``keys`` restricted to the comma-separated ``wanted`` keys or names (all variants of a name)."""
    if wanted:
        names = [w.strip() for w in wanted.split(",") if w.strip()]
        unknown = [n for n in names if not any(k == n or k.startswith(n + ".") for k in keys)]
        if unknown:
            sys.exit(f"unknown ops: {', '.join(unknown)}")
        keys = [k for k in keys if any(k == n or k.startswith(n + ".") for n in names)]
    return keys


def tolerances(op) -> tuple[float, float]:
    """(rtol, atol): the largest ``toleranceOverride`` of :data:`DTYPE` among the op's decorators, at
    least the defaults (torch's own defaults for the dtype where they are looser)."""
    import torch
    from torch.testing._comparison import default_tolerances
    from torch.testing._internal.common_device_type import toleranceOverride

    dtype = getattr(torch, DTYPE)
    rtol, atol = default_tolerances(dtype)
    rtol, atol = max(rtol, DEFAULT_RTOL), max(atol, DEFAULT_ATOL)
    for info in op.decorators:
        for decorator in getattr(info, "decorators", [info]):
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                rtol, atol = max(rtol, decorator.d[dtype].rtol), max(atol, decorator.d[dtype].atol)
    return rtol, atol


def describe(exc: BaseException) -> tuple[str, str | None, str | None]:
    """(``Type: first line``, NeuronCompileError stage, failing ATen op) of the innermost cause of
    ``exc`` (the last two None when it is no NeuronCompileError)."""
    from torch_neuronx.compiler.errors import NeuronCompileError

    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or getattr(e, "inner_exception", None)
    for e in chain:
        if isinstance(e, NeuronCompileError):
            return f"NeuronCompileError[{e.stage}]: {first_line(e.detail)}", e.stage, e.op
    root = chain[-1]
    return f"{type(root).__name__}: {first_line(root)}", None, None


def strided(sample) -> bool:
    """Whether every tensor of the sample has the strided layout."""
    import torch
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves([sample.input, sample.args, sample.kwargs])
    return all(t.layout == torch.strided for t in leaves if isinstance(t, torch.Tensor))


def clone_sample(sample) -> tuple:
    """(input, args, kwargs) of the sample with every tensor cloned (ops may write to inputs)."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (sample.input, sample.args,
                                                                                 sample.kwargs))


def run_op(op) -> dict:
    """One op's result record: its class, and what went wrong."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    record: dict = {"op": op_key(op), "status": "correct", "samples": 0}
    fallbacks_before = _eager_fallbacks()
    try:
        samples = list(itertools.islice(op.sample_inputs("cpu", getattr(torch, DTYPE), requires_grad=False), SAMPLES))
    except Exception as e:  # noqa: BLE001 - any failure of the sample generator
        return {**record, "status": "skipped", "reason": f"sample_inputs: {describe(e)[0]}"}
    samples = [s for s in samples if strided(s)]
    if not samples:
        return {**record, "status": "skipped", "reason": f"no strided {DTYPE} sample"}
    rtol, atol = tolerances(op)
    if MODE == "eager":
        compiled = on_neuron(op.op)
    else:
        compiled = torch.compile(lambda *a, **k: op.op(*a, **k), backend="neuron", fullgraph=False)
    for sample in samples:
        x, args, kwargs = clone_sample(sample)
        try:
            expected = op.op(x, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - eager rejects the sample
            return {**record, "status": "skipped", "reason": f"eager: {describe(e)[0]}"}
        try:
            mismatch = check(op, sample, expected, compiled, rtol, atol)
        except Exception as e:  # noqa: BLE001 - what the sweep is looking for
            message, stage, failing = describe(e)
            return {**record, "status": "error", "error": message, "stage": stage, "failing_op": failing}
        record["samples"] += 1
        if mismatch:
            diff = re.match(r"max diff (\S+):", mismatch)
            return {**record, "status": "wrong", "error": mismatch,
                    "max_diff": float(diff.group(1)) if diff else None}
    if MODE == "eager":  # ops (or parts of them) the device ran on the CPU
        record["fallbacks"] = _eager_fallbacks() - fallbacks_before
    else:
        record["graphs"] = int(counters["stats"]["unique_graphs"])
    return record


def _eager_fallbacks() -> int:
    from torch_neuronx import observe

    return observe.counters().get("eager_fallbacks", 0)


def on_neuron(fn):
    """``fn`` run on the eager ``neuron`` device: tensor arguments copied there, neuron outputs read
    back, and the CPU inputs given the values the op wrote into their neuron copies (in-place ops)."""
    import torch
    from torch.utils._pytree import tree_leaves, tree_map

    def to_neuron(t):
        return t.to("neuron") if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t

    def run(*args, **kwargs):
        moved_args, moved_kwargs = tree_map(to_neuron, (args, kwargs))
        if getattr(fn, "__name__", "") == "tensor_split" and len(args) > 1:
            # Its sections tensor is host data (CUDA requires it on the CPU too), not an operand.
            moved_args = (moved_args[0], args[1], *moved_args[2:])
        out = fn(*moved_args, **moved_kwargs)
        for given, moved in zip(tree_leaves((args, kwargs)), tree_leaves((moved_args, moved_kwargs))):
            if isinstance(given, torch.Tensor) and moved is not given:
                given.copy_(moved.cpu())
        return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) and t.device.type == "neuron" else t, out)

    return run


def check(op, sample, expected, compiled, rtol: float, atol: float) -> str | None:
    """Why the compiled op's outputs on ``sample`` are not eager's ``expected`` (None when they are):
    values for deterministic ops (or, where eager misses its own float64 result, accuracy as good
    as eager's), metadata for uninitialized outputs, distributions for random ops."""
    import torch

    def run(fn):
        x, args, kwargs = clone_sample(sample)
        return fn(x, *args, **kwargs)

    if op.name.startswith(RANDOM):
        return compare_random(lambda: run(op.op), lambda: run(compiled))
    got = run(compiled)
    if op.name.startswith(UNINITIALIZED):
        return compare_uninitialized(expected, got)
    key = op_key(op)
    mismatch = compare(canonical(key, expected), canonical(key, got), rtol, atol)
    if mismatch and tie_broken_otherwise(key, clone_sample(sample), expected, got):
        mismatch = None
    if MODE == "eager" and not mismatch:
        # The same call again takes the launch plan the first one left (device/launch.py).
        again = compare(canonical(key, got), canonical(key, run(compiled)), 0.0, 0.0)
        if again:
            return f"second call (launch plan) differs from the first: {again}"
    if mismatch and torch.float64 in op.supported_dtypes("cpu"):
        x, args, kwargs = widened(clone_sample(sample))
        try:
            reference = op.op(x, *args, **kwargs)
        except Exception:  # noqa: BLE001 - no float64 reference: the float32 verdict stands
            return mismatch
        if as_accurate_as_eager(canonical(key, expected), canonical(key, got), canonical(key, reference)):
            return None
    return mismatch


def worker(conn: Connection, log: str) -> None:
    """A worker process: load the ops, then answer each op key sent with its result record.

    It leads a process group of its own, so that killing it ends its compiler subprocesses too."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import torch_neuronx  # noqa: F401 - registers the backend before the first compile

    if DYNAMIC_FIRST:
        from torch_neuronx.device import choice

        choice.SHAPES_BEFORE_DYNAMIC = 0

    ops = load_ops()
    conn.send("ready")
    while (key := conn.recv()) is not None:
        print(f"=== {key}", flush=True)
        start = time.monotonic()
        record = run_op(ops[key])
        record["seconds"] = round(time.monotonic() - start, 2)
        conn.send(record)


class Worker:
    """A worker process, its pipe, and the op it runs (None while idle or starting)."""

    def __init__(self, log: str) -> None:
        ours, theirs = mp.get_context("spawn").Pipe()
        self.process = mp.get_context("spawn").Process(target=worker, args=(theirs, log), daemon=True)
        self.process.start()
        theirs.close()
        self.conn, self.key, self.started, self.ready = ours, None, 0.0, False

    def give(self, key: str) -> None:
        self.conn.send(key)
        self.key, self.started = key, time.monotonic()

    def kill(self) -> None:
        """Kill the worker's process group (the worker and any compiler it runs)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.join()


def death(process) -> str:
    """How a worker process ended: its signal's name or its exit code."""
    process.join(5)
    code = process.exitcode
    return f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"


def sweep(keys: list[str], jobs: int, timeout: float, out: str) -> None:
    """Run ``keys`` on ``jobs`` workers, appending each result to ``out`` as a JSON line."""
    pending, total, log = collections.deque(keys), len(keys), out + ".log"
    workers = [Worker(log) for _ in range(min(jobs, total))]
    try:
        _dispatch(workers, pending, total, timeout, out, log)
    finally:  # also on SIGTERM or Ctrl-C: no worker (nor its compiler) outlives the sweep
        for w in workers:
            if w.process.is_alive() and w.ready and w.key is None:
                w.conn.send(None)
                w.process.join(10)
            if w.process.is_alive():
                w.kill()


def _dispatch(workers: list[Worker], pending: collections.deque, total: int, timeout: float, out: str,
              log: str) -> None:
    """Hand ``pending`` op keys to idle ``workers`` until ``total`` results are written to ``out``."""
    done = 0
    with open(out, "a") as sink:
        def emit(record: dict) -> None:
            nonlocal done
            done += 1
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            detail = record.get("error") or record.get("reason") or ""
            print(f"[{done}/{total}] {record['op']}: {record['status']} {detail[:150]}", flush=True)

        while done < total:
            for w in workers:
                if w.ready and w.key is None and pending:
                    w.give(pending.popleft())
            busy = [w for w in workers if w.key is not None or not w.ready]
            if not busy:
                break
            deadline = min((w.started + timeout for w in busy if w.key is not None), default=time.monotonic() + 60)
            ready = wait([w.conn for w in busy], timeout=max(0.0, deadline - time.monotonic()))
            for i, w in enumerate(list(workers)):
                if w.conn in ready:
                    try:
                        message = w.conn.recv()
                    except EOFError:
                        if w.key is not None:
                            emit({"op": w.key, "status": "death", "error": f"worker died: {death(w.process)}"})
                            w.kill()
                        else:
                            sys.exit(f"a worker died while starting ({death(w.process)}); see {log}")
                        workers[i] = Worker(log)
                        continue
                    if message == "ready":
                        w.ready = True
                    else:
                        emit(message)
                        w.key = None
                elif w.key is not None and time.monotonic() - w.started > timeout:
                    w.kill()
                    emit({"op": w.key, "status": "timeout", "error": f"ran past {timeout:g} s"})
                    workers[i] = Worker(log)


def read_results(out: str) -> dict[str, dict]:
    """The records of ``out`` by op (the last record of an op wins)."""
    if not os.path.exists(out):
        return {}
    with open(out) as f:
        return {r["op"]: r for r in map(json.loads, filter(str.strip, f))}


def group_key(record: dict) -> str:
    """What groups non-correct ops: the first error line with numbers and addresses masked."""
    text = record.get("error") or record.get("reason") or ""
    if record["status"] == "wrong":
        text = re.sub(r"^max diff \S+: ", "", text)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", text)
    return re.sub(r"(?<![A-WYZa-wyz_])\d+(\.\d+)?(e[-+]?\d+)?", "N", text)[:200]


def grouped(records: dict[str, dict]) -> list[tuple[str, str, list[dict]]]:
    """(class, error key, records) of the non-correct ops, by class then largest group first."""
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for r in records.values():
        if r["status"] != "correct":
            groups[(r["status"], group_key(r))].append(r)
    order = {c: i for i, c in enumerate(CLASSES)}
    items = sorted(groups.items(), key=lambda kv: (order[kv[0][0]], -len(kv[1]), kv[0][1]))
    return [(status, key, rs) for (status, key), rs in items]


def label(record: dict) -> str:
    """An op's name in a group listing, with its maximum difference when wrong, the failing
    ATen op when an error names one."""
    diff, failing = record.get("max_diff"), record.get("failing_op")
    if diff is not None:
        return f"{record['op']} ({diff:.2g})"
    return f"{record['op']} [{failing.removeprefix('torch.')}]" if failing else record["op"]


def summary_rows(records: dict[str, dict]) -> list[tuple[str, int, float]]:
    """(class, count, percent) for every class, then the total."""
    counts = collections.Counter(r["status"] for r in records.values())
    total = max(1, len(records))
    return [(c, counts[c], 100 * counts[c] / total) for c in CLASSES] + [("total", len(records), 100.0)]


def print_report(records: dict[str, dict]) -> None:
    """The summary table and the non-correct ops grouped by first error line, on stdout."""
    print(f"\n{'class':<10}{'ops':>6}{'%':>8}")
    for status, count, percent in summary_rows(records):
        print(f"{status:<10}{count:>6}{percent:>7.1f}%")
    fell_back = sorted(r["op"] for r in records.values() if r["status"] == "correct" and r.get("fallbacks"))
    if any("fallbacks" in r for r in records.values()):
        native = sum(r["status"] == "correct" for r in records.values()) - len(fell_back)
        print(f"\ncorrect on the device alone: {native}; correct with some CPU fallback ({len(fell_back)}): "
              f"{', '.join(fell_back)}")
    no_graph = sorted(r["op"] for r in records.values() if r["status"] == "correct" and r.get("graphs") == 0
                      and "fallbacks" not in r)
    if no_graph:
        print(f"\ncorrect without compiling a graph ({len(no_graph)}): {', '.join(no_graph)}")
    for status, key, rs in grouped(records):
        print(f"\n[{status}] {len(rs)} op(s): {key}\n    " + ", ".join(label(r) for r in sorted(rs, key=label)))


def write_markdown(records: dict[str, dict], path: str) -> None:
    """The summary and the grouped non-correct ops as markdown tables, to ``path``."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| class | ops | % |", "| --- | ---: | ---: |"]
    lines += [f"| {s} | {c} | {p:.1f} |" for s, c, p in summary_rows(records)]
    lines += ["", "| class | ops | first error line | which |", "| --- | ---: | --- | --- |"]
    for status, key, rs in grouped(records):
        names = ", ".join(f"`{label(r)}`" for r in sorted(rs, key=label))
        lines.append(f"| {status} | {len(rs)} | {cell(key) or '-'} | {cell(names)} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def throwaway_cache() -> str:
    """Point the cache and artifact variables at a new temporary directory; return it."""
    root = tempfile.mkdtemp(prefix="opinfo-sweep-")
    for name in CACHE_VARIABLES:
        os.environ[name] = os.path.join(root, name.lower())
    return root


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated op names or name.variant keys (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per op before its worker is killed")
    p.add_argument("--out", default="opinfo_results.jsonl", help="JSON-lines results file (appended)")
    p.add_argument("--limit", type=int, help="run at most this many ops")
    p.add_argument("--resume", action="store_true", help="skip ops already recorded in --out")
    p.add_argument("--report", action="store_true", help="only summarize --out, run nothing")
    p.add_argument("--markdown", help="also write the summary as markdown to this file")
    p.add_argument("--cache", action="store_true", help="use the configured caches, not a throwaway one")
    p.add_argument("--mode", choices=("compile", "eager"), default="compile",
                   help="torch.compile(backend='neuron') on CPU tensors, or the eager neuron device")
    p.add_argument("--dtype", default="float32", help="the samples' dtype (default float32)")
    p.add_argument("--dynamic-first", action="store_true",
                   help="eager mode: every op family's dynamic-shape kernel at once (tests those kernels)")
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2; 0: all)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # The workers are spawned: they read these when they import this module.
    os.environ.update(OPINFO_SWEEP_MODE=args.mode, OPINFO_SWEEP_DTYPE=args.dtype,
                      OPINFO_SWEEP_SAMPLES=str(args.samples), OPINFO_SWEEP_DYNAMIC_FIRST=str(int(args.dynamic_first)))
    global SAMPLES, DTYPE, MODE, DYNAMIC_FIRST
    SAMPLES, DTYPE, MODE, DYNAMIC_FIRST = args.samples or None, args.dtype, args.mode, args.dynamic_first
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup of sweep()
    if not args.report:
        selected = select(list(load_ops()), args.ops)
        keys = [k for k in selected if k not in read_results(args.out)] if args.resume else selected
        keys = keys[:args.limit] if args.limit else keys
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        root = None if args.cache else throwaway_cache()
        try:
            sweep(keys, args.jobs, args.timeout, args.out)
        finally:
            if root:
                shutil.rmtree(root, ignore_errors=True)
    records = read_results(args.out)
    if not args.report and args.ops:  # report on this run's ops only
        records = {k: r for k, r in records.items() if k in set(selected)}
    print_report(records)
    if args.markdown:
        write_markdown(records, args.markdown)


if __name__ == "__main__":
    main()
