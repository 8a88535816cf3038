"""Float64 trigonometric functions (sin, cos, tan, tanh, atan, asin, acos, atan2), and float32
sin, cos and tan, as arithmetic.

float32 ``sin`` and ``cos`` are here too (Cephes sinf.c, three-part reduction): IREE's own
reduce with a single-precision pi, so their error grew with |x| (2.8e-4 near 1e4); these stay
within 1e-7 up to 1e5. So is float32 ``tan`` (Cephes tanf.c), whose relative error next to its
poles IREE's made large (3e-4 at -1.5706, where tan is -6328; 26 at -1420): its reduction is
exact (pi/4 in 12-bit parts, ``j`` in 12-bit halves), so it stays within 4 ulp of the truth
(measured, next to multiples of pi/2 included) for |x| up to 1.3e7, where ``|x| 4/pi`` reaches
2**24; past that the argument is clamped and the value is not tan(x) (eager reduces exactly).
float16 and bfloat16 go through float32.

IREE's CPU code generation lowers float64 ``math.sin``, ``math.cos``,
``math.tanh`` and ``math.atan2`` to calls into libm that it cannot link
(``iree-lld: error: undefined symbol: sin``). In float64 graphs these ops are
written here in arithmetic, ``floor``, ``exp``, ``sqrt``, ``copysign`` and
``where``, after the Cephes Math Library (S. L. Moshier; sin.c, tan.c, tanh.c,
atan.c). Every other dtype keeps the old lowering (IREE's own float32
approximations): the decompositions return ``NotImplemented`` for it, and
``atan2`` hands it to :func:`arithmetic.atan2 <.arithmetic.atan2>`, which fixes
IREE's special values.

- ``sin``, ``cos``, ``tan``: the argument's magnitude is reduced by the nearest
  even multiple ``j`` of pi/4 with pi/4 split in parts (Cody-Waite, Cephes'
  three with the last split once more: ``(((|x| - j DP1) - j DP2) - j DP3) -
  j DP4``, the first three products exact while ``j < 2**30``), then Cephes'
  polynomials (sin, cos) or rational (tan) on ``[-pi/4, pi/4]``, chosen and
  signed by the octant.
- ``tanh``: Cephes' rational below 0.625 (tanhf.c's polynomial in float32, where IREE's own
  saturated at |x| = 8), ``1 - 2 / (exp(2|x|) + 1)`` above.
- ``atan``: Cephes' reduction to ``[0, 0.66]`` (``-1/|x|`` past tan(3 pi/8),
  ``(|x| - 1) / (|x| + 1)`` past 0.66) and its rational; the offsets pi/2 and
  pi/4 carried in two parts.
- ``atan2``: the same rational on the reduced ratio of ``|y|`` and ``|x|``
  (formed from both, not from ``|y| / |x|``), reflected to ``pi - .`` for
  negative (and -0) ``x`` with pi carried in two parts, signed by ``y``;
  torch's values at zeros and infinities.
- ``asin(x) = atan2(x, sqrt((1 - x)(1 + x)))`` and
  ``acos(x) = atan2(sqrt((1 - x)(1 + x)), x)``; NaN past |x| = 1.

Signed zeros, infinities and NaN come out as eager's: ``sin``, ``cos`` and
``tan`` of +-inf are NaN, odd functions keep the sign of zero, ``tanh(+-inf)``
is +-1, ``atan(+-inf)`` is +-pi/2.

Measured on the compiled graphs against eager, relative error for |x| up to 1e6
(next to multiples of pi/2 included): sin and cos 2.3e-16, tan 4.1e-16, tanh,
atan, asin, acos and atan2 2.2e-16 to 2.5e-16: within about 1 ulp, 2 for tan
(eager's own libm/SLEEF values are within 1 ulp of the truth). The reduction is
exact by construction while ``j < 2**30`` (|x| < 8.4e8); past it the products
``j DPk`` round unless the compiler fuses them into multiply-adds, as IREE
evidently does on this x86 CPU: sin, cos and tan stayed within 1e-15 absolute
up to 1e15 (measured; not guaranteed elsewhere). Past about 1e16 the reduction rounds ``|x| 4/pi`` itself and the
values are not sin(x) (an absolute error up to 2; clamped to [-1, 1] for sin
and cos, and the reduction to |x| <= 2**60 so it stays finite): eager reduces
exactly (Payne-Hanek) there.

No constant that float32 cannot hold exactly is the left operand of a
subtraction from a tensor (``c - t``); ``-t + c`` is written instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions import arithmetic
from torch_neuronx.compiler.decompositions.cephes import p1evl, polevl

aten = torch.ops.aten

_INF = float("inf")
_NAN = float("nan")

# ---------------------------------------------------------------------------------------------
# Coefficients: Cephes Math Library Release 2.8 (S. L. Moshier), sin.c, tan.c, tanh.c, atan.c.

#: pi/4 in four parts: Cephes' DP1 (23 significant bits) and DP2 (21), then its DP3 split into
#: 23 bits and the rest, so j DP1, j DP2 and j DP3 are exact for integers j below 2**30 and
#: DP1 + DP2 + DP3 + DP4 is pi/4 to 3e-39 (Cephes' three parts: to 4e-32, which leaves a
#: relative error of 4e-12 in sin(x) for x within 1e-18 of a multiple of pi).
_DP1 = 7.85398125648498535156e-1
_DP2 = 3.77489470793079817668e-8
_DP3 = 2.6951512649788824e-15
_DP4 = 1.6410017714367502e-22
_FOUR_OVER_PI = 1.27323954473516268615

#: sin(z) = z + z^3 S(z^2), cos(z) = 1 - z^2/2 + z^4 C(z^2) for |z| <= pi/4.
_SIN = (1.58962301576546568060e-10, -2.50507477628578072866e-8, 2.75573136213857245213e-6,
        -1.98412698295895385996e-4, 8.33333333332211858878e-3, -1.66666666666666307295e-1)
_COS = (-1.13585365213876817300e-11, 2.08757008419747316778e-9, -2.75573141792967388112e-7,
        2.48015872888517045348e-5, -1.38888888888730564116e-3, 4.16666666666665929218e-2)

#: tan(z) = z + z^3 P(z^2) / Q(z^2) for |z| <= pi/4 (Q monic).
_TAN_P = (-1.30936939181383777646e4, 1.15351664838587416140e6, -1.79565251976484877988e7)
_TAN_Q = (1.36812963470692954678e4, -1.32089234440210967447e6, 2.50083801823357915839e7,
          -5.38695755929454629881e7)

#: tanh(x) = x + x^3 P(x^2) / Q(x^2) for |x| < 0.625 (Q monic).
_TANH_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
_TANH_Q = (1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)
_TANH_SPLIT = 0.625
_TANHF_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)

#: atan(z) = z + z^3 P(z^2) / Q(z^2) for 0 <= z <= 0.66 (Q monic).
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
_T3P8 = 2.41421356237309504880  # tan(3 pi / 8)
_ATAN_SPLIT = 0.66

#: Multiples of pi as float64 (hi) plus the rest (lo), so ``hi + (lo + t)`` rounds once.
_PIO4_HI, _PIO4_LO = 0.7853981633974483, 3.061616997868383e-17
_PIO2_HI, _PIO2_LO = 1.5707963267948966, 6.123233995736766e-17
_P3O4_HI, _P3O4_LO = 2.356194490192345, 9.184850993605148e-17
_PI_HI, _PI_LO = 3.141592653589793, 1.2246467991473532e-16

#: Magnitudes past which the reduction is clamped (it would overflow): no float64 there holds
#: anything of its position within the period.
_REDUCTION_LIMIT = 2.0 ** 60
#: In the ``(|y| - |x|) / (|y| + |x|)`` branch of atan2, magnitudes past this are halved first.
_SUM_OVERFLOW = 2.0 ** 1020


def _float64_only(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``fn`` for float64 tensors; ``NotImplemented`` (the op's own lowering) for any other dtype."""

    @functools.wraps(fn)
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float64:
            return NotImplemented
        return fn(x)

    return wrapper


