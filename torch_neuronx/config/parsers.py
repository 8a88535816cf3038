"""Typed parsers for raw environment strings.

Each ``parse_*`` function turns the raw string of one environment variable into its
typed value, or raises :class:`ConfigValueError` saying what is accepted; the registry
then logs one warning and uses the variable's default.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Iterator

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigValueError(ValueError):
    """A raw environment string that a variable's parser does not accept."""


class InvalidVariableError(ValueError):
    """A variable whose specification accepts nothing but its listed values holds another one.

    Raised where the value is read (not a warning and the default): the message names the
    variable, the value and what is accepted.
    """


def parse_bool(raw: str) -> bool:
    """Parse 0/1/true/false/yes/no/on/off in any case."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigValueError("expected one of 0, 1, true, false, yes, no (any case)")


def parse_strict_01(raw: str) -> bool:
    """Parse a bool that only accepts ``0`` and ``1`` (TORCH_NEURONX_ENABLE_STREAMS)."""
    value = raw.strip()
    if value in ("0", "1"):
        return value == "1"
    raise ConfigValueError("only 0 and 1 are accepted")


def parse_only_one_enables(raw: str) -> bool:
    """When set, only ``1`` enables the feature and any other value disables it."""
    return raw.strip() == "1"


def parse_int(raw: str) -> int:
    """Parse a decimal integer."""
    try:
        return int(raw.strip(), 10)
    except ValueError:
        raise ConfigValueError("expected a decimal integer") from None


def parse_non_negative_int(raw: str) -> int:
    """Parse a non-negative decimal integer."""
    value = parse_int(raw)
    if value < 0:
        raise ConfigValueError("expected a non-negative decimal integer")
    return value


_MAX_SECONDS = 1_000_000  # about 11 days: the system's waits (poll's milliseconds) overflow far above


def parse_seconds(raw: str) -> int:
    """Parse a timeout in whole seconds: a non-negative integer of at most :data:`_MAX_SECONDS`."""
    value = parse_non_negative_int(raw)
    if value > _MAX_SECONDS:
        raise ConfigValueError(f"expected at most {_MAX_SECONDS} seconds")
    return value


def parse_positive_seconds(raw: str) -> int:
    """Parse a time limit in whole seconds: a positive integer of at most :data:`_MAX_SECONDS` (0
    would stop every run at once)."""
    value = parse_seconds(raw)
    if value == 0:
        raise ConfigValueError("expected a positive number of seconds (0 would stop every run at once)")
    return value


_MAX_DEVICES = 128  # torch.device's index is an int8: neuron:0 to neuron:127


def parse_device_list(raw: str) -> tuple[int, ...]:
    """Parse visible devices: a count (``4``) or indices and ranges (``0,2``, ``0-3``); empty: none given."""
    text = raw.strip()
    if not text:
        return ()
    if text.isdigit() and "," not in text:
        count = int(text)
        if count < 1:
            raise ConfigValueError("a device count must be at least 1")
        _at_most_max(count)  # before the indices are built (a huge count)
        return tuple(range(count))
    indices: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ConfigValueError("expected a count, or comma-separated indices and ranges like 0,2-3")
        span = range(int(first), int(last if dash else first) + 1)
        if not span:
            raise ConfigValueError(f"empty range {part.strip()!r}")
        _at_most_max(len(indices) + span.stop - span.start)  # before the indices are built
        indices.extend(span)
    if len(set(indices)) != len(indices):
        raise ConfigValueError("a device is listed twice")
    return tuple(indices)


def _at_most_max(count: int) -> None:
    if count > _MAX_DEVICES:
        raise ConfigValueError(f"at most {_MAX_DEVICES} devices (torch keeps a device index in 8 bits)")


def parse_log_level(raw: str) -> int:
    """Parse 0 (ERROR) .. 3 (DEBUG)."""
    value = parse_int(raw)
    if not 0 <= value <= 3:
        raise ConfigValueError("expected 0 (ERROR), 1 (WARNING), 2 (INFO) or 3 (DEBUG)")
    return value


def parse_str(raw: str) -> str:
    """Keep a string as given."""
    return raw


def parse_path(raw: str) -> str:
    """Expand ``~`` and environment references in a path; reject an empty one."""
    value = raw.strip()
    if not value:
        raise ConfigValueError("expected a non-empty path")
    return os.path.expanduser(os.path.expandvars(value))


def parse_csv(raw: str) -> tuple[str, ...]:
    """Split a comma-separated list, dropping blanks."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


class IndexRanges:
    """A set of non-negative indices kept as sorted, merged ranges (``0-1000000000`` is one pair,
    not a billion integers): membership, length, equality with a tuple of its indices, and its
    indices when there are few (:meth:`describe`)."""

    __slots__ = ("spans",)
    _LISTED = 64  # up to this many indices, :meth:`describe` lists them

    def __init__(self, spans: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[tuple[int, int]] = []
        for start, stop in sorted(spans):  # half-open [start, stop)
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        self.spans = tuple(merged)

    @classmethod
    def of(cls, indices: Iterable[int]) -> IndexRanges:
        """The ranges of explicit ``indices``."""
        return cls((int(i), int(i) + 1) for i in indices)

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        at = bisect.bisect_right(self.spans, (index, float("inf"))) - 1
        return at >= 0 and self.spans[at][0] <= index < self.spans[at][1]

    def __len__(self) -> int:
        return sum(stop - start for start, stop in self.spans)

    def __iter__(self) -> Iterator[int]:
        for start, stop in self.spans:
            yield from range(start, stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IndexRanges):
            return self.spans == other.spans
        if isinstance(other, tuple | list):
            return len(other) == len(self) and self.spans == IndexRanges.of(other).spans
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.spans)

    def __str__(self) -> str:
        return ",".join(str(a) if b == a + 1 else f"{a}-{b - 1}" for a, b in self.spans)

    def __repr__(self) -> str:
        return f"IndexRanges({str(self)!r})"

    def describe(self) -> list[int] | str:
        """The indices as a list when there are few, else the ranges' text (``0-1000000``)."""
        return list(self) if len(self) <= self._LISTED else str(self)


def parse_index_ranges(raw: str) -> IndexRanges:
    """Parse indices and ranges (``0,1,2-5``), kept as ranges; an empty value is an error (the
    caller warns and takes its default).

    Unlike :func:`parse_device_list`, a lone number is an index, never a count
    (TORCH_NEURONX_PROFILE_RANKS, TORCH_NEURONX_PROFILE_CAPTURE_NC).
    """
    spans: list[tuple[int, int]] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        first, dash, last = (s.strip() for s in part.partition("-"))
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ConfigValueError("expected comma-separated indices and ranges like 0,1,2-5")
        start, stop = int(first), int(last if dash else first) + 1
        if stop <= start:
            raise ConfigValueError(f"empty range {part!r}")
        spans.append((start, stop))
    if not spans:
        raise ConfigValueError("no index given")
    return IndexRanges(spans)
