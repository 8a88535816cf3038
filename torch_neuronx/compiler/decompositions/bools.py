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


def wrapped(table: dict) -> dict:
    """``table`` with each op of :data:`OPS` computing its bool form in int32."""
    return {**table, **{op: in_int32(op, table.get(op)) for op in OPS}}
