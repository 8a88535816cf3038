"""The persistent NEFF cache and HLO cache: sharded, atomic, verified, shared.

:class:`NeffCache` looks up a compiled NEFF in an in-memory LRU, then on disk
(verifying its checksum), and otherwise compiles it under the key's lock and
stores it. Errors of the cache itself (a read-only or full disk, a corrupt
entry) become warnings and the program goes on: a corrupt entry is removed and
recompiled, never served; a failed write means this compile is not cached.
Errors of the compile itself (``compile_fn`` raising or returning something
that is not a NEFF) and lock timeouts are the caller's and propagate.

:func:`neff_cache` and :func:`hlo_cache` return process-wide instances built
from the configuration at call time.

Shared mounts (one TORCH_NEURONX_NEFF_CACHE_DIR, several nodes each with its own
local lock dir): the per-key lock only serializes the processes of one node, so
each node compiles a key at most once; two nodes may compile the same key at
the same time, and both atomically rename an equally valid entry into place
(the last one wins; readers see one whole file or the other). We chose not to
add a cross-node lock file in the shared dir: O_EXCL and stale-holder detection
are unreliable across NFS/Lustre clients (pids mean nothing on another host,
clocks drift), and a holder that died would stall every node until a timeout,
whereas a duplicate compile per node only costs time.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from torch_neuronx import config, observe
from torch_neuronx.cache import atomic, explain, layout, locks, stats
from torch_neuronx.cache.keys import CacheKey
from torch_neuronx.format import neff

_log = logging.getLogger("torch_neuronx.cache")

MEMORY_ENTRIES = 64  # NEFFs kept mapped in memory per process, most recently used


_CACHE_NAMES = {"hlo": "HLO cache (TORCH_NEURONX_HLO_CACHE_DIR)",
                "trace": "NKI trace cache (NKI_TRACE_CACHE_URL)"}


class _IoWarnings:
    """Warn once per (operation, errno) and stay quiet after, so a read-only cache does not flood logs.

    ``cache`` names the cache in the message (``NEFF cache``, ``HLO cache``) with the variable
    that places it, so the user knows which setting to fix.
    """

    def __init__(self, cache: str, outcome: str = "continuing without caching it") -> None:
        self._cache = cache
        self._outcome = outcome
        self._seen: set[tuple[str, int | None]] = set()

    def __call__(self, what: str, path: str, exc: OSError) -> None:
        seen = (what, exc.errno)
        level = logging.DEBUG if seen in self._seen else logging.WARNING
        self._seen.add(seen)
        _log.log(level, "%s: cannot %s %s (%s); %s", self._cache, what, path, exc, self._outcome)


class NeffCache:
    """A content-addressed NEFF cache rooted at ``root``, locking in ``lock_dir``.

    ``enabled`` and ``lock_timeout`` default to the configuration read at each
    call (TORCH_NEURONX_NEFF_DISABLE_CACHE, TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT).
    ``stats`` counts this instance's hits, misses, compiles, corrupt entries,
    lock waits and I/O errors and persists them under ``root/.stats``.
    """

    def __init__(self, root: str, lock_dir: str | None = None, *, memory_entries: int = MEMORY_ENTRIES,
                 enabled: bool | None = None, lock_timeout: float | None = None):
        self.root = root
        self.lock_dir = lock_dir or locks.lock_dir()
        self.memory_entries = memory_entries
        self._enabled = enabled
        self._lock_timeout = lock_timeout
        self._memory: collections.OrderedDict[str, neff.Neff] = collections.OrderedDict()
        self._memory_lock = threading.Lock()
        self.stats = stats.Stats(root, "neff")
        self.misses = explain.MissLog(root)
        self._warn_io = _IoWarnings("NEFF cache (TORCH_NEURONX_NEFF_CACHE_DIR)")
        self._warn_lock = _IoWarnings("NEFF compile locks (TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR)",
                                      "compiling without the lock: another process may compile it too")

    @property
    def enabled(self) -> bool:
        """Whether the persistent cache is used (TORCH_NEURONX_NEFF_DISABLE_CACHE unset)."""
        if self._enabled is not None:
            return self._enabled
        return not config.get("TORCH_NEURONX_NEFF_DISABLE_CACHE")

    def path(self, key: CacheKey) -> str:
        """Where ``key``'s entry lives (whether or not it exists)."""
        return layout.entry_path(self.root, key.digest)

    # -- memory --------------------------------------------------------------

    def _memory_get(self, digest: str) -> neff.Neff | None:
        with self._memory_lock:
            found = self._memory.get(digest)
            if found is not None:
                self._memory.move_to_end(digest)
            return found

    def _memory_put(self, digest: str, neff_obj: neff.Neff) -> None:
        with self._memory_lock:
            self._memory[digest] = neff_obj
            self._memory.move_to_end(digest)
            while len(self._memory) > self.memory_entries:
                self._memory.popitem(last=False)
                self.stats.incr("evictions")

    def forget(self) -> None:
        """Drop the in-memory entries (the disk entries stay)."""
        with self._memory_lock:
            self._memory.clear()

    # -- disk ----------------------------------------------------------------

    def _load(self, key: CacheKey) -> neff.Neff | None:
        """The verified entry on disk; a corrupt one is removed and counted."""
        path = self.path(key)
        try:
            status = os.stat(path)
            inode = status.st_ino
            neff_obj = neff.load(path)
            if neff_obj.header.key != key.digest:  # a valid NEFF of another entry, copied over this one
                raise neff.NeffFormatError(f"it holds the NEFF of key {neff_obj.header.key[:16]}..., not this key")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except neff.NeffFormatError as exc:
            _log.warning("NEFF cache entry %s of %s is corrupt (%s); removing it and recompiling",
                         path, key.label(), exc)
            self.stats.incr("corrupt")
            layout.remove_entry(self.root, key.digest, expected_inode=inode)
            return None
        except OSError as exc:
            self._io_error("read", path, exc)
            return None
        self.stats.incr("bytes_read", status.st_size)  # the whole file, as bytes_written counts it
        # Mark the use for `prune` (which evicts by access time) even on noatime mounts.
        with contextlib.suppress(OSError):
            os.utime(path, (time.time(), os.stat(path).st_mtime))
        return neff_obj

    def _lookup(self, key: CacheKey) -> neff.Neff | None:
        with observe.stage("cache.get", cache="neff", key=key.digest):
            return self._lookup_tiers(key)

    def _lookup_tiers(self, key: CacheKey) -> neff.Neff | None:
        found = self._memory_get(key.digest)
        if found is not None:
            self.stats.incr("hits_memory")
            return found
        found = self._load(key)
        if found is not None:
            self.stats.incr("hits_disk")
            self._memory_put(key.digest, found)
        return found

    def get(self, key: CacheKey) -> neff.Neff | None:
        """The verified NEFF of ``key`` from memory or disk, or None (counted as a miss)."""
        if not self.enabled:
            return None
        found = self._lookup(key)
        if found is None:
            self.stats.incr("misses")
        return found

    def _write(self, key: CacheKey, data: bytes) -> str | None:
        path = self.path(key)
        sidecar = {"digest": key.digest, "kind": key.kind, "graph_id": key.graph_id,
                   "components": key.components, "details": key.details, "created": time.time(),
                   "size": len(data), "pid": os.getpid(), "host": socket.gethostname()}
        try:
            atomic.write_atomic(path, data)
        except OSError as exc:
            self._io_error("write", path, exc)
            return None
        self.stats.incr("bytes_written", len(data))
        try:  # the sidecar and index only serve listings and explanations
            atomic.write_atomic(layout.sidecar_path(self.root, key.digest),
                                json.dumps(sidecar, sort_keys=True).encode(), durable=False)
            explain.index(self.root, key)
        except OSError as exc:
            self._io_error("write the sidecar of", path, exc)
        return path

    def put(self, key: CacheKey, data: bytes) -> str | None:
        """Store a complete NEFF container under ``key``; its path, or None when not written.

        Raises NeffFormatError when ``data`` is not a valid NEFF (nothing is stored).
        """
        neff_obj = neff.decode(data)
        if not self.enabled:
            return None
        path = self._write(key, data)
        if path is not None:
            self._memory_put(key.digest, dataclasses.replace(neff_obj, path=path))
        return path

    def _io_error(self, what: str, path: str, exc: OSError) -> None:
        self.stats.incr("io_errors")
        self._warn_io(what, path, exc)

    # -- the compile path ----------------------------------------------------

    def get_or_compile(self, key: CacheKey, compile_fn: Callable[[], bytes]) -> neff.Neff:
        """The NEFF of ``key``, compiling it with ``compile_fn`` (returning NEFF bytes) on a miss.

        Order: memory, disk, then the key's lock, disk again (another process
        may have compiled it meanwhile), ``compile_fn()``, atomic store. With
        the cache disabled, compiles every time, writes nothing, takes no lock.
        Raises LockTimeoutError when the lock wait runs out, and whatever
        ``compile_fn`` raises; NeffFormatError when it returns an invalid NEFF.
        """
        if not self.enabled:
            self.stats.incr("compiles", persist=False)
            return neff.decode(compile_fn())
        found = self._lookup(key)
        if found is not None:
            return found
        with contextlib.ExitStack() as stack:
            try:
                with observe.stage("cache.lock_wait", cache="neff", key=key.digest):
                    state = stack.enter_context(
                        locks.key_lock(key.digest, self._lock_timeout, directory=self.lock_dir))
            except locks.LockTimeoutError:
                raise
            except OSError as exc:
                self.stats.incr("io_errors")
                self._warn_lock("take the compile lock of", f"{key.label()} in {self.lock_dir}", exc)
                state = None
            if state is not None and state.contended:
                self.stats.incr("lock_waits")
            found = self._lookup(key)
            if found is not None:
                return found
            self._record_miss(key)
            data = compile_fn()
            self.stats.incr("compiles")
            neff_obj = neff.decode(data)
            with observe.stage("cache.put", cache="neff", key=key.digest):
                path = self._write(key, data)
            neff_obj = dataclasses.replace(neff_obj, path=path)
            self._memory_put(key.digest, neff_obj)
            return neff_obj

    def _record_miss(self, key: CacheKey) -> None:
        self.stats.incr("misses")
        try:
            message, differs = explain.explain(self.root, key)
        except OSError as exc:  # explanations must never stop a compile
            message, differs = f"cache miss for {key.label()}: cannot explain ({exc})", []
        _log.info("%s", message)
        self.misses.add(key, message, differs)


