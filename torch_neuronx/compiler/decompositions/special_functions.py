"""``special.ndtri``, ``special.zeta`` (Hurwitz), ``special.airy_ai`` and ``nextafter`` as
elementwise arithmetic.

torch-mlir lowers none of ``aten.special_ndtri``, ``aten.special_zeta`` (all three overloads),
``aten.special_airy_ai`` and ``aten.nextafter``:

- ``ndtri``: Cephes' three rationals (``ATen/native/Math.h``'s ``calc_ndtri``): one around
  0.5, two in ``sqrt(-2 log y)`` for the tails; ``+-inf`` at 1 and 0, NaN outside [0, 1].
- ``zeta(x, q)``: torch's algorithm (Cephes) in float64 for float32 as well (torch
  accumulates in double): ten terms summed, then Euler-Maclaurin with Bernoulli terms,
  each part stopping where torch stops; ``q < 0`` (integer ``x`` only) as three sums from
  positive arguments, ``zeta(x, p) + (-1)**x (zeta(x, 1 - p) - zeta(x, 1 - q))`` with
  ``p = q - floor(q)``, the terms torch sums one by one from ``q``. torch's special values:
  inf at ``x = 1`` and at poles (``q`` a non-positive integer), NaN for ``x < 1`` and for
  non-integer ``x`` at negative ``q``.
- ``airy_ai``: torch's ``airy_ai_forward`` (Cephes' ``airy.c``, ``Ai`` only): the asymptotic
  rationals in ``1 / zeta`` from 2.09 on (0 past 103.892), the oscillating asymptotic form in
  ``zeta**-2`` below -2.09, the Maclaurin series in ``x**3`` between, unrolled to the most terms
  torch sums there (10 in float32, 14 in float64), each stopping where torch's loop stops;
  NaN at +-inf.
- ``nextafter``: integer steps on the bits (``x`` viewed as an integer of its width), with
  every test made on the bits, so subnormal numbers (which the compiled code flushes in
  float comparisons) step exactly too.

Measured against eager: ndtri within 4.3e-7 relative in float32 (6.5e-16 in float64), zeta
1.2e-7 (7e-14; 1.7e-11 relative at negative ``q`` where its terms cancel, as eager's do),
airy_ai 2.9e-7 relative where |Ai| > 1e-3, 6e-8 absolute (float64: 4.9e-16, 1.1e-16; the
series bit for bit), nextafter bit for bit in float32, float64, float16 and bfloat16,
subnormal numbers included.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.cephes import polevl
from torch_neuronx.compiler.decompositions.special import ZETA_A

aten = torch.ops.aten

_NAN, _INF = float("nan"), float("inf")


def one_element_padded(fn: Callable) -> Callable:
    """Run the decomposition ``fn`` on two-element copies of its tensor arguments when each holds
    one element (shape known now), and return the first element in the broadcast shape.

    IREE compiles long elementwise graphs on one-element tensors for minutes (igamma: over 10
    minutes at shape ``()`` or ``(1,)``, 23 s at ``(2,)``): the padded graph is the fast one.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or any(not isinstance(t.numel(), int) or t.numel() != 1 for t in tensors):
            return fn(*args, **kwargs)
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        out = fn(*(torch.cat([a.reshape(1), a.reshape(1)]) if isinstance(a, torch.Tensor) else a for a in args),
                 **kwargs)
        return out if out is NotImplemented else out[:1].reshape(shape)

    return wrapper


