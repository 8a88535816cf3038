"""Chrome-trace / Perfetto JSON for a session's records and samples, and the merge into torch's traces.

Timestamps are microseconds from a base (``baseTimeNanoseconds`` of torch's trace, whose clock
is ``time.time_ns()``), so neuron events line up with torch's CPU ops. Tracks:

- one process per neuron device (``neuron:N``), one thread track per (stream, reporting thread):
  spans of one thread nest (they are context managers), spans of different threads never share
  a track, so every track nests as Perfetto requires;
- one process ``neuron runtime (host)`` for events of no device (compiles, cache lookups), one
  track per reporting thread; counts as counter (``C``) tracks there;
- one process ``host`` for the cpu_util and host_memory counters;
- device memory in use per device as a counter, from ``memory.malloc``/``memory.free`` (their
  ``allocated`` field when present, else the sizes allocated and freed within the session).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable
from typing import Any

from torch_neuronx.profiling.recorder import Record
from torch_neuronx.profiling.samplers import CpuSample, MemorySample

PID_BASE = 0x7FFF0000  # above any Linux pid, so never a CPU process of torch's trace
HOST_RUNTIME_PID = PID_BASE - 1
HOST_PID = PID_BASE - 2
CATEGORY = "neuron"


def device_pid(device: int | None) -> int:
    """The trace process of a neuron device (None: the host side of the runtime)."""
    return HOST_RUNTIME_PID if device is None else PID_BASE + device


def to_us(time_ns: int, base_ns: int) -> float:
    """A ``time.time_ns()`` instant as trace microseconds from ``base_ns``."""
    return round((time_ns - base_ns) / 1000.0, 3)


def _arg(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def label(record: Record) -> str:
    """A short name saying which graph, op or NEFF a record is about."""
    f = record.fields
    detail = f.get("graph") or f.get("op") or f.get("neff") or f.get("cache")
    return f"{record.name} {detail}" if detail else record.name


class _Tracks:
    """Thread ids and their metadata, assigned in order of first use."""

    def __init__(self) -> None:
        self.tids: dict[tuple[int, int | None, int], int] = {}
        self.meta: list[dict[str, Any]] = []
        self.pids: set[int] = set()

    def process(self, pid: int, name: str, sort_index: int) -> None:
        if pid in self.pids:
            return
        self.pids.add(pid)
        self.meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
                      {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": sort_index}}]

    def tid(self, record: Record) -> tuple[int, int]:
        pid = device_pid(record.device)
        self.process(pid, "neuron runtime (host)" if record.device is None else f"neuron:{record.device}",
                     pid)
        key = (pid, record.stream, record.thread)
        tid = self.tids.get(key)
        if tid is None:
            tid = self.tids[key] = 1 + sum(1 for k in self.tids if k[0] == pid)
            where = f"stream {record.stream}" if record.stream is not None else "host"
            name = f"{where} (thread {record.thread % 100000})"
            self.meta += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
                          {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": (record.stream if record.stream is not None else 999) * 100 + tid}}]
        return pid, tid


def record_events(records: Iterable[Record], base_ns: int) -> list[dict[str, Any]]:
    """The trace events of a session's records (spans ``X``, events ``i``, counts and memory ``C``)."""
    tracks = _Tracks()
    out: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    in_use: dict[int | None, int] = {}
    sizes: dict[tuple[int | None, Any], int] = {}
    for r in records:
        args = {k: _arg(v) for k, v in r.fields.items()}
        if r.value:
            args["value"] = r.value
        ts = to_us(r.start_ns, base_ns)
        if r.kind == "count":
            tracks.process(HOST_RUNTIME_PID, "neuron runtime (host)", HOST_RUNTIME_PID)
            totals[r.name] = totals.get(r.name, 0) + r.value
            out.append({"ph": "C", "name": r.name, "cat": CATEGORY, "pid": HOST_RUNTIME_PID, "tid": 0, "ts": ts,
                        "args": {"total": totals[r.name]}})
            continue
        pid, tid = tracks.tid(r)
        if r.kind == "span":
            out.append({"ph": "X", "name": label(r), "cat": f"{CATEGORY}.{r.category}", "pid": pid, "tid": tid,
                        "ts": ts, "dur": round(r.duration_ns / 1000.0, 3), "args": {"event": r.name, **args}})
        else:
            out.append({"ph": "i", "s": "t", "name": r.name, "cat": f"{CATEGORY}.{r.category}", "pid": pid,
                        "tid": tid, "ts": ts, "args": args})
        if r.name in ("memory.malloc", "memory.free"):
            key = (r.device, r.fields.get("address"))
            if r.name == "memory.malloc":
                sizes[key] = r.value
                in_use[r.device] = in_use.get(r.device, 0) + r.value
            else:
                in_use[r.device] = in_use.get(r.device, 0) - (r.value or sizes.pop(key, 0))
            allocated = r.fields.get("allocated")  # the allocator's own total, when it reports one
            in_use_now = allocated if isinstance(allocated, int) and not isinstance(allocated, bool) \
                else in_use[r.device]
            out.append({"ph": "C", "name": "device memory in use", "cat": CATEGORY, "pid": pid, "tid": 0, "ts": ts,
                        "args": {"bytes": in_use_now}})
    return tracks.meta + out


