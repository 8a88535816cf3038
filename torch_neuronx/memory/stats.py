"""Allocator statistics, in the key schemes of ``torch.cuda.memory_stats`` and TorchNeuron's.

Each statistic has ``current``, ``peak``, ``allocated`` (sum of increases) and
``freed`` (sum of decreases), kept for the small pool, the large pool and
``all``. The allocator updates :class:`Stat` fields inline on its hot path;
this module turns them into dictionaries and the text of ``memory_summary``.

``torch.cuda`` names them flat (``"allocated_bytes.all.current"``); TorchNeuron
nests them (``stats["allocated_bytes"]["current"]``, the ``all`` pool).
:func:`with_nested` gives one dictionary that answers both.
"""

from __future__ import annotations

import collections
from typing import Any

POOL_STAT_NAMES = (
    "allocation", "segment", "active", "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
)
POOL_NAMES = ("all", "small_pool", "large_pool")
STAT_FIELDS = ("current", "peak", "allocated", "freed")


class Stat:
    """One statistic. ``allocated`` is derived so increases cost one field update fewer."""

    __slots__ = ("current", "peak", "freed", "base")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.freed = 0  # sum of decreases since the last accumulated-stats reset
        self.base = 0  # `current` at that reset

    def add(self, amount: int) -> None:
        """Apply a signed change (the cold paths; the hot path inlines this)."""
        if amount >= 0:
            self.current += amount
            if self.current > self.peak:
                self.peak = self.current
        else:
            self.current += amount
            self.freed -= amount

    @property
    def allocated(self) -> int:
        """Sum of increases since the last accumulated-stats reset."""
        return self.current + self.freed - self.base

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.freed = 0
        self.base = self.current

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak,
                "allocated": self.allocated, "freed": self.freed}


class ActiveStat:
    """``active``/``active_bytes``: allocated plus freed-but-pending-on-streams, derived.

    Active memory differs from allocated memory only while freed blocks wait
    for other streams (``record_stream``), so the hot path updates only the
    allocated statistic and this one adds ``pending`` at read time. Its peak
    needs tracking only while something is pending: otherwise active equals
    allocated, whose own peak already bounds it.
    """

    __slots__ = ("of", "pending", "tracked_peak", "base")

    def __init__(self, of: Stat) -> None:
        self.of = of  # the allocated statistic (allocation or allocated_bytes)
        self.pending = Stat()  # freed by the user, still in use by a stream
        self.tracked_peak = 0
        self.base = 0  # `current` at the last accumulated-stats reset

    @property
    def current(self) -> int:
        return self.of.current + self.pending.current

    @property
    def peak(self) -> int:
        return max(self.tracked_peak, self.of.peak)

    @property
    def allocated(self) -> int:
        return self.of.allocated  # active grows exactly when allocated does

    @property
    def freed(self) -> int:
        return self.allocated - (self.current - self.base)

    def note_peak(self) -> None:
        """Called after an increase while some freed block is pending."""
        if self.current > self.tracked_peak:
            self.tracked_peak = self.current

    def reset_peak(self) -> None:
        self.tracked_peak = self.current

    def reset_accumulated(self) -> None:
        self.base = self.current

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak,
                "allocated": self.allocated, "freed": self.freed}


class PoolStats:
    """The statistics of one pool (or of ``all``)."""

    __slots__ = POOL_STAT_NAMES

    def __init__(self) -> None:
        for name in POOL_STAT_NAMES:
            if name not in ("active", "active_bytes"):
                setattr(self, name, Stat())
        self.active = ActiveStat(self.allocation)
        self.active_bytes = ActiveStat(self.allocated_bytes)

    def stats(self) -> list[Stat | ActiveStat]:
        return [getattr(self, name) for name in POOL_STAT_NAMES]


