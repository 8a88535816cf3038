"""The ``neuron`` c10d backend: ``dist.init_process_group("neuron")`` under torchrun.

:func:`register` (called when ``torch_neuronx`` is imported, so also by ``import torch``)
registers ``neuron`` with torch.distributed for the ``neuron`` device. Each process group is a
:class:`~.process_group.ProcessGroupNeuron`: TorchNeuron's Python ``ProcessGroup`` over
torch.distributed's own gloo transport (:mod:`.algorithms`, :mod:`.work`, :mod:`.validate`,
:mod:`.options`).
"""

from __future__ import annotations

import torch.distributed as dist

from torch_neuronx.distributed.options import DistributedConfigError
from torch_neuronx.distributed.process_group import ProcessGroupNeuron, create
from torch_neuronx.distributed.validate import CollectiveArgumentError
from torch_neuronx.distributed.work import CollectiveError

__all__ = ["CollectiveArgumentError", "CollectiveError", "DistributedConfigError", "ProcessGroupNeuron", "register"]

_registered = False


def register() -> None:
    """Register the ``neuron`` backend with torch.distributed (once)."""
    global _registered
    if _registered or not dist.is_available():
        return
    if "NEURON" not in dist.Backend._plugins:
        dist.Backend.register_backend("neuron", create, devices=["neuron"])
    _registered = True
