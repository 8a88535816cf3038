"""The PrivateUse1 hooks and device guard in Python, where the native ones cannot be built.

torch.accelerator, Dynamo's stream tracking and autograd's device bookkeeping
query these once PrivateUse1 is renamed ``neuron``. The native hooks and guard
(``device/native.py``) serve wherever a C++ compiler is found; these answer
availability only (no pinned memory, and the generic streams are stream 0).
"""

from __future__ import annotations

import functools

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
    """The device guard PyTorch switches devices through (one device here).

    Its one method, ``type_``, answers every stream query, and Dynamo queries the current
    stream at the start of every compiled call once an accelerator is registered. So
    ``type_`` is a C-level callable on the instance, not a Python method: PyTorch's C++ side
    calls it without entering a Python frame, which Dynamo would otherwise intercept on
    every compiled call (``torch.accelerator.current_stream`` 3.6 -> 1.7 us).
    """

    def __init__(self) -> None:
        super().__init__()
        self.type_ = functools.partial(getattr, torch._C._autograd.DeviceType, "PrivateUse1")
