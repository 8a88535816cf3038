"""A checker for Chrome-trace / Perfetto JSON files (Perfetto's own trace processor cannot run offline).

It checks what Perfetto's JSON importer needs: a ``traceEvents`` list (or a bare list);
every event a dict with a ``ph``; complete (``X``) events with numeric ``ts`` and a
non-negative ``dur``; counter (``C``) events with numeric args; metadata (``M``) events with
args; and, per track (``pid``, ``tid``), ``X`` events that nest: each starts after the end of
the previous one that is not its ancestor. :func:`check` returns the problems found;
:func:`validate` raises :class:`TraceError` listing them.

torch's own traces do not always nest (Dynamo's compile-time ranges cut across the ops
around them), so the nesting check can be limited to some events, e.g. :func:`neuron_event`
(the tracks this package writes).
"""

from __future__ import annotations

import gzip
import json
import numbers
from collections.abc import Callable, Iterable
from typing import Any

PHASES = frozenset("XBEiIMCbenstfPOND")  # Chrome trace phases Perfetto knows
EPSILON_US = 0.01  # rounding of µs to 3 decimals at large timestamps
MAX_PROBLEMS = 20


class TraceError(ValueError):
    """A trace file Perfetto would reject or misdraw; the message lists the problems."""


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def load(path: str) -> Any:
    """The JSON of a trace file (``.json`` or ``.json.gz``)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def events_of(trace: Any) -> list[Any]:
    """The events of a trace in either JSON form."""
    if isinstance(trace, list):
        return trace
    if isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list):
        return trace["traceEvents"]
    raise TraceError("a trace is a list of events or an object with a 'traceEvents' list")


def _event_problems(i: int, e: Any) -> list[str]:
    if not isinstance(e, dict):
        return [f"event {i} is not an object"]
    ph = e.get("ph")
    if ph not in PHASES:
        return [f"event {i} has an unknown phase {ph!r}"]
    where = f"event {i} ({ph} {e.get('name')!r})"
    problems = []
    if ph != "M" and not _number(e.get("ts")):
        problems.append(f"{where}: ts is not a number")
    if ph == "X" and not (_number(e.get("dur")) and e["dur"] >= 0):
        problems.append(f"{where}: a complete event needs a non-negative numeric dur")
    if ph == "C":
        args = e.get("args")
        if not isinstance(args, dict) or not args or not all(_number(v) for v in args.values()):
            problems.append(f"{where}: counter args must be a non-empty object of numbers")
    if ph == "M" and not isinstance(e.get("args"), dict):
        problems.append(f"{where}: metadata needs args")
    if ph in "XiIC" and "name" not in e:
        problems.append(f"{where}: no name")
    return problems


def neuron_event(event: dict[str, Any]) -> bool:
    """Whether a trace event is one of the Neuron session's (category ``neuron`` or ``neuron.*``)."""
    return str(event.get("cat", "")).split(".")[0] == "neuron"


Selector = Callable[[dict[str, Any]], bool]


def nesting_problems(events: Iterable[dict[str, Any]], only: Selector | None = None) -> list[str]:
    """Complete events of one track that overlap without nesting (among those ``only`` selects)."""
    tracks: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and _number(e.get("ts")) and _number(e.get("dur")) \
                and (only is None or only(e)):
            tracks.setdefault((e.get("pid"), e.get("tid")), []).append(
                (float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e.get("name"))))
    problems = []
    for track, spans in tracks.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1][1] - EPSILON_US:
                stack.pop()
            if stack and end > stack[-1][1] + EPSILON_US:
                top = stack[-1]
                problems.append(f"track pid={track[0]} tid={track[1]}: {name!r} [{start}, {end}] overlaps "
                                f"{top[2]!r} [{top[0]}, {top[1]}] without nesting")
                continue
            stack.append((start, end, name))
    return problems


def check(trace: Any, nesting: Selector | None = None) -> list[str]:
    """Every problem of a loaded trace (empty when Perfetto would import it cleanly); ``nesting``
    limits the nesting check to the events it selects."""
    try:
        events = events_of(trace)
    except TraceError as exc:
        return [str(exc)]
    problems = [p for i, e in enumerate(events) for p in _event_problems(i, e)]
    return problems + nesting_problems(events, nesting)


def validate(path_or_trace: Any, nesting: Selector | None = None) -> list[Any]:
    """The events of a valid trace (a path or loaded JSON); :class:`TraceError` listing the problems otherwise.

    ``nesting`` limits the nesting check to the events it selects (:func:`neuron_event`: ours).
    """
    trace = load(path_or_trace) if isinstance(path_or_trace, str) else path_or_trace
    problems = check(trace, nesting)
    if problems:
        shown = "\n  ".join(problems[:MAX_PROBLEMS])
        more = f"\n  ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise TraceError(f"{len(problems)} problem(s) in the trace:\n  {shown}{more}")
    return events_of(trace)
