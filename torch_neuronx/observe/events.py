"""Named events and spans with listeners: the one instrumentation point of every layer.

Every layer reports here and imports nothing above it; metric tables and the
profiler (and tests) are listeners that nothing below imports. With no listener
the cost is one flag check: :data:`state` ``.active`` is False, :func:`emit`
returns at once and :func:`span` hands back a shared do-nothing context. Hot
paths (a NEFF launch, an allocation) test ``state.active`` themselves before
building any event.

Counters (:func:`count`, and :func:`tally` for counts whose persistent totals a layer keeps
itself, the caches') are always kept, listeners or not: they are the process-wide totals
``torch_neuronx.metrics`` reports. So are the measurements of work done at compile rate:
:func:`stage` (a span timed always), :func:`sample` and :func:`record` (:mod:`.samples`).
Every name must be registered in :mod:`torch_neuronx.observe.names`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from torch_neuronx.observe import names, samples

_log = logging.getLogger("torch_neuronx.observe")


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing that happened: ``kind`` is ``"count"``, ``"event"`` or ``"span"``.

    ``start_ns`` is ``time.perf_counter_ns()`` at the event (a span's start);
    ``duration_ns`` is a span's length (0 otherwise); ``value`` a count's amount or an
    event's size (bytes, for transfers and allocations); ``fields`` what else the
    reporter knew (graph name, device, stream, ...). ``thread`` is the reporting thread's id.
    ``sampled``: a span whose duration was already kept as a sample of its name (a :func:`stage`,
    timed whether anything listens or not), which a listener must not add again.
    """

    name: str
    kind: str
    start_ns: int
    duration_ns: int = 0
    value: int = 0
    thread: int = 0
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    sampled: bool = False


Listener = Callable[[Event], None]


class _State:
    """Whether anything listens (read on hot paths) and who."""

    __slots__ = ("active", "listeners")

    def __init__(self) -> None:
        self.active = False
        self.listeners: tuple[Listener, ...] = ()


state = _State()
_lock = threading.RLock()  # reentrant: see process.at_termination
_counters: Counter[str] = Counter()


def subscribe(listener: Listener) -> Listener:
    """Call ``listener`` with every event from now on; returns it (to :func:`unsubscribe`)."""
    with _lock:
        state.listeners = (*state.listeners, listener)
        state.active = True
    return listener


def unsubscribe(listener: Listener) -> None:
    """Stop calling ``listener`` (nothing happens when it was not subscribed)."""
    with _lock:
        state.listeners = tuple(x for x in state.listeners if x is not listener)
        state.active = bool(state.listeners)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """``listener`` subscribed inside the block."""
    subscribe(listener)
    try:
        yield listener
    finally:
        unsubscribe(listener)


def _deliver(event: Event) -> None:
    for listener in state.listeners:
        try:
            listener(event)
        except Exception:  # a listener's bug must never fail the user's program
            _log.exception("observe listener %r failed on %s", listener, event.name)


def emit(name: str, value: int = 0, **fields: Any) -> None:
    """Report the event ``name`` (registered) to the listeners; a flag check when none listens."""
    if not state.active:
        return
    names.check(name)
    _deliver(Event(name, "event", time.perf_counter_ns(), 0, value, threading.get_ident(), fields))


def count(name: str, amount: int = 1, **fields: Any) -> None:
    """Add ``amount`` to the counter ``name`` (registered), and tell the listeners."""
    names.check(name)
    with _lock:
        _counters[name] += amount
    if state.active:
        _deliver(Event(name, "count", time.perf_counter_ns(), 0, amount, threading.get_ident(), fields))


def tally(name: str, amount: int = 1, **fields: Any) -> None:
    """A count whose persistent total another layer keeps (a cache instance's counters,
    :mod:`torch_neuronx.cache.stats`): added to this process's counter ``name`` and told to the listeners."""
    names.check(name)
    with _lock:
        _counters[name] += amount
    if not state.active:
        return
    _deliver(Event(name, "count", time.perf_counter_ns(), 0, amount, threading.get_ident(), fields))


def counter(name: str) -> int:
    """The current value of the counter ``name`` (0 when never counted)."""
    return _counters[name]


def counters() -> dict[str, int]:
    """A snapshot of every counter counted so far."""
    with _lock:
        return dict(_counters)


def reset_counters() -> None:
    """Set every counter back to zero."""
    with _lock:
        _counters.clear()


class _Span:
    __slots__ = ("name", "fields", "start", "value", "stage")

    def __init__(self, name: str, fields: dict[str, Any], value: int = 0, stage: bool = False) -> None:
        self.name, self.fields, self.value, self.stage = name, fields, value, stage

    def __enter__(self) -> _Span:
        if self.stage:
            samples.begin_stage(self.name)
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        end = time.perf_counter_ns()
        duration = end - self.start
        if self.stage:
            samples.add_stage(self.name, duration, self.fields.get("graph"))
            samples.add_sample(self.name, duration)
        if not state.active:
            return
        if exc is not None:
            self.fields["error"] = f"{type(exc).__name__}: {exc}"
        _deliver(Event(self.name, "span", self.start, duration, self.value, threading.get_ident(), self.fields,
                       self.stage))


_NO_SPAN = contextlib.nullcontext()


def span(name: str, value: int = 0, **fields: Any) -> contextlib.AbstractContextManager[Any]:
    """A timed span ``name`` (registered) around a block, reported when the block ends.

    ``value``: what the span moved or made (bytes, for transfers). With no listener it is a
    shared do-nothing context. A span left by an exception carries it in ``fields["error"]``.
    """
    if not state.active:
        return _NO_SPAN
    names.check(name)
    return _Span(name, fields, value)


def stage(name: str, **fields: Any) -> _Span:
    """A span that is timed whether anything listens or not, for work done at compile rate (a trace,
    a lowering, a compile, a cache lookup): its duration becomes a sample of the metric ``name``
    (:mod:`.samples`) and counts towards the stages :func:`~.samples.collecting` gathers."""
    names.check(name)
    return _Span(name, fields, 0, True)


def record(kind: str, row: dict[str, Any]) -> None:
    """Keep ``row`` among the records of ``kind`` (a registered name; one row per compiled graph)
    and tell the listeners (an ``"event"`` whose fields are the row)."""
    names.check(kind)
    samples.add_record(kind, row)
    if state.active:
        _deliver(Event(kind, "event", time.perf_counter_ns(), 0, 0, threading.get_ident(), dict(row)))


def sample(name: str, value: float) -> None:
    """Add a sample to the metric ``name`` (registered), kept whether anything listens or not: for
    values produced at compile rate (a NEFF's size)."""
    names.check(name)
    samples.add_sample(name, value)