class AllocatorStats:
    """Everything ``memory_stats`` reports for one device."""

    def __init__(self) -> None:
        self.all = PoolStats()
        self.small_pool = PoolStats()
        self.large_pool = PoolStats()
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.pinned_bytes = Stat()  # segment bytes page-locked (TORCH_NEURONX_USE_PINNED_MALLOC)
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_sync_all_streams = 0

    def _every_stat(self) -> list[Stat | ActiveStat]:
        return (self.all.stats() + self.small_pool.stats() + self.large_pool.stats()
                + [self.oversize_allocations, self.oversize_segments, self.pinned_bytes])

    def reset_peak(self) -> None:
        """Peaks restart from the current values (``reset_peak_memory_stats``)."""
        for stat in self._every_stat():
            stat.reset_peak()

    def reset_accumulated(self) -> None:
        """``allocated``/``freed`` sums and event counters restart from zero."""
        for stat in self._every_stat():
            stat.reset_accumulated()
        self.num_alloc_retries = self.num_ooms = 0
        self.num_device_alloc = self.num_device_free = self.num_sync_all_streams = 0

    def as_dict(self, max_split_size: int) -> collections.OrderedDict[str, Any]:
        """The flat, sorted dictionary ``torch.cuda.memory_stats`` returns."""
        flat: dict[str, Any] = {}
        for pool_name in POOL_NAMES:
            pool = getattr(self, pool_name)
            for name in POOL_STAT_NAMES:
                for field, value in getattr(pool, name).as_dict().items():
                    flat[f"{name}.{pool_name}.{field}"] = value
        for name in ("oversize_allocations", "oversize_segments", "pinned_bytes"):
            for field, value in getattr(self, name).as_dict().items():
                flat[f"{name}.{field}"] = value
        flat["num_alloc_retries"] = self.num_alloc_retries
        flat["num_ooms"] = self.num_ooms
        flat["num_device_alloc"] = self.num_device_alloc
        flat["num_device_free"] = self.num_device_free
        flat["num_sync_all_streams"] = self.num_sync_all_streams
        flat["max_split_size"] = -1 if max_split_size >= 2**64 - 1 else max_split_size
        return collections.OrderedDict(sorted(flat.items()))


def with_nested(flat: dict[str, Any]) -> collections.OrderedDict[str, Any]:
    """``flat`` (from :meth:`AllocatorStats.as_dict`) plus TorchNeuron's nested form of each statistic.

    Every statistic also appears under its short name as a dict of its four fields: a pooled one
    for its ``all`` pool (``result["allocated_bytes"]["current"] ==
    result["allocated_bytes.all.current"]``), an unpooled one as it is
    (``result["oversize_segments"]["peak"] == result["oversize_segments.peak"]``). The event
    counters (``num_ooms``, ...) have one key in both forms. Keys are sorted, as
    ``torch.cuda.memory_stats`` sorts its own.
    """
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        prefix, _, field = key.rpartition(".")
        if field not in STAT_FIELDS:
            continue
        name, _, pool = prefix.partition(".")
        if pool in ("", "all"):  # "name.field" (unpooled) or "name.all.field"
            nested.setdefault(name, {})[field] = value
    ordered = {name: {field: fields[field] for field in STAT_FIELDS if field in fields}
               for name, fields in nested.items()}
    return collections.OrderedDict(sorted({**flat, **ordered}.items()))


# -- memory_summary ----------------------------------------------------------


