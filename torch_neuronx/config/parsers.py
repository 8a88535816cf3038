"""Typed parsers for raw environment strings.

Each ``parse_*`` function turns the raw string of one environment variable into its
typed value, or raises :class:`ConfigValueError` saying what is accepted; the registry
then logs one warning and uses the variable's default.
"""

from __future__ import annotations

import os

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


def parse_device_list(raw: str) -> tuple[int, ...]:
    """Parse visible devices: a count (``4``) or indices and ranges (``0,2``, ``0-3``); empty: none given."""
    text = raw.strip()
    if not text:
        return ()
    if text.isdigit() and "," not in text:
        count = int(text)
        if count < 1:
            raise ConfigValueError("a device count must be at least 1")
        return tuple(range(count))
    indices: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ConfigValueError("expected a count, or comma-separated indices and ranges like 0,2-3")
        span = range(int(first), int(last if dash else first) + 1)
        if not span:
            raise ConfigValueError(f"empty range {part.strip()!r}")
        indices.extend(span)
    if len(set(indices)) != len(indices):
        raise ConfigValueError("a device is listed twice")
    return tuple(indices)


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


def parse_index_ranges(raw: str) -> tuple[int, ...]:
    """Parse indices and ranges (``0,1,2-5``): sorted, each once; empty means none.

    Unlike :func:`parse_device_list`, a lone number is an index, never a count
    (TORCH_NEURONX_PROFILE_RANKS, TORCH_NEURONX_PROFILE_CAPTURE_NC).
    """
    indices: set[int] = set()
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        first, dash, last = (s.strip() for s in part.partition("-"))
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ConfigValueError("expected comma-separated indices and ranges like 0,1,2-5")
        span = range(int(first), int(last if dash else first) + 1)
        if not span:
            raise ConfigValueError(f"empty range {part!r}")
        indices.update(span)
    return tuple(sorted(indices))
