"""``torch.neuron``: the device module, name for name with ``torch.cuda`` where the concept is the same.

On this implementation a NeuronCore is a runtime device of the live target
(the host CPU here): one core per process, as one Trainium worker process sees
its NeuronCore. Memory statistics come from the caching allocator, streams
from :mod:`torch_neuronx.runtime.streams`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from torch_neuronx import memory as _memory
from torch_neuronx import process
from torch_neuronx.device.random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_neuronx.runtime import device as runtime_device
from torch_neuronx.runtime import streams as _streams
from torch_neuronx.runtime.streams import (  # noqa: F401
    Event,
    Stream,
    set_stream,
    stream,
)


def _on_a_visible_device(fn: Any) -> Any:
    """``fn(device=None, ...)`` that first checks ``device`` names a device this process sees, as
    torch.cuda's calls do ("Invalid device argument"): ``memory_allocated(9)`` answered 0."""
    @functools.wraps(fn)
    def checked(device: Any = None, *args: Any, **kwargs: Any) -> Any:
        if device is not None:
            process.checked_device_index(device)
        return fn(device, *args, **kwargs)
    return checked


# Re-exported as torch.neuron.*, each checking its device argument.
max_memory_allocated = _on_a_visible_device(_memory.max_memory_allocated)
max_memory_reserved = _on_a_visible_device(_memory.max_memory_reserved)
mem_get_info = _on_a_visible_device(_memory.mem_get_info)
memory_allocated = _on_a_visible_device(_memory.memory_allocated)
memory_reserved = _on_a_visible_device(_memory.memory_reserved)
memory_snapshot = _on_a_visible_device(_memory.memory_snapshot)
memory_stats = _on_a_visible_device(_memory.memory_stats)
memory_stats_as_nested_dict = _on_a_visible_device(_memory.memory_stats_as_nested_dict)
memory_summary = _on_a_visible_device(_memory.memory_summary)
reset_accumulated_memory_stats = _on_a_visible_device(_memory.reset_accumulated_memory_stats)
reset_peak_memory_stats = _on_a_visible_device(_memory.reset_peak_memory_stats)
empty_cache = _on_a_visible_device(_memory.empty_cache)


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap what the caching allocator of ``device`` may reserve at ``fraction`` of its capacity."""
    if device is not None:
        process.checked_device_index(device)
    _memory.set_per_process_memory_fraction(fraction, device)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The share of ``device``'s capacity its caching allocator may reserve (1.0 unless capped)."""
    if device is not None:
        process.checked_device_index(device)
    return _memory.get_per_process_memory_fraction(device)

current_stream = _on_a_visible_device(_streams.current_stream)
default_stream = _on_a_visible_device(_streams.default_stream)
synchronize = _on_a_visible_device(_streams.synchronize)
caching_allocator_alloc = _memory.caching_allocator_alloc
caching_allocator_delete = _memory.caching_allocator_delete

_initialized = True  # torch.cuda's flag: torch.utils.checkpoint saves a device's RNG state only when it is set


def is_available() -> bool:
    """Whether a neuron device can run work here (the live target's runtime is present)."""
    return True


def device_count() -> int:
    """The number of neuron devices visible to this process (TORCH_NEURONX_VISIBLE_DEVICES; default 1)."""
    return process.device_count()


def current_device() -> int:
    """The index of this thread's current neuron device."""
    return runtime_device.current_index()


def set_device(device: Any) -> None:
    """Select this thread's current neuron device; an index this process does not see is an error."""
    runtime_device.set_current(device)
    if process.current_device():
        from torch_neuronx.device import index_less

        index_less.install()  # "neuron" without an index now names another device than 0


def is_initialized() -> bool:
    """Whether the runtime is up (it starts lazily, on first use)."""
    return True


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype() -> list[Any]:
    """Dtypes autocast may use on neuron."""
    import torch

    return [torch.bfloat16, torch.float16]


def init() -> None:
    """Initialize the runtime (it starts lazily on first use; kept for ``torch.cuda.init`` habits)."""


_lazy_init = init


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether bfloat16 tensors compute on neuron (they do: Trainium's native type)."""
    return True


def is_in_bad_fork() -> bool:
    """Whether this is a forked child whose runtime cannot be used (never here: the host runtime forks)."""
    return False


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``get_device_properties`` reports of one neuron device."""

    name: str
    total_memory: int
    type: str = "neuron"


def get_device_name(device: Any = None) -> str:
    """The name of a neuron device: its target's runtime (the host CPU here)."""
    import platform

    from torch_neuronx.process import device_index

    return f"NeuronCore {device_index(device)} ({platform.machine()} host)"


def get_device_properties(device: Any = None) -> DeviceProperties:
    """The name and total memory (bytes the allocator may hold) of a neuron device."""
    return DeviceProperties(name=get_device_name(device), total_memory=mem_get_info(device)[1])


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """A (major, minor) capability, as ``torch.cuda.get_device_capability``: (0, 0) for the host target."""
    return (0, 0)


class device:
    """Context manager that makes ``device`` the current neuron device, as ``torch.cuda.device``."""

    def __init__(self, device: Any) -> None:
        from torch_neuronx.process import device_index

        self.index = -1 if device is None else device_index(device)
        self.previous = -1

    def __enter__(self) -> None:
        if self.index >= 0:
            self.previous = current_device()
            set_device(self.index)

    def __exit__(self, *exc_info: object) -> None:
        if self.previous >= 0:
            set_device(self.previous)


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (no-op for a non-neuron tensor)."""

    def __init__(self, obj: Any) -> None:
        on_neuron = getattr(getattr(obj, "device", None), "type", None) == "neuron"
        super().__init__(obj.device if on_neuron else None)


def wait_stream(other: Stream) -> None:
    """Make the current stream wait for all work queued on ``other`` so far."""
    current_stream().wait_stream(other)


def wait_event(event: Event) -> None:
    """Make the current stream wait for ``event``."""
    current_stream().wait_event(event)


def record_event(event: Event | None = None) -> Event:
    """Record ``event`` (a new one when None) on the current stream."""
    return current_stream().record_event(event)


def __getattr__(name: str) -> Any:
    if name == "default_generators":  # one generator per device, made on first use
        from torch_neuronx.device.random import generators

        return generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
