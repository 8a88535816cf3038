"""Process-wide counters of the neuron backend (fallbacks, compiles, cache events).

The counters live in the instrumentation layer (:mod:`torch_neuronx.observe`),
where every layer reports them under a registered name; this module is their
public face, and the metric tables and their CSV export will build on it.
"""

from __future__ import annotations

from torch_neuronx.observe import events


def increment(name: str, amount: int = 1) -> None:
    """Add ``amount`` to the counter ``name`` (a name registered in ``torch_neuronx/observe/names.py``)."""
    events.count(name, amount)


def counter(name: str) -> int:
    """The current value of ``name`` (0 when never incremented)."""
    return events.counter(name)


def counters() -> dict[str, int]:
    """A snapshot of every counter."""
    return events.counters()


def reset() -> None:
    """Set every counter back to zero (tests use this)."""
    events.reset_counters()
