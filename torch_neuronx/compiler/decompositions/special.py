"""Special functions (erfc, erfinv, erfcx, lgamma, digamma, polygamma, i0, i0e, i1, i1e,
frexp) as elementwise arithmetic.

torch-mlir lowers none of ``aten.erfc``, ``aten.erfinv``, ``aten.special_erfcx``,
``aten.lgamma``, ``aten.digamma``, ``aten.polygamma`` (which the backwards
of ``lgamma`` and ``digamma`` call), ``aten.i0``, ``aten.special_i0e``,
``aten.special_i1``, ``aten.special_i1e`` (which one another's backwards call)
and ``aten.frexp``. Each is written here in arithmetic, ``exp``, ``log``,
``sqrt``, ``round``, ``floor``, ``clamp`` and ``where`` (frexp in integer
operations on the bits), evaluated in the input's dtype (float16 and bfloat16
in float32, cast back; integers in the default dtype):

- ``erfc``, ``erfcx``, ``erfinv``: written (and their methods described) in :mod:`.erf`;
  registered here.
- ``lgamma`` and ``digamma``: Stirling's series after shifting the argument
  past 10 (6 in float32), the reflection formula below 0 with ``sin(pi x)``
  from a polynomial of the distance to the nearest integer (IREE's ``sin`` is
  off by 1e-3 relative near 0 in float32, and float64 ``sin`` does not link).
- ``polygamma(1, x)``: torch's own algorithm (reflection below 0.5, six
  recurrence steps, asymptotic series) with ``pi * x`` rounded as torch rounds
  it, so gradients of ``digamma`` match eager even where that algorithm is
  inexact (eager's float32 trigamma is off by up to 1e-2 relative at large
  negative arguments).
- ``polygamma(n, x)`` for n >= 2: torch's ``(-1)**(n + 1) n! zeta(n + 1, x)``
  with Cephes' Hurwitz zeta (ten terms, then Euler-Maclaurin), in float64 for
  float32 too, as torch accumulates it; negative arguments as three sums from
  positive ones.
- ``i0``, ``i0e``, ``i1``, ``i1e``: Cephes' Chebyshev expansions on [0, 8] and
  past 8, step for step as torch's ``calc_i0`` etc. (its float32 tables for i1
  and i1e), so values, overflow to inf and NaN at +-inf are eager's.
- ``frexp``: the exponent field of the bits, and the bits with that field
  replaced; subnormal inputs through their fraction converted to a float.
  ``exp2`` of integers (frexp's gradient divides by ``exponent.exp2()``, which
  IREE computes inexactly: 2e-6 relative at 2**100) is built from bits too.
- ``kaiser_window`` (torch's kernel calls ``calc_i0``) becomes a constant,
  computed by torch at trace time.

Measured on the compiled graphs against eager (relative error, or absolute where
the value is below 1 in magnitude): float32 erfinv 1.2e-7, erfc, erfcx and
trigamma 5e-7, digamma 1.1e-6, lgamma 3.2e-6, i0 and i1 2.8e-7 (i0e and i1e
bit-exact), polygamma(2..6, .) 2.5e-7 at positive arguments; float64 erfc,
erfinv and trigamma 8e-16, erfcx 3e-15, lgamma 1e-14, digamma 1e-14 (3e-13 next
to negative poles, where eager's own digamma is off by up to 1e-12), i0, i0e,
i1 and i1e bit-exact (2e5 points over the whole range), polygamma(2..6, .)
1.5e-15 at positive arguments; frexp bit-exact in both. At negative arguments
polygamma cancels next to the zeros between poles, in eager as here: there,
float32 stays within 1e-5 absolute (7e-6 relative) and float64 within 8e-11
relative (eager is closer to the truth there by up to 10x). The compiled code
flushes subnormal numbers to zero (IREE on CPU): ``erfc`` of float32 above ~9.2
(float64 above ~26.5) is 0 where eager returns a subnormal number, as are
polygamma values and ``exp2`` powers in that range (so frexp's gradient is inf
where the exponent's power of 2 is a subnormal float32; eager's is finite). frexp
itself reads subnormal inputs from their bits: bit-exact there too.

No constant that float32 cannot hold exactly is the left operand of a
subtraction from a tensor (``c - t``): the compile path rounds that ``c`` to
float32 even in float64 graphs; ``-t + c`` keeps it exact.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from torch_neuronx.compiler.decompositions.cephes import LOW_PRECISION, elementwise, polevl, to_float32
from torch_neuronx.compiler.decompositions.erf import erfc, erfcx, erfinv
from torch_neuronx.compiler.decompositions.literals import literal

aten = torch.ops.aten

_INF = float("inf")
_NAN = float("nan")


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
    return a * polevl(a * a, coefficients)


def _shift(x: torch.Tensor) -> tuple[int, int]:
    """Recurrence steps and Stirling terms: 10 and 7 in float64 (error 3e-17), 6 and 4 in float32."""
    return (10, 7) if x.dtype == torch.float64 else (6, 4)


#: Stirling's series for lgamma: B_2k / (2k (2k - 1)) for k = 1..7, of 1 / z^(2k - 1).
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
#: The asymptotic series of digamma: B_2k / (2k) for k = 1..7, of 1 / z^(2k).
_DIGAMMA_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)


@elementwise
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
    series = inverse * polevl(inverse * inverse, _STIRLING[:terms][::-1])
    stirling = (w - 0.5) * log_w - w + _HALF_LOG_TWO_PI + series
    shifted_result = stirling + lost * (log_w - 0.5 * inverse) - torch.log(product)
    result = torch.where(small, shifted_result, stirling)
    distance = (x - torch.round(x)).abs()  # exact, in [0, 1/2]
    reflected = -torch.log(_sin_pi(distance)) + _LOG_PI - result
    result = torch.where(negative, reflected, result)
    # Poles: their reflection is inf - inf where lgamma(1 - x) overflows (x = -3e38).
    pole = negative & (distance == 0)
    return torch.where((x.abs() == _INF) | pole, _INF, result)


@elementwise
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
    series = inverse_square * polevl(inverse_square, _DIGAMMA_SERIES[:terms][::-1])
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
_PI_32 = to_float32(math.pi)
_PI_SQUARED_32 = to_float32(_PI_32 * _PI_32)
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
    sin = r * polevl(r2, _SIN if double else _SIN[-5:])
    cos = polevl(r2, _COS if double else _COS[-6:])
    odd = (k * 0.5) != torch.floor(k * 0.5)
    return torch.where(odd, cos * cos, sin * sin)


@elementwise
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


# ---------------------------------------------------------------------------------------------
# polygamma(n, x) for n >= 2, through the Hurwitz zeta function. Cephes (zeta.c), 3-clause BSD.

#: The Euler-Maclaurin denominators of Cephes' zeta: (2k)! / B_2k.
ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)
#: Terms summed directly before Euler-Maclaurin takes the rest (Cephes: until past 9).
_ZETA_TERMS = 10


def _int_power(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t ** k`` for an integer ``k >= 1``, by repeated squaring."""
    result = None
    while k:
        if k & 1:
            result = t if result is None else result * t
        k >>= 1
        if k:
            t = t * t
    return result


