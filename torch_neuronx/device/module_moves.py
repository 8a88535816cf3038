"""``module.to(...)`` keeps its parameters' identity in both directions.

``Module._apply`` swaps a parameter in place (``torch.utils.swap_tensors``) when the converted
tensor is a wrapper subclass, so ``model.to("neuron")`` keeps every ``Parameter`` object; on the
way back (``model.to("cpu")``, ``model.double()`` of a neuron model) the converted tensor is a
plain one, and ``_apply`` put a new ``Parameter`` in the module. An optimizer made before the
move kept updating the old ones: the model stopped training, silently (CUDA keeps the objects).
Here ``_apply`` of a module holding neuron tensors runs with torch's own switch for swapping
(``torch.__future__.set_swap_module_params_on_conversion``) on, so the objects stay.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["install"]

_inside = threading.local()
_installed = False


def _holds_neuron_tensors(module: torch.nn.Module) -> bool:
    return any(isinstance(t, NeuronTensor) for t in (*module.parameters(), *module.buffers()))


def _swapping(apply: Any) -> Any:
    @functools.wraps(apply)
    def _apply(self: torch.nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "active", False) or torch.__future__.get_swap_module_params_on_conversion() \
                or not _holds_neuron_tensors(self):
            return apply(self, fn, *args, **kwargs)
        _inside.active = True
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return apply(self, fn, *args, **kwargs)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
            _inside.active = False

    return _apply


def install() -> None:
    """Wrap ``torch.nn.Module._apply`` (once per process)."""
    global _installed
    if not _installed:
        torch.nn.Module._apply = _swapping(torch.nn.Module._apply)
        _installed = True