class HloCache:
    """Lowered HLO text keyed by a string (the dispatch key or graph key), on disk under ``root``.

    Files are ``ab/cd/<sha256(key)>.hlo``: a JSON header line (the key, the
    text's length and SHA-256) and the text. Reads verify key and checksum; a
    corrupt file is removed and counted; I/O errors become warnings.
    """

    def __init__(self, root: str, kind: str = "hlo"):
        self.root = root
        self.kind = kind
        self.stats = stats.Stats(None, kind)
        self._warn_io = _IoWarnings(_CACHE_NAMES.get(kind, f"{kind} cache"))

    def path(self, key: str) -> str:
        """Where the text of ``key`` lives."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        return os.path.join(self.root, digest[:2], digest[2:4], digest + ".hlo")

    def get(self, key: str, counted: bool = True) -> str | None:
        """The cached text of ``key``, or None. ``counted=False``: a probe (does an entry exist?),
        which the statistics do not count as a hit or a miss (a warm run reported misses)."""
        with observe.stage("cache.get", cache=self.kind):
            return self._get(key, counted)

    def _get(self, key: str, counted: bool = True) -> str | None:
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if counted:
                self.stats.incr("misses")
            return None
        except OSError as exc:
            self.stats.incr("io_errors")
            self._warn_io("read", path, exc)
            return None
        head, _, body = data.partition(b"\n")
        try:
            header = json.loads(head)
            valid = (header["key"] == key and header["length"] == len(body)
                     and header["sha256"] == hashlib.sha256(body).hexdigest())
            text = body.decode("utf-8") if valid else None
        except (ValueError, KeyError, TypeError):
            text = None
        if text is None:
            _log.warning("HLO cache entry %s is corrupt; removing it", path)
            self.stats.incr("corrupt")
            atomic.remove_quietly(path)
            return None
        if counted:
            self.stats.incr("bytes_read", len(data))
            self.stats.incr("hits_disk")
        return text

    def put(self, key: str, text: str) -> str | None:
        """Store ``text`` under ``key`` atomically; its path, or None when it could not be written."""
        with observe.stage("cache.put", cache=self.kind):
            return self._put(key, text)

    def _put(self, key: str, text: str) -> str | None:
        body = text.encode("utf-8")
        header = {"key": key, "length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        path = self.path(key)
        try:
            data = json.dumps(header).encode() + b"\n" + body
            atomic.write_atomic(path, data)
        except OSError as exc:
            self.stats.incr("io_errors")
            self._warn_io("write", path, exc)
            return None
        self.stats.incr("bytes_written", len(data))
        self.stats.incr("compiles")  # an entry produced on a miss (a lowering) and stored
        return path


_factory_lock = threading.Lock()
_neff_cache: NeffCache | None = None
_hlo_cache: HloCache | None = None


def neff_cache_dir() -> str:
    """The configured NEFF cache directory (TORCH_NEURONX_NEFF_CACHE_DIR), read now."""
    return config.get("TORCH_NEURONX_NEFF_CACHE_DIR")


def hlo_cache_dir() -> str:
    """The configured HLO cache directory (TORCH_NEURONX_HLO_CACHE_DIR), read now."""
    return config.get("TORCH_NEURONX_HLO_CACHE_DIR")


def neff_cache() -> NeffCache:
    """The process-wide NEFF cache for the configured directories (re-created when they change)."""
    global _neff_cache
    root, lock_dir = neff_cache_dir(), locks.lock_dir()
    with _factory_lock:
        if _neff_cache is None or (_neff_cache.root, _neff_cache.lock_dir) != (root, lock_dir):
            _neff_cache = NeffCache(root, lock_dir)
        return _neff_cache


def hlo_cache() -> HloCache:
    """The process-wide HLO cache for the configured directory (re-created when it changes)."""
    global _hlo_cache
    root = hlo_cache_dir()
    with _factory_lock:
        if _hlo_cache is None or _hlo_cache.root != root:
            _hlo_cache = HloCache(root)
        return _hlo_cache