def _hurwitz_zeta(s: int, q: torch.Tensor) -> torch.Tensor:
    """``zeta(s, q) = sum_k (q + k)**-s`` for an integer ``s >= 2`` and ``q > 0``: Cephes' method.

    Ten terms summed, then Euler-Maclaurin from ``w = q + 10`` with Cephes' twelve terms,
    written as ``w**(1 - s) (1/(s - 1) + 1/(2w) + sum_i c_i / w**(2i + 2))`` so no power of
    ``w`` overflows or underflows before the result does.
    """
    total = _int_power(1 / q, s)
    for k in range(1, _ZETA_TERMS):
        total = total + _int_power(1 / (q + k), s)
    # c_i = s (s + 1) ... (s + 2i) / A_i.
    coefficients = [math.prod(s + j for j in range(2 * i + 1)) / a for i, a in enumerate(ZETA_A)]
    inverse = 1 / (q + _ZETA_TERMS)
    series = inverse * (inverse * polevl(inverse * inverse, coefficients[::-1]) + 0.5) + 1 / (s - 1)
    return total + _int_power(inverse, s - 1) * series


def _polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """``polygamma(n, x) = (-1)**(n + 1) n! zeta(n + 1, x)`` for n >= 2, as torch computes it.

    Computed in float64 for float32 too, as torch's CPU kernel accumulates zeta (in float32
    the sums cancel next to the zeros at negative ``x``); torch rounds zeta to float32
    before the factor, so float32 results can differ from eager's by an ulp. (A float32
    graph holding it so compiles with float64 kept, see ``targets.KEEP_F64_FLAGS``.) Negative
    non-integer ``x`` takes torch's direct sum as ``zeta(s, p) + (-1)**s (zeta(s, 1 - p) -
    zeta(s, 1 - x))`` with ``p = x - floor(x)``: the same terms, each sum from a positive
    argument. Poles (0, negative integers and -inf) give ``zeta = +inf``, +inf gives NaN,
    as torch does.
    """
    s = n + 1
    q = x.to(torch.float64)
    negative = q < 0
    floor = torch.floor(q)
    zeta = _hurwitz_zeta(s, torch.where(negative, q - floor, q))
    near = _hurwitz_zeta(s, torch.where(negative, (floor + 1) - q, 1.0))  # 1 - p, exact
    reflected = near - _hurwitz_zeta(s, torch.where(negative, 1 - q, 1.0))
    zeta = torch.where(negative, zeta + (-1) ** s * reflected, zeta)
    zeta = torch.where((q <= 0) & (q == floor), _INF, zeta)
    zeta = torch.where(q == _INF, _NAN, zeta)
    return (zeta * ((-1) ** (n + 1) * math.factorial(n))).to(x.dtype)