def _mod(j: torch.Tensor, m: float) -> torch.Tensor:
    """``j mod m`` for non-negative integral float ``j`` and a power of two ``m`` (exact)."""
    return j - torch.floor(j * (1.0 / m)) * m


def _reduce(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``a = |x|`` (finite): ``(z, octant)`` with ``a = j pi/4 + z``, ``|z| <= pi/4`` (a
    little more where ``a / (pi/4)`` rounds up), ``j`` even and ``octant = j mod 8``."""
    a = torch.clamp(a, max=_REDUCTION_LIMIT)
    j = torch.floor(a * _FOUR_OVER_PI)
    j = j + _mod(j, 2.0)  # the next even multiple: |z| <= pi/4
    z = (((a - j * _DP1) - j * _DP2) - j * _DP3) - j * _DP4
    return z, _mod(j, 8.0)


def _sin_kernel(z: torch.Tensor, zz: torch.Tensor) -> torch.Tensor:
    """sin(z) for ``|z| <= pi/4``, ``zz = z * z``."""
    return z + z * (zz * polevl(zz, _SIN))


def _cos_kernel(zz: torch.Tensor) -> torch.Tensor:
    """cos(z) for ``|z| <= pi/4`` from ``zz = z * z``."""
    return (zz * -0.5 + 1.0) + zz * zz * polevl(zz, _COS)


def _nan_unless_finite(x: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``result`` where ``x`` is finite, else NaN."""
    return torch.where(x.abs() < _INF, result, _NAN)


def _sign_of(x: torch.Tensor) -> torch.Tensor:
    """+-1 by ``x``'s sign bit (-1 for -0)."""
    return torch.copysign(torch.ones_like(x), x)


def _octant_sin_cos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """|x| reduced by multiples of pi/4: its octant and the kernels' sine and cosine (float64:
    four-part reduction and Cephes' sin.c; float32: Cephes' sinf.c)."""
    if x.dtype == torch.float32:
        z, octant = _reduce32(x.abs())
        zz = z * z
        return octant, z + z * (zz * polevl(zz, _SIN32)), (zz * -0.5 + 1.0) + zz * zz * polevl(zz, _COS32)
    z, octant = _reduce(x.abs())
    zz = z * z
    return octant, _sin_kernel(z, zz), _cos_kernel(zz)


#: float32 (Cephes sinf.c): pi/4 in three parts, j DP1 exact for j < 2**16 and j DP2 for
#: j < 2**13 (|x| < 6434); sin and cos polynomials on [-pi/4, pi/4].
_DP1_32, _DP2_32, _DP3_32 = 0.78515625, 2.4187564849853515625e-4, 3.77489497744594108e-8
_SIN32 = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS32 = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)


