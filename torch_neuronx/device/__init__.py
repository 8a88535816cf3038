"""The ``neuron`` device name in PyTorch: PrivateUse1 renamed, and ``torch.neuron``.

:func:`register` (run on ``import torch_neuronx``) renames PyTorch's PrivateUse1
backend to ``neuron`` and registers :mod:`torch_neuronx.device.module` as
``torch.neuron``, whose names follow ``torch.cuda``'s (device count, streams,
the caching allocator's memory statistics). The eager execution of ``neuron``
tensors builds on this registration.
"""

from __future__ import annotations

import logging

_log = logging.getLogger("torch_neuronx.device")
_registered = False


def register() -> bool:
    """Make ``neuron`` PyTorch's PrivateUse1 device and ``torch.neuron`` its module; idempotent."""
    global _registered
    if _registered:
        return True
    import torch

    from torch_neuronx.device import module

    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", "neuron"):
        _log.warning("PrivateUse1 is already registered as %r; torch.neuron is not available", current)
        return False
    if current == "neuron" and hasattr(torch, "neuron"):
        _registered = True  # registered by another copy of this module (e.g. a reload)
        return True
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from torch_neuronx.device.hooks import NeuronDeviceGuard, NeuronHooks

    _setup_privateuseone_for_python_backend("neuron", module, NeuronHooks(), NeuronDeviceGuard())
    _registered = True
    return True
