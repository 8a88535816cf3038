"""Python scalars that torch converts to a tensor's dtype with an overflow check.

torch's CPU kernels of the fill family, ``where`` with a scalar, ``clamp`` and ``addcmul``/
``addcdiv`` convert their scalar to the tensor's dtype with ``checked_convert`` and raise
``value cannot be converted to type int8_t without overflow`` (``full((2,), 300,
dtype=torch.int8)``); a compiled kernel would wrap the value silently (44). :func:`check`
raises torch's own error (torch's conversion of the value, run on the host) before such an op
runs on neuron tensors; values every dtype of their kind holds skip it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten

# op -> (the argument whose dtype the scalar takes, the scalar arguments)
_SPECS = {
    "fill.Scalar": ("self", ("value",)), "fill_.Scalar": ("self", ("value",)),
    "new_full.default": ("self", ("fill_value",)),
    "masked_fill.Scalar": ("self", ("value",)), "masked_fill_.Scalar": ("self", ("value",)),
    "index_fill.int_Scalar": ("self", ("value",)), "index_fill_.int_Scalar": ("self", ("value",)),
    "where.ScalarOther": ("self", ("other",)), "where.ScalarSelf": ("other", ("self",)),
    "clamp.default": ("self", ("min", "max")), "clamp_.default": ("self", ("min", "max")),
    "clamp_min.default": ("self", ("min",)), "clamp_min_.default": ("self", ("min",)),
    "clamp_max.default": ("self", ("max",)), "clamp_max_.default": ("self", ("max",)),
    "addcmul.default": ("self", ("value",)), "addcmul_.default": ("self", ("value",)),
    "addcdiv.default": ("self", ("value",)), "addcdiv_.default": ("self", ("value",)),
    "full_like.default": ("self", ("fill_value",)),
    "pow.Tensor_Scalar": ("self", ("exponent",)), "pow_.Scalar": ("self", ("exponent",)),
}


def _resolve() -> dict[Any, tuple[int, tuple[int, ...], tuple[str, ...]]]:
    table = {}
    for name, (tensor, scalars) in _SPECS.items():
        packet, overload = name.split(".")
        op = getattr(getattr(aten, packet), overload)
        names = [a.name for a in op._schema.arguments]
        table[op] = (names.index(tensor), tuple(names.index(s) for s in scalars), scalars)
    return table


#: Ops with an ``alpha``: torch checks it against the result type (a bool alpha for a non-bool
#: result, a float alpha for integers, a value the type cannot hold); they computed with it.
_ALPHA = {aten.add.Tensor: False, aten.sub.Tensor: False, aten.add_.Tensor: True, aten.sub_.Tensor: True}


CHECKED = {**_resolve(), **{op: None for op in _ALPHA}}  # what :func:`check` looks at
#: Out-of-place ops whose result takes the promoted type of tensor and scalar: ``uint8.clamp(-2.5,
#: 4.5)`` computes in float, with nothing to check (it raised the overflow error).
_PROMOTING = frozenset((aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
                        aten.where.ScalarOther, aten.where.ScalarSelf, aten.pow.Tensor_Scalar))
#: Ops that convert a number to a floating-point result type unchecked (``where(h > 0, h, 1e10)`` of a
#: float16 ``h`` is inf, not an error).
_UNCHECKED_FLOAT = frozenset((aten.where.ScalarOther, aten.where.ScalarSelf))
#: Ops whose float16/bfloat16 kernels take their value in float32 (a loss scale of 65536 in a float16
#: ``addcmul_`` computes; it raised the overflow error).
_FLOAT32_VALUE = frozenset((aten.addcmul.default, aten.addcmul_.default, aten.addcdiv.default,
                            aten.addcdiv_.default))


def _safe(value: Any, dtype: torch.dtype) -> bool:
    """Whether ``value`` converts to ``dtype`` without a check: small numbers, and any number for
    bool, complex and float32/float64 tensors of ordinary values."""
    if type(value) is bool or dtype is torch.bool or dtype.is_complex:
        return True
    if dtype.is_floating_point:
        return not (abs(value) > 65504.0 and value == value and abs(value) != float("inf"))
    return type(value) is int and -128 <= value <= 127


def _check_alpha(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    if type(alpha) is int and alpha == 1 or len(args) < 2 or not isinstance(args[0], torch.Tensor):
        return
    dtype = args[0].dtype if _ALPHA[func] else torch.result_type(args[0], args[1])
    if type(alpha) is not bool and dtype.is_floating_point and _safe(alpha, dtype):
        return  # an optimizer's step (``p.add_(g, alpha=-lr)``): nothing to check, no cost
    one = torch.zeros(1, dtype=dtype)
    torch.add(one, one, alpha=alpha)  # torch's own checks and errors, on the host


def check(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Raise torch's overflow error when ``func`` converts a scalar that ``dtype`` cannot hold."""
    if func in _ALPHA:
        _check_alpha(func, args, kwargs)
        return
    spec = CHECKED.get(func)
    if spec is None:
        return
    where, positions, names = spec
    target = args[where] if where < len(args) else kwargs.get(func._schema.arguments[where].name)
    if not isinstance(target, torch.Tensor):
        return
    for position, name in zip(positions, names):
        value = args[position] if position < len(args) else kwargs.get(name)
        if not isinstance(value, int | float):
            continue
        dtype = torch.result_type(target, value) if func in _PROMOTING else target.dtype
        if func in _UNCHECKED_FLOAT and dtype.is_floating_point:
            continue
        if func in _FLOAT32_VALUE and dtype in (torch.float16, torch.bfloat16):
            dtype = torch.float32
        if func is aten.full_like.default and kwargs.get("dtype") is not None:
            dtype = kwargs["dtype"]
        if not _safe(value, dtype):
            torch.empty(2, dtype=dtype).fill_(value)  # torch's checked conversion (one value skips it)
