"""TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG: the segment pool's tuning knobs.

The variable is a comma-separated list of ``key=value`` pairs. Values are raw
non-negative decimal integers (bytes, or a plain count for
``kRoundupPower2Divisions``); size suffixes such as ``1MB`` are rejected.
Unknown keys and invalid values are ignored with a warning and the field keeps
its default, exactly as the specification says, so a typo never stops a
training job. :func:`load` parses the variable once per process, on first
allocator use; each device pool keeps the :class:`AllocatorConfig` it was built
with, so changing the variable later has no effect until restart.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading

from torch_neuronx import config

ENV = "TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG"
SIZE_MAX = 2**64 - 1  # the C++ allocator's size_t maximum: "unlimited"
BLOCK_ALIGNMENT = 64  # every block address is a multiple of this (see kMinRoundedSize)

_log = logging.getLogger("torch_neuronx.memory.allocator_config")

_DIGITS = re.compile(r"[0-9]+")
_SUFFIXED = re.compile(r"\s*[0-9]+(\.[0-9]*)?\s*([kmgtp]i?b?|b)\s*", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """The validated segment-pool knobs, one field per documented key.

    Field names are the specification's keys in snake case; :data:`KEYS` maps
    between the two. ``small_split_threshold`` and ``large_split_threshold``
    default to ``min_rounded_size`` and ``pool_boundary`` (see :func:`parse`).
    """

    pool_boundary: int = 1 << 20
    small_segment_size: int = 2 << 20
    medium_segment_size: int = 64 << 20
    medium_threshold: int = 16 << 20
    segment_alignment: int = 2 << 20
    min_rounded_size: int = 256
    roundup_power2_divisions: int = 4
    small_split_threshold: int = 256
    large_split_threshold: int = 1 << 20
    max_split_size: int = SIZE_MAX
    max_non_split_rounding: int = 20 << 20

    def as_env(self) -> dict[str, int]:
        """The fields under the specification's key names."""
        return {key: getattr(self, field) for key, field in KEYS.items()}


KEYS: dict[str, str] = {
    "kPoolBoundary": "pool_boundary",
    "kSmallSegmentSize": "small_segment_size",
    "kMediumSegmentSize": "medium_segment_size",
    "kMediumThreshold": "medium_threshold",
    "kSegmentAlignment": "segment_alignment",
    "kMinRoundedSize": "min_rounded_size",
    "kRoundupPower2Divisions": "roundup_power2_divisions",
    "kSmallSplitThreshold": "small_split_threshold",
    "kLargeSplitThreshold": "large_split_threshold",
    "kMaxSplitSizeBytes": "max_split_size",
    "kMaxNonSplitRoundingBytes": "max_non_split_rounding",
}
_COUNT_KEYS = frozenset({"kRoundupPower2Divisions"})  # plain integers, not byte counts


def _warn(key: str, value: str, problem: str, kept: int) -> None:
    _log.warning("%s: %s=%r is not valid: %s; keeping the default %d",
                 ENV, key, value, problem, kept)


def _parse_number(key: str, value: str) -> int | str:
    """The integer in ``value``, or why it is not acceptable."""
    what = "a plain non-negative decimal integer" if key in _COUNT_KEYS else \
        "raw bytes as a non-negative decimal integer"
    if _SUFFIXED.fullmatch(value):
        return f"size suffixes are not accepted, expected {what} (for example 1048576 for 1 MB)"
    if not _DIGITS.fullmatch(value):
        return f"expected {what}"
    number = int(value)
    if number > SIZE_MAX:
        return f"expected {what} no larger than {SIZE_MAX} (SIZE_MAX)"
    return number


def _check_field(key: str, number: int) -> str | None:
    """Single-field rules beyond the syntax; returns the problem or None."""
    if key in ("kSmallSegmentSize", "kMediumSegmentSize") and number == 0:
        return "a segment size must be positive"
    if key == "kSegmentAlignment" and (number == 0 or number & (number - 1)):
        return "must be a power of 2 (for example 2097152)"
    if key == "kMinRoundedSize" and (number == 0 or number % BLOCK_ALIGNMENT):
        # Block addresses are sums of rounded sizes: a multiple of 64 keeps them 64-byte aligned.
        return (f"must be a positive multiple of {BLOCK_ALIGNMENT} so that blocks stay "
                f"{BLOCK_ALIGNMENT}-byte aligned")
    if key == "kRoundupPower2Divisions" and not 1 <= number <= 64:
        return "the valid range is [1, 64]"
    return None


def _split_pairs(raw: str) -> list[tuple[str, str]]:
    pairs = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue  # tolerate a trailing comma or empty string
        key, sep, value = item.partition("=")
        if not sep:
            _log.warning("%s: %r is not a key=value pair; ignored (expected key1=value1,key2=value2)",
                         ENV, item)
            continue
        pairs.append((key.strip(), value.strip()))
    return pairs


def parse(raw: str) -> AllocatorConfig:
    """Parse and validate a TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG value.

    Never raises: every problem logs one warning (through the
    ``torch_neuronx.memory`` logger) naming the variable, the key, the bad
    value and what is accepted, and the affected field keeps its default.
    """
    defaults = AllocatorConfig()
    values: dict[str, int] = {}
    for key, value in _split_pairs(raw):
        if key not in KEYS:
            _log.warning("%s: unknown key %r (value %r) ignored; known keys: %s",
                         ENV, key, value, ", ".join(KEYS))
            continue
        default = getattr(defaults, KEYS[key])
        number = _parse_number(key, value)
        if isinstance(number, str):
            _warn(key, value, number, default)
            continue
        problem = _check_field(key, number)
        if problem:
            _warn(key, value, problem, default)
            continue
        values[key] = number
    return _cross_validate(values)


def _cross_validate(values: dict[str, int]) -> AllocatorConfig:
    """Rules between fields, then the dependent defaults."""
    fields = {KEYS[key]: number for key, number in values.items()}
    # The split thresholds follow the knobs they are documented against unless set.
    fields.setdefault("small_split_threshold", fields.get("min_rounded_size", 256))
    fields.setdefault("large_split_threshold", fields.get("pool_boundary", 1 << 20))
    divisions = fields.get("roundup_power2_divisions", 4)
    if divisions & (divisions - 1):
        # PyTorch's scheme shifts by floor(log2(N)): a non-power-of-2 N behaves like the power below it.
        _log.warning("%s: kRoundupPower2Divisions=%d is not a power of 2; rounding uses %d divisions",
                     ENV, divisions, 1 << (divisions.bit_length() - 1))
    medium_segment = fields.get("medium_segment_size", 64 << 20)
    max_split = fields.get("max_split_size", SIZE_MAX)
    if max_split < medium_segment:
        # Below the medium segment size, fresh medium segments could never be carved up.
        _warn("kMaxSplitSizeBytes", str(max_split),
              f"must be at least kMediumSegmentSize ({medium_segment})", SIZE_MAX)
        del fields["max_split_size"]
    return AllocatorConfig(**fields)


_loaded: AllocatorConfig | None = None
_load_lock = threading.Lock()


def load() -> AllocatorConfig:
    """The process's configuration: parsed from the environment on the first call only."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            _loaded = parse(config.get(ENV) or "")
        return _loaded
