"""Process-wide counters of the neuron backend (fallbacks, compiles, cache events).

The metric tables and their CSV export build on these counters; this module is
the one place that counts, so every layer reports through :func:`increment`.
"""

from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counters: Counter[str] = Counter()


def increment(name: str, amount: int = 1) -> None:
    """Add ``amount`` to the counter ``name``."""
    with _lock:
        _counters[name] += amount


def counter(name: str) -> int:
    """The current value of ``name`` (0 when never incremented)."""
    return _counters[name]


def counters() -> dict[str, int]:
    """A snapshot of every counter."""
    with _lock:
        return dict(_counters)


def reset() -> None:
    """Set every counter back to zero (tests use this)."""
    with _lock:
        _counters.clear()
