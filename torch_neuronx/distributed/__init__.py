"""The ``neuron`` c10d backend: ``dist.init_process_group("neuron")`` under torchrun.

:func:`register` (called when ``torch_neuronx`` is imported, so also by ``import torch``)
registers ``neuron`` with torch.distributed for the ``neuron`` device. Each process group is a
:class:`~.process_group.ProcessGroupNeuron`: TorchNeuron's Python ``ProcessGroup`` over
torch.distributed's own gloo transport (:mod:`.algorithms`, :mod:`.work`, :mod:`.validate`,
:mod:`.options`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch.distributed as dist

__all__ = ["CollectiveArgumentError", "CollectiveError", "DistributedConfigError", "ProcessGroupNeuron", "register"]

#: Exported names and their modules, imported on first use: the process group's modules import
#: Dynamo (their methods are hidden from it), which ``import torch`` must not pay for (about 1 s).
_LAZY = {"CollectiveArgumentError": "validate", "CollectiveError": "work", "DistributedConfigError": "options",
         "ProcessGroupNeuron": "process_group"}
_registered = False


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def _create(*args: Any, **kwargs: Any) -> Any:
    """The backend's creator (torch.distributed calls it per process group): process_group.create,
    bound to the device that ``init_process_group`` / ``new_group`` was given as ``device_id``."""
    from torch_neuronx import process
    from torch_neuronx.distributed.process_group import create

    if not dist.is_initialized() and len(args) >= 3:  # the default group: this process's global rank
        process.note_default_group(args[1], args[2])
    group = create(*args, **kwargs)
    device = _device_id(sys._getframe(1))
    if device is not None:
        group.bound_device_id = device
    return group


def _device_id(frame: Any) -> Any:
    """The ``device_id`` of the c10d call making a group (``_new_process_group_helper``'s argument):
    c10d binds the group it made to it, and then replaces that group with ours, unbound (so
    ``dist.split_group`` refused: "No device associated with the default pg")."""
    for _ in range(3):
        if frame is None:
            return None
        if frame.f_code.co_name == "_new_process_group_helper":
            device = frame.f_locals.get("device_id")
            return device if getattr(device, "type", None) == "neuron" else None
        frame = frame.f_back
    return None


def register() -> None:
    """Register the ``neuron`` backend with torch.distributed (once)."""
    global _registered
    if _registered or not dist.is_available():
        return
    if "NEURON" not in dist.Backend._plugins:
        dist.Backend.register_backend("neuron", _create, devices=["neuron"])
    from torch_neuronx.distributed import staging

    staging.install()
    _registered = True
