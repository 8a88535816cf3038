"""The ``neuron`` c10d backend: ``dist.init_process_group("neuron")`` under torchrun.

:func:`register` (called when ``torch_neuronx`` is imported, so also by ``import torch``)
registers ``neuron`` with torch.distributed for the ``neuron`` device. Each process group is a
:class:`~.process_group.ProcessGroupNeuron`: TorchNeuron's Python ``ProcessGroup`` over
torch.distributed's own gloo transport (:mod:`.algorithms`, :mod:`.work`, :mod:`.validate`,
:mod:`.options`).
"""

from __future__ import annotations

import datetime
import functools
import importlib
import sys
import warnings
from typing import Any

import torch.distributed as dist

__all__ = ["CollectiveArgumentError", "CollectiveError", "DistributedConfigError", "ProcessGroupNeuron", "register"]

#: Exported names and their modules, imported on first use: the process group's modules import
#: Dynamo (their methods are hidden from it), which ``import torch`` must not pay for (about 1 s).
_LAZY = {"CollectiveArgumentError": "validate", "CollectiveError": "collective_queue",
         "DistributedConfigError": "options", "ProcessGroupNeuron": "process_group"}
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
    from torch_neuronx.distributed import fsdp_init, staging

    staging.install()
    fsdp_init.install()
    _install_monitored_barrier()
    _registered = True


def _install_monitored_barrier() -> None:
    """``dist.monitored_barrier`` on neuron groups. torch's refuses every backend but gloo by name
    ("only implemented for GLOO backend") before it asks the group, although the group's own
    ``monitored_barrier`` is what it then calls; a neuron group's runs on its gloo transport and
    names the ranks that did not arrive within the timeout. Other groups go to torch's, unchanged."""
    c10d = dist.distributed_c10d
    original = c10d.monitored_barrier
    if getattr(original, "__neuron_original__", None) is not None:
        return

    @functools.wraps(original)
    def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        if c10d._rank_not_in_group(group) or "neuron" not in str(dist.get_backend(group)):
            return original(group, timeout, wait_all_ranks)
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            warnings.warn(f"Please specify timeout arg as a timedelta. Converting current value of {timeout} "
                          "assuming it represents seconds", stacklevel=2)
            timeout = datetime.timedelta(seconds=timeout)
        if timeout is not None:
            c10d._check_valid_timeout(timeout)
        group_to_use = c10d._get_default_group() if group is None else group
        if timeout is None:
            return group_to_use.monitored_barrier(wait_all_ranks=wait_all_ranks)  # the group's own timeout
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.__neuron_original__ = original  # type: ignore[attr-defined]
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier
