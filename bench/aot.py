"""Benchmark of the AOT entry point and of torch 2.13's guard-reduction recipes, next to the raw IREE call.

One run, the small MLP (64-128-128-10, batch 32) under ``torch.no_grad()``; competitors
alternate in short rounds and ratios are medians of per-round ratios (bench/compile.py's
method); a second pass keeps each competitor's fastest batch of 50 calls (batches alternating),
the estimate least disturbed by other work on a shared machine. Competitors:

- ``raw``: the IREE Python API on the very NEFF the backend runs (bench/compile.py);
- ``aot``: ``torch_neuronx.aot_compile`` (guard-free, our input checks);
- ``aot_loaded``: the same, loaded from its package by ``torch_neuronx.aot_load``;
- ``torch_aot``: PyTorch's ``torch.compile(..., fullgraph=True).forward.aot_compile`` with
  ``disable_guard_check()``, without our checks;
- ``compile``: plain ``torch.compile(model, backend="neuron")``;
- ``skip_inbuilt``: with ``guard_filter_fn=torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe``;
- ``tensor_guards``: with ``guard_filter_fn=torch.compiler.keep_tensor_guards_unsafe``;
- ``forward``: ``torch.compile(model.forward, backend="neuron")``;
- ``floor``: the model compiled with a backend that computes nothing (Dynamo's own cost).

A second group runs ``compile`` and ``raw`` under
``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, which applies to every compiled
call. Last, a serving process's cold start (fresh process, time to the first result; imports,
IREE's runtime among them, excluded): ``torch.compile`` with empty caches, ``torch.compile`` with warm caches (a
warm-start plan and the NEFF cache), and ``aot_load`` of a package with empty caches.
Usage: ``python bench/aot.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from copy import deepcopy

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile as common  # noqa: E402  (bench/compile.py: models, raw IREE call, interleaving)


def _compiled(model: torch.nn.Module, x: torch.Tensor, **options: object) -> Callable:
    fn = torch.compile(deepcopy(model), backend="neuron", options=options or None)
    fn(x)
    return fn


def competitors(model: torch.nn.Module, x: torch.Tensor, package: str) -> dict[str, Callable]:
    """Every competitor of the first group, compiled and called once."""
    import torch_neuronx

    aot = torch_neuronx.aot_compile(model, (x,))
    aot(x)
    graph = aot.compiled_graph
    order = graph._executable.neff.header.signature["inputs"]
    call = common.raw_iree_call(graph, common._match_inputs(order, [*model.parameters(), x]))
    aot.save(package)
    loaded = torch_neuronx.aot_load(package, model)
    loaded(x)
    torch_aot = torch.compile(deepcopy(model), backend="neuron", fullgraph=True).forward.aot_compile(((x,), {}))
    torch_aot.disable_guard_check()
    forward_model = deepcopy(model)
    forward = torch.compile(forward_model.forward, backend="neuron")
    forward(x)
    floor = common.dynamo_floor(deepcopy(model), x)
    floor(x)
    return {
        "raw": lambda _x: call(), "aot": aot, "aot_loaded": loaded, "torch_aot": torch_aot,
        "compile": _compiled(model, x),
        "skip_inbuilt": _compiled(model, x, guard_filter_fn=torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe),
        "tensor_guards": _compiled(model, x, guard_filter_fn=torch.compiler.keep_tensor_guards_unsafe),
        "forward": forward, "floor": floor,
    }


_START = """
import sys, time, torch, torch.nn as nn
import iree.runtime  # noqa: F401  (1.3 s here, paid alike by every path: not timed)
import torch_neuronx
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
x = torch.randn(32, 64)
with torch.no_grad():
    t = time.perf_counter()
    fn = torch_neuronx.aot_load(sys.argv[1], model) if sys.argv[1] else torch.compile(model, backend="neuron")
    fn(x)
    print(time.perf_counter() - t)
"""


def cold_start_s(package: str, caches: str) -> float:
    """Seconds from compile (or load) to the first result of the small MLP in a fresh process."""
    env = {**os.environ, **{name: os.path.join(caches, name.lower()) for name in (
        "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_HLO_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR", "TORCH_NEURONX_DEBUG_DIR")}}
    out = subprocess.run([sys.executable, "-c", _START, package], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def best_of_us(group: dict[str, Callable], x: torch.Tensor, batches: int, calls: int = 50) -> dict[str, float]:
    """Each competitor's fastest batch of ``calls`` calls, us per call, batches alternating.

    On a shared machine the fastest batch is the one least disturbed by other work: the
    estimate of what a call costs on its own, where medians show what it costs under load.
    """
    best = dict.fromkeys(group, float("inf"))
    for _ in range(batches):
        for label, fn in group.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn(x)
            best[label] = min(best[label], (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings (noisier)")
    args = parser.parse_args()
    seconds = 0.5 if args.quick else 2.0
    torch.set_num_threads(common.THREADS)
    torch.manual_seed(0)
    model, x = common.mlp(64, 128)
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        group = competitors(model, x, os.path.join(tmp, "mlp.tnxaot"))
        first = common.interleaved_us(group, x, seconds * len(group))
        best = best_of_us(group, x, batches=50 if args.quick else 200)
        stance_group = {"raw": group["raw"], "compile": group["compile"]}
        torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        try:
            stance = common.interleaved_us(stance_group, x, seconds * len(stance_group))
        finally:
            torch.compiler.set_stance("default")
    lines = [[label, f"{statistics.median(v):.1f}", f"{common.paired_ratio(v, first['raw']):.2f}",
              f"{best[label]:.1f}", f"{best[label] / best['raw']:.2f}"] for label, v in first.items()]
    lines.append(["compile + skip_guard_eval_unsafe (own rounds)", f"{statistics.median(stance['compile']):.1f}",
                  f"{common.paired_ratio(stance['compile'], stance['raw']):.2f}", "-", "-"])
    common._table("MLP 64-128-128-10, batch 32, no grad: us per call and ratio to the raw IREE call "
                  f"(torch threads: {common.THREADS}); median of rounds, and fastest batch of 50 calls",
                  ["competitor", "median us", "/raw (paired)", "best us", "best/raw best"], lines)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.tnxaot")
        torch_neuronx_aot(model, x, path)
        cold = cold_start_s("", os.path.join(tmp, "compile"))
        warm = cold_start_s("", os.path.join(tmp, "compile"))
        loaded = cold_start_s(path, os.path.join(tmp, "empty"))
    common._table("serving cold start of the same MLP (fresh process, time to the first result; "
                  "imports, IREE's runtime among them, excluded), s",
                  ["torch.compile, empty caches", "torch.compile, warm caches", "aot_load, empty caches"],
                  [[f"{cold:.2f}", f"{warm:.2f}", f"{loaded:.2f}"]])


def torch_neuronx_aot(model: torch.nn.Module, x: torch.Tensor, path: str) -> None:
    """Compile ``model`` with ``torch_neuronx.aot_compile`` and save its package at ``path``."""
    import torch_neuronx

    torch_neuronx.aot_compile(model, (x,)).save(path)


if __name__ == "__main__":
    main()
