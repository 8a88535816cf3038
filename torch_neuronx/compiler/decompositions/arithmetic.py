"""Arithmetic torch-mlir lowers wrongly or not at all: ``remainder``, ``fmod`` and rounding
divisions with torch's signs and integer rules, shifts and bitwise ops with Python scalars,
``gcd``/``lcm``, ``lerp``, ``fma``, ``add`` of booleans, ``eq``, ``isfinite``, ``atan2``,
``pow`` and ``hypot`` at their special values (clamps: :mod:`.clamps`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx.compiler.decompositions import indexing, integer_powers
from torch_neuronx.compiler.decompositions.general import calls_itself
from torch_neuronx.compiler.errors import InvalidInputError

aten = torch.ops.aten


def remainder(a, b):
    """Python's modulo (the result takes the divisor's sign).

    torch-mlir lowers ``aten.remainder`` to ``stablehlo.remainder``, which is C's
    fmod (the dividend's sign): silently wrong for operands of mixed sign.
    """
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (
            a.is_floating_point() or b.is_floating_point()):
        a, b = _promoted(a, b)
        mod = _fmod_float(a, b)  # torch: fmod, then moved into the divisor's sign
        return torch.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        a, b = _promoted(a, b)  # a bool tensor % 300 is an int64 remainder
    return a - aten.div.Tensor_mode(a, b, rounding_mode="floor") * b


def _promoted(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.result_type(a, b)
    a, b = torch.broadcast_tensors(a, b)
    return a.to(dtype), b.to(dtype)


def _fmod_float(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C's fmod of floats: torch-mlir's own lowering (``stablehlo.remainder``), exact for large
    quotients, with the dividend's sign on zeros and a finite dividend over an infinite divisor
    kept (IREE gives +0.0 and NaN there)."""
    if a.dtype in (torch.float32, torch.float16, torch.bfloat16):
        # IREE's remainder divides in the operands' type: a float32 quotient that rounds up to an
        # integer gave ~0 (fmod(100.5, 0.1): 1.5e-6, torch 0.0999985), a float16 one overflowed
        # (fmod(65504, 1.5): 16). In float64 the quotient of float32 values rounds only beyond
        # 2**29, and the product of its integer part is exact.
        wide = aten.fmod.Tensor(a.to(torch.float64), b.to(torch.float64)).to(a.dtype)
        mod = torch.copysign(wide, a)
    else:
        mod = torch.copysign(aten.fmod.Tensor(a, b), a)  # :func:`fmod` lets this call through to torch-mlir
    return torch.where(b.isinf() & a.isfinite(), a, mod)


def _floor_divide_integers(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact integer floor division: the truncating quotient, one less where the remainder's sign
    differs from the divisor's (torch-mlir went through float32: 2**31 - 1 // 3 was 715827904)."""
    quotient = aten.div.Tensor_mode(a, b, rounding_mode="trunc")
    remainder = a - quotient * b
    return torch.where((remainder != 0) & ((remainder < 0) != (b < 0)), quotient - 1, quotient)


def div_mode(a, b, *, rounding_mode: str | None = None):
    """``aten.div`` with ``rounding_mode="floor"``, computed as torch computes it.

    torch-mlir lowers it to floor(a / b) in floating point: for floats that differs from
    torch at infinities (torch: ``floor_divide(inf, 2)`` is NaN, ``floor_divide(-1, inf)`` is
    -1) and where a / b rounds up to an integer; for int32 and int64 it went through float32,
    wrong beyond 2**24. Other rounding modes lower as they are.
    """
    if rounding_mode != "floor":
        return NotImplemented
    if not isinstance(a, torch.Tensor):  # ``5 // t``
        a = promoted_scalar(a, b)
    b = promoted_scalar(b, a)
    if not (a.is_floating_point() or b.is_floating_point()):
        return _floor_divide_integers(*_promoted(a, b))
    a, b = _promoted(a, b)
    mod = _fmod_float(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    floor = torch.where(div == 0, torch.copysign(torch.zeros_like(div), a / b), floor)
    return torch.where(b == 0, a / b, floor)


def remainder_scalar(a, b):
    # The number in the type the op computes in: an integer tensor % 2.5 is a float32 remainder
    # (a 2.5 made int64 gave 7 % 2.5 = 1 where torch gives 2.0).
    return remainder(a, promoted_scalar(b, a))


@calls_itself
def fmod(a, b):
    """C's remainder (the dividend's sign); torch-mlir lowers no ``fmod`` with a scalar divisor."""
    if a.is_floating_point() or b.is_floating_point():
        return _fmod_float(*_promoted(a, b))
    a, b = _promoted(a, b)
    return a - aten.div.Tensor_mode(a, b, rounding_mode="trunc") * b


def fmod_scalar(a, b):
    return fmod(a, promoted_scalar(b, a))


def promoted_scalar(value, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of the type ``like`` op ``value`` computes in (tensors pass through)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.scalar_tensor(value, dtype=torch.result_type(like, value), device=like.device)


def _as_tensor(value, like):
    return value if isinstance(value, torch.Tensor) else torch.scalar_tensor(value, dtype=like.dtype,
                                                                            device=like.device)


def bitwise_xor_scalar(a, b):
    return aten.bitwise_xor.Tensor(a, _as_tensor(b, a))


def bitwise_or_scalar(a, b):
    return aten.bitwise_or.Tensor(a, _as_tensor(b, a))


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``prims.fma`` (inductor's decompositions emit it once inductor is loaded): a * b + c; IREE
    may contract it back into one fused multiply-add."""
    return a * b + c


def lerp(start: torch.Tensor, end: torch.Tensor, weight: torch.Tensor | float) -> torch.Tensor:
    """``aten.lerp`` (every Adam step) with torch's two-sided formula, exact at both ends; ours so
    the table does not depend on which decomposition the loaded torch modules registered."""
    difference = end - start
    if not isinstance(weight, torch.Tensor):
        weight = torch.scalar_tensor(weight, dtype=difference.dtype, device=difference.device)
    return torch.where(weight.abs() < 0.5, start + weight * difference, end - difference * (-weight + 1))


def gcd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.gcd`` by Euclid's algorithm, unrolled for the worst case of the dtype (consecutive
    Fibonacci numbers: 47 steps for 32 bits, 93 for 64); finished pairs keep their value."""
    a, b = torch.broadcast_tensors(a, b)
    if a.is_signed():
        a, b = a.abs(), b.abs()
    steps = {1: 13, 2: 25, 4: 47}.get(a.element_size(), 93)
    for _ in range(steps):
        nonzero = b != 0
        remainder = a - aten.div.Tensor_mode(a, torch.where(nonzero, b, torch.ones_like(b)), rounding_mode="trunc") * b
        a, b = torch.where(nonzero, b, a), torch.where(nonzero, remainder, b)
    return a


def abs_unsigned(x: torch.Tensor) -> torch.Tensor:
    """``aten.abs`` of unsigned integers: the values themselves (torch-mlir could not
    lower the abs of an unsigned type)."""
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool or x.is_signed():
        return NotImplemented
    return x.clone()


def lcm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.lcm``: |a / gcd(a, b) * b|, 0 when either is 0."""
    a, b = torch.broadcast_tensors(a, b)
    divisor = gcd(a, b)
    safe = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    # As torch's C++ kernel: narrow integers are promoted to int before the product and abs.
    wide = torch.int32 if a.element_size() < 4 else a.dtype
    multiple = (aten.div.Tensor_mode(a, safe, rounding_mode="trunc").to(wide) * b.to(wide)).abs().to(a.dtype)
    return torch.where(divisor == 0, torch.zeros_like(a), multiple)


def add_bool(a: torch.Tensor, b: torch.Tensor | float, *, alpha: float = 1) -> torch.Tensor:
    """``aten.add`` of two bool tensors: logical or, as torch (IREE added the 1-bit integers and
    wrapped True + True to False)."""
    if not (isinstance(b, torch.Tensor) and a.dtype == torch.bool and b.dtype == torch.bool and alpha):
        return NotImplemented
    return torch.logical_or(a, b)


def copysign_integers(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.copysign`` of integer or bool tensors: in the float type of its result first, as torch
    converts them (``copysign(INT_MIN, 1)`` was negative: the magnitude overflowed in the integers)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or (
            a.is_floating_point() and b.is_floating_point()) or a.is_complex() or b.is_complex():
        return NotImplemented
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return aten.copysign.Tensor(a.to(dtype), b.to(dtype))


def eq_tensor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.eq.Tensor`` of a float tensor with itself: NaN is not equal to itself.

    torch-mlir folds ``x == x`` to a constant true (so ``isfinite``, which torch writes as
    ``(x == x) & (x.abs() != inf)``, called NaN finite).
    """
    if a is b and (a.is_floating_point() or a.is_complex()):
        return a.isnan().logical_not()
    return compared_in_common_type(aten.eq.Tensor)(a, b)


def compared_in_common_type(op: Any) -> Callable:
    """A comparison of two integer tensors of different types, in their promoted type, as torch.

    torch-mlir compared a uint8 tensor with an int8 one as signed 8-bit integers: ``uint8(255) <
    int8(127)`` was True (torch compares in int16)."""
    def comparison(a: Any, b: Any) -> Any:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype == b.dtype \
                or a.is_floating_point() or b.is_floating_point() or a.is_complex() or b.is_complex():
            return NotImplemented
        common = torch.result_type(a, b)
        return op(a.to(common), b.to(common))
    return comparison


def isfinite(x: torch.Tensor) -> torch.Tensor:
    """``aten.isfinite``: torch-mlir's lowering (|x| != inf) calls NaN finite."""
    if not (x.is_floating_point() or x.is_complex()):
        return torch.ones_like(x, dtype=torch.bool)
    return x.isnan().logical_not() & (x.abs() != float("inf"))


@calls_itself
def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``aten.atan2`` with IEEE's zeros and infinities (IREE's approximation gives NaN for them)."""
    if y.is_complex() or x.is_complex():
        return NotImplemented
    dtype = torch.result_type(y, x)  # before broadcasting: a 0-d float64 does not widen float32
    y, x = torch.broadcast_tensors(y, x)
    if not dtype.is_floating_point:  # integers and bools: torch's default float
        dtype = torch.get_default_dtype()
    y, x = y.to(dtype), x.to(dtype)
    result = aten.atan2.default(y, x)
    pi = torch.pi
    # y +-0 (IREE gave +pi for atan2(-0.0, -0.5), C -pi): +-pi for a negative x, +-0 for a positive one
    zeros = torch.copysign(torch.where(x.signbit(), pi, 0.0), y)
    infinities = torch.copysign(torch.where(x.signbit(), 0.75 * pi, 0.25 * pi), y)  # both +-inf
    result = torch.where((y == 0) & ~x.isnan(), zeros.to(dtype), result)
    # a finite y over an infinite x: +-pi for -inf (IREE gave +pi for atan2(-1, -inf)), +-0 for +inf;
    # an infinite y over a finite x: +-pi/2
    result = torch.where(x.isinf() & y.isfinite(), zeros.to(dtype), result)
    result = torch.where(y.isinf() & x.isfinite(), torch.copysign(torch.full_like(y, 0.5 * pi), y), result)
    result = torch.where(y.isinf() & x.isinf(), infinities.to(dtype), result)
    # atan2 has y's sign: IREE's lost it where y / x underflows (atan2(-1, -3e38) was +pi)
    return torch.copysign(result, y)


@calls_itself
def pow_tensor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.pow`` of two tensors with a floating result, with C's ``pow`` at its special values.

    IREE computes it as ``exp(b * log(a))``: a negative base gave NaN even for an integral
    exponent (``(-2) ** 2`` was NaN, not 4), ``0 ** 0`` and ``nan ** 0`` NaN, not 1, and ``1 ** nan``
    NaN. Here the magnitude comes from the op on ``|a|``, and the sign and special cases follow C.
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if integer_powers.is_integer(dtype):
        return integer_powers.power(a.to(dtype), b.to(dtype))
    if not dtype.is_floating_point:
        return NotImplemented
    a, b = torch.broadcast_tensors(a.to(dtype), b.to(dtype))
    magnitude = aten.pow.Tensor_Tensor(a.abs(), b)
    integral = (b == b.floor()) & b.isfinite()
    odd = integral & ((b * 0.5).floor() * 2 != b)
    result = torch.where(a.signbit() & odd, -magnitude, magnitude)  # (-0) ** 3 is -0
    # NaN in, NaN out (unless ``one`` below): said outright, since MLIR folds pow of a constant
    # NaN base (``torch.pow(float("nan"), x)``, ``full_like(x, nan) ** x``) to 1.
    result = torch.where(((a < 0) & a.isfinite() & b.isfinite() & ~integral) | a.isnan() | b.isnan(),
                         torch.nan, result)
    one = (a == 1) | (b == 0) | ((a == -1) & b.isinf())
    return torch.where(one, torch.ones((), dtype=dtype), result)


def pow_scalar(a, b: torch.Tensor) -> torch.Tensor:
    """``aten.pow`` of a Python number raised to a tensor: a positive base lowers as it is; zero
    (``0.0 ** 0`` was NaN), NaN, infinite and negative bases (``(-2.0) ** x`` gave zeros) follow C."""
    dtype = torch.result_type(a, b)
    if integer_powers.is_integer(dtype) and isinstance(a, int):
        return integer_powers.power_of_base(a, b.to(dtype))
    if not dtype.is_floating_point or isinstance(a, complex) or (a > 0 and a not in (1, math.inf)):
        return NotImplemented
    b = b.to(dtype)
    if a == 1:  # 1 ** anything, NaN too, is 1
        return torch.ones_like(b)
    if a != a:  # NaN: 1 at 0, else NaN
        return torch.where(b == 0, 1.0, torch.nan).to(dtype)
    # Decided here from the number, never from comparisons of a constant tensor of it: torch-mlir
    # folds comparisons of constant splats wrong (``full((3,), 2.0) > 0`` is all-false), and
    # whether such a comparison reached it depended on the order of our constant folding.
    size = abs(a)
    if size == 0:  # 1 at 0, 0 above, inf below
        magnitude = torch.where(b == 0, 1.0, torch.where(b > 0, 0.0, torch.where(b < 0, torch.inf, b)))
    elif size == math.inf:  # 1 at 0, inf above, 0 below
        magnitude = torch.where(b == 0, 1.0, torch.where(b > 0, torch.inf, torch.where(b < 0, 0.0, b)))
    elif size == 1:  # -1 ** +-inf is 1 (NaN stays NaN)
        magnitude = torch.where(b.isnan(), torch.nan, 1.0)
    else:
        magnitude = aten.pow.Scalar(size, b)  # a positive base: as IREE lowers it
    if math.copysign(1.0, a) > 0:
        return magnitude.to(dtype)
    integral = (b == b.floor()) & b.isfinite()
    odd = integral & ((b * 0.5).floor() * 2 != b)
    result = torch.where(odd, -magnitude, magnitude)
    if size not in (0, math.inf):  # a negative finite base to a non-integral power: NaN
        result = torch.where(b.isfinite() & ~integral, torch.nan, result)
    return torch.where(b == 0, 1.0, result).to(dtype)


#: Exponents torch computes as multiplications (2, 3, -1, -2), sqrt and rsqrt (0.5, -0.5: so
#: -0.0 ** 0.5 is -0.0 and -inf ** 0.5 NaN, unlike C), or trivially; IREE lowers them alike.
_POW_AS_IS = frozenset({0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, -0.5})


def _pow_finite_number(a: torch.Tensor, b: float) -> torch.Tensor:
    """:func:`pow_tensor` for a finite Python exponent, its cases decided from the number (never
    from comparisons of a constant tensor of it, which torch-mlir folds wrong: float64 ``b == 0``
    of a splat of 2.5 folded to true, and every power came out 1.0)."""
    if b == 0:
        return torch.ones_like(a)
    magnitude = aten.pow.Tensor_Tensor(a.abs(), torch.full_like(a, b))
    integral = float(b).is_integer()
    if integral and math.fmod(b, 2) != 0:  # odd: the sign of the base, (-0) ** 3 is -0
        magnitude = torch.where(a.signbit(), -magnitude, magnitude)
    undefined = a.isnan() if integral else a.isnan() | ((a < 0) & a.isfinite())  # (-8) ** (1/3)
    result = torch.where(undefined, torch.nan, magnitude)
    return torch.where(a == 1, torch.ones((), dtype=a.dtype), result)


def pow_tensor_scalar(a: torch.Tensor, b) -> torch.Tensor:
    """``aten.pow`` of a tensor raised to a Python number: the exponents torch computes with
    multiplications, sqrt or rsqrt lower as they are; others as :func:`pow_tensor` does (``x ** 7.0``
    was NaN for negative bases, ``x ** nan`` zeros, ``x ** inf`` NaN for bases of magnitude above 1,
    ``-inf ** (1/3)`` NaN, not inf)."""
    if isinstance(b, complex) or not isinstance(a, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(a, b)
    if integer_powers.is_integer(dtype) and type(b) is int and b < 0 and dtype is not torch.bool:
        raise InvalidInputError("Integers to negative integer powers are not allowed.")  # eager's check
    if integer_powers.is_integer(dtype) and isinstance(b, int) and integer_powers.wrapped(b, dtype) > 3:
        return integer_powers.power_of_number(a.to(dtype), integer_powers.wrapped(b, dtype))
    if dtype.is_floating_point and b in (-1.0, -2.0):
        # as torch's kernel: a reciprocal (torch-mlir's linalg lowering of these exponents, a
        # dynamic kernel's, gave -inf for 0 ** -1 and 0 ** -2)
        base = a.to(dtype)
        return torch.reciprocal(base if b == -1.0 else base * base)
    if not dtype.is_floating_point or b in _POW_AS_IS:
        return NotImplemented
    if math.isfinite(b):
        return _pow_finite_number(a.to(dtype), b)
    magnitude = a.to(dtype).abs()
    if math.isnan(b):
        result = torch.full_like(magnitude, math.nan)
    else:  # C: |a| > 1 goes to inf at +inf and to 0 at -inf, |a| < 1 the other way
        big, small = (math.inf, 0.0) if b > 0 else (0.0, math.inf)
        result = torch.where(magnitude > 1, big, torch.where(magnitude < 1, small, magnitude))
    one = a == 1 if math.isnan(b) else magnitude == 1  # 1 ** anything is 1, and so is -1 ** +-inf
    return torch.where(one, 1.0, result).to(dtype)


def hypot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.hypot`` without overflow: the larger magnitude times sqrt(1 + ratio**2); inf wins over NaN."""
    dtype = torch.result_type(a, b)  # before broadcasting: a 0-d float64 does not widen float32
    a, b = torch.broadcast_tensors(a.abs().to(dtype), b.abs().to(dtype))
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, 0.0, small / big)
    result = big * torch.sqrt(1 + ratio * ratio)
    return torch.where(a.isinf() | b.isinf(), float("inf"), result)


def ldexp(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``aten.ldexp`` as torch computes it: ``x * 2 ** other``, exact for integer exponents.

    The powers of two are built from their bits and applied in up to three steps (each within the
    compute dtype's exponent range), so only the last multiplication rounds. IREE's ``pow`` and
    ``exp2`` of integers are approximations (``2.0 ** 3`` was 8 - 2e-15 in float64), and one power
    in float32 overflowed where the product does not: float64 ``ldexp(1, 1023)`` was inf, float32
    ``ldexp(1e-30, 150)`` inf, ``ldexp(1, -1074)`` 0. Floating exponents keep ATen's float32 power.
    """
    if other.is_floating_point() or other.is_complex() or x.is_complex():
        return torch.mul(x, torch.pow(2.0, other))
    out_dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    compute, bits, bias, mantissa = (torch.float64, torch.int64, 1023, 52) if out_dtype == torch.float64 \
        else (torch.float32, torch.int32, 127, 23)
    limit = bias - 1  # a power of 2 ** limit or 2 ** -limit is a normal number
    result = x.to(compute)
    left = other.to(torch.int64).clamp(-3 * limit, 3 * limit)
    for _ in range(3):
        step = left.clamp(-limit, limit)
        power = ((step.to(bits) + bias) << mantissa).view(compute)
        result = result * power
        left = left - step
    return result.to(out_dtype)


def logit_backward(grad: torch.Tensor, x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``aten.logit_backward`` as torch's CPU kernel: 0 outside ``[eps, 1 - eps]``, NaN outside
    ``[0, 1]`` without eps, ``grad / (x (1 - x))`` elsewhere, and NaN for a NaN ``x`` (torch's
    decomposition tests inside the range, and gave a NaN input a gradient of 0)."""
    lo, hi = (0.0, 1.0) if eps is None else (eps, 1.0 - eps)
    outside = 0.0 if eps is not None else float("nan")
    return torch.where((x < lo) | (x > hi), outside, grad / (x * (1.0 - x)))


def copysign_scalar(x: torch.Tensor, other: float) -> torch.Tensor:
    """``aten.copysign.Scalar`` (a number as the sign; torch-mlir lowers only the tensor form):
    ``|x|`` or ``-|x|`` by the number's sign bit, integers promoted as torch promotes them."""
    if x.is_complex() or isinstance(other, complex):
        return NotImplemented
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return torch.neg(x.abs()) if math.copysign(1.0, float(other)) < 0 else x.abs()


def round_decimals(x: torch.Tensor, *, decimals: int = 0) -> torch.Tensor:
    """``aten.round.decimals`` as torch's CPU kernel computes it: in float32 for float16 and
    bfloat16 (scaled in float16, ``round(1000.25, decimals=2)`` overflowed to inf), dividing by the
    power of ten for negative ``decimals``. Of an integer tensor: torch's error (its CPU kernel has
    none; here ``round(ints, decimals=-1)`` returned the integers unchanged)."""
    if x.is_complex():
        return NotImplemented
    if x.is_floating_point():
        if decimals == 0:
            return torch.round(x)
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        scale = 10.0 ** abs(decimals)
        if compute != torch.float64:  # the power of ten as the kernel's cast to float32 rounds it
            scale = struct.unpack("f", struct.pack("f", scale))[0]
        wide = x.to(compute)
        rounded = torch.round(wide / scale) * scale if decimals < 0 else torch.round(wide * scale) / scale
        return rounded.to(x.dtype)
    kernel = "round_vml_cpu" if decimals == 0 else "round_cpu"
    raise NotImplementedError(f'"{kernel}" not implemented for \'{indexing.scalar_type_name(x.dtype)}\'')


def in_default_float(op: Any) -> Callable:
    """``op`` of an integer or bool tensor in the default float type, as torch computes it
    (torch-mlir legalizes ``reciprocal`` and ``erf`` of floats only: ``1 / n`` of an integer
    tensor, SWA's ``AveragedModel`` weight, failed to compile)."""
    def decomposition(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.is_complex():
            return NotImplemented
        return op(x.to(torch.get_default_dtype()))
    return decomposition


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.reciprocal.default: in_default_float(aten.reciprocal.default),
    aten.round.decimals: round_decimals,
    aten.erf.default: in_default_float(aten.erf.default),
    aten.ldexp.Tensor: ldexp,
    aten.logit_backward.default: logit_backward,
    aten.copysign.Scalar: copysign_scalar,
    aten.remainder.Tensor: remainder,
    aten.remainder.Scalar: remainder_scalar,
    aten.div.Tensor_mode: div_mode,
    aten.div.Scalar_mode: div_mode,
    aten.fmod.Tensor: fmod,
    aten.fmod.Scalar: fmod_scalar,
    aten.gcd.default: gcd,
    aten.abs.default: abs_unsigned,
    aten.add.Tensor: add_bool,
    aten.lcm.default: lcm,
    aten.lerp.Scalar: lerp,
    aten.lerp.Tensor: lerp,
    aten.isfinite.default: isfinite,
    aten.eq.Tensor: eq_tensor,
    **{op: compared_in_common_type(op) for op in (aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor,
                                                    aten.gt.Tensor, aten.ge.Tensor)},
    aten.atan2.default: atan2,
    aten.copysign.Tensor: copysign_integers,
    aten.pow.Tensor_Tensor: pow_tensor,
    aten.pow.Scalar: pow_scalar,
    aten.pow.Tensor_Scalar: pow_tensor_scalar,
    aten.hypot.default: hypot,
    aten.bitwise_xor.Scalar: bitwise_xor_scalar,
    aten.bitwise_or.Scalar: bitwise_or_scalar,
}
