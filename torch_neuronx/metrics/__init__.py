"""TorchNeuron's metrics API: counters, metrics, the text report, and the metric tables' CSV export.

Counters (how often: compiles, cache hits per tier, CPU fallbacks per op as ``aten::<op>``) and
compile-rate metrics (stage times, NEFF sizes, one ``graph_stats`` row per compiled graph) are
always kept. Op-rate metrics (each NEFF launch, transfer, eager op, allocation) are kept while
:func:`is_enabled`: after :func:`set_enabled` ``(True)``, or when TORCH_NEURONX_ENABLED_METRIC_TABLES
names a table that needs them. With neither, the hot paths pay one flag check per event.

Names follow torch_xla and TorchNeuron: ``get_counter_names``, ``get_counter_value``,
``get_metric_names``, ``get_metric_data``, ``report``, ``report_filtered``, ``clear_counters``,
``clear_metrics``, ``clear_all``, ``get_compilation_metrics``; TorchNeuron's
``CompilationCache.*`` counters and metrics answer beside ours. Tables: :func:`export_tables`,
:func:`enable_tables`, :func:`table_rows` (``docs/metrics.md`` lists them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch_neuronx import observe
from torch_neuronx.metrics import report as _report
from torch_neuronx.metrics import tables as _tables
from torch_neuronx.metrics.collector import collector as _collector
from torch_neuronx.metrics.report import COUNTER_ALIASES, METRIC_ALIASES, MetricData
from torch_neuronx.metrics.tables import TABLES
from torch_neuronx.observe import samples as _samples

__all__ = ["COUNTER_ALIASES", "METRIC_ALIASES", "MetricData", "TABLES", "clear_all", "clear_counters",
           "clear_metrics", "counter", "counters", "enable_tables", "enabled_tables", "export_tables",
           "get_compilation_metrics", "get_counter_names", "get_counter_value", "get_dynamo_metrics",
           "get_metric_data", "get_metric_names", "increment", "is_enabled", "report", "report_filtered", "reset",
           "reset_dynamo_metrics", "set_enabled", "table_rows"]


def is_enabled() -> bool:
    """Whether op-rate metrics (launches, transfers, eager ops, memory) are being collected."""
    return _collector.enabled


def set_enabled(enabled: bool) -> None:
    """Start (True) or stop (False) collecting op-rate metrics. Counters are kept either way."""
    _collector.enable(bool(enabled))


def get_counter_names() -> list[str]:
    """Names of the counters that are not zero (TorchNeuron's ``CompilationCache.*`` first)."""
    return _report.counter_names()


def get_counter_value(name: str) -> int:
    """The value of counter ``name`` (0 when never counted)."""
    return _report.counter_value(name)


def get_metric_names() -> list[str]:
    """Names of the metrics that have samples."""
    return _report.metric_names()


def get_metric_data(name: str) -> MetricData | None:
    """``(total_samples, accumulator, samples)`` of metric ``name``, samples as ``(time_ns, value)``;
    None when it has none. Times are in nanoseconds, sizes in bytes."""
    return _report.metric_data(name)


def report() -> str:
    """Every metric (``Metric:``, ``TotalSamples``, ``Accumulator``, ``Mean``, ``Min``, ``Max``,
    ``Percentiles``) and every non-zero counter (``Counter:``, ``Value``), as text."""
    return _report.build()


def report_filtered(counter_names: Iterable[str] | None = None, metric_names: Iterable[str] | None = None) -> str:
    """The report of the named counters and metrics only (None: all of that kind; ``[]``: none)."""
    return _report.build(counter_names, metric_names)


def clear_counters() -> None:
    """Set every counter to zero (the caches' persistent statistics are not touched)."""
    observe.reset_counters()


def clear_metrics() -> None:
    """Forget every metric's samples and the op-rate totals of the tables."""
    _samples.clear_samples()
    _collector.clear()


def clear_all() -> None:
    """:func:`clear_counters` and :func:`clear_metrics` (the graph rows: :func:`reset_dynamo_metrics`)."""
    clear_counters()
    clear_metrics()


def get_compilation_metrics() -> dict[str, Any]:
    """The compile path in numbers: TorchNeuron's ``CompilationCache`` counters (without the
    prefix), compiled, fallen-back and warm-started graphs, compiler seconds and NEFF bytes."""
    return _report.compilation_metrics()


def get_dynamo_metrics() -> list[dict[str, Any]]:
    """The ``graph_stats`` rows: one per graph compiled for torch.compile since the last reset."""
    return _tables.rows("graph_stats")


def reset_dynamo_metrics() -> None:
    """Forget the ``graph_stats`` rows."""
    _samples.clear_records("graph.compiled")


def enable_tables(names: Sequence[str]) -> None:
    """Enable metric tables for export (as TORCH_NEURONX_ENABLED_METRIC_TABLES does); unknown names raise."""
    _tables.enable(names)


def enabled_tables() -> list[str]:
    """The metric tables enabled for export."""
    return _tables.enabled()


def table_rows(name: str) -> list[dict[str, Any]]:
    """The rows of metric table ``name`` now."""
    return _tables.rows(name)


def export_tables(directory: str | None = None, names: Sequence[str] | None = None) -> list[str]:
    """Write metric tables as ``metric_table_{name}_rank{rank}.csv`` (the enabled ones when ``names``
    is None) into ``directory`` (TORCH_NEURONX_METRICS_DIR by default); the paths written."""
    return _tables.export(names, directory)


# The names this module had before the tables existed (tests and tools use them).
def increment(name: str, amount: int = 1) -> None:
    """Add ``amount`` to the counter ``name`` (a name registered in ``torch_neuronx/observe/names.py``)."""
    observe.count(name, amount)


def counter(name: str) -> int:
    """The current value of counter ``name`` (0 when never incremented)."""
    return observe.counter(name)


def counters() -> dict[str, int]:
    """A snapshot of every counter."""
    return observe.counters()


def reset() -> None:
    """Set every counter back to zero."""
    observe.reset_counters()


_tables.configure()  # reads TORCH_NEURONX_ENABLED_METRIC_TABLES now: an unknown name is reported at once
