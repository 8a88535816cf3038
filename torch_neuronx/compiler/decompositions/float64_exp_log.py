"""Float64 ``expm1`` and ``log1p``, and the functions built on them, accurate near zero.

IREE computes float64 ``expm1`` and ``log1p`` as ``exp(x) - 1`` and ``log(1 + x)``: near zero
the subtraction cancels (``expm1(1e-20)`` was 0, ``expm1(1e-12)`` 8.9e-5 off relatively,
``log1p(1e-10)`` 8e-9), and so were ``sinh``, ``asinh``, ``atanh`` and ``elu`` of small
arguments. Here (float64 only; other dtypes keep their lowering, accurate already):

- ``expm1``: Kahan's ``(u - 1) x / log(u)`` with ``u = exp(x)`` below 0.5 in magnitude, ``x``
  itself where ``u`` is 1, ``u - 1`` above;
- ``log1p``: ``log(u) x / (u - 1)`` with ``u = 1 + x``, ``x`` itself where ``u`` is 1;
- ``sinh`` below 1 in magnitude: ``(e + e / (e + 1)) / 2`` with ``e = expm1(|x|)``, signed;
  above, from ``exp(|x| / 2)``;
- ``asinh`` below 1: ``log1p(a + a^2 / (1 + sqrt(1 + a^2)))`` of ``a = |x|``, signed; above,
  ``log(a + sqrt(a^2 + 1))``;
- ``atanh``: ``log1p(2a / (1 - a)) / 2``, signed;
- ``elu``: its negative side through ``expm1`` (every float dtype: torch-mlir's ``exp(x) - 1``
  cancelled in float32 too).

Both tricks rely on ``exp`` and ``log`` being accurate to an ulp or two, which IREE's float64
ones are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions import general

aten = torch.ops.aten


def _float64(x: torch.Tensor) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.float64


def _expm1(x: torch.Tensor) -> torch.Tensor:
    u = torch.exp(x)
    less = u - 1
    accurate = less * x / torch.log(u)  # (only where |x| is small: the product overflows near 709)
    result = torch.where(x.abs() < 0.5, accurate, less)
    return torch.where(u == 1, x, result)


def _log1p(x: torch.Tensor) -> torch.Tensor:
    u = 1 + x
    accurate = torch.log(u) * x / (u - 1)
    return torch.where((u == 1) | (u == math.inf), x, accurate)


def expm1(x: torch.Tensor) -> torch.Tensor:
    """``aten.expm1`` of float64 (see the module docstring)."""
    return _expm1(x) if _float64(x) else NotImplemented


def log1p(x: torch.Tensor) -> torch.Tensor:
    """``aten.log1p`` of float64 (see the module docstring)."""
    return _log1p(x) if _float64(x) else NotImplemented


def sinh(x: torch.Tensor) -> torch.Tensor:
    """``aten.sinh`` of float64: the expm1 form below 1 in magnitude; above, ``h h / 2 - 1 / (2 h h)``
    with ``h = exp(|x| / 2)`` (finite up to where sinh itself overflows), signed."""
    if not _float64(x):
        return NotImplemented
    a = x.abs()
    e = _expm1(a)
    h = torch.exp(0.5 * a)
    large = (0.5 * h) * h - 0.5 / (h * h)
    return torch.copysign(torch.where(a < 1, 0.5 * (e + e / (e + 1)), large), x)


def asinh(x: torch.Tensor) -> torch.Tensor:
    """``aten.asinh`` of float64: the log1p form below 1 in magnitude, ``log(a + sqrt(a^2 + 1))``
    above, ``log(a) + log(2)`` past 1e150 (where ``a^2`` would overflow), signed. Of other real
    dtypes in a linalg trace (a dynamic-shape kernel), the same in float32 past 1e18: torch-mlir's
    linalg form overflowed (inf beyond 1.8e19) and lost the sign (``asinh(-inf)`` was NaN)."""
    if not _float64(x):
        return _asinh_for_linalg(x)
    a = x.abs()
    square = a * a
    small = _log1p(a + square / (1 + torch.sqrt(1 + square)))
    large = torch.where(a > 1e150, torch.log(a) + math.log(2.0), torch.log(a + torch.sqrt(square + 1)))
    return torch.copysign(torch.where(a < 1, small, large), x)


def _result_in_float32(x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype] | None:
    """``x`` in float32 and the dtype of a unary float op's result, in a linalg trace of a real tensor."""
    if not (general.for_linalg() and isinstance(x, torch.Tensor)) or x.is_complex():
        return None
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    return (x.to(torch.float32), dtype) if dtype != torch.float64 else None


def _asinh_for_linalg(x: torch.Tensor) -> torch.Tensor:
    wide = _result_in_float32(x)
    if wide is None:
        return NotImplemented
    x32, dtype = wide
    a = x32.abs()
    large = torch.where(a > 1e18, torch.log(a) + math.log(2.0), torch.log(a + torch.sqrt(a * a + 1)))
    small = torch.log1p(a + a * a / (1 + torch.sqrt(1 + a * a)))
    return torch.copysign(torch.where(a < 1, small, large), x32).to(dtype)


def acosh(x: torch.Tensor) -> torch.Tensor:
    """``aten.acosh`` in a linalg trace (a dynamic-shape kernel): ``log1p(t + sqrt(2t + t^2))`` with
    ``t = x - 1``, ``log(x) + log(2)`` past 1e18, NaN below 1 (torch-mlir's linalg form gave inf
    for ``acosh(-1e30)`` and beyond 1.8e19); float64 and StableHLO's lowering keep theirs."""
    wide = _result_in_float32(x)
    if wide is None:
        return NotImplemented
    x32, dtype = wide
    t = x32 - 1
    result = torch.where(x32 > 1e18, torch.log(x32) + math.log(2.0), torch.log1p(t + torch.sqrt(2 * t + t * t)))
    return torch.where(x32 < 1, math.nan, result).to(dtype)


def atanh(x: torch.Tensor) -> torch.Tensor:
    """``aten.atanh`` of float64: ``log1p(2a / (1 - a)) / 2``, signed (inf at 1, NaN past it)."""
    if not _float64(x):
        return NotImplemented
    a = x.abs()
    return torch.copysign(0.5 * _log1p(2 * a / (1 - a)), x)


def elu(x: torch.Tensor, alpha=1.0, scale=1.0, input_scale=1.0) -> torch.Tensor:
    """``aten.elu`` (and ``selu``, ``celu``), its negative side through an accurate ``expm1``:
    :func:`expm1` for float64, IREE's own (accurate) for float32, in float32 for float16 and
    bfloat16. torch-mlir lowers elu's as ``exp(x) - 1``: float32 ``elu(-1e-6)`` was 1.3% off and
    ``elu(-1e-8)`` 0."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return NotImplemented
    if _float64(x):
        return torch.where(x > 0, x * scale, _expm1(x * input_scale) * (alpha * scale))
    wide = x.float()
    return torch.where(wide > 0, wide * scale, torch.expm1(wide * input_scale) * (alpha * scale)).to(x.dtype)


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.expm1.default: expm1,
    aten.log1p.default: log1p,
    aten.sinh.default: sinh,
    aten.asinh.default: asinh,
    aten.acosh.default: acosh,
    aten.atanh.default: atanh,
    aten.elu.default: elu,
}
