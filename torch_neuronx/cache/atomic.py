"""Atomic file writes: a reader sees the old file or the whole new one, never a part.

Data goes to a temporary file in the destination's directory (same filesystem,
so the rename cannot turn into a copy), is flushed and fsynced, and is renamed
over the destination; then the directory is fsynced so the rename itself
survives a power loss. This holds on shared mounts too, which is what lets
several nodes write the same cache entry without corrupting it.

A writer killed midway leaves a temporary file behind, never a partial entry.
Temporary names start with ``.`` and carry the writer's host and pid, so
listings skip them and :func:`is_stale_temp` can tell abandoned ones.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable

TEMP_MARK = ".tmp-"
STALE_TEMP_AGE = 3600.0  # seconds after which any temporary file counts as abandoned

# Test-only hook, called with (temp_path, final_path) after the data is written
# and fsynced and before the rename. Tests install a function that pauses here
# so they can SIGKILL a writer at the worst moment; production code leaves it None.
before_rename_hook: Callable[[str, str], None] | None = None


def temp_path(path: str) -> str:
    """A fresh temporary name next to ``path``: ``.<name>.tmp-<host>-<pid>-<random>``."""
    directory, name = os.path.split(path)
    host = socket.gethostname().replace("-", "_")
    return os.path.join(directory, f".{name}{TEMP_MARK}{host}-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable; filesystems that cannot are skipped."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL on some network and special filesystems
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, creating parent directories.

    ``durable=False`` skips the fsyncs, for advisory files (stats, explanations)
    where losing the latest update on a crash is fine but a torn file is not.
    Raises OSError (the temporary file is removed).
    """
    directory = os.path.dirname(path) or "."  # (a bare file name: the working directory)
    os.makedirs(directory, exist_ok=True)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if before_rename_hook is not None:
            before_rename_hook(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    if durable:
        fsync_dir(directory)


def remove_quietly(path: str) -> bool:
    """Remove a file; True when it was removed, False when it was gone or could not be."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, owned by someone else
        return True
    return True


def is_temp(name: str) -> bool:
    """Whether a directory entry is a temporary file of :func:`write_atomic`."""
    return name.startswith(".") and TEMP_MARK in name


def is_stale_temp(path: str, *, max_age: float = STALE_TEMP_AGE) -> bool:
    """Whether a temporary file was abandoned: its writer on this host is dead, or it is old."""
    name = os.path.basename(path)
    if not is_temp(name):
        return False
    with contextlib.suppress(ValueError):
        host, pid, _ = name.rsplit(TEMP_MARK, 1)[1].rsplit("-", 2)
        if host == socket.gethostname().replace("-", "_") and not pid_alive(int(pid)):
            return True
    try:
        return time.time() - os.stat(path).st_mtime > max_age
    except OSError:
        return False
