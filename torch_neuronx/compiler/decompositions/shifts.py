"""Integer shifts as torch's CPU kernels compute them: torch-mlir lowers no shift to StableHLO.

A shift past the type's width, or a negative one, gives what torch's kernel gives (0, or the
sign for a signed right shift); uint8 computes in int16; a Python number shifted by a tensor
(``1 << bit``) takes the tensor's type.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions import integer_powers
from torch_neuronx.compiler.decompositions.arithmetic import _as_tensor

aten = torch.ops.aten


def _shift_operands(a, b):
    """``a`` and the shift ``b`` in the type the shift computes in, its width and signedness, and the
    type of the result. uint8 computes in int16 (torch-mlir made the folded uint8 results of a
    constant shift a uint8 literal, which does not lower)."""
    dtype = torch.result_type(a, b) if isinstance(b, torch.Tensor) else a.dtype
    compute = torch.int16 if dtype == torch.uint8 else dtype
    a = a.to(compute)
    return a, _as_tensor(b, a).to(compute), torch.iinfo(dtype).bits, dtype.is_signed, dtype


def shift_left(a, b):
    """Integer ``a << b`` as ``a * 2**b`` (torch-mlir lowers no shift to StableHLO), wrapping as
    the CPU's shift does; a shift past the width (or negative) gives 0, as torch's kernel does
    (``2**b`` wrapped: ``uint8 << 70`` gave 192)."""
    a, b, width, _, dtype = _shift_operands(a, b)
    power = integer_powers.two_to_the(torch.clamp(b, 0, width - 1), width - 1)
    # Zeros computed from ``a``, not a literal (see _shift_operands).
    return torch.where((b >= 0) & (b < width), a * power, a * 0).to(dtype)


def shift_right(a, b):
    """Arithmetic ``a >> b`` as the floor division by ``2**b``, which rounds the same way for
    negatives. A shift of a signed value by width-1 or more (or a negative one) is its sign, and of
    an unsigned one by its width or more 0, as torch's kernel gives: ``2**31`` of int32 wrapped to
    INT_MIN (``x >> 31`` flipped signs) and ``2**32`` to 0 (a division by zero)."""
    a, b, width, signed, dtype = _shift_operands(a, b)
    largest = width - 2 if signed else width - 1  # the largest power of two the type holds
    quotient = aten.div.Tensor_mode(a, integer_powers.two_to_the(torch.clamp(b, 0, largest), largest),
                                    rounding_mode="floor")
    past = torch.where(a < 0, a * 0 - 1, a * 0) if signed else a * 0
    return torch.where((b >= 0) & (b <= largest), quotient, past).to(dtype)


def _number_shifted(shift):
    """``number << tensor`` / ``number >> tensor`` (``1 << bit``, a bit mask): the number as a 0-d
    tensor of the result's type."""
    def shifted(a, b):
        return shift(torch.scalar_tensor(a, dtype=torch.result_type(a, b), device=b.device), b)

    return shifted


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.__lshift__.Scalar: shift_left,
    aten.__lshift__.Tensor: shift_left,
    aten.bitwise_left_shift.Tensor: shift_left,
    aten.bitwise_left_shift.Tensor_Scalar: shift_left,
    aten.bitwise_left_shift.Scalar_Tensor: _number_shifted(shift_left),
    aten.__rshift__.Scalar: shift_right,
    aten.__rshift__.Tensor: shift_right,
    aten.bitwise_right_shift.Tensor: shift_right,
    aten.bitwise_right_shift.Tensor_Scalar: shift_right,
    aten.bitwise_right_shift.Scalar_Tensor: _number_shifted(shift_right),
}
