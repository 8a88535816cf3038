"""What observing costs: per-call time with metrics off, with metrics on, and under the profiler.

The metric-tables issue's target: with no table enabled and no profiler, the hot paths pay at
most one flag check per event. Measured, in one process, rounds alternating the settings
(medians):

- a warm eager op (add of 32x64 on ``neuron``), to completion;
- a compiled small MLP (batch 32) through ``torch.compile(backend="neuron")``;
- torch CPU eager's add and the MLP on the CPU, for scale;
- the instrumentation layer's own costs: an ``observe.span`` with nothing listening, and the flag.

Usage: ``python bench/metrics_overhead.py [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
from common import isa  # bench/common.py (the scripts run from bench/ or by path)

THREADS = min(2, os.cpu_count() or 1)


def _per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def _profiler() -> contextlib.AbstractContextManager:
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from torch_neuronx.profiling import NeuronConfig

    config = NeuronConfig(profile_output_dir=tempfile.mkdtemp(prefix="neuron_profile_bench_"))
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=config)


def _settings() -> dict[str, object]:
    from torch_neuronx import metrics

    @contextlib.contextmanager
    def metrics_on():
        metrics.set_enabled(True)
        try:
            yield
        finally:
            metrics.set_enabled(False)
            metrics.clear_metrics()

    return {"off": contextlib.nullcontext, "metrics on": metrics_on, "profiler": _profiler}


def measure(rounds: int) -> dict[str, dict[str, float]]:
    """µs per call of each workload under each setting."""
    import torch_neuronx  # noqa: F401

    x = torch.randn(32, 64)
    nx = x.to("neuron")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    compiled = torch.compile(model, backend="neuron")

    def eager_neuron():
        (nx + nx).cpu()

    def mlp_neuron():
        with torch.no_grad():
            compiled(x)

    def mlp_cpu():
        with torch.no_grad():
            model(x)

    workloads = {"add 32x64 (neuron, to completion)": eager_neuron, "small MLP, batch 32 (neuron compiled)":
                 mlp_neuron, "add 32x64 (torch CPU)": lambda: x + x, "small MLP (torch CPU)": mlp_cpu}
    for fn in workloads.values():
        for _ in range(30):
            fn()
    settings = _settings()
    times: dict[str, dict[str, list[float]]] = {w: {s: [] for s in settings} for w in workloads}
    n = 200
    for _ in range(rounds):
        for setting, context in settings.items():
            with context():
                for workload, fn in workloads.items():
                    times[workload][setting].append(_per_call_us(fn, n))
    return {w: {s: statistics.median(v) for s, v in by.items()} for w, by in times.items()}


def layer_costs() -> dict[str, float]:
    """ns of an ``observe.span`` with nothing listening, and of the flag check alone."""
    from torch_neuronx import observe

    n = 200_000
    state = observe.state

    def span():
        with observe.span("runtime.launch"):
            pass

    def flag():
        if state.active:
            pass

    def nothing():
        pass

    base = _per_call_us(nothing, n)
    return {"span, nothing listening": (_per_call_us(span, n) - base) * 1000,
            "flag check": (_per_call_us(flag, n) - base) * 1000}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    result = measure(3 if args.quick else 9)
    print(f"CPU: {isa()}, torch threads: {THREADS}\n")
    print("| workload, µs per call | off | metrics on | on / off | profiler | profiler / off |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for workload, by in result.items():
        off = by["off"]
        print(f"| {workload} | {off:.1f} | {by['metrics on']:.1f} | {by['metrics on'] / off:.2f} | "
              f"{by['profiler']:.1f} | {by['profiler'] / off:.2f} |")
    print("\n| instrumentation point, nothing listening | ns |\n| --- | --- |")
    for name, ns in layer_costs().items():
        print(f"| {name} | {ns:.0f} |")


if __name__ == "__main__":
    main()
