"""Why a cache lookup missed, and the record of the last run's misses.

Every entry's sidecar keeps its key components (see :mod:`keys`), and an
index directory per graph group (``<root>/.graphs/<group>/<digest>``) lists
the entries of one graph. On a miss, the new key is compared with every entry
of its group; the closest one (fewest differing components, then newest)
explains the miss: ``cache miss for g: compiler_version differs (was '3.12',
now '3.13')``. The store logs that at INFO (TORCH_NEURONX_LOG_LEVEL=2) and
:class:`MissLog` appends it to this process's file
``<root>/.explain/<host>-<pid>-<random>.json`` (rewritten atomically), which
``python -m torch_neuronx.cache explain`` reads back. Only the newest
:data:`KEEP_RUNS` run files are kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any

from torch_neuronx.cache import atomic, layout
from torch_neuronx.cache.keys import CacheKey

_log = logging.getLogger("torch_neuronx.cache")

KEEP_RUNS = 32  # run files kept in .explain/
KEEP_MISSES = 1000  # misses kept per run file


def index(root: str, key: CacheKey) -> None:
    """List ``key``'s entry under its graph group (an empty marker file; raises OSError)."""
    directory = layout.group_dir(root, key.group)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, key.digest), "ab"):
        pass


def _differing(key: CacheKey, sidecar: dict[str, Any]) -> list[str]:
    old = sidecar.get("components") or {}
    names = list(key.components) + [n for n in old if n not in key.components]
    return [n for n in names if key.components.get(n) != old.get(n)]


def closest(root: str, key: CacheKey) -> tuple[dict[str, Any], list[str]] | None:
    """The sidecar of the entry of ``key``'s group closest to ``key``, and the differing components."""
    directory = layout.group_dir(root, key.group)
    try:
        digests = os.listdir(directory)
    except OSError:
        return None
    best: tuple[int, float, dict[str, Any], list[str]] | None = None
    for digest in digests:
        if digest == key.digest or atomic.is_temp(digest):
            continue
        try:
            sidecar = layout.read_sidecar(root, digest)
        except ValueError:  # not a digest name
            continue
        if sidecar is None:  # entry removed (pruned, corrupt): forget it
            atomic.remove_quietly(os.path.join(directory, digest))
            continue
        differs = _differing(key, sidecar)
        rank = (len(differs), -float(sidecar.get("created", 0)))
        if best is None or rank < best[:2]:
            best = (*rank, sidecar, differs)
    return None if best is None else (best[2], best[3])


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _change(field: str, old: Any, new: Any) -> str:
    """How one compiler-config field changed: for lists (the flags), the items removed and added
    (both lists cut at one length hid the flag that differed)."""
    if isinstance(old, list) and isinstance(new, list):
        removed, added = [x for x in old if x not in new], [x for x in new if x not in old]
        if removed or added:
            return f"{field}: removed {_short(removed)}, added {_short(added)}"
        return f"{field}: same items, another order"
    return f"{field}: was {_short(old)}, now {_short(new)}"


def _describe(name: str, key: CacheKey, sidecar: dict[str, Any]) -> str:
    new = key.details.get(name)
    old = (sidecar.get("details") or {}).get(name)
    if name == "compiler_config" and isinstance(new, dict) and isinstance(old, dict):
        fields = sorted({*new, *old}, key=str)
        changes = [_change(f, old.get(f), new.get(f)) for f in fields if new.get(f) != old.get(f)]
        return f"compiler_config differs ({'; '.join(changes)})"
    if name in ("hlo", "graph"):
        was = (sidecar.get("components") or {}).get(name, "?")[:12]
        now = key.components.get(name, "?")[:12]
        return f"{name} differs (was {was}, now {now}: the lowered graph changed)"
    if name not in key.components:
        return f"{name} differs (the entry is a {sidecar.get('kind')} key, this is a {key.kind} key)"
    return f"{name} differs (was {_short(old)}, now {_short(new)})"


def explain(root: str, key: CacheKey) -> tuple[str, list[str]]:
    """A one-line explanation of a miss of ``key`` and the names of the differing components."""
    found = closest(root, key)
    if found is None:
        return f"cache miss for {key.label()}: no cached entry for this graph yet (first compile)", []
    sidecar, differs = found
    if not differs:
        return (f"cache miss for {key.label()}: closest entry {sidecar.get('digest', '?')[:16]} has the "
                "same components but another key schema"), []
    parts = "; ".join(_describe(name, key, sidecar) for name in differs)
    return f"cache miss for {key.label()}: {parts}", differs


class MissLog:
    """This process's misses, with explanations, kept in ``<root>/.explain/``."""

    def __init__(self, root: str):
        host = socket.gethostname()
        name = f"{host.replace('-', '_')}-{os.getpid()}-{secrets.token_hex(4)}.json"
        self.path = os.path.join(root, layout.EXPLAIN_DIR, name)
        self._record: dict[str, Any] = {"pid": os.getpid(), "host": host, "started": time.time(),
                                        "argv": sys.argv[:8], "misses": []}
        self._lock = threading.Lock()
        self._enabled = True

    def add(self, key: CacheKey, message: str, differs: list[str]) -> None:
        """Record one miss; I/O errors turn recording off (explanations are advisory)."""
        with self._lock:
            if not self._enabled:
                return
            first = not self._record["misses"]
            misses = self._record["misses"]
            misses.append({"time": time.time(), "graph_id": key.graph_id, "digest": key.digest,
                           "differs": differs, "explanation": message})
            del misses[:-KEEP_MISSES]
            data = json.dumps(self._record).encode()
            try:
                atomic.write_atomic(self.path, data, durable=False)
            except OSError as exc:
                self._enabled = False
                _log.info("cannot record cache miss explanations in %s (%s)", self.path, exc)
                return
        if first:
            _trim(os.path.dirname(self.path))


def _run_files(directory: str) -> list[str]:
    """Run files, newest first."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json") and not atomic.is_temp(n)]
    except OSError:
        return []
    stamped = []
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            stamped.append((os.stat(path).st_mtime, path))
    return [path for _, path in sorted(stamped, reverse=True)]


def _trim(directory: str) -> None:
    for path in _run_files(directory)[KEEP_RUNS:]:
        atomic.remove_quietly(path)


def runs(root: str, count: int = 1) -> list[dict[str, Any]]:
    """The ``count`` most recent runs' records (pid, host, started, argv, misses), newest first."""
    records = []
    for path in _run_files(os.path.join(root, layout.EXPLAIN_DIR))[:count]:
        try:
            with open(path, "rb") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            record["path"] = path
            records.append(record)
    return records
