"""Lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d``, ``nn.LazyBatchNorm1d``, ...) on ``neuron``.

A lazy module holds ``UninitializedParameter`` and ``UninitializedBuffer`` objects until its
first call tells it their shapes; ``materialize()`` then creates the real tensor on the device
of the placeholder's empty data. On CUDA a placeholder stays a placeholder when it is created
there (``nn.LazyLinear(4, device="cuda")``) and when its module moves (``.cuda()``). A neuron
tensor is a Python tensor subclass, so here the same programs failed: creating one on ``neuron``
raised an internal error of torch's ``_make_subclass``, and moving one turned it into a plain
0-element tensor, so the module never materialized and its first call failed ("weight should
have at least three dimensions").

Here a placeholder on ``neuron`` is an instance of a class that is both its kind and a
:class:`~torch_neuronx.runtime.tensor.NeuronTensor` (:func:`neuron_kind`): torch's lazy
machinery sees a placeholder, its data is a neuron tensor, and ``materialize()`` creates the
real tensor on ``neuron`` and turns the placeholder into a plain neuron tensor (a parameter
keeps its ``Parameter`` flag). :func:`install` lets the placeholders' constructors create one,
:func:`mark_moved` makes one of a placeholder copied to ``neuron``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, UninitializedTensorMixin

from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["install", "mark_moved", "neuron_kind"]

_originals: dict[type, Any] = {}


def _detach(self: torch.Tensor) -> torch.Tensor:
    """A placeholder's detach is a placeholder of the same kind (``nn.Parameter(placeholder)``,
    which ``module.to("neuron")`` calls on a module already there, requires it)."""
    with torch._C.DisableTorchFunctionSubclass():
        out = torch.Tensor.detach(self)
    out.__class__ = type(self)
    return out


def _deepcopy(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
    """A fresh placeholder of the same kind, device and dtype (torch's for ``UninitializedParameter``)."""
    if id(self) not in memo:
        memo[id(self)] = type(self)(self.requires_grad, self.device, self.dtype)
    return memo[id(self)]


@functools.cache
def neuron_kind(kind: type) -> type:
    """The class of a ``kind`` placeholder (``UninitializedParameter``, ``UninitializedBuffer`` or
    a subclass) whose data is on ``neuron``; ``kind`` itself when it is one already."""
    if issubclass(kind, NeuronTensor):
        return kind
    allowed = [*kind._allowed_methods, torch.Tensor.detach, torch.Tensor.requires_grad_]
    return type(kind.__name__, (kind, NeuronTensor), {
        "cls_to_become": NeuronTensor, "_allowed_methods": allowed, "detach": _detach, "__deepcopy__": _deepcopy,
        "__module__": kind.__module__, "__qualname__": kind.__qualname__})


def _constructor(kind: type) -> Any:
    """``kind.__new__``, which builds a neuron placeholder where the empty data lands on ``neuron``
    (``device="neuron"``, or the default device), and defers to torch's everywhere else."""
    original = _originals[kind]

    def __new__(cls: type, requires_grad: bool | None = None, device: Any = None, dtype: Any = None,
                *args: Any, **kwargs: Any) -> torch.Tensor:
        data = torch.empty(0, device=device, dtype=dtype)
        if not isinstance(data, NeuronTensor):
            flag = (() if requires_grad is None else (requires_grad,))
            if args:
                return original(cls, *flag, device, dtype, *args, **kwargs)
            return original(cls, *flag, device=device, dtype=dtype, **kwargs)
        if issubclass(cls, torch.nn.Parameter):
            made = torch.nn.Parameter(data, True if requires_grad is None else requires_grad)
        else:
            made = data.requires_grad_(bool(requires_grad))
            made.persistent = kwargs.get("persistent", args[0] if args else True)
            made._is_buffer = True
        made.__class__ = neuron_kind(cls)
        return made

    return __new__


def mark_moved(source: Any, moved: Any) -> None:
    """Make ``moved``, the neuron copy of ``source``, a placeholder when ``source`` is one."""
    if isinstance(source, UninitializedTensorMixin) and type(moved) is NeuronTensor:
        moved.__class__ = neuron_kind(type(source))


def install() -> None:
    """Let ``UninitializedParameter(device="neuron")`` and ``UninitializedBuffer(...)`` build neuron
    placeholders (once)."""
    for kind in (UninitializedParameter, UninitializedBuffer):
        if kind not in _originals:
            _originals[kind] = kind.__new__
            kind.__new__ = _constructor(kind)
