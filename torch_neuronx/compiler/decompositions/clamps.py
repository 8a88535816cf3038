"""Clamps torch-mlir lowers wrongly or not at all: integers by float bounds (in the promoted float
type), integers by int bounds (torch's checked conversion: its overflow error, unsigned wrapping),
and tensor bounds of another dtype or shape (``maximum`` then ``minimum``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx.compiler.decompositions.general import calls_itself
from torch_neuronx.compiler.errors import InvalidInputError

aten = torch.ops.aten


_C_NAMES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int",
            torch.int64: "int64_t"}


def _integer_bound(x: torch.Tensor, bound: Any) -> Any:
    """An int bound of an integer tensor as torch's checked conversion gives it: an overflow is its
    error, and a negative bound of an unsigned tensor wraps (``clamp(uint8, min=-1)`` is 255)."""
    if bound is None or isinstance(bound, bool) or not isinstance(bound, int) or x.dtype not in _C_NAMES:
        return bound
    info = torch.iinfo(x.dtype)
    overflows = bound > info.max or (bound < -info.max if info.min == 0 else bound < info.min)
    if overflows:
        raise InvalidInputError(f"value cannot be converted to type {_C_NAMES[x.dtype]} without overflow")
    return bound % (info.max + 1) if info.min == 0 else bound


def clamp_min_integer(x: torch.Tensor, min: Any) -> torch.Tensor:  # noqa: A002
    """``aten.clamp_min`` of an integer tensor by a number: torch's conversion of the bound."""
    checked = _integer_bound(x, min)
    return NotImplemented if checked == min else aten.clamp_min.default(x, checked)


def clamp_max_integer(x: torch.Tensor, max: Any) -> torch.Tensor:  # noqa: A002
    """``aten.clamp_max`` of an integer tensor by a number: torch's conversion of the bound."""
    checked = _integer_bound(x, max)
    return NotImplemented if checked == max else aten.clamp_max.default(x, checked)


@calls_itself
def clamp(x: torch.Tensor, min: float | None = None, max: float | None = None) -> torch.Tensor:  # noqa: A002
    """``aten.clamp`` of integers by float bounds: in the promoted float type, as torch (torch-mlir
    rejected the mixed types); by int bounds, as torch's checked conversion gives them (an overflow
    is its error: a uint8 tensor clamped to 300 wrapped)."""
    checked = (_integer_bound(x, min), _integer_bound(x, max))
    if checked != (min, max):
        return aten.clamp.default(x, *checked)
    bounds = [v for v in (min, max) if v is not None]
    dtype = x.dtype
    for bound in bounds:
        dtype = torch.promote_types(dtype, torch.result_type(x, bound))
    if dtype == x.dtype:
        return NotImplemented
    return aten.clamp.default(x.to(dtype), min, max)


def clamp_tensor(x: torch.Tensor, min: torch.Tensor | None = None,  # noqa: A002
                 max: torch.Tensor | None = None) -> torch.Tensor:  # noqa: A002
    """``aten.clamp`` by tensor bounds of another dtype or shape: ``maximum`` then ``minimum``,
    which promote and broadcast as torch's clamp (StableHLO's clamp wants one dtype and shape:
    a float16 tensor clamped by a float32 one failed to lower). A NaN anywhere gives NaN, and a
    bound ``min > max`` gives ``max``, as torch's."""
    bounds = [b for b in (min, max) if b is not None]
    if all(b.dtype == x.dtype and b.shape == x.shape for b in bounds):
        return NotImplemented
    out = x if min is None else torch.maximum(x, min)
    return out if max is None else torch.minimum(out, max)


def clamp_min_tensor(x: torch.Tensor, min: torch.Tensor) -> torch.Tensor:  # noqa: A002
    """``aten.clamp_min`` by a tensor: ``maximum`` (see :func:`clamp_tensor`)."""
    return torch.maximum(x, min)


def clamp_max_tensor(x: torch.Tensor, max: torch.Tensor) -> torch.Tensor:  # noqa: A002
    """``aten.clamp_max`` by a tensor: ``minimum`` (see :func:`clamp_tensor`)."""
    return torch.minimum(x, max)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.clamp.default: clamp,
    aten.clamp_min.default: clamp_min_integer,
    aten.clamp_max.default: clamp_max_integer,
    aten.clamp.Tensor: clamp_tensor,
    aten.clamp_min.Tensor: clamp_min_tensor,
    aten.clamp_max.Tensor: clamp_max_tensor,
}
