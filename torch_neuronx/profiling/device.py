"""The device mode: per-execution timings of every NEFF, and the NEFFs copied from the NEFF cache.

Each ``runtime.launch`` span names its NEFF by a 16-hex prefix of its cache key (field ``neff``).
The NEFF cache keeps an entry at ``<root>/ab/cd/<digest>.neff`` (:mod:`torch_neuronx.cache.layout`),
so the prefix finds its shard directory and the entries there whose digest it begins.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import statistics
from typing import Any

from torch_neuronx.cache import layout
from torch_neuronx.profiling.chrome import CATEGORY, device_pid, to_us
from torch_neuronx.profiling.recorder import Record

_log = logging.getLogger("torch_neuronx.profiling")
LAUNCH = "runtime.launch"
NEFF_DIR = "neffs"


def executions(records: list[Record]) -> dict[str, list[Record]]:
    """The ``runtime.launch`` spans of each NEFF (by key prefix), in time order."""
    out: dict[str, list[Record]] = {}
    for r in records:
        if r.name == LAUNCH and r.kind == "span" and r.fields.get("neff"):
            out.setdefault(str(r.fields["neff"]), []).append(r)
    return out


def find_neffs(cache_dir: str, prefix: str) -> list[str]:
    """The NEFF files of the cache entries whose digest starts with ``prefix``."""
    try:
        layout.check_digest(prefix)
    except ValueError:
        return []
    shard = os.path.join(cache_dir, prefix[:2], prefix[2:4])
    return sorted(glob.glob(os.path.join(glob.escape(shard), glob.escape(prefix) + "*" + layout.ENTRY_SUFFIX)))


def copy_neffs(cache_dir: str, prefixes: list[str], out_dir: str) -> dict[str, list[str]]:
    """Copy each prefix's NEFFs (and sidecars) into ``out_dir``; the copied paths, relative to its parent."""
    copied: dict[str, list[str]] = {}
    for prefix in prefixes:
        for path in find_neffs(cache_dir, prefix):
            os.makedirs(out_dir, exist_ok=True)
            target = os.path.join(out_dir, os.path.basename(path))
            try:
                shutil.copyfile(path, target)
                sidecar = path[: -len(layout.ENTRY_SUFFIX)] + layout.SIDECAR_SUFFIX
                if os.path.exists(sidecar):
                    shutil.copyfile(sidecar, target[: -len(layout.ENTRY_SUFFIX)] + layout.SIDECAR_SUFFIX)
            except OSError as exc:  # an entry evicted meanwhile: the timings are still worth having
                _log.warning("profiler: could not copy NEFF %s (%s)", path, exc)
                continue
            copied.setdefault(prefix, []).append(os.path.join(NEFF_DIR, os.path.basename(path)))
    return copied


def summary(runs: dict[str, list[Record]], copied: dict[str, list[str]]) -> dict[str, Any]:
    """Per NEFF: execution count, total/mean/min/max in µs, and its copied files."""
    out: dict[str, Any] = {}
    for prefix, spans in runs.items():
        us = [r.duration_ns / 1000.0 for r in spans]
        out[prefix] = {"executions": len(us), "total_us": round(sum(us), 3), "mean_us": round(statistics.fmean(us), 3),
                       "min_us": round(min(us), 3), "max_us": round(max(us), 3), "files": copied.get(prefix, []),
                       "graph": next((str(r.fields["graph"]) for r in spans if r.fields.get("graph")), None)}
    return out


def execution_events(runs: dict[str, list[Record]], base_ns: int) -> list[dict[str, Any]]:
    """One ``X`` event per execution, on one track per NEFF of each device and reporting thread (a NEFF
    run by two threads at once would not nest on one track)."""
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str, int], int] = {}
    for prefix, spans in sorted(runs.items()):
        for i, r in enumerate(spans):
            pid = device_pid(r.device)
            key = (pid, prefix, r.thread)
            if key not in tids:
                tids[key] = 10_000 + len(tids)
                events += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": "neuron runtime (host)" if r.device is None else f"neuron:{r.device}"}},
                           {"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[key],
                            "args": {"name": f"neff {prefix} (stream {r.stream})"}}]
            events.append({"ph": "X", "name": f"neff {prefix}", "cat": f"{CATEGORY}.device", "pid": pid,
                           "tid": tids[key], "ts": to_us(r.start_ns, base_ns), "dur": round(r.duration_ns / 1000.0, 3),
                           "args": {"neff": prefix, "execution": i, "stream": r.stream}})
    return events
