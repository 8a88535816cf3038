"""Integer ``pow`` as torch's kernels compute it: wrapping square-and-multiply over every bit.

torch raises integers to integer powers by square-and-multiply in the result's dtype, so the
product wraps as C's does (``2 ** 64`` is 0 in int64, ``3 ** 64`` is 8733086111712066817), and
a negative exponent gives 1 for base 1, +-1 for base -1 and 0 for any other base. IREE's
integer power looped over too few of the exponent's bits: ``2 ** 64`` was 1 (as if the
exponent were taken modulo 64), ``3 ** 1000`` in uint8 was 0 where torch gives 33.

Here the loop is unrolled over every bit of the exponent's dtype (its value bits: 63 for int64,
8 for uint8), or, for an exponent known when tracing, over the bits it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def is_integer(dtype: torch.dtype) -> bool:
    """Whether ``pow`` in ``dtype`` is an integer power (bool is not one: torch refuses it)."""
    return dtype in _INTEGERS


def wrapped(value: int, dtype: torch.dtype) -> int:
    """The Python integer ``value`` converted to ``dtype`` as C converts it (modulo 2**bits)."""
    bits = torch.iinfo(dtype).bits
    value %= 1 << bits
    return value - (1 << bits) if dtype.is_signed and value >= 1 << (bits - 1) else value


def _negative_powers(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``base ** exponent`` for negative exponents: 1 for base 1, +-1 for base -1, else 0."""
    odd = (exponent & 1) == 1
    minus_one = torch.where(odd, torch.full_like(base, -1), torch.ones_like(base))
    return torch.where(base == 1, torch.ones_like(base), torch.where(base == -1, minus_one, torch.zeros_like(base)))


def _square_and_multiply(base: torch.Tensor | int, exponent: torch.Tensor, bits: int,
                         squared: Callable[[Any], Any]) -> torch.Tensor:
    """``base ** exponent`` over the exponent's low ``bits`` bits (negative exponents: torch's
    values), the squares of ``base`` (a tensor, or a Python number) taken by ``squared``."""
    signed = exponent.dtype.is_signed
    remaining = torch.where(exponent < 0, torch.zeros_like(exponent), exponent) if signed else exponent
    result, square = torch.ones_like(exponent), base
    for position in range(bits):
        # The low bit, then the exponent halved: one constant (a mask per bit, 63 distinct int64
        # constants, made a dispatch of 64 bindings the runtime refuses above 32: int64 powers fell back).
        result = torch.where((remaining & 1) != 0, result * square, result)
        if position + 1 < bits:
            remaining = torch.div(remaining, 2, rounding_mode="trunc")  # (non-negative: exact)
            square = squared(square)
    if not signed:
        return result
    below = _negative_powers(base if isinstance(base, torch.Tensor) else torch.full_like(exponent, base), exponent)
    return torch.where(exponent < 0, below, result)


def _value_bits(dtype: torch.dtype) -> int:
    return torch.iinfo(dtype).bits - (1 if dtype.is_signed else 0)


def power(base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``base ** exponent`` of two integer tensors of one dtype (broadcast), as torch's kernel."""
    base, exponent = torch.broadcast_tensors(base, exponent)
    return _square_and_multiply(base, exponent, _value_bits(base.dtype), lambda square: square * square)


def power_of_base(base: int, exponent: torch.Tensor, largest: int | None = None) -> torch.Tensor:
    """``base ** exponent`` of a Python integer and an integer tensor, in the tensor's dtype: the
    base's squares are Python numbers. ``largest``: a bound known for the exponent (only its bits
    are visited)."""
    dtype = exponent.dtype
    bits = _value_bits(dtype)
    if largest is not None:
        bits = min(bits, max(largest, 1).bit_length())
    return _square_and_multiply(wrapped(base, dtype), exponent, bits, lambda square: wrapped(square * square, dtype))


def two_to_the(exponent: torch.Tensor, largest: int) -> torch.Tensor:
    """``2 ** exponent`` for integers ``0 <= exponent <= largest`` (a shift's factor), exact."""
    return power_of_base(2, exponent, largest)


def power_of_number(base: torch.Tensor, exponent: int) -> torch.Tensor:
    """``base ** exponent`` of an integer tensor and a non-negative Python integer (unrolled over
    the exponent's own bits)."""
    result, square = torch.ones_like(base), base
    while exponent:
        if exponent & 1:
            result = result * square
        exponent >>= 1
        if exponent:
            square = square * square
    return result
