"""The metrics listener: per-event measurements while metrics are enabled.

Counters and compile-rate measurements (stage times, NEFF sizes, graph rows) are kept by the
instrumentation layer whether anything listens or not. What happens at op rate (a launch, a
transfer, an eager op, an allocation) is measured only while this listener is subscribed:
``torch_neuronx.metrics.set_enabled(True)``, or a metric table that needs it
(TORCH_NEURONX_ENABLED_METRIC_TABLES). With neither, nothing listens and the hot paths pay one
flag check per event.

While enabled, each span becomes a sample of its name (nanoseconds) and, when it moved bytes,
of ``<name>.bytes``; eager ops are totalled per op, transfers per direction, and the device
memory is sampled over time (at most one row per device every :data:`MEMORY_INTERVAL_NS`, plus
every new peak).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any

from torch_neuronx import observe
from torch_neuronx.observe import samples

MEMORY_INTERVAL_NS = 1_000_000
KEEP_MEMORY_ROWS = 100_000


@dataclasses.dataclass
class OpTotals:
    """One eager op's calls, by how they ran, and their host time (dispatch to return)."""

    calls: int = 0
    how: dict[str, int] = dataclasses.field(default_factory=dict)
    total_ns: int = 0


@dataclasses.dataclass
class MoveTotals:
    """Calls, bytes and time of one kind of transfer or collective."""

    calls: int = 0
    bytes: int = 0
    total_ns: int = 0


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What a :class:`Collector` measured, copied at one moment."""

    ops: dict[str, OpTotals]
    moves: dict[str, MoveTotals]
    memory: list[dict[str, Any]]

    def __bool__(self) -> bool:
        return bool(self.ops or self.moves or self.memory)


class Collector:
    """Subscribed to the instrumentation layer while enabled; keeps the op-rate measurements."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: see process.at_termination
        self._subscribed = False
        self._listener = self.on_event  # one bound method: unsubscribe() compares by identity
        self.clear()

    def clear(self) -> None:
        """Forget what was measured (not whether it is enabled)."""
        with self._lock:
            self.ops: dict[str, OpTotals] = {}
            self.moves: dict[str, MoveTotals] = {}
            self.memory: deque[dict[str, Any]] = deque(maxlen=KEEP_MEMORY_ROWS)
            self._last_memory: dict[int, int] = {}
            self._peak: dict[int, int] = {}
            # Per device, the latest state a throttled event did not write: a reader sees it last
            # (the frees right after a peak left the table's last row showing freed memory).
            self._pending_memory: dict[int, dict[str, Any]] = {}

    @property
    def enabled(self) -> bool:
        return self._subscribed

    def snapshot(self) -> Snapshot:
        """A consistent copy of what was measured so far, taken under the lock (for readers)."""
        with self._lock:
            return Snapshot(ops={op: OpTotals(t.calls, dict(t.how), t.total_ns) for op, t in self.ops.items()},
                            moves={name: MoveTotals(t.calls, t.bytes, t.total_ns) for name, t in self.moves.items()},
                            memory=[dict(r) for r in self.memory]
                            + [dict(r) for r in self._pending_memory.values()])

    def enable(self, on: bool) -> None:
        """Subscribe (True) or unsubscribe (False) the listener."""
        with self._lock:
            if on == self._subscribed:
                return
            self._subscribed = on
        if on:
            observe.subscribe(self._listener)
        else:
            observe.unsubscribe(self._listener)

    def on_event(self, event: observe.Event) -> None:
        """The listener: what each kind of event adds."""
        if event.kind == "span":
            self._on_span(event)
        elif event.name in ("memory.malloc", "memory.free"):
            self._on_memory(event)

    def _on_span(self, event: observe.Event) -> None:
        if event.fields.get("error") is None and not event.sampled:  # (a stage's sample is kept already)
            samples.add_sample(event.name, event.duration_ns)
            if event.value:
                samples.add_sample(event.name + ".bytes", event.value)
        name = event.name
        if name == "eager.op":
            self._on_op(event)
        elif name.startswith(("transfer.", "collective.")):
            with self._lock:
                totals = self.moves.setdefault(name, MoveTotals())
                totals.calls += 1
                totals.bytes += event.value
                totals.total_ns += event.duration_ns

    def _on_op(self, event: observe.Event) -> None:
        op, how = event.fields.get("op", "?"), event.fields.get("how", "other")
        with self._lock:
            totals = self.ops.get(op)
            if totals is None:
                totals = self.ops[op] = OpTotals()
            totals.calls += 1
            totals.how[how] = totals.how.get(how, 0) + 1
            totals.total_ns += event.duration_ns

    def _on_memory(self, event: observe.Event) -> None:
        fields = event.fields
        device, allocated = fields.get("device", 0), fields.get("allocated")
        if allocated is None:
            return
        with self._lock:
            peak = self._peak.get(device, 0)
            new_peak = allocated > peak
            if new_peak:
                self._peak[device] = allocated
            row = {"time_ns": time.time_ns(), "device": device, "allocated_bytes": allocated,
                   "reserved_bytes": fields.get("reserved", 0), "peak_allocated_bytes": max(peak, allocated)}
            if not new_peak and event.start_ns - self._last_memory.get(device, -MEMORY_INTERVAL_NS) \
                    < MEMORY_INTERVAL_NS:
                self._pending_memory[device] = row
                return
            self._last_memory[device] = event.start_ns
            self._pending_memory.pop(device, None)
            self.memory.append(row)


collector = Collector()
