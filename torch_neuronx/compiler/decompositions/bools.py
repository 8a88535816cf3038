"""Accumulations and clamps of bool tensors, computed in int32.

torch adds booleans with saturation (``True + True`` is ``True``), while torch-mlir's lowering of
a scatter-add into a bool tensor adds bits (``True + True`` came out ``False``), and clamps
compared bools as signed bits (``clamp_min(True, False)`` came out ``False``). These ops,
given a bool ``self``, run on int32 copies of their bool operands (never of an index or a
mask) and their result is compared with 0: the same values as torch's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx.compiler.errors import InvalidInputError

aten = torch.ops.aten

#: The ops whose bool form runs in int32 (their other decompositions apply on the way).
OPS = (
    aten.scatter_add.default, aten.index_add.default, aten.scatter.reduce, aten.scatter.value_reduce,
    aten.scatter_reduce.two, aten.index_put.default, aten._unsafe_masked_index_put_accumulate.default,
    aten.clamp_min.Tensor, aten.clamp_max.Tensor, aten.clamp.Tensor,
)
# The arguments holding values (the others are indices, masks, dims, flags).
_VALUES = frozenset({"self", "src", "source", "values", "value", "min", "max"})


def _as_int(value: Any) -> Any:
    return value.to(torch.int32) if isinstance(value, torch.Tensor) and value.dtype == torch.bool else value


def in_int32(op: Any, previous: Callable | None) -> Callable:
    """The decomposition of ``op``: ``previous`` (or the op itself) for other dtypes; for a bool
    ``self``, the op on int32 copies of its bool value arguments, compared with 0."""
    names = [a.name for a in op._schema.arguments]

    @functools.wraps(previous or op)
    def decomposition(*args: Any, **kwargs: Any) -> Any:
        if not args or not isinstance(args[0], torch.Tensor) or args[0].dtype != torch.bool:
            return previous(*args, **kwargs) if previous is not None else NotImplemented
        cast = [_as_int(a) if i < len(names) and names[i] in _VALUES else a for i, a in enumerate(args)]
        return op(*cast, **{k: _as_int(v) if k in _VALUES else v for k, v in kwargs.items()}) != 0

    return decomposition


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool)


def _compared_in_promoted_type(op: Any) -> Callable:
    """``bool_tensor == 2``: torch compares in the promoted type (int64: all False); torch-mlir
    converted the number to bool (True: the tensor itself)."""
    def decomposition(x: Any, other: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype == torch.bool and not isinstance(other, bool):
            return op(x.to(torch.result_type(x, other)), other)
        return NotImplemented
    return decomposition


def _add(x: Any, other: Any, *, alpha: Any = 1) -> Any:
    """Bool addition saturates (``True + True`` is True, a logical or); torch-mlir added bits (xor)."""
    if _is_bool(x) and _is_bool(other):
        other = other if isinstance(other, torch.Tensor) else torch.scalar_tensor(other, dtype=torch.bool,
                                                                                     device=x.device)
        return torch.logical_or(x, other) if alpha else x.clone()
    return NotImplemented


def _sub(x: Any, other: Any, *, alpha: Any = 1) -> Any:
    if _is_bool(x) and _is_bool(other):
        raise InvalidInputError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                                "Use the `^` or `logical_xor()` operator instead.")
    if _is_bool(x) or _is_bool(other):
        raise InvalidInputError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
            "invert a mask, use the `~` or `logical_not()` operator instead.")
    return NotImplemented


def _bool_fill(value: Any, dtype: Any) -> Any:
    """A fill value as a bool tensor holds it: nonzero is True (torch-mlir kept the low bit: 2 was False)."""
    return bool(value) if dtype == torch.bool and isinstance(value, int | float) else value


def _full(size: Any, fill_value: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
    if dtype == torch.bool and not isinstance(fill_value, bool):
        return aten.full.default(size, _bool_fill(fill_value, dtype), dtype=dtype, **kwargs)
    return NotImplemented


def _full_like(x: Any, fill_value: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
    target = x.dtype if dtype is None else dtype
    if target == torch.bool and not isinstance(fill_value, bool):
        return aten.full_like.default(x, _bool_fill(fill_value, target), dtype=dtype, **kwargs)
    return NotImplemented


def _fill(x: Any, value: Any) -> Any:
    if x.dtype == torch.bool and isinstance(value, int | float) and not isinstance(value, bool):
        return aten.fill.Scalar(x, bool(value))
    return NotImplemented


def _first(*decompositions: Callable | None) -> Callable:
    """The first of ``decompositions`` that does not return NotImplemented."""
    chain = [d for d in decompositions if d is not None]

    def decomposition(*args: Any, **kwargs: Any) -> Any:
        for d in chain:
            result = d(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return NotImplemented
    return decomposition


def _refused(message: str) -> Callable:
    """A decomposition raising torch's error for a bool input (torch has no kernel for it)."""
    def decomposition(x: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype == torch.bool:
            raise InvalidInputError(message)
        return NotImplemented
    return decomposition


#: Ops torch refuses for bool tensors (they computed here).
_REFUSED = {
    aten.argmax.default: "argmax(): does not support bool input",
    aten.argmin.default: "argmin(): does not support bool input",
    aten.median.default: "\"median_cpu\" not implemented for 'Bool'",
    aten.median.dim: "\"median_out\" not implemented for 'Bool'",
    aten.nanmedian.default: "\"median_cpu\" not implemented for 'Bool'",
    aten.nanmedian.dim: "\"median_out\" not implemented for 'Bool'",
    aten.kthvalue.default: "\"kthvalue_cpu\" not implemented for 'Bool'",
}


#: Ops of bool tensors and Python numbers, and their forms with torch's values.
_SCALARS: dict[Any, Callable] = {
    **{op: _compared_in_promoted_type(op) for op in (aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar,
                                                      aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar)},
    aten.add.Tensor: _add, aten.add.Scalar: _add, aten.sub.Tensor: _sub, aten.sub.Scalar: _sub,
    aten.full.default: _full, aten.full_like.default: _full_like, aten.fill.Scalar: _fill,
    **{op: _refused(message) for op, message in _REFUSED.items()},
}


def wrapped(table: dict) -> dict:
    """``table`` with each op of :data:`OPS` computing its bool form in int32, and bool tensors'
    arithmetic with numbers as torch computes it (:data:`_SCALARS`)."""
    table = {**table, **{op: in_int32(op, table.get(op)) for op in OPS}}
    return {**table, **{op: _first(fix, table.get(op)) for op, fix in _SCALARS.items()}}