def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """``aten.polygamma``: n = 0 digamma, n = 1 trigamma (digamma's gradient), n >= 2 through
    the Hurwitz zeta function (each one's gradient is the next)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    if n < 0:
        return NotImplemented
    return elementwise(functools.partial(_polygamma, n))(x)


# ---------------------------------------------------------------------------------------------
# Modified Bessel functions i0, i0e, i1 and i1e. Coefficients: Cephes Math Library (i0.c, i1.c,
# S. L. Moshier), 3-clause BSD, as torch's ATen/native/Math.h holds them.

#: Chebyshev coefficients of exp(-x) I0(x) on [0, 8] (in y = x/2 - 2), zero order last.
_I0E_A = (-4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16,
          1.71539128555513303061E-15, -1.16853328779934516808E-14, 7.67618549860493561688E-14,
          -4.85644678311192946090E-13, 2.95505266312963983461E-12, -1.72682629144155570723E-11,
          9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
          -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7,
          1.11738753912010371815E-6, -4.41673835845875056359E-6, 1.64484480707288970893E-5,
          -5.75419501008210370398E-5, 1.88502885095841655729E-4, -5.76375574538582365885E-4,
          1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
          -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2,
          1.71620901522208775349E-1, -3.04682672343198398683E-1, 6.76795274409476084995E-1)
#: Chebyshev coefficients of exp(-x) sqrt(x) I0(x) on [8, inf) (in y = 32/x - 2).
_I0E_B = (-7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17,
          3.46122286769746109310E-17, -2.82762398051658348494E-16, -3.42548561967721913462E-16,
          1.77256013305652638360E-15, 3.81168066935262242075E-15, -9.55484669882830764870E-15,
          -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
          7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11,
          -3.14991652796324136454E-11, 1.18891471078464383424E-11, 4.94060238822496958910E-10,
          3.39623202570838634515E-9, 2.26666899049817806459E-8, 2.04891858946906374183E-7,
          2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
          8.04490411014108831608E-1)
#: Chebyshev coefficients of exp(-x) I1(x) / x on [0, 8]; float32 uses the last 17, as torch does.
_I1E_A = (2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16,
          -1.10559694773538630805E-15, 7.60068429473540693410E-15, -5.04218550472791168711E-14,
          3.22379336594557470981E-13, -1.98397439776494371520E-12, 1.17361862988909016308E-11,
          -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
          9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7,
          -8.56872026469545474066E-7, 3.47025130813767847674E-6, -1.32731636560394358279E-5,
          4.78156510755005422638E-5, -1.61760815825896745588E-4, 5.12285956168575772895E-4,
          -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
          2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1,
          -1.76416518357834055153E-1, 2.52587186443633654823E-1)
#: Chebyshev coefficients of exp(-x) sqrt(x) I1(x) on [8, inf); float32 uses the last 7.
_I1E_B = (7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17,
          -3.20952592199342395980E-17, 2.96262899764595013876E-16, 3.30820231092092828324E-16,
          -1.88035477551078244854E-15, -3.81440307243700780478E-15, 1.04202769841288027642E-14,
          4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
          -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11,
          3.25260358301548823856E-11, -1.89749581235054123450E-11, -5.58974346219658380687E-10,
          -3.83538038596423702205E-9, -2.63146884688951950684E-8, -2.51223623787020892529E-7,
          -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
          7.78576235018280120474E-1)


def chbevl(y: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """Cephes' ``chbevl``: ``sum' c_i T_i(y/2)`` (zero order last) by Clenshaw's recurrence, step for step."""
    b1 = coefficients[0]
    b0 = y * b1 + coefficients[1]
    for c in coefficients[2:]:
        b2, b1 = b1, b0
        b0 = y * b1 - b2 + c
    return 0.5 * (b0 - b2)


