"""Metric tables: named tables of rows, exported as CSV per rank (TORCH_NEURONX_ENABLED_METRIC_TABLES).

``graph_stats`` is TorchNeuron's own table, column for column; the others are ours (TorchNeuron
has no equivalent) and are documented in ``docs/metrics.md``. Each enabled table is written to
``{TORCH_NEURONX_METRICS_DIR}/metric_table_{name}_rank{rank}.csv`` when the process exits (a
process that used no neuron device and compiled nothing, such as torchrun's agent, writes
nothing) and on :func:`export`. The variable is read, and an unknown table name reported with the valid names,
when ``torch_neuronx`` is imported (:func:`configure`), not after a whole run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch_neuronx import config, observe, process
from torch_neuronx.cache import atomic
from torch_neuronx.config import directories
from torch_neuronx.metrics.collector import collector
from torch_neuronx.observe import samples

_log = logging.getLogger("torch_neuronx.metrics")


@dataclasses.dataclass(frozen=True)
class Table:
    """One metric table: its columns, where its rows come from, and whether it needs the listener."""

    name: str
    doc: str
    columns: tuple[str, ...]
    rows: Callable[[], list[dict[str, Any]]]
    live: bool  # needs the metrics listener (op-rate events) to be subscribed


GRAPH_STATS_COLUMNS = ("graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count", "timestamp",
                       "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us", "torch_neuronx_compile_us")
_CACHE_KINDS = ("neff", "hlo", "trace")
_CACHE_COLUMNS = ("hits_memory", "hits_disk", "misses", "compiles", "corrupt", "lock_waits", "io_errors",
                  "evictions", "bytes_read", "bytes_written")


def _graph_rows() -> list[dict[str, Any]]:
    return samples.records("graph.compiled")


def _eager_rows() -> list[dict[str, Any]]:
    ops = {op: (t.calls, t.how, t.total_ns) for op, t in collector.snapshot().ops.items()}
    rows = []
    for op, (calls, how, total_ns) in sorted(ops.items(), key=lambda kv: -kv[1][2]):
        rows.append({"op": op, "calls": calls, "compiled": how.get("compiled", 0),
                     "fallback": how.get("fallback", 0), "view": how.get("view", 0),
                     "other": calls - how.get("compiled", 0) - how.get("fallback", 0) - how.get("view", 0),
                     "total_us": round(total_ns / 1000, 3), "mean_us": round(total_ns / 1000 / calls, 3)})
    return rows


def _cache_rows() -> list[dict[str, Any]]:
    counts = observe.counters()
    return [{"cache": kind, **{c: counts.get(f"{kind}_cache.{c}", 0) for c in _CACHE_COLUMNS}}
            for kind in _CACHE_KINDS]


def _memory_rows() -> list[dict[str, Any]]:
    return collector.snapshot().memory


def _transfer_rows() -> list[dict[str, Any]]:
    moves = {name: (t.calls, t.bytes, t.total_ns) for name, t in collector.snapshot().moves.items()}
    return [{"kind": name, "calls": calls, "bytes": size, "total_us": round(ns / 1000, 3),
             "mean_us": round(ns / 1000 / calls, 3) if calls else 0.0}
            for name, (calls, size, ns) in sorted(moves.items())]


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("graph_stats", "One row per graph compiled for torch.compile (TorchNeuron's table): the NEFF cache key, "
          "TorchNeuron's graph name, model, collectives, FX node count, when, and the microseconds of its FX "
          "passes, lowering and NEFF (cache lookup and compiler).", GRAPH_STATS_COLUMNS, _graph_rows, False),
    Table("eager_ops", "One row per eager op: calls, how they ran (compiled kernel, CPU fallback, view, other: "
          "random, copies), and host time from the call to its return (the op is queued, so this is the "
          "dispatch cost; device time is in runtime.launch).",
          ("op", "calls", "compiled", "fallback", "view", "other", "total_us", "mean_us"), _eager_rows, True),
    Table("caches", "One row per cache (NEFF, HLO, NKI trace): this process's hits per tier, misses, "
          "compiles, corrupt entries, lock waits, I/O errors, in-memory evictions, bytes read and written.",
          ("cache", *_CACHE_COLUMNS), _cache_rows, False),
    Table("memory", "Device memory over time: allocated, reserved and peak allocated bytes per device, a row at "
          "most every millisecond and at every new peak (wall-clock time_ns).",
          ("time_ns", "device", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes"), _memory_rows, True),
    Table("transfers", "One row per kind of data movement (host to device, device to host, collectives): "
          "calls, bytes, total and mean time.",
          ("kind", "calls", "bytes", "total_us", "mean_us"), _transfer_rows, True),
)}

_lock = threading.RLock()  # reentrant: see process.at_termination
_enabled: list[str] = []
_configured = False
_exit_registered = False


def parse_names(value: str) -> tuple[list[str], list[str]]:
    """The valid and the unknown table names in a comma-separated list (blanks ignored, order kept)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    valid = [n for n in dict.fromkeys(names) if n in TABLES]
    return valid, [n for n in names if n not in TABLES]


