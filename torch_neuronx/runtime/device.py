"""One object per neuron device index: its runtime (IREE HAL) devices, its allocator, its streams.

``device(torch.device("neuron", 1))`` (or ``device(1)``, ``device("neuron:1")``)
is the :class:`NeuronDevice` of that index, created on first use; only indices
below :func:`~torch_neuronx.process.device_count` exist (TORCH_NEURONX_VISIBLE_DEVICES).

On the cpu target every index runs its NEFFs on the host: the HAL device of a
driver (``local-sync`` for small graphs, ``local-task`` for large ones) is one
per process, shared by the indices, as the host's CPUs are. Memory and streams
are each index's own: one caching allocator per index (tensors of ``neuron:1``
never take blocks of ``neuron:0``) and one default stream per index.
"""

from __future__ import annotations

import threading
from typing import Any

from torch_neuronx import memory, process
from torch_neuronx.memory.allocator import CachingAllocator
from torch_neuronx.runtime import executable, streams

_devices: dict[int, NeuronDevice] = {}
_lock = threading.Lock()


class NeuronDevice:
    """Device ``index``: what runs on it (HAL devices), what it holds (allocator), its queues (streams)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"NeuronDevice(neuron:{self.index})"

    def hal(self, driver: str) -> executable.Device:
        """The runtime device of ``driver`` that runs this index's NEFFs (opened on first use)."""
        return executable.device(driver)

    @property
    def allocator(self) -> CachingAllocator:
        """This index's caching allocator."""
        return memory.device_allocator(self.index)

    @property
    def default_stream(self) -> streams.Stream:
        """This index's default stream."""
        return streams.default_stream(self.index)

    def current_stream(self) -> streams.Stream:
        """This thread's current stream on this index."""
        return streams.current_stream(self.index)

    def synchronize(self) -> None:
        """Wait for the work queued on every stream of this index."""
        streams.synchronize(self.index)


def current_index() -> int:
    """The index of this thread's current neuron device (0 unless set)."""
    return streams.current_device()


def set_current(which: Any) -> None:
    """Make ``which`` this thread's current neuron device (``torch.neuron.set_device``)."""
    streams.set_current_device(process.checked_device_index(which))


def device(which: Any = None) -> NeuronDevice:
    """The device object of ``which`` (None: index 0; an int, "neuron[:N]" or a ``torch.device``).

    Raises ``ValueError`` for an index this process does not see.
    """
    index = process.checked_device_index(which)
    found = _devices.get(index)
    if found is None:
        with _lock:
            found = _devices.setdefault(index, NeuronDevice(index))
    return found


def devices() -> list[NeuronDevice]:
    """Every device this process sees, by index."""
    return [device(i) for i in range(process.device_count())]
