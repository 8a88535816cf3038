"""Cache counters: in-process, and persisted per process for ``python -m torch_neuronx.cache stats``.

Each process (each cache instance, in fact) owns one file,
``<root>/.stats/<host>-<pid>-<random>.json``, holding its cumulative counters.
Only its owner ever writes it, always by atomic rename, so any number of
processes on any number of nodes update their counters without locks and
without lost updates; :func:`aggregate` sums the files. Counters that change on
the cold path (misses, compiles, corrupt entries...) are written at once; memory
hits, which can be frequent, are written with the next write or at exit.

:func:`compact` folds the files of finished processes into one, so the
directory stays small: a file is first claimed by renaming it (only one
compactor can win that rename), then added to a new folded file, then deleted.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time

from torch_neuronx import observe
from torch_neuronx.cache import atomic, layout

_log = logging.getLogger("torch_neuronx.cache")

COUNTERS = ("hits_memory", "hits_disk", "misses", "compiles", "corrupt", "lock_waits", "io_errors",
            "evictions", "bytes_read", "bytes_written")
_LAZY = frozenset({"hits_memory", "evictions", "bytes_read", "bytes_written"})  # written with the next write or at exit
_CLAIM = ".claim-"
COMPACT_AFTER = 64  # files of finished processes tolerated before compact() folds them
FINISHED_AGE = 24 * 3600.0  # a file untouched this long counts as finished even on another host


def stats_dir(root: str) -> str:
    """The directory of the per-process counter files of a cache."""
    return os.path.join(root, layout.STATS_DIR)


def _process_name() -> str:
    host = socket.gethostname().replace("-", "_")
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


class Stats:
    """Counters of one cache instance; persisted under ``root`` unless ``root`` is None.

    Each count is also reported to the instrumentation layer's listeners as ``{kind}_cache.{name}``.
    """

    def __init__(self, root: str | None, kind: str = "other"):
        self._metric = f"{kind}_cache."
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()
        self._path = os.path.join(stats_dir(root), _process_name() + ".json") if root else None
        self._dirty = False
        self._registered = False
        self._started = time.time()

    def incr(self, name: str, n: int = 1, *, persist: bool = True) -> None:
        """Add ``n`` to counter ``name`` (one of :data:`COUNTERS`); ``persist=False`` writes nothing now."""
        with self._lock:
            self._counts[name] += n
            self._dirty = True
        observe.tally(self._metric + name, n)
        if not persist:
            return
        if name not in _LAZY:
            self.flush()
        elif not self._registered and self._path:
            self._registered = True
            atexit.register(self.flush)

    def snapshot(self) -> dict[str, int]:
        """This process's counters."""
        with self._lock:
            return dict(self._counts)

    def flush(self) -> None:
        """Write this process's counters now (a no-op when nothing changed)."""
        with self._lock:
            if not self._dirty or not self._path:
                return
            record = {"counts": dict(self._counts), "pid": os.getpid(),
                      "host": socket.gethostname(), "started": self._started, "updated": time.time()}
            self._dirty = False
            path = self._path
        try:
            atomic.write_atomic(path, json.dumps(record).encode(), durable=False)
        except OSError as exc:
            # Counters are advisory: stop writing them, say so once (the store warns about
            # the unusable directory itself).
            self._path = None
            _log.info("cannot write NEFF cache statistics to %s (%s); counting in memory only",
                         path, exc)


def _read(path: str) -> dict[str, int]:
    try:
        with open(path, "rb") as f:
            counts = json.load(f).get("counts", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: int(v) for k, v in counts.items() if k in COUNTERS and isinstance(v, int)}


def _files(root: str) -> list[str]:
    directory = stats_dir(root)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if n.endswith(".json") and not atomic.is_temp(n)]


def aggregate(root: str) -> tuple[dict[str, int], int]:
    """The counters of every process that used the cache at ``root``, summed, and the file count."""
    total = dict.fromkeys(COUNTERS, 0)
    files = _files(root)
    for path in files:
        for name, value in _read(path).items():
            total[name] += value
    return total, len(files)


def _finished(path: str) -> bool:
    """Whether the process owning a counter file is gone (its counts will not change)."""
    name = os.path.basename(path)
    if name.startswith("folded-"):
        return True
    try:
        host, pid, _ = name[: -len(".json")].rsplit("-", 2)
        pid_number = int(pid)
    except ValueError:
        return False
    if host == socket.gethostname().replace("-", "_"):
        return not atomic.pid_alive(pid_number)
    try:  # another node's process: we cannot ask, so go by age
        return time.time() - os.stat(path).st_mtime > FINISHED_AGE
    except OSError:
        return False


def compact(root: str, *, threshold: int = COMPACT_AFTER) -> int:
    """Fold the files of finished processes into one when there are more than ``threshold``.

    Returns how many files were folded. Safe to run from several processes at once.
    """
    candidates = [p for p in _files(root) if _finished(p)]
    if len(candidates) <= threshold:
        return 0
    claimed: list[str] = []
    for path in candidates:
        target = path + _CLAIM + str(os.getpid())
        with contextlib.suppress(OSError):  # another compactor won this one
            os.rename(path, target)
            claimed.append(target)
    total = dict.fromkeys(COUNTERS, 0)
    for path in claimed:
        for name, value in _read(path).items():
            total[name] += value
    folded = os.path.join(stats_dir(root), f"folded-{_process_name()}.json")
    try:
        atomic.write_atomic(folded, json.dumps({"counts": total, "updated": time.time()}).encode())
    except OSError:
        for path in claimed:  # put them back rather than lose the counts
            with contextlib.suppress(OSError):
                os.rename(path, path.rsplit(_CLAIM, 1)[0])
        return 0
    for path in claimed:
        atomic.remove_quietly(path)
    return len(claimed)
