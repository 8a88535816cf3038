"""``erfc``, ``erfcx`` and ``erfinv`` as elementwise arithmetic (torch-mlir lowers none of them).

- ``erfc``: Cephes' rational approximations (``1 - erf`` near 0, then
  ``exp(-x**2) P(x) / Q(x)``), with ``exp(-x**2)`` split so the rounding of
  ``x**2`` is not magnified: relative accuracy holds into the tail.
- ``erfinv``: Giles' single-precision approximation (an asymptotic inversion of
  erfc past its range in float64) refined by Halley steps whose residual uses
  ``erfc`` where ``erf`` would round to 1.
- ``erfcx``: erfc's tail rationals without the exponential.

Accuracy against eager is listed with the other special functions in :mod:`.special`,
which registers these in its decomposition table.
"""

from __future__ import annotations

import math

import torch

from torch_neuronx.compiler.decompositions.cephes import elementwise, p1evl, polevl

_INF = float("inf")
_NAN = float("nan")


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
    near = polevl(a, _ERFC_P) / p1evl(a, _ERFC_Q)
    far = polevl(a, _ERFC_R) / p1evl(a, _ERFC_S)
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
    return x * polevl(z, _ERF_D) / p1evl(z, _ERF_U)


@elementwise
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


@elementwise
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


@elementwise
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
    central = polevl(w - 2.5, _GILES_CENTRAL)
    tail = polevl(torch.sqrt(w) - 3, _GILES_TAIL)
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
        erfc_outer = torch.exp(-(outer * outer)) * polevl(outer, _ERFC_P) / p1evl(outer, _ERFC_Q)
        residual = torch.where(x < 1, (inner - a) + _erf_minus_identity(inner), (1 - a) - erfc_outer)
        slope = _TWO_OVER_SQRT_PI * torch.exp(-(x * x))
        x = x - residual / (slope + x * residual)
    x = torch.where(a == 1, _INF, x)
    x = torch.where(a > 1, _NAN, x)
    return torch.copysign(x, y)