def configure() -> list[str]:
    """Read TORCH_NEURONX_ENABLED_METRIC_TABLES (once): enable its tables, warn of unknown names at once."""
    global _configured
    with _lock:
        if _configured:
            return list(_enabled)
        _configured = True
    valid, unknown = parse_names(config.get("TORCH_NEURONX_ENABLED_METRIC_TABLES"))
    if unknown:
        warnings.warn(f"TORCH_NEURONX_ENABLED_METRIC_TABLES names unknown metric table(s) {', '.join(unknown)}; "
                      f"valid tables: {', '.join(TABLES)}. They are ignored.", UserWarning, stacklevel=2)
    enable(valid)
    return valid


def enable(names: Sequence[str]) -> None:
    """Enable the tables ``names`` for export (adding to those enabled); unknown names raise ``ValueError``."""
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise ValueError(f"unknown metric table(s) {', '.join(unknown)}; valid tables: {', '.join(TABLES)}")
    global _exit_registered
    with _lock:
        _enabled.extend(n for n in names if n not in _enabled)
        live = any(TABLES[n].live for n in _enabled)
        register_exit = bool(_enabled) and not _exit_registered
        _exit_registered = _exit_registered or register_exit
    if live:
        collector.enable(True)
    if register_exit:
        import atexit
        atexit.register(_export_at_exit)
        process.at_termination(_export_at_exit)  # SIGTERM skips atexit


def enabled() -> list[str]:
    """The tables enabled for export."""
    with _lock:
        return list(_enabled)


def disable_all() -> None:
    """Enable no table (the listener stays as ``set_enabled`` left it)."""
    with _lock:
        _enabled.clear()


def rows(name: str) -> list[dict[str, Any]]:
    """The rows of table ``name`` now."""
    if name not in TABLES:
        raise ValueError(f"unknown metric table {name!r}; valid tables: {', '.join(TABLES)}")
    return TABLES[name].rows()


def csv_path(name: str, directory: str | None = None) -> str:
    """Where table ``name`` of this rank is written."""
    root = directory if directory is not None else directories.directory("TORCH_NEURONX_METRICS_DIR")
    return os.path.join(root, f"metric_table_{name}_rank{process.rank()}.csv")


def to_csv(name: str) -> str:
    """Table ``name`` as CSV text: a header of its columns, then its rows."""
    table = TABLES[name]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=table.columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(table.rows())
    return out.getvalue()


def export(names: Sequence[str] | None = None, directory: str | None = None) -> list[str]:
    """Write tables ``names`` (the enabled ones when None) as CSV, atomically; their paths.
    An unknown name raises ``ValueError`` naming the valid tables, before anything is written."""
    chosen = enabled() if names is None else ([names] if isinstance(names, str) else list(names))
    unknown = [n for n in chosen if n not in TABLES]
    if unknown:
        raise ValueError(f"unknown metric table(s) {', '.join(map(str, unknown))}; valid tables: {', '.join(TABLES)}")
    paths = []
    for name in chosen:
        path = csv_path(name, directory)
        # Readable as every other artifact (the umask's mode, not mkstemp's 0600), never torn.
        atomic.write_atomic(os.path.abspath(path), to_csv(name).encode(), durable=False)
        paths.append(path)
    return paths


def _used() -> bool:
    """Whether this process did anything the tables report (a launcher such as torchrun's agent
    imports torch, and so this package, but must not write, or overwrite, rank 0's tables)."""
    return bool(collector.snapshot()) or any(observe.counters().values()) or bool(samples.records("graph.compiled"))


_owner = os.getpid()  # a forked child inherits the tables but must not overwrite its parent's files


def _export_at_exit() -> None:
    if os.getpid() != _owner:
        return
    if not _used():
        _log.debug("no metric tables written: this process used no neuron device and compiled nothing")
        return
    try:
        for path in export():
            _log.info("wrote metric table %s", path)
    except OSError as exc:  # at exit: say it, never raise (an unusable directory fell back to the default)
        _log.warning("could not write the metric tables to %s: %s",
                     config.get("TORCH_NEURONX_METRICS_DIR"), exc)
