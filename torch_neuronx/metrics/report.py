"""TorchNeuron's names for our counters and metrics, and the text report (torch_xla's layout).

A counter or metric is known under the instrumentation layer's name (``neff_cache.hits_disk``,
``pipeline.lower``, ``aten::nonzero``) and, for the compilation cache, under TorchNeuron's
(``CompilationCache.PersistentHits``, ``CompilationCache.CompilationTime``), which sums ours.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from torch_neuronx import observe
from torch_neuronx.observe import names, samples

#: TorchNeuron's compilation-cache counters, each the sum of ours (the NEFF cache's).
COUNTER_ALIASES: dict[str, tuple[str, ...]] = {
    "CompilationCache.InMemoryHits": ("neff_cache.hits_memory",),
    "CompilationCache.InMemoryMisses": ("neff_cache.hits_disk", "neff_cache.misses"),
    "CompilationCache.PersistentHits": ("neff_cache.hits_disk",),
    "CompilationCache.PersistentMisses": ("neff_cache.misses",),
    "CompilationCache.Evictions": ("neff_cache.evictions",),
    "CompilationCache.TotalCompilations": ("neff_cache.compiles",),
}
#: TorchNeuron's compilation-cache metrics, each one of ours.
METRIC_ALIASES: dict[str, str] = {
    "CompilationCache.NeffSize": "neff.size",
    "CompilationCache.CompilationTime": "compiler.compile",
}
PERCENTILES = (1, 5, 10, 20, 50, 80, 90, 95, 99)


class MetricData(NamedTuple):
    """What :func:`metric_data` answers, in torch_xla's order: how many samples were ever added,
    their sum (nanoseconds for times, bytes for sizes), and the latest ones as ``(time_ns, value)``."""

    total_samples: int
    accumulator: float
    samples: list[tuple[int, float]]


def counter_value(name: str) -> int:
    """The value of counter ``name`` (ours or TorchNeuron's; 0 when never counted)."""
    counts = observe.counters()
    if name in COUNTER_ALIASES:
        return sum(counts.get(n, 0) for n in COUNTER_ALIASES[name])
    return counts.get(name, 0)


def counter_names() -> list[str]:
    """Names of the counters that are not zero (TorchNeuron's first, then ours, sorted)."""
    counts = observe.counters()
    ours = sorted(n for n, v in counts.items() if v)
    aliases = [a for a, parts in COUNTER_ALIASES.items() if any(counts.get(p) for p in parts)]
    return aliases + ours


def _source(name: str) -> str:
    return METRIC_ALIASES.get(name, name)


def metric_names() -> list[str]:
    """Names of the metrics that have samples (TorchNeuron's first, then ours)."""
    have = samples.metric_names()
    return [a for a, ours in METRIC_ALIASES.items() if ours in have] + have


def metric_data(name: str) -> MetricData | None:
    """The samples of metric ``name`` (ours or TorchNeuron's), or None when it has none."""
    entry = samples.metric_data(_source(name))
    if entry is None:
        return None
    return MetricData(entry.total, entry.accumulator, list(entry.recent))


def unit(name: str) -> str:
    """The unit of metric ``name``: ``ns``, ``bytes`` or ``count``."""
    source = _source(name)
    if source.endswith(".bytes"):
        return "bytes"
    try:
        return names.metric(source).unit
    except names.UnknownMetricError:
        return "count"


def format_value(value: float, kind: str) -> str:
    """``value`` for people: a time (``12.345ms``), a size (``1.50MB``) or a number."""
    if kind == "ns":
        for scale, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if abs(value) >= scale:
                return f"{value / scale:.3f}{suffix}"
        return f"{value:.0f}ns"
    if kind == "bytes":
        for scale, suffix in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")):
            if abs(value) >= scale:
                return f"{value / scale:.2f}{suffix}"
        return f"{value:.0f}B"
    return f"{value:g}"


def _percentiles(values: list[float]) -> list[tuple[int, float]]:
    ordered = sorted(values)
    return [(p, ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))])
            for p in PERCENTILES]


def metric_block(name: str) -> list[str]:
    """The report lines of metric ``name`` (none when it has no samples)."""
    entry = samples.metric_data(_source(name))
    if entry is None or not entry.total:
        return []
    kind = unit(name)
    lines = [f"Metric: {name}", f"  TotalSamples: {entry.total}",
             f"  Accumulator: {format_value(entry.accumulator, kind)}",
             f"  Mean: {format_value(entry.accumulator / entry.total, kind)}",
             f"  Min: {format_value(entry.minimum, kind)}", f"  Max: {format_value(entry.maximum, kind)}"]
    recent = [v for _, v in entry.recent]
    if recent:
        lines.append("  Percentiles: " + "; ".join(f"{p}%={format_value(v, kind)}"
                                                   for p, v in _percentiles(recent)))
    return lines


def counter_block(name: str) -> list[str]:
    """The report lines of counter ``name``."""
    return [f"Counter: {name}", f"  Value: {counter_value(name)}"]


def build(counter_filter: Iterable[str] | None = None, metric_filter: Iterable[str] | None = None) -> str:
    """The report: a block per metric, then per counter (only those named, when filters are given)."""
    metric_list = metric_names() if metric_filter is None else list(metric_filter)
    counter_list = counter_names() if counter_filter is None else list(counter_filter)
    lines: list[str] = []
    for name in metric_list:
        lines += metric_block(name)
    for name in counter_list:
        lines += counter_block(name)
    return "\n".join(lines) + ("\n" if lines else "")


def compilation_metrics() -> dict[str, Any]:
    """The compile path in numbers: graphs, cache outcomes, compiles and their time, NEFF bytes."""
    compile_time = samples.metric_data("compiler.compile")
    neff_size = samples.metric_data("neff.size")
    result: dict[str, Any] = {alias.split(".", 1)[1]: counter_value(alias) for alias in COUNTER_ALIASES}
    result.update({
        "CompiledGraphs": observe.counter("compiled_graphs"),
        "FallbackGraphs": observe.counter("fallback_graphs"),
        "WarmStartPlans": observe.counter("warm_start_plans"),
        "CompilationTimeSeconds": (compile_time.accumulator / 1e9) if compile_time else 0.0,
        "NeffBytes": int(neff_size.accumulator) if neff_size else 0,
    })
    return result
