"""Always-kept measurements: metric samples, records of compiled graphs, and per-thread stage timings.

Counters (:mod:`.events`) say how often; the stores here say how long and how big. They are
kept whether anything listens or not, so they are only fed on paths that run at compile rate
(a trace, a lowering, a compile, a cache lookup) or by a listener that was switched on
(``torch_neuronx.metrics.set_enabled``): the hot paths never reach them when nothing listens.

- :func:`add_sample` / :func:`metric_data`: per name, the number of samples, their sum, min and
  max, and the latest :data:`KEEP_SAMPLES` ``(time_ns, value)`` pairs (a ring): what XLA-style
  ``get_metric_data`` and ``report`` answer.
- :func:`add_record` / :func:`records`: rows of a kind (one per compiled graph), the last
  :data:`KEEP_RECORDS` of each kind.
- :func:`collecting`: the stage durations (``pipeline.fx_passes``, ``pipeline.lower``, ...)
  measured on this thread inside the block, summed per stage, and the facts given to :func:`note`
  there (the NEFF key): what a graph's row reports.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

_log = logging.getLogger("torch_neuronx.observe")
KEEP_SAMPLES = 1024
KEEP_RECORDS = 100_000


@dataclasses.dataclass
class Samples:
    """The samples of one metric: totals over every sample, and the latest ones with their times."""

    total: int = 0
    accumulator: float = 0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    recent: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=KEEP_SAMPLES))

    def add(self, value: float, at_ns: int) -> None:
        self.total += 1
        self.accumulator += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.recent.append((at_ns, value))


_lock = threading.RLock()  # reentrant: see process.at_termination
_samples: dict[str, Samples] = {}
_records: dict[str, collections.deque] = {}
_local = threading.local()


def add_sample(name: str, value: float, at_ns: int | None = None) -> None:
    """Add one sample to the metric ``name`` (``at_ns``: wall-clock ``time.time_ns()``, now by default)."""
    at = time.time_ns() if at_ns is None else at_ns
    with _lock:
        entry = _samples.get(name)
        if entry is None:
            entry = _samples[name] = Samples()
        entry.add(value, at)


def metric_names() -> list[str]:
    """Names of the metrics that have samples, sorted."""
    with _lock:
        return sorted(_samples)


def metric_data(name: str) -> Samples | None:
    """A copy of the samples of ``name`` (None when it has none)."""
    with _lock:
        entry = _samples.get(name)
        if entry is None:
            return None
        return dataclasses.replace(entry, recent=collections.deque(entry.recent, maxlen=KEEP_SAMPLES))


def clear_samples() -> None:
    """Forget every metric's samples."""
    with _lock:
        _samples.clear()


def add_record(kind: str, row: dict[str, Any]) -> None:
    """Keep ``row`` among the records of ``kind`` (the latest :data:`KEEP_RECORDS`)."""
    with _lock:
        rows = _records.get(kind)
        if rows is None:
            rows = _records[kind] = collections.deque(maxlen=KEEP_RECORDS)
        rows.append(row)


def records(kind: str) -> list[dict[str, Any]]:
    """The records of ``kind``, oldest first (copies)."""
    with _lock:
        return [dict(r) for r in _records.get(kind, ())]


def clear_records(kind: str | None = None) -> None:
    """Forget the records of ``kind`` (of every kind when None)."""
    with _lock:
        if kind is None:
            _records.clear()
        else:
            _records.pop(kind, None)


@contextlib.contextmanager
def collecting(graph: str | None = None) -> Iterator[dict[str, Any]]:
    """A dict that receives the nanoseconds of every stage timed on this thread inside the block,
    summed per stage name (nested blocks each receive them); ``graph`` names the stages' logs."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stages: dict[str, Any] = {}
    stack.append(stages)
    previous = getattr(_local, "graph", None)
    if graph is not None:
        _local.graph = graph
    try:
        yield stages
    finally:
        stack.remove(stages)
        _local.graph = previous


def note(name: str, value: Any) -> None:
    """Tell the blocks of :func:`collecting` on this thread a fact of the work (the NEFF key of a graph)."""
    for stages in getattr(_local, "stack", ()):
        stages[name] = value


#: The stages under way, per thread id (innermost last): what a progress line shows.
running: dict[int, list[str]] = {}


def begin_stage(name: str) -> None:
    """A stage started on this thread."""
    running.setdefault(threading.get_ident(), []).append(name)


def add_stage(name: str, duration_ns: int, graph: str | None = None) -> None:
    """A stage of ``duration_ns`` ended on this thread: add it to the blocks of :func:`collecting`,
    and log it (``torch_neuronx.observe`` at INFO, TORCH_NEURONX_LOG_LEVEL=2; cache stages at DEBUG)."""
    stack = running.get(threading.get_ident())
    if stack:
        stack.pop()
    for stages in getattr(_local, "stack", ()):
        stages[name] = stages.get(name, 0) + duration_ns
    level = logging.DEBUG if name.startswith("cache.") else logging.INFO
    if _log.isEnabledFor(level):
        graph = getattr(_local, "graph", None) or graph
        _log.log(level, "%s%s: %.3f s", f"{graph}: " if graph else "", name, duration_ns / 1e9)