def _common(a, b) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both operands as tensors of their result dtype (integers in the default dtype), broadcast;
    None for dtypes other than float32 and float64."""
    dtype = torch.result_type(a, b)
    if not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        return None
    like = a if isinstance(a, torch.Tensor) else b
    a, b = (t.to(dtype) if isinstance(t, torch.Tensor) else torch.full((), float(t), dtype=dtype, device=like.device)
            for t in (a, b))
    return tuple(torch.broadcast_tensors(a, b))


# ---------------------------------------------------------------------------------------------
# ndtri. Coefficients: Cephes Math Library (ndtri.c, S. L. Moshier), 3-clause BSD.

_NDTRI_P0 = (-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
             1.39312609387279679503E1, -1.23916583867381258016E0)
_NDTRI_Q0 = (1.0, 1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1,
             -2.25462687854119370527E2, 2.00260212380060660359E2, -8.20372256168333339912E1,
             1.59056225126211695515E1, -1.18331621121330003142E0)
_NDTRI_P1 = (4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
             4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
             -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4)
_NDTRI_Q1 = (1.0, 1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1,
             1.50425385692907503408E1, 2.50464946208309415979E0, -1.42182922854787788574E-1,
             -3.80806407691578277194E-2, -9.33259480895457427372E-4)
_NDTRI_P2 = (3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
             1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
             3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9)
_NDTRI_Q2 = (1.0, 6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0,
             2.16236993594496635890E-1, 1.34204006088543189037E-2, 3.28014464682127739104E-4,
             2.89247864745380683936E-6, 6.79019408009981274425E-9)
_EXP_MINUS_2 = 0.13533528323661269189
_SQRT_TWO_PI = 2.50662827463100050242E0


def _real_floating(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` as float32 or float64 (integers and booleans in the default dtype), or None for
    other dtypes (the op is then left as it is)."""
    if not x.is_floating_point() and not x.is_complex():
        x = x.to(torch.get_default_dtype())
    return x if x.dtype in (torch.float32, torch.float64) else None


@one_element_padded
def ndtri(y: torch.Tensor) -> torch.Tensor:
    """``aten.special_ndtri``: the inverse of the standard normal CDF, as ``calc_ndtri``."""
    y = _real_floating(y)
    if y is None:
        return NotImplemented
    upper = y > 1 - _EXP_MINUS_2
    t = torch.where(upper, 1 - y, y)
    # Around 0.5: y - 0.5 + (y - 0.5)^3 P(..)/Q(..).
    c = torch.where(t > _EXP_MINUS_2, t, 0.5) - 0.5
    c2 = c * c
    central = (c + c * (c2 * polevl(c2, _NDTRI_P0) / polevl(c2, _NDTRI_Q0))) * _SQRT_TWO_PI
    # Tails: x = sqrt(-2 log t), x - log(x)/x - R(1/x).
    x = torch.sqrt(-2.0 * torch.log(torch.clamp(t, min=1e-300 if y.dtype == torch.float64 else 1e-38, max=0.5)))
    z = 1 / x
    near = z * polevl(z, _NDTRI_P1) / polevl(z, _NDTRI_Q1)
    far = z * polevl(z, _NDTRI_P2) / polevl(z, _NDTRI_Q2)
    tail = (x - torch.log(x) / x) - torch.where(x < 8, near, far)
    tail = torch.where(upper, tail, -tail)
    out = torch.where(t > _EXP_MINUS_2, central, tail)
    out = torch.where(y == 0, -_INF, torch.where(y == 1, _INF, out))
    return torch.where((y < 0) | (y > 1), _NAN, out)


# ---------------------------------------------------------------------------------------------
# Hurwitz zeta.

#: Terms summed directly before Euler-Maclaurin (torch: while i < 9 or a <= 9, from q > 0).
_ZETA_TERMS = 10
_MACHEP = 1.11022302462515654042E-16