def sample_events(cpu: Iterable[CpuSample], memory: Iterable[MemorySample], base_ns: int) -> list[dict[str, Any]]:
    """Counter events of the host samples (CPU percent per CPU and average; memory bytes and percent)."""
    out: list[dict[str, Any]] = []
    cpu, memory = list(cpu), list(memory)
    if cpu or memory:
        out += [{"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "host"}},
                {"ph": "M", "name": "process_sort_index", "pid": HOST_PID, "tid": 0, "args": {"sort_index": HOST_PID}}]

    def counter(name: str, ts: float, args: dict[str, float]) -> None:
        out.append({"ph": "C", "name": name, "cat": f"{CATEGORY}.host", "pid": HOST_PID, "tid": 0, "ts": ts,
                    "args": args})

    for s in cpu:
        ts = to_us(s.time_ns, base_ns)
        counter("cpu utilization (%)", ts, {"average": round(s.average, 2)})
        counter("cpu utilization per cpu (%)", ts, {f"cpu{i}": round(p, 2) for i, p in enumerate(s.per_cpu)})
    for m in memory:
        ts = to_us(m.time_ns, base_ns)
        counter("system memory used (bytes)", ts, {"bytes": m.system_used_bytes})
        counter("system memory used (%)", ts, {"percent": m.system_percent})
        counter("process rss (bytes)", ts, {"bytes": m.process_rss_bytes})
        counter("process memory (%)", ts, {"percent": round(m.process_percent, 3)})
    return out


def write_trace(path: str, events: list[dict[str, Any]], base_ns: int, metadata: dict[str, Any]) -> str:
    """Write a standalone trace file (``traceEvents``, ``baseTimeNanoseconds``, our ``neuron`` metadata)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    trace = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns,
             "traceEvents": events, "neuron": metadata}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
    return path


def _load(path: str) -> tuple[dict[str, Any], bool]:
    gz = path.endswith(".gz")
    with (gzip.open(path, "rt") if gz else open(path)) as f:
        data = json.load(f)
    if isinstance(data, list):
        data = {"traceEvents": data}
    return data, gz


def merge_into(path: str, session_events: Any, metadata: dict[str, Any]) -> None:
    """Add a session's events to the trace torch wrote at ``path`` (JSON or ``.json.gz``), on its clock.

    ``session_events`` is a function from the trace's base (ns) to the events to add.
    """
    data, gz = _load(path)
    base_ns = int(data.get("baseTimeNanoseconds", 0))
    data.setdefault("traceEvents", []).extend(session_events(base_ns))
    data["neuron"] = metadata
    tmp = f"{path}.tmp{os.getpid()}"
    with (gzip.open(tmp, "wt") if gz else open(tmp, "w")) as f:
        json.dump(data, f)
    os.replace(tmp, path)
