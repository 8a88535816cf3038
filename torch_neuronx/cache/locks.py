"""Per-key compile locks in TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR.

One lock file per cache key, ``<local dir>/neff_locks/<digest>.lock``, locked
with ``fcntl.flock``: the kernel drops the lock when its holder exits or is
killed, so a crashed compile never wedges the others. The lock directory must
be on a local POSIX filesystem because flock over NFS/Lustre is unreliable;
processes on other nodes sharing one NEFF cache dir are kept apart only by the
store's atomic renames (each node compiles a key at most once).

The holder writes ``{"pid", "host", "since"}`` into the lock file so that a
waiter that gives up (after TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT seconds) can
say who holds it. The holder unlinks the file before releasing it, so lock
files do not pile up; a waiter that then wins the lock of an unlinked file
notices (the inode at the path changed) and tries again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

from torch_neuronx import config

_SAFE_NAME = re.compile(r"[0-9A-Za-z_.-]{1,200}")
POLL_INTERVAL = 0.05  # seconds between tries: short next to a compile, cheap for the CPU


class LockTimeoutError(TimeoutError):
    """Waited longer than TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT for a per-key compile lock."""

    def __init__(self, key: str, lock_path: str, holder: dict[str, Any] | None, timeout: float):
        self.key = key
        self.lock_path = lock_path
        self.holder = holder
        self.timeout = timeout
        if holder:
            who = f"pid {holder.get('pid')} on host {holder.get('host')}"
        else:
            who = "an unknown holder (pid not written yet)"
        super().__init__(
            f"timed out after {timeout:g} s waiting for the compile lock of cache key {key} "
            f"(lock file {lock_path}, held by {who}). Another process is still compiling this "
            "graph: wait for it, raise TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT, or if that process is "
            "stuck, stop it."
        )


@dataclasses.dataclass(frozen=True)
class LockState:
    """What acquiring a lock took: its file, whether another process held it, and how long we waited."""

    path: str
    contended: bool
    waited: float


def lock_dir() -> str:
    """The configured local lock directory (TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR), read now."""
    return config.get("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR")


def lock_path(digest: str, directory: str | None = None) -> str:
    """The lock file of ``digest``; the digest must be a plain file name (no path separators)."""
    if not _SAFE_NAME.fullmatch(digest):
        raise ValueError(f"cache key {digest!r} cannot name a lock file")
    return os.path.join(directory or lock_dir(), "neff_locks", f"{digest}.lock")


def read_holder(path: str) -> dict[str, Any] | None:
    """The pid/host a lock file names, or None when it is empty, gone or being written."""
    try:
        with open(path, "rb") as f:
            holder = json.loads(f.read() or b"null")
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _try_acquire(path: str) -> int | None:
    """An fd holding the lock of ``path``, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    try:
        same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same = False
    if not same:  # the previous holder unlinked this file while we waited: retry on the new one
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def key_lock(digest: str, timeout: float | None = None, *, directory: str | None = None,
             poll_interval: float = POLL_INTERVAL) -> Iterator[LockState]:
    """Hold the compile lock of one cache key for the duration of the block.

    ``timeout`` defaults to TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT (seconds, read
    now); 0 means a single try. Raises :class:`LockTimeoutError` naming the key,
    the lock file and the holder's pid when the wait runs out. Raises OSError
    when the lock directory cannot be created or written.
    """
    if timeout is None:
        timeout = config.get("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT")
    path = lock_path(digest, directory)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    start = time.monotonic()
    contended = False
    while True:
        fd = _try_acquire(path)
        if fd is not None:
            break
        contended = True
        if time.monotonic() - start >= timeout:
            raise LockTimeoutError(digest, path, read_holder(path), timeout)
        time.sleep(poll_interval)
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        with contextlib.suppress(OSError):  # a full disk must not cost us a lock we hold
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield LockState(path, contended, time.monotonic() - start)
    finally:
        # Unlink while still holding the lock (see the module docstring), then release.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
