"""Special functions (erfc, erfinv, erfcx, lgamma, digamma, polygamma) as elementwise arithmetic.

torch-mlir lowers none of ``aten.erfc``, ``aten.erfinv``, ``aten.special_erfcx``,
``aten.lgamma``, ``aten.digamma`` and ``aten.polygamma`` (which the backwards
of ``lgamma`` and ``digamma`` call). Each is written here in arithmetic,
``exp``, ``log``, ``sqrt``, ``round``, ``clamp`` and ``where``, evaluated in
the input's dtype (float16 and bfloat16 in float32, cast back; integers in the
default dtype):

- ``erfc``: Cephes' rational approximations (``1 - erf`` near 0, then
  ``exp(-x**2) P(x) / Q(x)``), with ``exp(-x**2)`` split so the rounding of
  ``x**2`` is not magnified: relative accuracy holds into the tail.
- ``erfinv``: Giles' single-precision approximation (an asymptotic inversion of
  erfc past its range in float64) refined by Halley steps whose residual uses
  ``erfc`` where ``erf`` would round to 1.
- ``erfcx``: erfc's tail rationals without the exponential.
- ``lgamma`` and ``digamma``: Stirling's series after shifting the argument
  past 10 (6 in float32), the reflection formula below 0 with ``sin(pi x)``
  from a polynomial of the distance to the nearest integer (IREE's ``sin`` is
  off by 1e-3 relative near 0 in float32, and float64 ``sin`` does not link).
- ``polygamma(1, x)``: torch's own algorithm (reflection below 0.5, six
  recurrence steps, asymptotic series) with ``pi * x`` rounded as torch rounds
  it, so gradients of ``digamma`` match eager even where that algorithm is
  inexact (eager's float32 trigamma is off by up to 1e-2 relative at large
  negative arguments).

Measured on the compiled graphs against eager (relative error, or absolute where
the value is below 1 in magnitude): float32 erfinv 1.2e-7, erfc, erfcx and
trigamma 5e-7, digamma 1.1e-6, lgamma 3.2e-6; float64 erfc, erfinv and trigamma
8e-16, erfcx 3e-15, lgamma 1e-14, digamma 1e-14 (3e-13 next to negative poles,
where eager's own digamma is off by up to 1e-12). The compiled code flushes
subnormal results to zero (IREE on CPU): ``erfc`` of float32 above ~9.2
(float64 above ~26.5) is 0 where eager returns a subnormal number.

No constant that float32 cannot hold exactly is the left operand of a
subtraction from a tensor (``c - t``): the compile path rounds that ``c`` to
float32 even in float64 graphs; ``-t + c`` keeps it exact.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence

import torch

aten = torch.ops.aten

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_INF = float("inf")
_NAN = float("nan")


def _elementwise(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """Run ``fn`` in float32 for half types (cast back) and in the default dtype for integers."""

    @functools.wraps(fn)
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        if x.is_complex():
            return NotImplemented
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        compute = torch.float32 if dtype in _LOW_PRECISION else dtype
        return fn(x.to(compute)).to(dtype)

    return wrapper


def _to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _polevl(x: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """The polynomial with ``coefficients`` (highest degree first) at ``x``, by Horner's rule."""
    result = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        result = result * x + c
    return result


def _p1evl(x: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """:func:`_polevl` of a monic polynomial whose leading 1 ``coefficients`` leaves out."""
    result = x + coefficients[0]
    for c in coefficients[1:]:
        result = result * x + c
    return result


# ---------------------------------------------------------------------------------------------
# erfc and erfinv. Coefficients: Cephes Math Library (ndtr.c, S. L. Moshier), 3-clause BSD.

#: erf(x) = x T(x^2) / U(x^2) for |x| < 1 (U monic).
_ERF_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4)
_ERF_U = (3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
          2.26290000613890934246E4, 4.92673942608635921086E4)
#: erfc(x) = exp(-x^2) P(x) / Q(x) for 1 <= x < 8 (Q monic).
_ERFC_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
           4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
           9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)
