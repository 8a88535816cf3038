"""Where things live in a NEFF cache directory.

::

    <root>/ab/cd/<digest>.neff     the entry: a complete NEFF container
    <root>/ab/cd/<digest>.json     its sidecar: key components, graph id, created, size
    <root>/.graphs/<group>/<digest>  empty markers: the entries of one graph (for explanations)
    <root>/.stats/<proc>.json      per-process counters (see stats.py)
    <root>/.explain/<proc>.json    per-process miss explanations (see explain.py)

Two levels of two-hex-digit shards keep directories small on shared
filesystems. Names starting with ``.`` are never entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from torch_neuronx.cache import atomic

ENTRY_SUFFIX = ".neff"
SIDECAR_SUFFIX = ".json"
INDEX_DIR = ".graphs"
STATS_DIR = ".stats"
EXPLAIN_DIR = ".explain"
_DIGEST = re.compile(r"[0-9a-f]{16,128}")
_SHARD = re.compile(r"[0-9a-f]{2}")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One cache entry on disk, as a listing sees it."""

    digest: str
    path: str
    size: int
    atime: float
    mtime: float


def check_digest(digest: str) -> str:
    """``digest`` if it is a lowercase hex digest; ValueError otherwise (no path tricks)."""
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f"{digest!r} is not a cache key digest (lowercase hex)")
    return digest


def shard_dir(root: str, digest: str) -> str:
    """The directory holding ``digest``'s files."""
    check_digest(digest)
    return os.path.join(root, digest[:2], digest[2:4])


def entry_path(root: str, digest: str) -> str:
    """The NEFF file of ``digest``."""
    return os.path.join(shard_dir(root, digest), digest + ENTRY_SUFFIX)


def sidecar_path(root: str, digest: str) -> str:
    """The JSON sidecar of ``digest``."""
    return os.path.join(shard_dir(root, digest), digest + SIDECAR_SUFFIX)


def group_dir(root: str, group: str) -> str:
    """The index directory listing the entries of one graph group."""
    return os.path.join(root, INDEX_DIR, hashlib.sha256(group.encode()).hexdigest()[:32])


def read_sidecar(root: str, digest: str) -> dict[str, Any] | None:
    """The sidecar of ``digest``, or None when missing or unreadable."""
    try:
        with open(sidecar_path(root, digest), "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _shard_dirs(root: str) -> Iterator[str]:
    with contextlib.suppress(OSError):
        for first in sorted(os.listdir(root)):
            if not _SHARD.fullmatch(first):
                continue
            with contextlib.suppress(OSError):
                for second in sorted(os.listdir(os.path.join(root, first))):
                    if _SHARD.fullmatch(second):
                        yield os.path.join(root, first, second)


def iter_entries(root: str) -> Iterator[Entry]:
    """Every entry under ``root`` (files vanishing meanwhile are skipped)."""
    for directory in _shard_dirs(root):
        with contextlib.suppress(OSError), os.scandir(directory) as it:
            for item in it:
                if not item.name.endswith(ENTRY_SUFFIX) or item.name.startswith("."):
                    continue
                digest = item.name[: -len(ENTRY_SUFFIX)]
                if not _DIGEST.fullmatch(digest):
                    continue
                try:
                    st = item.stat()
                except OSError:
                    continue
                yield Entry(digest, item.path, st.st_size, st.st_atime, st.st_mtime)


def iter_orphans(root: str) -> Iterator[str]:
    """Sidecars without an entry and temporary files, in the shard directories."""
    for directory in _shard_dirs(root):
        with contextlib.suppress(OSError), os.scandir(directory) as it:
            for item in it:
                if atomic.is_temp(item.name):
                    yield item.path
                elif item.name.endswith(SIDECAR_SUFFIX):
                    digest = item.name[: -len(SIDECAR_SUFFIX)]
                    if not os.path.exists(os.path.join(directory, digest + ENTRY_SUFFIX)):
                        yield item.path


def remove_entry(root: str, digest: str, *, expected_inode: int | None = None) -> bool:
    """Remove an entry and its sidecar; True when the entry file was removed.

    With ``expected_inode``, only the file we judged is removed: if another
    process has meanwhile renamed a fresh entry into place, it stays.
    """
    path = entry_path(root, digest)
    if expected_inode is not None:
        try:
            if os.stat(path).st_ino != expected_inode:
                return False
        except OSError:
            return False
    removed = atomic.remove_quietly(path)
    atomic.remove_quietly(sidecar_path(root, digest))
    return removed