def _power(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``a ** -x`` for ``a > 0``: ``exp(-x log a)``, and 1 at ``a = 1`` (as C's pow, for x = +-inf)."""
    return torch.where(a == 1, 1.0, torch.exp(-x * torch.log(a)))


def _zeta_positive(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``sum_k (q + k)**-x`` for ``q > 0``, float64, as torch's ``zeta``: ``q**-x`` and nine more
    terms (returning there if a term falls below 1.1e-16 of the sum), then Euler-Maclaurin from
    ``w = q + 9`` (its terms stop once one is below 1.1e-16 of the sum)."""
    s = _power(q, x)
    done = torch.zeros_like(q, dtype=torch.bool)
    b = s
    for k in range(1, _ZETA_TERMS):
        b = _power(q + k, x)
        s = torch.where(done, s, s + b)
        done = done | ((-_MACHEP * s < b) & (b < _MACHEP * s))
    w = q + (_ZETA_TERMS - 1)
    tail = s + b * w / (x - 1) - 0.5 * b
    a = torch.ones_like(q)
    active = ~done
    k = 0.0
    for c in ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / c
        tail = torch.where(active, tail + t, tail)
        active = active & ~(torch.abs(t / tail) < _MACHEP)
        k += 1.0
        a = a * (x + k)
        b = b / w
        k += 1.0
    return torch.where(done, s, tail)


def _zeta(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``aten.special_zeta`` on float64 tensors of one shape (see the module's docstring)."""
    negative = q < 0
    floor_q = torch.floor(q)
    p = q - floor_q
    safe = torch.where(negative, p, q)
    safe = torch.where(safe > 0, safe, 1.0)  # poles and NaN: finite where not selected
    direct = _zeta_positive(x, safe)
    near = _zeta_positive(x, torch.where(negative & (p > 0), 1 - p, 1.0))
    far = _zeta_positive(x, torch.where(negative, 1 - q, 1.0))
    sign = torch.where(torch.remainder(x, 2) == 0, 1.0, -1.0)
    out = torch.where(negative, direct + sign * (near - far), direct)
    out = torch.where(negative & (x == _INF), _INF, out)  # some |q + k| < 1: its term is inf
    out = torch.where(q.isnan(), _NAN, out)
    out = torch.where((q <= 0) & (x != torch.floor(x)), _NAN, out)
    out = torch.where((q <= 0) & (q == floor_q), _INF, out)
    out = torch.where(x < 1, _NAN, out)
    return torch.where(x == 1, _INF, out)


@one_element_padded
def zeta(x, q) -> torch.Tensor:
    """``aten.special_zeta`` (and its scalar overloads): float32 computes in float64, as torch."""
    operands = _common(x, q)
    if operands is None:
        return NotImplemented
    x, q = operands
    return _zeta(x.to(torch.float64), q.to(torch.float64)).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Airy Ai. Coefficients: Cephes Math Library (airy.c, S. L. Moshier), 3-clause BSD, as torch's
# airy_ai_forward holds them.

_AIRY_AN = (3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
            1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
            1.40264691163389668864e+01, 9.99999999999999995305e-01)
_AIRY_AD = (5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
            1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
            1.40959135607834029598e+01, 1.00000000000000000470e+00)
_AIRY_AFN = (-1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
             -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
             -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08)
_AIRY_AFD = (1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
             9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
             4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07)
_AIRY_AGN = (1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
             9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
             5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
             8.11789239554389293311e-08, 3.41551784765923618484e-10)
_AIRY_AGD = (9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
             5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
             4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
             4.91834570062930015649e-09)
_ONE_OVER_SQRT_PI = 5.64189583547756286948e-01
_AIRY_C1, _AIRY_C2 = 0.355028053887817239260, 0.258819403792806798405
#: Bounds of the Maclaurin region (|x| < 2.09), and where Ai underflows to 0.
_AIRY_SERIES, _AIRY_ZERO = 2.09, 103.892
#: The most terms torch's series loop sums in the Maclaurin region (measured on a fine grid: 10
#: in float32, 14 in float64), and a margin: past its stop a term changes nothing.
_AIRY_TERMS = {torch.float32: 12, torch.float64: 16}


def _airy_positive(x: torch.Tensor) -> torch.Tensor:
    """Ai at ``x >= 2.09``: the rational in ``1 / zeta``, ``zeta = 2/3 x**1.5``, over ``exp(zeta)``."""
    zeta = 2.0 * x * torch.sqrt(x) / 3.0
    w = 1.0 / zeta
    ratio = polevl(w, _AIRY_AN) / polevl(w, _AIRY_AD)
    return _ONE_OVER_SQRT_PI * ratio / (2.0 * torch.sqrt(torch.sqrt(x)) * torch.exp(zeta))


def _airy_negative(x: torch.Tensor) -> torch.Tensor:
    """Ai at ``x < -2.09``: modulus and phase rationals in ``z**2``, ``z = 1 / zeta``."""
    zeta = -2.0 * x * torch.sqrt(-x) / 3.0
    z = 1.0 / zeta
    zz = z * z
    f = 1.0 + zz * polevl(zz, _AIRY_AFN) / polevl(zz, _AIRY_AFD)
    g = z * polevl(zz, _AIRY_AGN) / polevl(zz, _AIRY_AGD)
    t = zeta + 0.25 * math.pi
    return _ONE_OVER_SQRT_PI / torch.sqrt(torch.sqrt(-x)) * (torch.sin(t) * f - torch.cos(t) * g)


def _airy_series(x: torch.Tensor) -> torch.Tensor:
    """Ai at ``|x| < 2.09``: ``c1 f - c2 g``, the two Maclaurin series in ``x**3`` summed term by
    term as torch's loop (its divisions in its order) until a term of ``f`` is below epsilon."""
    eps = torch.finfo(x.dtype).eps
    z = x * x * x
    f, g, m, n = torch.ones_like(x), x, torch.ones_like(x), x
    done = torch.zeros_like(x, dtype=torch.bool)
    for i in range(1, _AIRY_TERMS[x.dtype] + 1):
        m = m * z / (3 * i - 1) / (3 * i)
        n = n * z / (3 * i) / (3 * i + 1)
        f = torch.where(done, f, f + m)
        g = torch.where(done, g, g + n)
        done = done | ~(torch.abs(m / f) > eps)
    return _AIRY_C1 * f - _AIRY_C2 * g


@one_element_padded
def airy_ai(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_airy_ai``: the Airy function Ai, as torch's ``airy_ai_forward``."""
    x = _real_floating(x)
    if x is None:
        return NotImplemented
    positive = x >= _AIRY_SERIES
    negative = x < -_AIRY_SERIES
    out = _airy_series(torch.where(positive | negative, 0.0, x))
    out = torch.where(positive, _airy_positive(torch.where(positive, x, _AIRY_SERIES)), out)
    out = torch.where(negative, _airy_negative(torch.where(negative, x, -_AIRY_SERIES)), out)
    out = torch.where(x > _AIRY_ZERO, 0.0, out)
    return torch.where(x.isinf(), _NAN, out)


# ---------------------------------------------------------------------------------------------
# nextafter.

#: Per dtype: the signed integer type of its bits and the bit of the sign.
_BITS = {torch.float32: (torch.int32, 31), torch.float64: (torch.int64, 63), torch.float16: (torch.int16, 15),
         torch.bfloat16: (torch.int16, 15)}
_EXPONENT_ALL_ONES = {torch.float32: 0x7F800000, torch.float64: 0x7FF0000000000000, torch.float16: 0x7C00,
                      torch.bfloat16: 0x7F80}


def nextafter(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``aten.nextafter``: the float after ``x`` towards ``other``, as C's ``nextafter``.

    NaN if either is NaN; ``other`` if they are equal (so ``nextafter(0.0, -0.0)`` is -0.0);
    the smallest subnormal number of ``other``'s sign from a zero; else ``x``'s bits plus one
    where ``x < other`` and ``x > 0`` agree, minus one where they do not. Every comparison is
    one of integers: magnitudes from the bits, ordered by a sign-magnitude key.
    """
    if x.dtype != other.dtype or x.dtype not in _BITS:
        return NotImplemented
    x, other = torch.broadcast_tensors(x, other)
    int_dtype, sign_bit = _BITS[x.dtype]
    magnitude_mask = (1 << sign_bit) - 1
    bx, by = x.contiguous().view(int_dtype), other.contiguous().view(int_dtype)
    mx, my = bx & magnitude_mask, by & magnitude_mask
    nan = (mx > _EXPONENT_ALL_ONES[x.dtype]) | (my > _EXPONENT_ALL_ONES[x.dtype])
    # A key ordered as the floats are (both zeros 0): the magnitude, negated for negative numbers.
    kx, ky = torch.where(bx < 0, -mx, mx), torch.where(by < 0, -my, my)
    up = (kx < ky) == (kx > 0)
    stepped = torch.where(up, bx + 1, bx - 1)
    from_zero = (by & ~magnitude_mask) | 1  # other's sign bit on the smallest subnormal
    bits = torch.where(mx == 0, from_zero, stepped)
    bits = torch.where(kx == ky, by, bits)
    out = bits.to(int_dtype).view(x.dtype)
    return torch.where(nan, _NAN, out)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.special_ndtri.default: ndtri,
    aten.special_airy_ai.default: airy_ai,
    aten.special_zeta.default: zeta,
    aten.special_zeta.self_scalar: zeta,
    aten.special_zeta.other_scalar: zeta,
    aten.nextafter.default: nextafter,
}