def format_size(nbytes: int) -> str:
    """Bytes in the largest unit that keeps the number below 1024 (torch's summary style)."""
    value = float(nbytes)
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value):6d} {unit}" if unit == "B  " else f"{value:6.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _format_count(count: int) -> str:
    for unit in ("  ", "K ", "M "):
        if abs(count) < 1000 * 1000 or unit == "M ":
            return f"{count:7d} {unit}"
        count //= 1000
    raise AssertionError("unreachable")


_SUMMARY_ROWS = (
    ("allocated_bytes", "Allocated memory", format_size),
    ("active_bytes", "Active memory", format_size),
    ("requested_bytes", "Requested memory", format_size),
    ("reserved_bytes", "Device reserved memory", format_size),
    ("inactive_split_bytes", "Non-releasable memory", format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "Reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
)


def summary(stats: dict[str, Any], device: int, abbreviated: bool = False) -> str:
    """A table of ``stats`` laid out like ``torch.cuda.memory_summary``."""
    rule, thick = "|" + "-" * 75 + "|", "|" + "=" * 75 + "|"
    title = f"torch_neuronx memory summary, device ID {device}"
    ooms = f"Neuron OOMs: {stats['num_ooms']}"
    retries = f"segment alloc retries: {stats['num_alloc_retries']}"
    header = "|".join(f"{name:^12}" for name in ("Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"))
    lines = [thick, f"|{title:^75}|", rule, f"|{ooms:^37}|{retries:^37}|", thick,
             f"|{'Metric':^23}|{header}|", rule]
    pools = (("all", ""),) if abbreviated else (
        ("all", ""), ("large_pool", "      from large pool"), ("small_pool", "      from small pool"))
    for key, title, fmt in _SUMMARY_ROWS:
        for pool, label in pools:
            cells = [fmt(stats[f"{key}.{pool}.{field}"])
                     for field in ("current", "peak", "allocated", "freed")]
            lines.append(f"| {(label or title):<22}|" + "|".join(f" {c} " for c in cells) + "|")
        lines.append(rule)
    for key, title in (("oversize_allocations", "Oversize allocations"),
                       ("oversize_segments", "Oversize segments")):
        cells = [_format_count(stats[f"{key}.{field}"])
                 for field in ("current", "peak", "allocated", "freed")]
        lines.append(f"| {title:<22}|" + "|".join(f" {c} " for c in cells) + "|")
    lines.append(thick)
    return "\n".join(lines) + "\n"


# -- memory_snapshot ---------------------------------------------------------


def block_record(address: int, size: int, requested: int, state: str) -> dict[str, Any]:
    """One block of a snapshot segment, as ``torch.cuda.memory_snapshot`` writes it."""
    return {"address": address, "size": size, "requested_size": requested, "state": state, "frames": []}


def segment_record(device: int, address: int, total_size: int, stream: int, is_small: bool,
                   blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One segment of a snapshot, with its per-state totals."""
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": address, "total_size": total_size,
            "allocated_size": allocated, "active_size": active, "requested_size": requested,
            "stream": stream, "segment_type": "small" if is_small else "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}


# -- out of memory -----------------------------------------------------------


def oom_message(*, device: int, rounded: int, requested: int, segment_size: int, capacity: int,
                reserved: int, allocated: int, largest_free: int, free_cached: int,
                limit: int | None = None) -> str:
    """The message of ``OutOfMemoryError``, modelled on PyTorch's CUDA one.

    ``fragmentation`` is the share of cached free memory outside the largest
    free block: memory that exists but cannot serve one large request.
    """
    def size(nbytes: int) -> str:
        return format_size(nbytes).strip()

    unallocated = reserved - allocated  # cached free blocks and frees pending on streams
    fragmentation = 100.0 * (1 - largest_free / free_cached) if free_cached else 0.0
    return (
        f"Neuron out of memory. Tried to allocate {size(rounded)} ({requested} bytes requested, a "
        f"new {size(segment_size)} segment needed) on neuron:{device}. The device has a total "
        f"capacity of {size(capacity)} ({capacity} bytes) of which {size(max(capacity - reserved, 0))} "
        f"is free. Of the memory the caching allocator reserved, {size(allocated)} is allocated and "
        f"{size(unallocated)} is reserved but unallocated; the largest free block is "
        f"{size(largest_free)}, so {fragmentation:.1f}% of the cached free memory is fragmented. If "
        "reserved but unallocated memory is large, tune TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG to "
        "reduce fragmentation (for example kRoundupPower2Divisions=8, or "
        "kMaxSplitSizeBytes=536870912,kMaxNonSplitRoundingBytes=67108864), and free tensors you no "
        "longer need. The capacity comes from TORCH_NEURONX_DEVICE_MEMORY_BYTES (0 means the host's RAM)."
        + ("" if limit is None else f" This process may reserve {size(limit)} of it "
           f"(torch.neuron.set_per_process_memory_fraction({limit / capacity:.3g})).")
    )
