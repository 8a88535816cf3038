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
    reset_counters,
    span,
    state,
    subscribe,
    tally,
    unsubscribe,
)
from torch_neuronx.observe.names import Metric, UnknownMetricError, metric, metrics

__all__ = ["Event", "Metric", "UnknownMetricError", "count", "counter", "counters", "emit", "listening", "metric",
           "metrics", "reset_counters", "span", "state", "subscribe", "tally", "unsubscribe"]
