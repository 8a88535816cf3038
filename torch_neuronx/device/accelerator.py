"""``torch.accelerator`` on neuron: the calls torch answers only from a C++ backend, answered here.

torch 2.13's ``torch.accelerator.synchronize`` asks the device guard to synchronize the
device, and its memory functions ask a C++ ``DeviceAllocator``; a Python backend can
register neither (its device guard has one method, ``type_``), so each raised an
internal error for neuron. :func:`install` wraps those functions: when the current
accelerator is neuron they call ``torch.neuron``'s (the caching allocator's statistics,
the streams), otherwise torch's own, unchanged. ``set_stream`` accepts a
``torch.neuron.Stream`` as it accepts a ``torch.cuda.Stream``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# torch.accelerator names whose neuron answer is torch.neuron's function of the same name,
# except where the right side names another.
_ROUTED = {
    "synchronize": "synchronize",
    "empty_cache": "empty_cache",
    "memory_stats": "memory_stats",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "get_memory_info": "mem_get_info",
    # The device index: torch's ask the device guard, whose Python form cannot set a device.
    "set_device_index": "set_device",
    "set_device_idx": "set_device",
    "current_device_index": "current_device",
    "current_device_idx": "current_device",
}


def _on_neuron() -> bool:
    current = torch.accelerator.current_accelerator()
    return current is not None and current.type == "neuron"


def _routed(original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs) if _on_neuron() else original(*args, **kwargs)

    call.__neuron_original__ = original  # type: ignore[attr-defined]
    return call


def _set_stream(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """``torch.accelerator.set_stream`` that also takes a ``torch.neuron.Stream``.

    torch's own takes only a C++ ``torch.Stream`` (a CUDA stream is one; a neuron stream,
    a Python object, is not): for a neuron stream it makes the stream's device current and
    the stream its current stream, as torch's does for a CUDA stream.
    """
    from torch_neuronx.device import module

    @functools.wraps(original)
    def set_stream(stream: Any) -> None:
        if isinstance(stream, module.Stream):
            module.set_device(stream.device_index)
            module.set_stream(stream)
        else:
            original(stream)

    set_stream.__neuron_original__ = original  # type: ignore[attr-defined]
    return set_stream


class _DeviceIndex(torch.accelerator.device_index):
    """``torch.accelerator.device_index(i)``: for neuron, ``torch.neuron``'s current device inside
    the block (torch's exchanges the device through the device guard, which left it unchanged)."""

    def __enter__(self) -> None:
        if self.idx is not None and _on_neuron():
            from torch_neuronx.device import module

            self.prev_idx = module.current_device()
            module.set_device(self.idx)
            self._neuron = True
            return
        self._neuron = False
        super().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        if getattr(self, "_neuron", False):
            from torch_neuronx.device import module

            module.set_device(self.prev_idx)
            return
        super().__exit__(*exc_info)


def install() -> None:
    """Route torch.accelerator's device-wide calls to torch.neuron's when neuron is the accelerator; idempotent.

    ``set_stream`` also takes a ``torch.neuron.Stream``; every other call is torch's own.
    """
    from torch_neuronx.device import module

    for name, ours in _ROUTED.items():
        for namespace in (torch.accelerator, torch.accelerator.memory):
            original = getattr(namespace, name, None)
            if original is None or hasattr(original, "__neuron_original__"):
                continue
            setattr(namespace, name, _routed(original, getattr(module, ours)))
    if not hasattr(torch.accelerator.set_stream, "__neuron_original__"):
        torch.accelerator.set_stream = _set_stream(torch.accelerator.set_stream)
    if not issubclass(torch.accelerator.device_index, _DeviceIndex):
        torch.accelerator.device_index = _DeviceIndex
