"""The session's listener: every event of the instrumentation layer, kept as a :class:`Record`.

Names are handled generically (a name's category is the part before its first dot), so new
emit points in lower layers need nothing here. Each record gets the neuron device and stream
it belongs to: from the event's ``device``/``stream`` fields where present, else from the name
of the reporting thread when it is a stream's worker (``"neuron:0 stream 1"``). Events of
devices not captured (TORCH_NEURONX_PROFILE_CAPTURE_NC) are dropped; beyond
TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC records per device the rest are dropped and counted.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
import time
from collections.abc import Iterable
from typing import Any

from torch_neuronx.config.parsers import IndexRanges
from torch_neuronx.observe import Event

HOST = -1  # the bucket of events that belong to no neuron device (compiles, cache lookups)
_WORKER = re.compile(r"neuron:(\d+) stream (\d+)")


@dataclasses.dataclass(frozen=True)
class Record:
    """One recorded event, with wall-clock times (``time.time_ns()``, torch's trace clock)."""

    name: str
    kind: str  # "span", "event" or "count"
    start_ns: int
    duration_ns: int
    value: int
    thread: int
    device: int | None
    stream: int | None
    fields: dict[str, Any]

    @property
    def category(self) -> str:
        """The part of the name before its first dot (``runtime`` of ``runtime.launch``)."""
        return self.name.partition(".")[0]

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


def clock_offset_ns(samples: int = 7) -> int:
    """``time.time_ns() - time.perf_counter_ns()``, from the tightest of a few readings."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    assert best is not None
    return best[1]


def device_index(value: Any) -> int | None:
    """A device index from an event field: an int, ``"neuron:N"`` or a ``torch.device``; None if unknown."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    index = getattr(value, "index", None)
    if isinstance(index, int):
        return index
    text = str(value)
    tail = text.rpartition(":")[2]
    return int(tail) if tail.isdigit() else (0 if text == "neuron" else None)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Recorder:
    """A listener keeping every event of its window, subject to the capture filter and the cap."""

    def __init__(self, capture_nc: Iterable[int], max_events_per_nc: int, offset_ns: int) -> None:
        self.capture_nc = capture_nc if isinstance(capture_nc, IndexRanges) else IndexRanges.of(capture_nc)
        self.max_events_per_nc = max_events_per_nc
        self.offset_ns = offset_ns
        self.start_perf_ns = time.perf_counter_ns()
        self.records: list[Record] = []
        self.kept: collections.Counter[int] = collections.Counter()
        self.dropped: collections.Counter[int] = collections.Counter()  # over the cap, per device
        self.filtered = 0  # events of devices not captured
        self._lock = threading.Lock()
        self._threads: dict[tuple[int, str], tuple[int | None, int | None]] = {}

    def _thread_place(self, ident: int) -> tuple[int | None, int | None]:
        """(device, stream) of the calling thread when it is a stream's worker."""
        name = threading.current_thread().name  # idents are reused once a thread ends: the name decides
        place = self._threads.get((ident, name))
        if place is None:
            match = _WORKER.fullmatch(name)
            place = (int(match[1]), int(match[2])) if match else (None, None)
            self._threads[(ident, name)] = place
        return place

    def __call__(self, event: Event) -> None:
        fields = event.fields
        device = device_index(fields.get("device"))
        stream = _int_or_none(fields.get("stream"))
        if device is None or stream is None:
            thread_device, thread_stream = self._thread_place(event.thread)
            device = thread_device if device is None else device
            stream = thread_stream if stream is None else stream
        if device is not None and device not in self.capture_nc:
            self.filtered += 1
            return
        start = max(event.start_ns, self.start_perf_ns)  # a span begun before the window: clipped to it
        duration = max(0, event.start_ns + event.duration_ns - start)
        record = Record(event.name, event.kind, start + self.offset_ns, duration, event.value, event.thread,
                        device, stream, dict(fields))
        bucket = HOST if device is None else device
        with self._lock:
            if self.kept[bucket] >= self.max_events_per_nc:
                self.dropped[bucket] += 1
                return
            self.kept[bucket] += 1
            self.records.append(record)

    def snapshot(self) -> list[Record]:
        """The records so far, in time order."""
        with self._lock:
            return sorted(self.records, key=lambda r: (r.start_ns, -r.duration_ns))

    def drops(self) -> dict[str, int]:
        """Dropped events per device (``"host"`` for none) over the cap."""
        return {("host" if k == HOST else str(k)): v for k, v in sorted(self.dropped.items())}
