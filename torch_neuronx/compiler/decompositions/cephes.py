"""Helpers the special-function decompositions share: Cephes' polynomial evaluation and the dtype rule.

Every special function is evaluated in its input's dtype, float16 and bfloat16 in
float32 (cast back), integers in the default dtype (:func:`elementwise`).
Polynomials are evaluated by Horner's rule as Cephes' ``polevl`` and ``p1evl``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def elementwise(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """Run ``fn`` in float32 for half types (cast back) and in the default dtype for integers."""

    @functools.wraps(fn)
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        if x.is_complex():
            return NotImplemented
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        compute = torch.float32 if dtype in LOW_PRECISION else dtype
        return fn(x.to(compute)).to(dtype)

    return wrapper


def to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32."""
    return struct.unpack("f", struct.pack("f", value))[0]


def polevl(x: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """The polynomial with ``coefficients`` (highest degree first) at ``x``, by Horner's rule."""
    result = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        result = result * x + c
    return result


def p1evl(x: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """:func:`polevl` of a monic polynomial whose leading 1 ``coefficients`` leaves out."""
    result = x + coefficients[0]
    for c in coefficients[1:]:
        result = result * x + c
    return result
