"""The instrumentation layer: named counters, events and spans, and the listeners that receive them.

It sits at the bottom of the tree with the configuration: every layer reports
through :mod:`.events` (``count``, ``emit``, ``span``) under a name registered in
:mod:`.names`; the metric tables and the profiler listen (``subscribe``).
"""

from torch_neuronx.observe.events import (
    Event,
    count,
    counter,
    counters,
    emit,
    listening,
    record,
    reset_counters,
    sample,
    span,
    stage,
    state,
    subscribe,
    tally,
    unsubscribe,
)
from torch_neuronx.observe.names import Metric, UnknownMetricError, metric, metrics
from torch_neuronx.observe.samples import collecting, note

__all__ = ["Event", "Metric", "UnknownMetricError", "collecting", "count", "counter", "counters", "emit", "listening",
           "metric", "metrics", "note", "record", "reset_counters", "sample", "span", "stage", "state", "subscribe",
           "tally", "unsubscribe"]
