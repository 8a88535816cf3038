"""``aten._foreach_*`` ops (optimizers, ``clip_grad_norm_``) as one per-tensor op each.

torch-mlir lowers no list-of-tensors op. Each ``_foreach_<op>`` overload becomes the
list of ``aten.<op>`` calls it stands for, which the compiler fuses as it likes:

- ``.default`` (unary): ``op(t)`` per tensor;
- ``.Scalar`` / ``.Tensor``: ``op(t, other)`` with the same scalar or tensor for all;
- ``.List`` / ``.ScalarList``: ``op(t, other_i)`` pairwise;
- ``addcmul``/``addcdiv`` take two tensor lists and a value (or one value per tensor);
  ``lerp`` a second list and a weight (or weights).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx.compiler.decompositions.arithmetic import promoted_scalar

aten = torch.ops.aten

_UNARY = ("sqrt", "neg", "abs", "exp", "log", "reciprocal", "sign", "sigmoid", "tanh", "log1p", "expm1",
          "floor", "ceil", "round", "trunc", "frac", "sin", "cos", "erf", "rsqrt")
_BINARY = {"add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor, "div": aten.div.Tensor,
           "maximum": aten.maximum.default, "minimum": aten.minimum.default, "pow": aten.pow.Tensor_Tensor,
           "clamp_min": aten.clamp_min.Tensor, "clamp_max": aten.clamp_max.Tensor}


def _unary(op: torch._ops.OpOverload) -> Callable:
    def each(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [op(t) for t in tensors]

    return each


#: Ops that take a Python number as it is (the per-tensor op's own scalar form): torch computes
#: ``x * 0.9`` of a bfloat16 ``x`` with 0.9 unrounded, in float32, and rounds the product once.
#: A number made a 0-d tensor of ``x``'s type first is 0.8984375 (a third of the products off).
_NUMBER_OPERAND = {aten.add.Tensor: aten.add.Tensor, aten.sub.Tensor: aten.sub.Tensor,
                   aten.mul.Tensor: aten.mul.Tensor, aten.div.Tensor: aten.div.Tensor,
                   aten.pow.Tensor_Tensor: aten.pow.Tensor_Scalar}
_WITH_ALPHA = (aten.add.Tensor, aten.sub.Tensor)


def _binary(op: torch._ops.OpOverload, pairwise: bool) -> Callable:
    def each(tensors: list[torch.Tensor], others: Any, **kwargs: Any) -> list[torch.Tensor]:
        alpha = kwargs.get("alpha", 1)
        items = others if pairwise else [others] * len(tensors)
        return [_one(op, t, other, alpha) for t, other in zip(tensors, items, strict=True)]

    return each


def _one(op: torch._ops.OpOverload, t: torch.Tensor, other: Any, alpha: Any) -> torch.Tensor:
    """``op(t, other)`` as the per-tensor call torch's foreach kernel stands for (``alpha`` scales
    ``other`` inside the op, rounded once, as ``torch.add(t, other, alpha=...)`` does)."""
    if not isinstance(other, torch.Tensor) and op in _NUMBER_OPERAND:
        return _NUMBER_OPERAND[op](t, other)
    other = promoted_scalar(other, t)
    if alpha != 1:
        if op in _WITH_ALPHA:
            return op(t, other, alpha=alpha)
        other = other * alpha
    return op(t, other)


def _pow_scalar_and_tensor(scalar: Any, exponents: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.pow(scalar, e) for e in exponents]


def _addc(op: Callable) -> Callable:
    def each(tensors: list[torch.Tensor], first: list[torch.Tensor], second: list[torch.Tensor],
             value: Any = 1) -> list[torch.Tensor]:
        values = value.unbind(0) if isinstance(value, torch.Tensor) else \
            value if isinstance(value, list | tuple) else [value] * len(tensors)
        return [op(t, a, b, value=v) if not isinstance(v, torch.Tensor) else t + v * _product(op, a, b)
                for t, a, b, v in zip(tensors, first, second, values, strict=True)]

    return each


def _product(op: Callable, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b if op is torch.addcmul else a / b


def _lerp(tensors: list[torch.Tensor], ends: list[torch.Tensor], weight: Any) -> list[torch.Tensor]:
    weights = weight if isinstance(weight, list | tuple) else [weight] * len(tensors)
    return [torch.lerp(t, e, w) for t, e, w in zip(tensors, ends, weights, strict=True)]


def foreach_norm(tensors: list[torch.Tensor], ord: float = 2,  # noqa: A002
                 dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """``aten._foreach_norm`` (``clip_grad_norm_``): one vector norm per tensor."""
    return [torch.linalg.vector_norm(t, ord, dtype=dtype) for t in tensors]


def _table() -> dict[torch._ops.OpOverload, Callable]:
    table: dict[torch._ops.OpOverload, Callable] = {aten._foreach_norm.Scalar: foreach_norm}
    for name in _UNARY:
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is not None and "default" in packet.overloads():
            table[packet.default] = _unary(getattr(aten, name).default)
    for name, op in _BINARY.items():
        packet = getattr(aten, f"_foreach_{name}")
        for overload in packet.overloads():
            if overload in ("Scalar", "Tensor"):
                table[getattr(packet, overload)] = _binary(op, pairwise=False)
            elif overload in ("List", "ScalarList"):
                table[getattr(packet, overload)] = _binary(op, pairwise=True)
    table[aten._foreach_pow.ScalarAndTensor] = _pow_scalar_and_tensor
    for name, op in (("addcmul", torch.addcmul), ("addcdiv", torch.addcdiv)):
        packet = getattr(aten, f"_foreach_{name}")
        for overload in ("Scalar", "ScalarList", "Tensor"):
            table[getattr(packet, overload)] = _addc(op)
    for overload in ("List", "Scalar", "ScalarList"):
        table[getattr(aten._foreach_lerp, overload)] = _lerp
    return table


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = _table()