def bessel_series(a: torch.Tensor, order: int, float32_tails: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The two Chebyshev series of i0e (``order`` 0) or i1e (1) at ``a = |x|``: on [0, 8] in
    ``a/2 - 2`` and past 8 in ``32/a - 2`` (each garbage where the other applies). With
    ``float32_tails`` a float32 i1 uses the shorter tables of torch's ``calc_i1`` kernels (the
    ``special_modified_bessel_*`` kernels use the whole tables at every dtype)."""
    if order == 0:
        near, far = _I0E_A, _I0E_B
    elif a.dtype == torch.float64 or not float32_tails:
        near, far = _I1E_A, _I1E_B
    else:  # torch's float32 tables for i1 are the tails of the float64 ones
        near, far = _I1E_A[-17:], _I1E_B[-7:]
    return chbevl(a / 2 - 2, near), chbevl(32 / a - 2, far)


@elementwise
def i0(x: torch.Tensor) -> torch.Tensor:
    """``aten.i0`` (``torch.special.i0``): ``exp(|x|)`` times Cephes' Chebyshev series, as torch's
    ``calc_i0`` (overflowing to inf with ``exp``; NaN at +-inf)."""
    a = x.abs()
    near, far = bessel_series(a, 0)
    scale = torch.exp(a)
    return torch.where(a <= 8, scale * near, scale * far / torch.sqrt(a))


@elementwise
def i0e(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_i0e``: ``exp(-|x|) I0(x)``, Cephes' Chebyshev series (``calc_i0e``)."""
    a = x.abs()
    near, far = bessel_series(a, 0)
    return torch.where(a <= 8, near, far / torch.sqrt(a))


