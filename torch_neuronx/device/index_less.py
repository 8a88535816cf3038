"""``"neuron"`` without an index names the current device in the calls PyTorch resolves in C++.

``Tensor.to("neuron")`` (and so ``Module.to``, ``torch.load(map_location=...)``),
``torch.tensor(..., device="neuron")``, ``torch.as_tensor``, ``torch.asarray`` and
``Tensor.new_tensor`` give a device without an index its index in C++, from the device
guard's ``getDevice()``; the Python device guard PyTorch offers a Python backend answers 0 and
cannot be overridden. So after ``torch.neuron.set_device(1)`` those calls put tensors on
``neuron:0`` while the factories (``torch.zeros(..., device="neuron")``) put them on
``neuron:1``, and the next op mixing them failed. :func:`install` (run by ``set_device`` the
first time a device other than 0 becomes current) wraps those calls so that an index-less
neuron device becomes ``neuron:<current>`` first; while the current device is 0 the wrapper
calls straight through, and a program that never leaves device 0 never installs it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx import process

__all__ = ["install"]

_lock = threading.Lock()
_installed = False


def _index_less(value: Any) -> bool:
    if value.__class__ is str:
        return value == "neuron"
    return value.__class__ is torch.device and value.type == "neuron" and value.index is None


def _resolving(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with its index-less neuron device arguments (positional or ``device=``) made
    the current device's."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        index = process.current_device()
        if index:
            current = torch.device("neuron", index)
            if any(_index_less(a) for a in args):
                args = tuple(current if _index_less(a) else a for a in args)
            if _index_less(kwargs.get("device")):
                kwargs["device"] = current
        return original(*args, **kwargs)

    call.__neuron_original__ = original  # type: ignore[attr-defined]
    return call


def install() -> None:
    """Wrap the calls named in the module docstring; idempotent, thread-safe."""
    global _installed
    with _lock:
        if _installed:
            return
        for owner, name in ((torch.Tensor, "to"), (torch.Tensor, "new_tensor"), (torch, "tensor"),
                            (torch, "as_tensor"), (torch, "asarray")):
            setattr(owner, name, _resolving(getattr(owner, name)))
        _installed = True
