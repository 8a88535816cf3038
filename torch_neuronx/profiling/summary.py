"""``python -m torch_neuronx.profiling summarize DIR``: where the time of a profile went.

Reads the neuron events of the newest ``trace.json`` (else ``runtime.json``) under ``DIR``,
prints the top graphs (NEFF executions), eager ops and transfers by total time, and writes two
PNGs beside it (matplotlib, Agg backend): ``timeline.png`` (the spans of each track) and
``top.png`` (a bar chart of the event names taking the most time).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Iterable
from typing import Any

from torch_neuronx.profiling import validate

TOP = 10
TRACE_NAMES = ("trace.json", "runtime.json")


@dataclasses.dataclass
class Row:
    """One line of a table: a name, how often, how long in total (µs), and bytes where known."""

    name: str
    count: int = 0
    total_us: float = 0.0
    bytes: int = 0


def find_trace(directory: str) -> str:
    """The newest ``trace.json`` under ``directory`` (else ``runtime.json``); FileNotFoundError if none."""
    if os.path.isfile(directory):
        return directory
    for name in TRACE_NAMES:
        found = glob.glob(os.path.join(glob.escape(directory), "**", name), recursive=True)
        if found:
            return max(found, key=os.path.getmtime)
    raise FileNotFoundError(f"no {' or '.join(TRACE_NAMES)} under {directory}: profile with "
                            "torch.profiler and ProfilerActivity.PrivateUse1 first (docs/profiling.md)")


def neuron_spans(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The complete events of the neuron runtime (category ``neuron.*``, device executions excluded)."""
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).startswith("neuron.")
            and e.get("cat") != "neuron.device"]


def _event(e: dict[str, Any]) -> str:
    return str(e.get("args", {}).get("event") or e.get("name"))


def table(spans: Iterable[dict[str, Any]], key: Any, top: int = TOP) -> list[Row]:
    """Rows grouped by ``key(event)`` (skipping None), the longest total first."""
    rows: dict[str, Row] = {}
    for e in spans:
        name = key(e)
        if name is None:
            continue
        row = rows.setdefault(name, Row(name))
        row.count += 1
        row.total_us += float(e["dur"])
        value = e.get("args", {}).get("value")
        row.bytes += value if isinstance(value, int) else 0
    return sorted(rows.values(), key=lambda r: -r.total_us)[:top]


def tables(events: list[dict[str, Any]]) -> dict[str, list[Row]]:
    """The top graphs, ops, transfers and event names of a trace's neuron spans."""
    spans = neuron_spans(events)
    args = lambda e: e.get("args", {})  # noqa: E731
    return {
        "graphs (NEFF executions)": table(
            spans, lambda e: (str(args(e).get("graph") or args(e).get("neff")) if _event(e) == "runtime.launch"
                              else None)),
        "eager ops": table(spans, lambda e: str(args(e).get("op") or e["name"]) if _event(e) == "eager.op" else None),
        "transfers": table(spans, lambda e: _event(e) if _event(e).startswith("transfer.") else None),
        "all neuron events": table(spans, _event),
    }


def render(tables_: dict[str, list[Row]]) -> str:
    """The tables as text."""
    lines = []
    for title, rows in tables_.items():
        lines += [f"Top {title} by time", f"  {'name':<48} {'count':>7} {'total ms':>10} {'mean us':>10}"]
        lines += [f"  {r.name[:48]:<48} {r.count:>7} {r.total_us / 1000:>10.3f} {r.total_us / r.count:>10.1f}"
                  for r in rows] or ["  (none)"]
        lines.append("")
    return "\n".join(lines)


def track_names(events: Iterable[dict[str, Any]]) -> dict[tuple[Any, Any], str]:
    """``(pid, tid)`` -> "process / thread" from the trace's metadata events."""
    processes = {e.get("pid"): e["args"].get("name") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    return {(e.get("pid"), e.get("tid")): f"{processes.get(e.get('pid'), e.get('pid'))} / {e['args'].get('name')}"
            for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}


def plot_timeline(spans: list[dict[str, Any]], path: str, names_: dict[tuple[Any, Any], str] | None = None) -> str:
    """A PNG of the spans of each neuron track over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tracks = sorted({(e.get("pid"), e.get("tid")) for e in spans}, key=str)
    origin = min((float(e["ts"]) for e in spans), default=0.0)
    fig, ax = plt.subplots(figsize=(12, 1 + 0.4 * max(1, len(tracks))))
    names = sorted({_event(e) for e in spans})
    colors = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}
    for row, track in enumerate(tracks):
        bars = [((float(e["ts"]) - origin) / 1000, max(float(e["dur"]) / 1000, 1e-3))
                for e in spans if (e.get("pid"), e.get("tid")) == track]
        cols = [colors[_event(e)] for e in spans if (e.get("pid"), e.get("tid")) == track]
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=cols)
    labels = [(names_ or {}).get(t) or f"pid {t[0]} tid {t[1]}" for t in tracks]
    ax.set_yticks(range(len(tracks)), labels, fontsize=7)
    ax.set_xlabel("ms from the first neuron event")
    ax.set_title("neuron timeline")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names[:20]]
    if handles:
        ax.legend(handles, names[:20], fontsize=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_top(rows: list[Row], path: str) -> str:
    """A PNG bar chart of total time per event name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 1 + 0.35 * max(1, len(rows))))
    ax.barh([r.name[:40] for r in rows][::-1], [r.total_us / 1000 for r in rows][::-1], color="tab:blue")
    ax.set_xlabel("total ms")
    ax.set_title("neuron events by total time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summarize(directory: str, out_dir: str | None = None) -> tuple[str, list[str]]:
    """The report of the profile under ``directory`` and the PNGs written (beside its trace by default)."""
    trace_path = find_trace(directory)
    events = validate.events_of(validate.load(trace_path))
    result = tables(events)
    out = out_dir or os.path.dirname(trace_path)
    os.makedirs(out, exist_ok=True)
    pngs = [plot_timeline(neuron_spans(events), os.path.join(out, "timeline.png"), track_names(events)),
            plot_top(result["all neuron events"], os.path.join(out, "top.png"))]
    return f"Profile {trace_path}\n\n{render(result)}", pngs
