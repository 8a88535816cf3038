"""The PrivateUse1 hooks and device guard PyTorch's C++ side asks the neuron backend for.

torch.accelerator, Dynamo's stream tracking and autograd's device bookkeeping
query these once PrivateUse1 is renamed ``neuron``.
"""

from __future__ import annotations

import torch


class NeuronHooks(torch._C._acc.PrivateUse1Hooks):
    """Answers PyTorch's availability questions about the neuron backend."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class NeuronDeviceGuard(torch._C._acc.DeviceGuard):
    """The device guard PyTorch switches devices through (one device here)."""

    def type_(self) -> torch._C._autograd.DeviceType:
        return torch._C._autograd.DeviceType.PrivateUse1
