"""FSDP2's ``fully_shard`` of a model built on the CPU, with a mesh on ``neuron``.

``fully_shard`` moves the parameters and buffers not yet on the mesh's device itself
(``_move_states_to_device``), by ``tensor.data = tensor.to(device)``, as for CUDA. A neuron tensor
is a wrapper subclass, which ``set_data`` refuses to put under a CPU tensor ("incompatible tensor
type"): so the move to ``neuron`` swaps each tensor with its moved copy instead
(``torch.utils.swap_tensors``), as FSDP2 already does for tensors that are wrapper subclasses
themselves. The object stays the same: references the program holds (an optimizer's) follow it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from torch_neuronx import imports as after_import

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_init"


def _moving_by_swap(module: Any) -> None:
    """Wrap ``_move_states_to_device`` (see the module docstring)."""
    move: Callable[..., None] = module._move_states_to_device
    if getattr(move, "_neuron", False):
        return

    def move_states_to_device(params: list[nn.Parameter], buffers: list[torch.Tensor], device: torch.device) -> None:
        if device.type != "neuron":
            return move(params, buffers, device)
        rest_params, rest_buffers = [], []
        for tensor, rest in [(p, rest_params) for p in params] + [(b, rest_buffers) for b in buffers]:
            if tensor.device.type in ("cpu", "neuron") and tensor.device != device \
                    and type(tensor) in (torch.Tensor, nn.Parameter, nn.Buffer):
                with torch.no_grad():  # (autograd would hold one more reference, which swap refuses)
                    moved = tensor.to(device)
                    if isinstance(tensor, nn.Parameter):
                        moved = nn.Parameter(moved, requires_grad=tensor.requires_grad)
                torch.utils.swap_tensors(tensor, moved)
            else:
                rest.append(tensor)
        return move(rest_params, rest_buffers, device)

    move_states_to_device._neuron = True  # type: ignore[attr-defined]
    module._move_states_to_device = move_states_to_device


def install() -> None:
    """Patch FSDP2's initialization now if it is loaded, else when it is (idempotent)."""
    after_import.when_imported(_MODULE, _moving_by_swap)
