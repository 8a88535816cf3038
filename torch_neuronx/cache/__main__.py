"""``python -m torch_neuronx.cache``: inspect and maintain the persistent NEFF cache.

Subcommands: ``ls``, ``stats``, ``verify [--repair]``, ``prune --max-bytes N
--older-than D``, ``explain``, ``clear``. The cache directory is
TORCH_NEURONX_NEFF_CACHE_DIR unless ``--dir`` says otherwise. Exit status: 0
on success, 1 when something is wrong (bad entries left, I/O errors), 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from torch_neuronx.cache import explain, layout, maintenance, stats, store

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """Bytes from ``N``, ``N K``/``M``/``G``/``T`` (binary units, optional ``B``/``iB``)."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 1000000, 500M, 2G)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_duration(text: str) -> float:
    """Seconds from ``N`` or ``N`` with a unit: s, m, h, d, w (``7d``, ``12h``, ``30m``, ``3600s``)."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 7d, 12h, 30m, 3600s)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp else "-"


def _listing(root: str) -> list[dict[str, Any]]:
    rows = []
    for entry in layout.iter_entries(root):
        sidecar = layout.read_sidecar(root, entry.digest) or {}
        rows.append({"digest": entry.digest, "size": entry.size, "created": sidecar.get("created"),
                     "last_used": entry.atime, "graph_id": sidecar.get("graph_id", ""),
                     "kind": sidecar.get("kind", ""), "components": sidecar.get("components", {}),
                     "path": entry.path})
    rows.sort(key=lambda r: r["last_used"], reverse=True)
    return rows


def cmd_ls(args: argparse.Namespace) -> int:
    rows = _listing(args.dir)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"NEFF cache {args.dir} is empty")
        return 0
    print(f"{'KEY':<16}  {'SIZE':>10}  {'CREATED':<19}  {'LAST USED':<19}  GRAPH")
    for r in rows:
        print(f"{r['digest'][:16]}  {_human(r['size']):>10}  {_when(r['created']):<19}  "
              f"{_when(r['last_used']):<19}  {r['graph_id'] or '-'}")
    print(f"{len(rows)} entries, {_human(sum(r['size'] for r in rows))} in {args.dir}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    stats.compact(args.dir)
    entries = list(layout.iter_entries(args.dir))
    counts, processes = stats.aggregate(args.dir)
    result = {"dir": args.dir, "entries": len(entries), "bytes": sum(e.size for e in entries),
              "processes": processes, **counts}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    lookups = counts["hits_memory"] + counts["hits_disk"] + counts["misses"]
    rate = f"{100 * (lookups - counts['misses']) / lookups:.1f}%" if lookups else "-"
    print(f"NEFF cache {args.dir}")
    print(f"  entries       {len(entries)} ({_human(result['bytes'])})")
    print(f"  hits          {counts['hits_memory']} in memory, {counts['hits_disk']} on disk "
          f"(hit rate {rate})")
    print(f"  misses        {counts['misses']}")
    print(f"  compiles      {counts['compiles']}")
    print(f"  corrupt       {counts['corrupt']} (removed and recompiled)")
    print(f"  lock waits    {counts['lock_waits']}")
    print(f"  I/O errors    {counts['io_errors']}")
    print(f"  processes     {processes} recorded")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = maintenance.verify(args.dir, repair=args.repair)
    for entry, why in report.bad:
        print(f"BAD  {entry.path}: {why}")
    for path in report.leftovers:
        print(f"LEFTOVER  {path}")
    print(f"checked {report.checked} entries: {report.checked - len(report.bad)} good, "
          f"{len(report.bad)} bad, {len(report.leftovers)} leftover files")
    if args.repair:
        print(f"removed {report.removed} bad entries and {report.leftovers_removed} leftover files")
        return 0 if report.ok else 1
    if report.bad or report.leftovers:
        print("run `python -m torch_neuronx.cache verify --repair` to remove them")
        return 1
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    removed = maintenance.prune(args.dir, max_bytes=args.max_bytes, older_than=args.older_than)
    left = list(layout.iter_entries(args.dir))
    print(f"removed {len(removed)} entries ({_human(sum(e.size for e in removed))}); "
          f"{len(left)} entries ({_human(sum(e.size for e in left))}) remain in {args.dir}")
    now = time.time()
    stuck = [e for e in left if args.older_than is not None and now - e.atime > args.older_than]
    over = args.max_bytes is not None and sum(e.size for e in left) > args.max_bytes
    if stuck or over:
        return _not_removed(args.dir, "prune could not remove the entries it selected")
    return 0


def _not_removed(root: str, what: str) -> int:
    """Say that entries could not be removed (a read-only mount, another user's files); status 1."""
    writable = os.access(root, os.W_OK)
    print(f"error: {what} from {root}" + ("" if writable else " (the directory is not writable)"),
          file=sys.stderr)
    return 1


def cmd_explain(args: argparse.Namespace) -> int:
    records = explain.runs(args.dir, args.runs)
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    if not records:
        print(f"no cache misses recorded in {args.dir} (every lookup hit, or nothing ran with this "
              "cache dir)")
        return 0
    for record in records:
        misses = record.get("misses", [])
        command = " ".join(record.get("argv") or []) or "?"
        print(f"run of pid {record.get('pid')} on {record.get('host')} started "
              f"{_when(record.get('started'))} ({command}): {len(misses)} cache misses")
        for miss in misses:
            print(f"  {miss.get('explanation')}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    count, size = maintenance.clear(args.dir)
    print(f"removed {count} entries ({_human(size)}) from {args.dir}")
    status = 0
    left = sum(1 for _ in layout.iter_entries(args.dir))
    if left:
        status = _not_removed(args.dir, f"{left} entries could not be removed")
    if args.hlo:
        hlo_dir = args.hlo_dir or store.hlo_cache_dir()
        print(f"removed {maintenance.clear_hlo(hlo_dir)} HLO entries from {hlo_dir}")
    return status


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m torch_neuronx.cache``."""
    parser = argparse.ArgumentParser(prog="python -m torch_neuronx.cache",
                                     description="Inspect and maintain the persistent NEFF cache.")
    parser.add_argument("--dir", default=None,
                        help="NEFF cache directory (default: TORCH_NEURONX_NEFF_CACHE_DIR)")
    # Accept --dir after the subcommand too; SUPPRESS keeps it from overwriting the global one.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ls", parents=[common], help="list entries, most recently used first")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_ls)
    p = sub.add_parser("stats", parents=[common], help="entries, bytes and hit/miss/corrupt counters")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_stats)
    p = sub.add_parser("verify", parents=[common], help="check every entry's checksum (exit 1 if bad)")
    p.add_argument("--repair", action="store_true", help="remove bad entries and leftover files")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("prune", parents=[common], help="evict entries by age and/or total size")
    p.add_argument("--max-bytes", type=parse_size, help="keep at most this many bytes (500M, 2G ...)")
    p.add_argument("--older-than", type=parse_duration,
                   help="evict entries not used for this long (7d, 12h, 30m, 3600s)")
    p.set_defaults(func=cmd_prune)
    p = sub.add_parser("explain", parents=[common], help="why the last run's lookups missed")
    p.add_argument("--runs", type=int, default=1, help="how many recent runs to show (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("clear", parents=[common], help="remove every entry and record")
    p.add_argument("--hlo", action="store_true", help="clear the HLO cache too")
    p.add_argument("--hlo-dir", help="HLO cache directory (default: TORCH_NEURONX_HLO_CACHE_DIR)")
    p.set_defaults(func=cmd_clear)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "prune" and args.max_bytes is None and args.older_than is None:
        parser.error("prune needs --max-bytes and/or --older-than")
    args.dir = os.path.abspath(args.dir or store.neff_cache_dir())
    if os.path.exists(args.dir) and not os.path.isdir(args.dir):
        print(f"error: NEFF cache directory {args.dir} is not a directory", file=sys.stderr)
        return 1
    try:
        return args.func(args)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