def _reduce32(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_reduce` in float32, with Cephes sinf's three-part pi/4."""
    a = torch.clamp(a, max=_REDUCTION_LIMIT)
    j = torch.floor(a * _FOUR_OVER_PI)
    j = j + _mod(j, 2.0)
    return ((a - j * _DP1_32) - j * _DP2_32) - j * _DP3_32, _mod(j, 8.0)


#: float32 tan (Cephes tanf.c): tan(z) = z + z^3 P(z^2) for |z| <= pi/4.
_TANF = (9.38540185543e-3, 3.11992232697e-3, 2.44301354525e-2, 5.34112807005e-2, 1.33387994085e-1,
         3.33331568548e-1)
#: pi/4 in float32 parts of 12 significant bits (the first's last four are zero) and a last of
#: 24: with ``j`` split in two halves of 12 bits, every product ``j_half * part`` is exact, and
#: the parts sum to pi/4 within 2e-24.
_PIO4_PARTS32 = (0.78515625, 2.4187564849853516e-4, 3.7747668102383614e-8, 1.2816414596272807e-12)
_PIO4_LAST32 = 3.0616168005906746e-17
#: pi/2 as float32 ``hi + lo`` (the correction of :func:`_reduce32_exact`, no cancellation there).
_PIO2_HI32, _PIO2_LO32 = 1.5707963705062866, -4.371138828673793e-8
#: The reduction stays exact while ``j = |x| 4/pi < 2**24``.
_REDUCTION_LIMIT32 = 2.0 ** 24 * 0.78515625


def _reduce32_exact(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z, octant)`` of :func:`_reduce` for float32 ``a = |x|`` (finite), exact to float32
    rounding of ``z`` for ``a`` below :data:`_REDUCTION_LIMIT32` (1.3e7), next to the poles too.

    ``j`` is split into a multiple of 4096 and the rest, both of at most 12 significant bits, so
    that no product with the 12-bit parts of pi/4 rounds and no partial difference does while it
    is small (Cody-Waite); only the last, 24-bit part's product rounds, at 1e-24 relative. ``j``
    itself comes from a rounded ``a 4/pi`` and may be one even step off there: ``z`` is then
    corrected by pi/2 (``octant`` by 2), which cancels nothing.
    """
    a = torch.clamp(a, max=_REDUCTION_LIMIT32)
    j = torch.floor(a * _FOUR_OVER_PI)
    j = j + _mod(j, 2.0)
    j_high = torch.floor(j * (1.0 / 4096.0)) * 4096.0
    j_low = j - j_high
    z = a
    for part in _PIO4_PARTS32:
        z = (z - j_high * part) - j_low * part
    z = z - j * _PIO4_LAST32
    over, under = z > _PIO4_HI, z < -_PIO4_HI
    z = torch.where(over, (z - _PIO2_HI32) - _PIO2_LO32, torch.where(under, (z + _PIO2_HI32) + _PIO2_LO32, z))
    j = torch.where(over, j + 2.0, torch.where(under, j - 2.0, j))
    return z, _mod(j, 8.0)


def _float64_or_float32(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``fn`` for float64 and float32 (float16 and bfloat16 through float32), else ``NotImplemented``.

    IREE's own float32 sin, cos and tan reduce the argument with a single-precision pi: their
    error grows with |x| (sin and cos: 2.8e-4 absolute near 1e4, where positional encodings and
    rotary angles reach; torch's stays below 4e-8), and tan's relative error is large next to
    its poles (3e-4 at -1.5706, 26 at -1420).
    """
    @functools.wraps(fn)
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float64, torch.float32):
            return fn(x)
        if x.dtype in (torch.float16, torch.bfloat16):
            return fn(x.float()).to(x.dtype)
        return NotImplemented

    return wrapper


@_float64_or_float32
def sin(x: torch.Tensor) -> torch.Tensor:
    """``aten.sin``: Cephes' sin.c (float64) or sinf.c (float32)."""
    octant, s, c = _octant_sin_cos(x)
    result = torch.where(_mod(octant, 4.0) == 0, s, c)  # octants 2 and 6 take the cosine
    result = torch.where(octant >= 4, -result, result)
    result = torch.clamp(result, -1.0, 1.0) * _sign_of(x)
    return _nan_unless_finite(x, result)


@_float64_or_float32
def cos(x: torch.Tensor) -> torch.Tensor:
    """``aten.cos``: Cephes' cos (sin.c, or sinf.c in float32)."""
    octant, s, c = _octant_sin_cos(x)
    result = torch.where(_mod(octant, 4.0) == 0, c, s)  # octants 2 and 6 take the sine
    result = torch.where((octant == 2) | (octant == 4), -result, result)
    return _nan_unless_finite(x, torch.clamp(result, -1.0, 1.0))


@_float64_or_float32
def tan(x: torch.Tensor) -> torch.Tensor:
    """``aten.tan``: Cephes' tan.c rational (float64) or tanf.c polynomial (float32, after the
    exact reduction of :func:`_reduce32_exact`) on the reduced argument, ``-1/t`` in octants 2
    and 6."""
    if x.dtype == torch.float32:
        z, octant = _reduce32_exact(x.abs())
        zz = z * z
        t = z + z * (zz * polevl(zz, _TANF))
    else:
        z, octant = _reduce(x.abs())
        zz = z * z
        t = z + z * (zz * polevl(zz, _TAN_P) / p1evl(zz, _TAN_Q))
    result = torch.where(_mod(octant, 4.0) == 0, t, -1.0 / t) * _sign_of(x)
    return _nan_unless_finite(x, result)


@_float64_or_float32
def tanh(x: torch.Tensor) -> torch.Tensor:
    """``aten.tanh``: Cephes' tanh.c (float64, a rational below 0.625) or tanhf.c (float32, a
    polynomial there), else ``1 - 2 / (exp(2|x|) + 1)`` (exactly 1 once exp overflows). IREE's
    float32 tanh was exactly +-1 from |x| = 8 (torch's from 9.01): a tanh-squashed Gaussian's
    ``log_prob(tanh(u))`` was NaN, ``log(1 - tanh(u) ** 2)`` -inf."""
    a = x.abs()
    small_a = torch.clamp(a, max=_TANH_SPLIT)
    zz = small_a * small_a
    if x.dtype == torch.float32:
        small = small_a + small_a * (zz * polevl(zz, _TANHF_P))
    else:
        small = small_a + small_a * (zz * polevl(zz, _TANH_P) / p1evl(zz, _TANH_Q))
    large = -2.0 / (torch.exp(2.0 * a) + 1.0) + 1.0
    return torch.where(a < _TANH_SPLIT, small, large) * _sign_of(x)


def _atan_core(num: torch.Tensor, den: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cephes' atan.c reduction of ``q = num / den`` (``num, den >= 0``).

    Returns ``(core, big, mid)``: ``atan(q) = core`` where neither mask holds (q <= 0.66),
    ``pi/4 + core`` where ``mid`` (0.66 < q <= tan(3 pi/8)), ``pi/2 + core`` where ``big``.
    The reduced argument comes from ``num`` and ``den``, not from the rounded ``q``.
    """
    q = num / den
    big = q > _T3P8
    mid = (q > _ATAN_SPLIT) & ~big
    scale = torch.where(num > _SUM_OVERFLOW, 0.5, 1.0)  # keeps num + den finite
    num_s, den_s = num * scale, den * scale
    z = torch.where(big, -den / num, torch.where(mid, (num_s - den_s) / (num_s + den_s), q))
    zz = z * z
    core = z + z * (zz * polevl(zz, _ATAN_P) / p1evl(zz, _ATAN_Q))
    return core, big, mid


def _atan_offsets(big: torch.Tensor, mid: torch.Tensor, reflect: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` of the offset the reduction of :func:`_atan_core` added: 0, pi/4 or pi/2,
    or where ``reflect``, pi minus it (pi, 3 pi/4, pi/2)."""
    zero = torch.zeros(big.shape, dtype=torch.float64, device=big.device)  # float64 constants
    hi = torch.where(big, _PIO2_HI, torch.where(mid, _PIO4_HI, zero))
    lo = torch.where(big, _PIO2_LO, torch.where(mid, _PIO4_LO, zero))
    if reflect is not None:
        hi = torch.where(reflect, torch.where(big, _PIO2_HI, torch.where(mid, _P3O4_HI, zero + _PI_HI)), hi)
        lo = torch.where(reflect, torch.where(big, _PIO2_LO, torch.where(mid, _P3O4_LO, zero + _PI_LO)), lo)
    return hi, lo


@_float64_only
def atan(x: torch.Tensor) -> torch.Tensor:
    """``aten.atan`` (float64): Cephes' atan.c (``+-pi/2`` at ``+-inf``)."""
    core, big, mid = _atan_core(x.abs(), torch.ones_like(x))
    hi, lo = _atan_offsets(big, mid)
    return (hi + (lo + core)) * _sign_of(x)


def _atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """atan2 of float64 ``y`` and ``x`` (broadcast), with torch's values at zeros and infinities."""
    ay, ax = y.abs(), x.abs()
    core, big, mid = _atan_core(ay, ax)
    both_zero = (ay == 0) & (ax == 0)  # 0/0: atan2 is 0 (pi for negative x)
    both_inf = (ay == _INF) & (ax == _INF)  # inf/inf: pi/4 (3 pi/4)
    core = torch.where(both_zero | both_inf, 0.0, core)
    mid = mid | both_inf
    reflect = _sign_of(x) < 0
    hi, lo = _atan_offsets(big, mid, reflect)
    core = torch.where(reflect, -core, core)
    return torch.copysign(hi + (lo + core), y)


def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``aten.atan2``: :func:`_atan2` for float64, :func:`arithmetic.atan2 <.arithmetic.atan2>` otherwise."""
    if not (y.is_floating_point() or x.is_floating_point()):
        return arithmetic.atan2(y, x)
    if torch.result_type(y, x) != torch.float64:
        return arithmetic.atan2(y, x)
    y, x = torch.broadcast_tensors(y.to(torch.float64), x.to(torch.float64))
    return _atan2(y, x)


def _sqrt_one_minus_square(x: torch.Tensor) -> torch.Tensor:
    """``sqrt(1 - x**2)`` as ``sqrt((1 - x)(1 + x))`` (no cancellation near +-1; NaN past it)."""
    return torch.sqrt((-x + 1.0) * (x + 1.0))


@_float64_only
def asin(x: torch.Tensor) -> torch.Tensor:
    """``aten.asin`` (float64): ``atan2(x, sqrt((1 - x)(1 + x)))``."""
    return _atan2(x, _sqrt_one_minus_square(x))


@_float64_only
def acos(x: torch.Tensor) -> torch.Tensor:
    """``aten.acos`` (float64): ``atan2(sqrt((1 - x)(1 + x)), x)``."""
    return _atan2(_sqrt_one_minus_square(x), x)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``aten.gelu`` with ``approximate="tanh"`` of a float64 tensor as torch's reference computes
    it, through our ``tanh`` (lowered whole, it linked libm's float64 tanh, which IREE lacks:
    "undefined symbol: tanh"); other calls are not decomposed."""
    if x.dtype != torch.float64 or approximate != "tanh":
        return NotImplemented
    from torch._refs.nn.functional import gelu as reference

    return reference(x, approximate="tanh")


def gelu_backward(grad: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``aten.gelu_backward`` of :func:`gelu`'s calls, as torch's decomposition computes it."""
    if x.dtype != torch.float64 or approximate != "tanh":
        return NotImplemented
    from torch._decomp.decompositions import gelu_backward as reference

    return reference(grad, x, approximate="tanh")


#: This module's decompositions, merged into the compile path's table (after general's atan2).
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.gelu.default: gelu,
    aten.gelu_backward.default: gelu_backward,
    aten.sin.default: sin,
    aten.cos.default: cos,
    aten.tan.default: tan,
    aten.tanh.default: tanh,
    aten.atan.default: atan,
    aten.asin.default: asin,
    aten.acos.default: acos,
    aten.atan2.default: atan2,
}