_ERFC_Q = (1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
           9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
           1.65666309194161350182E3, 5.57535340817727675546E2)
#: erfc(x) = exp(-x^2) R(x) / S(x) for x >= 8 (S monic).
_ERFC_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
           6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)
_ERFC_S = (2.26052863220117276590E0, 9.39603524938001434673E0, 1.20489539808096656605E1,
           1.70814450747565897222E1, 9.60896809063285878198E0, 3.36907645100081516050E0)

#: Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision:
#: erfinv(y) = y p(w - 2.5) for w = -log(1 - y^2) < 5, else y q(sqrt(w) - 3).
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
               -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _exp_minus_square(a: torch.Tensor) -> torch.Tensor:
    """``exp(-a * a)`` for ``0 <= a < 32`` without magnifying the rounding of ``a * a``.

    ``a * a`` rounds by up to half an ulp, which ``exp`` turns into a relative error of
    ``a**2`` half-ulps (5e-6 at a = 9 in float32). Split ``a = m + (a - m)`` with ``m``
    short enough (12 significant bits in float32, 26 in float64) that ``m * m`` is exact:
    ``exp(-m * m) * exp(-(a - m) * (a + m))``.
    """
    scale = 2.0 ** 21 if a.dtype == torch.float64 else 2.0 ** 7
    m = torch.round(a * scale) / scale
    return torch.exp(-(m * m)) * torch.exp(-((a - m) * (a + m)))


def _erfc_tail(a: torch.Tensor) -> torch.Tensor:
    """``erfc(a) * exp(a**2)`` for finite ``a`` past :func:`_erfc_split`: Cephes' two rationals."""
    near = _polevl(a, _ERFC_P) / _p1evl(a, _ERFC_Q)
    far = _polevl(a, _ERFC_R) / _p1evl(a, _ERFC_S)
    return torch.where(a < 8, near, far)


def _erfc_split(x: torch.Tensor) -> float:
    """Where erfc turns from ``1 - erf`` to the rational tail: Cephes' 1 in float64; 0.5 in
    float32, where the tail is still exact to 1e-11 and ``1 - erf`` loses no digits yet."""
    return 1.0 if x.dtype == torch.float64 else 0.5


#: erf(x) - x = x D(x^2) / U(x^2) for |x| < 1, D = T - U (leading -1): the same rational with
#: the identity split off, so erf(x) - y (erfinv's residual) is computed without rounding erf(x).
_ERF_D = (-1.0, *(t - u for t, u in zip(_ERF_T, _ERF_U)))


def _erf_minus_identity(x: torch.Tensor) -> torch.Tensor:
    """``erf(x) - x`` for ``|x| <= 1``: Cephes' rational for erf less ``x``."""
    z = x * x
    return x * _polevl(z, _ERF_D) / _p1evl(z, _ERF_U)


@_elementwise
def erfc(x: torch.Tensor) -> torch.Tensor:
    """``aten.erfc``: ``1 - erf(x)`` near 0 (below 1 in float64, 0.5 in float32), else
    ``exp(-x**2)`` times a rational.

    Relative accuracy holds into the tail (no ``1 - erf(x)`` there); negative arguments
    take ``2 - erfc(-x)``. Magnitudes are clamped to 30, where erfc is 0 in both
    precisions, to keep the polynomials finite (infinities included).
    """
    a = torch.clamp(x.abs(), max=30.0)
    inner = (1 - x) - _erf_minus_identity(x)
    tail = _exp_minus_square(a) * _erfc_tail(a)
    tail = torch.where(x < 0, 2 - tail, tail)
    return torch.where(a < _erfc_split(x), inner, tail)


#: Past this magnitude erfcx(x) is 1 / (sqrt(pi) x) (1 - 1 / (2 x^2)) to 1e-20 (S(x) would overflow).
_ERFCX_ASYMPTOTIC = 1e5


