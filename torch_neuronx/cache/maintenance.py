"""Cache upkeep behind the CLI: verify, prune, clear.

All of these are safe while other processes use the cache: removing an entry
that a process has already mapped does not disturb it (POSIX keeps the file
until it is closed), and a process that finds the entry gone recompiles it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time

from torch_neuronx.cache import atomic, layout
from torch_neuronx.format import neff


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify` found: checked entries, bad ones (entry, why), and what was repaired."""

    checked: int = 0
    bad: list[tuple[layout.Entry, str]] = dataclasses.field(default_factory=list)
    removed: int = 0
    leftovers: list[str] = dataclasses.field(default_factory=list)  # abandoned temps, orphan sidecars
    leftovers_removed: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing bad remains (everything bad was repaired)."""
        return len(self.bad) == self.removed and len(self.leftovers) == self.leftovers_removed


def _leftovers(root: str) -> list[str]:
    found = []
    for path in layout.iter_orphans(root):
        if not atomic.is_temp(os.path.basename(path)) or atomic.is_stale_temp(path):
            found.append(path)
    return found


def verify(root: str, *, repair: bool = False) -> VerifyReport:
    """Check every entry's NEFF checksum; with ``repair``, remove bad entries and leftovers.

    Temporary files of live writers are left alone; abandoned ones and sidecars
    without an entry count as leftovers.
    """
    report = VerifyReport()
    for entry in layout.iter_entries(root):
        report.checked += 1
        try:
            inode = os.stat(entry.path).st_ino
            found = neff.load(entry.path)
            if found.header.key != entry.digest:  # a valid NEFF of another entry, copied over this one
                raise neff.NeffFormatError(f"it holds the NEFF of key {found.header.key[:16]}..., "
                                           f"not {entry.digest[:16]}...")
        except FileNotFoundError:  # removed meanwhile by another process
            report.checked -= 1
            continue
        except neff.NeffFormatError as exc:
            report.bad.append((entry, str(exc)))
            if repair and layout.remove_entry(root, entry.digest, expected_inode=inode):
                report.removed += 1
        except OSError as exc:  # unreadable: reported, not removed (it may be a permission problem)
            report.bad.append((entry, f"cannot read it: {exc}"))
        else:  # reading is not using: keep the access time that `prune` goes by
            with contextlib.suppress(OSError):
                os.utime(entry.path, (entry.atime, entry.mtime))
    report.leftovers = _leftovers(root)
    if repair:
        report.leftovers_removed = sum(atomic.remove_quietly(p) for p in report.leftovers)
    return report


def prune(root: str, *, max_bytes: int | None = None, older_than: float | None = None,
          now: float | None = None) -> list[layout.Entry]:
    """Evict entries not used for ``older_than`` seconds, then the least recently used ones
    until the entries total at most ``max_bytes``. Returns the removed entries.

    "Used" is the access time, which the store sets on every disk hit.
    Abandoned temporary files are removed as well.
    """
    now = time.time() if now is None else now
    entries = sorted(layout.iter_entries(root), key=lambda e: e.atime)
    removed: list[layout.Entry] = []
    kept: list[layout.Entry] = []
    for entry in entries:
        if older_than is not None and now - entry.atime > older_than:
            if layout.remove_entry(root, entry.digest):
                removed.append(entry)
        else:
            kept.append(entry)
    if max_bytes is not None:
        total = sum(e.size for e in kept)
        for entry in kept:
            if total <= max_bytes:
                break
            if layout.remove_entry(root, entry.digest):
                removed.append(entry)
            total -= entry.size
    for path in _leftovers(root):
        atomic.remove_quietly(path)
    return removed


def clear(root: str) -> tuple[int, int]:
    """Remove every entry, sidecar, index, statistic and explanation; (entries, bytes) removed."""
    count = size = 0
    for entry in layout.iter_entries(root):
        if layout.remove_entry(root, entry.digest):
            count += 1
            size += entry.size
    for path in layout.iter_orphans(root):
        atomic.remove_quietly(path)
    for name in (layout.INDEX_DIR, layout.STATS_DIR, layout.EXPLAIN_DIR):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    # Empty shard directories go too; ones another process is writing into stay.
    with contextlib.suppress(OSError):
        for first in os.listdir(root):
            outer = os.path.join(root, first)
            if len(first) != 2 or not os.path.isdir(outer):
                continue
            for second in os.listdir(outer):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(outer, second))
            with contextlib.suppress(OSError):
                os.rmdir(outer)
    return count, size


def clear_hlo(root: str) -> int:
    """Remove every HLO cache file under ``root``; the number removed."""
    count = 0
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".hlo"):
                count += atomic.remove_quietly(path)
            elif atomic.is_temp(name):
                atomic.remove_quietly(path)
    return count
