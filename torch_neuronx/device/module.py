"""``torch.neuron``: the device module, name for name with ``torch.cuda`` where the concept is the same.

On this implementation a NeuronCore is a runtime device of the live target
(the host CPU here): one core per process, as one Trainium worker process sees
its NeuronCore. Memory statistics come from the caching allocator, streams
from :mod:`torch_neuronx.runtime.streams`.
"""

from __future__ import annotations

from typing import Any

from torch_neuronx.memory import (  # noqa: F401  (re-exported as torch.neuron.*)
    caching_allocator_alloc,
    caching_allocator_delete,
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
)
from torch_neuronx.runtime.streams import (  # noqa: F401
    Event,
    Stream,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
)

_current = 0


def is_available() -> bool:
    """Whether a neuron device can run work here (the live target's runtime is present)."""
    return True


def device_count() -> int:
    """The number of neuron devices visible to this process."""
    return 1


def current_device() -> int:
    """The index of the current neuron device."""
    return _current


def set_device(device: Any) -> None:
    """Select the current neuron device (only index 0 exists here)."""
    global _current
    from torch_neuronx.runtime.streams import device_index

    index = device_index(device)
    if not 0 <= index < device_count():
        raise ValueError(f"neuron device {index} does not exist; device_count() is {device_count()}")
    _current = index


def is_initialized() -> bool:
    """Whether the runtime is up (it starts lazily, on first use)."""
    return True


def _is_in_bad_fork() -> bool:
    return False


def manual_seed_all(seed: int) -> None:
    """Seed every neuron device's generator: a no-op, neuron random numbers come from the host generator.

    ``torch.manual_seed`` seeds that generator and then calls this function.
    """


def get_amp_supported_dtype() -> list[Any]:
    """Dtypes autocast may use on neuron."""
    import torch

    return [torch.bfloat16, torch.float16]