@_elementwise
def erfcx(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_erfcx``: ``exp(x**2) erfc(x)``, the tail rationals of :func:`erfc` without the exp.

    Near 0 ``exp(x**2) (1 - erf(x))``; below ``-split`` ``2 exp(x**2) - erfcx(-x)`` with
    ``x**2`` rounded as torch's kernel rounds it (off by up to ``x**2`` half-ulps, 4e-6
    relative at -8 in float32, but eager's value), overflowing to inf as torch does; past
    1e5 the asymptotic ``1 / (sqrt(pi) x)``.
    """
    split = _erfc_split(x)
    a = x.abs()
    tail = _erfc_tail(torch.clamp(a, min=split, max=_ERFCX_ASYMPTOTIC))
    asymptotic = (1 - 0.5 / (a * a)) / (a * math.sqrt(math.pi))
    tail = torch.where(a > _ERFCX_ASYMPTOTIC, asymptotic, tail)
    inner_x = torch.clamp(x, min=-split, max=split)
    inner = torch.exp(inner_x * inner_x) * ((1 - inner_x) - _erf_minus_identity(inner_x))
    negative = 2 * torch.exp(x * x) - tail
    return torch.where(x >= split, tail, torch.where(x <= -split, negative, inner))


@_elementwise
def erfinv(y: torch.Tensor) -> torch.Tensor:
    """``aten.erfinv``: Giles' approximation, refined by Halley's method on ``erf(x) = |y|``.

    The residual ``erf(x) - |y|`` is computed as ``(1 - |y|) - erfc(x)`` from x = 1, where
    ``1 - |y|`` is exact and erfc keeps its relative accuracy, so the tail converges to
    the correctly rounded inverse rather than to wherever ``erf`` rounds to ``|y|``. One
    step in float32; two in float64 (Giles' tail is a float32 fit, far off near +-1 in
    float64). ``erfinv(+-1) = +-inf``, ``|y| > 1`` gives NaN. float32 results are within
    1.5 ulp of eager's (which are correctly rounded), so near +-1 the gradient
    ``exp(erfinv(y)**2)`` can differ from eager's by ``2 erfinv(y)**2`` such ulps (2e-6).
    """
    a = y.abs()
    w = -torch.log((1 - a) * (1 + a))
    central = _polevl(w - 2.5, _GILES_CENTRAL)
    tail = _polevl(torch.sqrt(w) - 3, _GILES_TAIL)
    x = torch.where(w < 5, central, tail) * a
    if y.dtype == torch.float64:
        # Past Giles' range (1 - |y| < 1e-7): invert erfc(x) ~ exp(-x^2) / (x sqrt(pi)) (1 - 1/(2x^2)),
        # within 7e-5 relative there.
        big = torch.clamp(-torch.log((1 - a) * math.sqrt(math.pi)), min=2.0)
        guess = torch.sqrt(big - 0.5 * torch.log(big))
        guess = torch.sqrt(big - torch.log(guess) + torch.log(1 - 0.5 / (guess * guess)))
        x = torch.where(w > 16, guess, x)
    x = torch.where(a < 1, x, 0.0)  # finite where the result is a special value
    # erf(x) - |y| below 1; above, (1 - |y|) - erfc(x), where erf would round towards 1 but
    # 1 - |y| is exact. exp(-x * x) needs no split here: its relative error moves the root of
    # erfc(x) = 1 - |y| by only that error over 2x.
    for _ in range(2 if y.dtype == torch.float64 else 1):
        inner = torch.clamp(x, max=1.0)
        outer = torch.clamp(x, min=1.0, max=8.0)  # finite where not selected
        erfc_outer = torch.exp(-(outer * outer)) * _polevl(outer, _ERFC_P) / _p1evl(outer, _ERFC_Q)
        residual = torch.where(x < 1, (inner - a) + _erf_minus_identity(inner), (1 - a) - erfc_outer)
        slope = _TWO_OVER_SQRT_PI * torch.exp(-(x * x))
        x = x - residual / (slope + x * residual)
    x = torch.where(a == 1, _INF, x)
    x = torch.where(a > 1, _NAN, x)
    return torch.copysign(x, y)


# ---------------------------------------------------------------------------------------------
# lgamma, digamma and trigamma.

_LOG_PI = math.log(math.pi)
_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)

#: sin(pi a) = a S(a^2) for |a| <= 1/2: Taylor coefficients (-1)^k pi^(2k+1) / (2k+1)!,
#: to a^21 in float64 (next term 1e-18 relative), to a^13 in float32 (7e-10).
_SIN_PI = tuple((-1) ** k * math.pi ** (2 * k + 1) / math.factorial(2 * k + 1) for k in range(11))[::-1]


def _sin_pi(a: torch.Tensor) -> torch.Tensor:
    """``sin(pi * a)`` for ``|a| <= 1/2``, to an ulp or two (IREE's sin is far less accurate)."""
    coefficients = _SIN_PI if a.dtype == torch.float64 else _SIN_PI[-7:]
    return a * _polevl(a * a, coefficients)


def _shift(x: torch.Tensor) -> tuple[int, int]:
    """Recurrence steps and Stirling terms: 10 and 7 in float64 (error 3e-17), 6 and 4 in float32."""
    return (10, 7) if x.dtype == torch.float64 else (6, 4)


#: Stirling's series for lgamma: B_2k / (2k (2k - 1)) for k = 1..7, of 1 / z^(2k - 1).
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
#: The asymptotic series of digamma: B_2k / (2k) for k = 1..7, of 1 / z^(2k).
_DIGAMMA_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)


@_elementwise
def lgamma(x: torch.Tensor) -> torch.Tensor:
    """``aten.lgamma``: log|Gamma(x)|.

    For ``z >= n`` (n = 10 in float64, 6 in float32) Stirling's series; below, the same at
    ``z + n`` less ``log(z (z + 1) ... (z + n - 1))``. Negative arguments reflect:
    ``log(pi / |sin(pi x)|) - lgamma(1 - x)``. Poles (0 and negative integers) and
    infinities give +inf, as torch does.
    """
    steps, terms = _shift(x)
    negative = x < 0
    z = torch.where(negative, 1 - x, x)
    small = z < steps
    # z + steps rounds; its rounding error (exact by Fast2Sum, z < steps) corrects the result.
    shifted = z + steps
    lost = z - (shifted - steps)
    w = torch.where(small, shifted, z)
    zs = torch.where(small, z, 1.0)  # keeps the product finite where it is not used
    product = zs
    for k in range(1, steps):
        product = product * (zs + k)
    log_w = torch.log(w)
    inverse = 1 / w
    series = inverse * _polevl(inverse * inverse, _STIRLING[:terms][::-1])
    stirling = (w - 0.5) * log_w - w + _HALF_LOG_TWO_PI + series
    shifted_result = stirling + lost * (log_w - 0.5 * inverse) - torch.log(product)
    result = torch.where(small, shifted_result, stirling)
    distance = (x - torch.round(x)).abs()  # exact, in [0, 1/2]
    reflected = -torch.log(_sin_pi(distance)) + _LOG_PI - result
    result = torch.where(negative, reflected, result)
    return torch.where(x.abs() == _INF, _INF, result)


@_elementwise
def digamma(x: torch.Tensor) -> torch.Tensor:
    """``aten.digamma`` (and ``torch.special.psi``): the logarithmic derivative of Gamma.

    ``log z - 1/(2z) - sum B_2k / (2k z^2k)`` for ``z >= n`` (n = 10 in float64, 6 in
    float32); below, at ``z + n`` less ``sum 1/(z + k)``. Negative arguments reflect:
    ``digamma(1 - x) - pi cot(pi x)``. As torch: -inf at +0, +inf at -0, NaN at negative
    integers and -inf.
    """
    steps, terms = _shift(x)
    negative = x < 0
    z = torch.where(negative, 1 - x, x)
    small = z < steps
    w = torch.where(small, z + steps, z)
    inverse_square = 1 / (w * w)
    series = inverse_square * _polevl(inverse_square, _DIGAMMA_SERIES[:terms][::-1])
    asymptotic = torch.log(w) - 0.5 / w - series
    recurrence = 1 / z
    for k in range(1, steps):
        recurrence = recurrence + 1 / (z + k)
    result = torch.where(small, asymptotic - recurrence, asymptotic)
    # pi cot(pi x), from the distance to the nearest integer: cos(pi r) = sin(pi (1/2 - r)).
    r = x - torch.round(x)
    distance = r.abs()
    cot = torch.copysign(_sin_pi(0.5 - distance) / _sin_pi(distance), r)
    result = torch.where(negative, result - math.pi * cot, result)
    result = torch.where(x == 0, torch.where(x.signbit(), _INF, -_INF), result)
    return torch.where(negative & (x == torch.floor(x)), _NAN, result)


#: pi/2 split for Cody and Waite's reduction: parts of 11 bits (float32) or 26 bits (float64),
#: so k * part is exact for k < 2^13 (float32) or 2^27 (float64); the last part rounds.
_HALF_PI_PARTS_32 = (float.fromhex("0x1.92p+0"), float.fromhex("0x1.fb4p-12"),
                     float.fromhex("0x1.4442d18469899p-24"))
_HALF_PI_PARTS_64 = (float.fromhex("0x1.921fb5p+0"), float.fromhex("0x1.110b46p-26"),
                     float.fromhex("0x1.1a62633145c07p-54"))
#: pi and pi * pi as torch's float32 kernels use them: rounded to float32, product rounded.
_PI_32 = _to_float32(math.pi)
_PI_SQUARED_32 = _to_float32(_PI_32 * _PI_32)
#: cos(t) = C(t^2) for |t| <= pi/4, Taylor coefficients to t^16 (float64) or t^10 (float32).
_COS = tuple((-1) ** k / math.factorial(2 * k) for k in range(9))[::-1]
_SIN = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(9))[::-1]