@elementwise
def i1(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_i1``: ``calc_i1``, odd (``i1(-0.0)`` is +0.0 as in torch; NaN at +-inf)."""
    a = x.abs()
    near, far = bessel_series(a, 1)
    scale = torch.exp(a)
    out = torch.where(a <= 8, scale * a * near, scale * far / torch.sqrt(a))
    return torch.where(x < 0, -out, out)


@elementwise
def i1e(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_i1e``: ``exp(-|x|) I1(x)``, ``calc_i1e`` (+0.0 at -0.0, -0.0 at -inf)."""
    a = x.abs()
    near, far = bessel_series(a, 1)
    out = torch.where(a <= 8, near * a, far / torch.sqrt(a))
    return torch.where(x < 0, -out, out)


# ---------------------------------------------------------------------------------------------
# frexp, by bit manipulation.

#: Per dtype: the integer type of its bits, their number, fraction bits, exponent bias.
_FLOAT_LAYOUT = {torch.float32: (torch.int32, 32, 23, 127), torch.float64: (torch.int64, 64, 52, 1023)}


def frexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.frexp.Tensor``: ``x = mantissa * 2**exponent`` with ``0.5 <= |mantissa| < 1``, exactly.

    The exponent field of ``x``'s bits gives the exponent; the mantissa is ``x``'s bits with
    that field set to the exponent of 0.5. A subnormal ``x`` (exponent field 0) takes both
    from its fraction converted to a float (exact), scaled. Zeros, infinities and NaN give
    ``(x, 0)``, as torch does. float16 and bfloat16 go through float32 (exact). Zero is
    told by the exponent field and the fraction: tested as ``(bits & ~sign) == 0`` it
    compiled to a comparison that subnormal numbers, flushed, passed.
    """
    if not x.is_floating_point() or x.is_complex():
        return NotImplemented
    dtype = x.dtype
    y = x.to(torch.float32) if dtype in LOW_PRECISION else x
    int_dtype, width, fraction_bits, bias = _FLOAT_LAYOUT[y.dtype]
    fraction_mask = (1 << fraction_bits) - 1
    field_max = 2 * bias + 1
    sign_mask = -(1 << (width - 1))  # the sign bit alone, as a signed integer
    bits = y.view(int_dtype)
    field = (bits >> fraction_bits) & field_max
    fraction = bits & fraction_mask
    subnormal = field == 0
    # A subnormal x is fraction * 2**(1 - bias - fraction_bits); the fraction is exact as a float.
    fraction_bits_of = fraction.to(y.dtype).view(int_dtype)
    source = torch.where(subnormal, fraction_bits_of, bits)
    source_field = (source >> fraction_bits) & field_max
    exponent = source_field - (bias - 1) + torch.where(subnormal, 1 - bias - fraction_bits, 0)
    mantissa_bits = (source & fraction_mask) | (bits & sign_mask) | ((bias - 1) << fraction_bits)
    mantissa = mantissa_bits.view(y.dtype)
    special = (subnormal & (fraction == 0)) | (field == field_max)
    mantissa = torch.where(special, y, mantissa)
    exponent = torch.where(special, 0, exponent)
    return mantissa.to(dtype), exponent.to(torch.int32)


def exp2(x: torch.Tensor) -> torch.Tensor:
    """``aten.exp2`` of an integer tensor (frexp's gradient divides by ``exponent.exp2()``): exact.

    ``2**e`` is built from its bits; past the largest exponent it is inf, below the smallest
    normal one 0 (eager gives subnormal powers down to ``2**-149`` in float32, which the
    compiled code would flush anyway). Floating inputs keep the usual lowering.
    """
    dtype = torch.get_default_dtype()
    if x.is_floating_point() or x.is_complex() or dtype not in _FLOAT_LAYOUT:
        return NotImplemented
    int_dtype, _, fraction_bits, bias = _FLOAT_LAYOUT[dtype]
    e = torch.clamp(x.to(torch.int64), min=-bias, max=bias + 1).to(int_dtype)  # bias + 1: the inf field
    bits = torch.where(e > -bias, (e + bias) << fraction_bits, 0)
    return bits.to(int_dtype).view(dtype)


def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype: torch.dtype | None = None,
                  layout=None, device=None, pin_memory=None) -> torch.Tensor:
    """``aten.kaiser_window`` (all three overloads), whose kernel calls ``calc_i0``: a constant.

    Computed now by torch's own kernel, with every dispatch mode off, and entered into the
    graph as ``torch.tensor`` data is (``lift_fresh_copy`` of a literal), as the DFT matrices
    of :mod:`.spectral` are: eager's values exactly. (Built from :func:`i0` in the graph, the
    window made IREE spend seconds evaluating the constant expression at compile time.)
    """
    return literal(lambda: aten.kaiser_window.beta(window_length, periodic, beta, dtype=dtype), device)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.erfc.default: erfc,
    aten.erfinv.default: erfinv,
    aten.special_erfcx.default: erfcx,
    aten.lgamma.default: lgamma,
    aten.digamma.default: digamma,
    aten.polygamma.default: polygamma,
    aten.i0.default: i0,
    aten.special_i0e.default: i0e,
    aten.special_i1.default: i1,
    aten.special_i1e.default: i1e,
    aten.frexp.Tensor: frexp,
    aten.exp2.default: exp2,
    aten.kaiser_window.default: kaiser_window,
    aten.kaiser_window.periodic: kaiser_window,
    aten.kaiser_window.beta: kaiser_window,
}
