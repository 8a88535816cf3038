"""What a Neuron profiling session records: :class:`ProfileMode`, :class:`NeuronConfig`, :class:`Settings`.

A :class:`NeuronConfig` handed to ``torch.profiler.profile(experimental_config=...)`` is a
subclass of torch's ``_ExperimentalConfig`` (it survives into the profiler), and whatever it
sets wins over the environment; what it leaves as None comes from the ``TORCH_NEURONX_PROFILE_*``
variables. :func:`resolve` turns either into the :class:`Settings` a session runs with.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from collections.abc import Iterable
from typing import Any

import torch

from torch_neuronx import config
from torch_neuronx.config import directories
from torch_neuronx.config.parsers import ConfigValueError, IndexRanges, parse_index_ranges

_log = logging.getLogger("torch_neuronx.profiling")


class ProfileMode(enum.Enum):
    """What a session records, each in its own output file."""

    DEVICE = "device"  # per-execution timings of every NEFF, and the NEFFs themselves
    RUNTIME = "runtime"  # every event of the instrumentation layer
    CPU_UTIL = "cpu_util"  # per-CPU and average utilization, once a second
    HOST_MEMORY = "host_memory"  # system and process memory, once a second


VALID_MODES = tuple(m.value for m in ProfileMode)


def parse_modes(modes: str | Iterable[ProfileMode | str], source: str = "TORCH_NEURONX_PROFILE_MODES"
                ) -> frozenset[ProfileMode]:
    """Modes from a comma-separated string or an iterable; an unknown one is ignored with a warning."""
    items = modes.split(",") if isinstance(modes, str) else list(modes)
    chosen: set[ProfileMode] = set()
    for item in items:
        if isinstance(item, ProfileMode):
            chosen.add(item)
            continue
        name = str(item).strip().lower()
        if not name:
            continue
        try:
            chosen.add(ProfileMode(name))
        except ValueError:
            _log.warning("%s: unknown profile mode %r ignored; valid modes are %s",
                         source, item, ", ".join(VALID_MODES))
    return frozenset(chosen)


def _indices(value: str | Iterable[int], source: str, default: IndexRanges) -> IndexRanges:
    if not isinstance(value, str):
        return IndexRanges.of(value)
    try:
        return parse_index_ranges(value)
    except ConfigValueError as exc:
        _log.warning("%s=%r is not valid: %s; using the default %s", source, value, exc, default)
        return default


class NeuronConfig(torch._C._profiler._ExperimentalConfig):
    """TorchNeuron's profiler options, passed as ``torch.profiler.profile(experimental_config=...)``.

    Every option left as None comes from its environment variable: ``modes``
    (TORCH_NEURONX_PROFILE_MODES; ProfileMode values or their names), ``max_events_per_nc``
    (TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC), ``capture_enabled_for_nc`` (``"0,1,2-5"`` or
    indices; TORCH_NEURONX_PROFILE_CAPTURE_NC), ``profile_output_dir``
    (TORCH_NEURONX_PROFILE_OUTPUT_DIR) and ``neff_cache_dir`` (TORCH_NEURONX_NEFF_CACHE_DIR).
    """

    def __init__(self, modes: Iterable[ProfileMode | str] | str | None = None, max_events_per_nc: int | None = None,
                 capture_enabled_for_nc: str | Iterable[int] | None = None, profile_output_dir: str | None = None,
                 neff_cache_dir: str | None = None, **experimental: object) -> None:
        super().__init__(**experimental)
        self.modes = modes
        self.max_events_per_nc = max_events_per_nc
        self.capture_enabled_for_nc = capture_enabled_for_nc
        self.profile_output_dir = profile_output_dir
        self.neff_cache_dir = neff_cache_dir

    def __repr__(self) -> str:
        return (f"NeuronConfig(modes={self.modes!r}, max_events_per_nc={self.max_events_per_nc!r}, "
                f"capture_enabled_for_nc={self.capture_enabled_for_nc!r}, "
                f"profile_output_dir={self.profile_output_dir!r}, neff_cache_dir={self.neff_cache_dir!r})")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The effective options of one session."""

    modes: frozenset[ProfileMode]
    max_events_per_nc: int
    capture_nc: IndexRanges
    output_dir: str
    neff_cache_dir: str

    @property
    def listens(self) -> bool:
        """Whether the session subscribes to the instrumentation layer."""
        return bool(self.modes & {ProfileMode.RUNTIME, ProfileMode.DEVICE})


def _environment_modes() -> frozenset[ProfileMode]:
    """TORCH_NEURONX_PROFILE_MODES; a value naming no valid mode gives a warning and the default
    (as every other variable's bad value does), not a session that records nothing."""
    modes = parse_modes(config.get("TORCH_NEURONX_PROFILE_MODES"))
    if modes:
        return modes
    default = config.var("TORCH_NEURONX_PROFILE_MODES").default_value()
    _log.warning("TORCH_NEURONX_PROFILE_MODES names no valid mode; using the default %s", default)
    return parse_modes(default)


def _max_events(value: Any) -> int:
    """``NeuronConfig(max_events_per_nc=...)`` as the variable takes it: a non-negative integer; any
    other value warns and the variable's value is used (-1 dropped every event, the warning then
    naming a variable the user never set)."""
    if value is not None:
        try:
            number = int(value)
            if number >= 0 and not isinstance(value, bool):
                return number
        except (TypeError, ValueError):
            pass
        _log.warning("NeuronConfig(max_events_per_nc=%r) is not a non-negative integer; using "
                     "TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC", value)
    return int(config.get("TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC"))


def _output_dir(value: str | None) -> str:
    """``NeuronConfig(profile_output_dir=...)``, or, when not given or when it names something that is
    not a directory (a file: the profile was lost at the session's end), the variable's directory."""
    if value and not (os.path.exists(value) and not os.path.isdir(value)):
        return value
    if value:
        _log.warning("NeuronConfig(profile_output_dir=%r) is not a directory; using "
                     "TORCH_NEURONX_PROFILE_OUTPUT_DIR", value)
    return directories.directory("TORCH_NEURONX_PROFILE_OUTPUT_DIR")


def resolve(cfg: NeuronConfig | None = None) -> Settings:
    """The settings of a session: ``cfg``'s options where set, else the environment's."""
    cfg = cfg if cfg is not None else NeuronConfig()
    modes = parse_modes(cfg.modes, "NeuronConfig(modes=...)") if cfg.modes is not None else frozenset()
    if not modes:  # no option, or one naming no valid mode: warned there, and the environment's
        if cfg.modes is not None:
            _log.warning("NeuronConfig(modes=%r) names no valid mode; using TORCH_NEURONX_PROFILE_MODES", cfg.modes)
        modes = _environment_modes()
    env_nc = config.get("TORCH_NEURONX_PROFILE_CAPTURE_NC")
    capture = (_indices(cfg.capture_enabled_for_nc, "NeuronConfig(capture_enabled_for_nc=...)", env_nc)
               if cfg.capture_enabled_for_nc is not None else env_nc)
    return Settings(
        modes=modes,
        max_events_per_nc=_max_events(cfg.max_events_per_nc),
        capture_nc=capture,
        output_dir=_output_dir(cfg.profile_output_dir),
        neff_cache_dir=cfg.neff_cache_dir or config.get("TORCH_NEURONX_NEFF_CACHE_DIR"),
    )


def captures_this_rank(rank: int) -> bool:
    """Whether global rank ``rank`` is listed in TORCH_NEURONX_PROFILE_RANKS."""
    return rank in config.get("TORCH_NEURONX_PROFILE_RANKS")