def _sin_squared(t: torch.Tensor) -> torch.Tensor:
    """``sin(t)**2`` for any finite ``t`` (accurate for |t| < 1e4 in float32, 2e8 in float64)."""
    double = t.dtype == torch.float64
    parts = _HALF_PI_PARTS_64 if double else _HALF_PI_PARTS_32
    k = torch.round(t * (2 / math.pi))
    r = ((t - k * parts[0]) - k * parts[1]) - k * parts[2]  # |r| <= pi/4
    r2 = r * r
    sin = r * _polevl(r2, _SIN if double else _SIN[-5:])
    cos = _polevl(r2, _COS if double else _COS[-6:])
    odd = (k * 0.5) != torch.floor(k * 0.5)
    return torch.where(odd, cos * cos, sin * sin)


@_elementwise
def trigamma(x: torch.Tensor) -> torch.Tensor:
    """``polygamma(1, x)``, step for step as torch's CPU kernel computes it.

    Below 0.5 the reflection ``pi**2 / sin(pi x)**2 - trigamma(1 - x)``, with ``pi * x``
    rounded in the working dtype as torch rounds it (so large negative arguments are as
    inexact as eager's); then six recurrence steps and an asymptotic series. The sine of
    that rounded product is exact to an ulp or two for |x| < 4096 in float32 (6.7e7 in
    float64); past that it drifts from eager's (where eager's trigamma is noise anyway).
    """
    pi, pi_squared = (math.pi, math.pi * math.pi) if x.dtype == torch.float64 else (_PI_32, _PI_SQUARED_32)
    reflect = x < 0.5
    result = torch.where(reflect, -pi_squared / _sin_squared(x * pi), 0.0)
    z = torch.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (z * z)
        z = z + 1
    ixx = 1 / (z * z)
    result = result + (1 + 1 / (2 * z) + ixx * (-(ixx * (-(ixx * (1 / 42)) + 1 / 30)) + 1 / 6)) / z
    return torch.where(reflect, -result, result)


def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """``aten.polygamma`` for n = 0 (digamma) and n = 1 (trigamma, digamma's gradient)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    return NotImplemented


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.erfc.default: erfc,
    aten.erfinv.default: erfinv,
    aten.special_erfcx.default: erfcx,
    aten.lgamma.default: lgamma,
    aten.digamma.default: digamma,
    aten.polygamma.default: polygamma,
}
