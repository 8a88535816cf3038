"""Orthogonal polynomials of ``torch.special`` (Chebyshev T, U, V, W and their shifted forms,
Hermite H and He, Laguerre L, Legendre P) as elementwise arithmetic.

torch-mlir lowers none of ``aten.special_*_polynomial_*``. torch's CPU kernels
(``ATen/native/Math.h``) truncate the degree ``n`` to an integer and run the
three-term recurrence up to it; since ``n`` is a tensor here, the recurrence is
unrolled to a fixed number of steps, each step's value kept where it is the
element's degree. Step for step as torch computes, and torch's x86 kernels are compiled
with fused multiply-adds (``a * q - k * p`` rounds once, after ``k * p``): float32 steps
compute in float64, where the product is exact, and round once, so float32 values,
overflows and the NaN that follows an overflow (``inf - inf``) are eager's bit for bit.
float64 rounds twice (within 4e-12 relative of eager after hundreds of steps). Past the
unrolled steps:

- Chebyshev polynomials: where ``|x| < 1`` (``|2x - 1| < 1`` for the shifted ones) torch
  itself switches to ``cos(n acos x)`` and its kin from a small degree on (6, 8 or 4), and
  so do we, with ``acos``, ``cos`` and ``sin`` computed in float64 and rounded (as libm's
  float functions): one ulp of ``acos x`` is ``n`` ulps of the result, so eager's values and
  ours differ by up to ``n * 2.4e-7`` absolute in float32. Where ``|x| >= 1`` and ``n`` is
  above :data:`CHEBYSHEV_STEPS`, the hyperbolic closed forms (``cosh(n acosh |x|)`` and
  its kin, in float64), NaN where the recurrence would have overflowed two steps before:
  eager's recurrence drifts from them by ~``n**2`` ulps next to ``|x| = 1`` (7e-4 relative
  at degree 500, 1.4e-2 at 2000 in float32), ours are the accurate ones.
- Hermite polynomials: every float32 recurrence has overflowed by degree 50 (He: 58), so
  torch's values are NaN at every x from degree 53 (He: 61; float64: 272 and 305), up to
  its own limit of 128 (float32; 512) past which it returns NaN: the steps stop there
  (:data:`HERMITE_STEPS`), exact throughout.
- Laguerre and Legendre polynomials: unrolled to :data:`STEPS` (64); a larger degree gives
  NaN (eager loops on), except torch's special values (Laguerre at x = 0, Legendre at +-1).

A degree given as a Python number (the ``n_scalar`` overloads) unrolls just that many steps.
The degree follows torch's conversion to int64: truncated; NaN, infinities and
magnitudes past 2**63 (which x86 converts to the smallest int64) count as negative,
where every polynomial is 0. Integer and boolean arguments compute in the default
dtype, as torch promotes them; other dtypes are not decomposed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.special_functions import one_element_padded

aten = torch.ops.aten

#: Recurrence steps unrolled for Laguerre and Legendre polynomials (larger degrees: NaN).
STEPS = 64
#: Recurrence steps unrolled for Chebyshev polynomials where |x| > 1 (closed forms past them).
CHEBYSHEV_STEPS = 24
#: Degrees past which torch's Hermite polynomials (H, He) are NaN at every x, per dtype: every
#: recurrence has overflowed by then (float32 H from 53 on, He from 61; float64 272 and 305, on
#: a dense grid of x), though torch's own limit (getHermitianLimit) is 128 (float32) and 512.
HERMITE_STEPS = {torch.float32: (56, 64), torch.float64: (276, 308)}
_NAN = float("nan")


def _operands(x, n) -> tuple[torch.Tensor, torch.Tensor, int | None] | None:
    """(x, degree, largest degree or None) in the result dtype, the degree truncated as torch
    converts it to int64 (invalid ones -1); None for dtypes not decomposed. A Python-number
    degree is known now: its value bounds the steps to unroll."""
    dtype = torch.result_type(x, n)
    if not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        return None
    known = None
    if not isinstance(n, torch.Tensor):
        value = float(n)
        known = int(value) if math.isfinite(value) and abs(value) < 2.0 ** 63 else -1
    like = x if isinstance(x, torch.Tensor) else n
    x = x.to(dtype) if isinstance(x, torch.Tensor) else torch.full((), float(x), dtype=dtype, device=like.device)
    n = n.to(dtype) if isinstance(n, torch.Tensor) else torch.full((), float(n), dtype=dtype, device=like.device)
    x, n = torch.broadcast_tensors(x, n)
    degree = torch.trunc(n)
    valid = torch.isfinite(degree) & (degree.abs() < 2.0 ** 63)
    return x, torch.where(valid, degree, -1.0), known


def _unrolled(first: torch.Tensor, second: torch.Tensor, step: Callable, n: torch.Tensor,
              steps: int) -> torch.Tensor:
    """``q_n`` for ``1 <= n <= steps`` of ``q_0 = first``, ``q_1 = second``,
    ``q_{k+1} = step(k, q_k, q_{k-1})`` (``second`` where ``n`` is past ``steps``)."""
    p, q, out = first, second, second
    for k in range(1, steps):
        p, q = q, step(k, q, p)
        out = torch.where(n == k + 1, q, out)
    return out


def _wide(a: torch.Tensor) -> torch.Tensor:
    """``a`` as :func:`_fms` takes its factor: float32 widened to float64."""
    return a.to(torch.float64) if a.dtype == torch.float32 else a


def _fms(a: torch.Tensor, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * q - c`` rounded once to ``q``'s dtype, as the fused multiply-add of torch's compiled
    kernels (``a`` from :func:`_wide`; float32 computes in float64, where the product is exact,
    so values are eager's bit for bit); float64 rounds twice."""
    if a.dtype == q.dtype:
        return a * q - c
    return (a * q.to(a.dtype) - c.to(a.dtype)).to(q.dtype)


def _polynomial(kernel: Callable) -> Callable:
    """The three overloads (tensor or number x and n) of a polynomial computed by
    ``kernel(x, n, known)`` (see :func:`_operands`)."""

    @one_element_padded
    def decomposition(x, n):
        operands = _operands(x, n)
        return NotImplemented if operands is None else kernel(*operands)

    decomposition.__name__ = decomposition.__qualname__ = kernel.__name__
    decomposition.__doc__ = kernel.__doc__
    return decomposition


def _steps(known: int | None, bound: int) -> int:
    """Steps to unroll: a known degree's (at most ``bound``), else ``bound``."""
    return bound if known is None else max(0, min(known, bound))


def _even(n: torch.Tensor) -> torch.Tensor:
    """Whether the integer-valued ``n`` is even."""
    return torch.remainder(n, 2) == 0


# ---------------------------------------------------------------------------------------------
# Chebyshev polynomials.

def _chebyshev_outside(kind: str, y: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The closed form of the ``kind`` Chebyshev polynomial at ``|y| >= 1`` (in float64, rounded),
    NaN where torch's recurrence overflows two steps or more before degree ``n``."""
    wide = y.to(torch.float64)
    m = n.to(torch.float64)
    t = torch.acosh(torch.clamp(wide.abs(), min=1.0))
    negative = wide < 0
    # V_n(-a) = (-1)^n W_n(a) and W_n(-a) = (-1)^n V_n(a): the sinh form where W's applies.
    sinh_form = negative if kind == "v" else ~negative if kind == "w" else None

    def ratio(k: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``sinh(k t) / sinh(s t)``, ``k / s`` at ``t = 0`` (``|y| = 1``, where the forms meet)."""
        return torch.where(t == 0, k / s, torch.sinh(k * t) / torch.sinh(s * t))

    def value(degree: torch.Tensor) -> torch.Tensor:
        if kind == "t":
            return torch.cosh(degree * t)
        if kind == "u":
            return ratio(degree + 1, torch.ones_like(t))
        half = degree + 0.5
        return torch.where(sinh_form, ratio(half, torch.full_like(t, 0.5)), torch.cosh(half * t) / torch.cosh(t / 2))

    out = torch.where(negative & ~_even(m), -value(m), value(m)).to(y.dtype)
    return torch.where(torch.isinf(value(m - 2).to(y.dtype)), _NAN, out)


def _rounded(fn: Callable, t: torch.Tensor) -> torch.Tensor:
    """``fn(t)`` computed in float64 and rounded to ``t``'s dtype: as libm's float functions
    (within an ulp), more accurate than the compiled float32 ones."""
    return fn(t.to(torch.float64)).to(t.dtype)


#: Per Chebyshev kind: the degree past which torch uses the trigonometric form inside
#: (plain, shifted), and q_1 as a function of y (q_0 = 1; q_{k+1} = 2y q_k - q_{k-1}).
_CHEBYSHEV = {"t": ((6, 6), lambda y: y), "u": ((8, 6), lambda y: y + y),
              "v": ((8, 6), lambda y: y + y - 1.0), "w": ((8, 4), lambda y: y + y + 1.0)}


def _chebyshev_inside(kind: str, shifted: bool, y: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """torch's trigonometric form of the ``kind`` Chebyshev polynomial for ``|y| < 1`` (its
    fallbacks where the denominator rounds to 0 too)."""
    theta = _rounded(torch.acos, y)
    if kind == "t":
        return _rounded(torch.cos, n * theta)
    if kind == "u":
        s = _rounded(torch.sin, theta)
        return torch.where(s != 0, _rounded(torch.sin, (n + 1) * theta) / s,
                           (n + 1) * _rounded(torch.cos, (n + 1) * theta) / y)
    odd_sign = torch.where(_even(n), 1.0, -1.0)
    half = theta / 2
    if kind == "v":
        return torch.where(_rounded(torch.sin, half) != 1,
                           _rounded(torch.cos, (n + 0.5) * theta) / _rounded(torch.cos, half), (n + n + 1) * odd_sign)
    fallback = odd_sign if shifted else torch.where(y > 0, n + n + 1, odd_sign)
    cos_half = _rounded(torch.cos, half)
    return torch.where(cos_half != 1, _rounded(torch.sin, (n + 0.5) * theta) / _rounded(torch.sin, half), fallback)


def _chebyshev(kind: str, shifted: bool, x: torch.Tensor, n: torch.Tensor, known: int | None) -> torch.Tensor:
    """The ``kind`` Chebyshev polynomial (of ``2x - 1`` when ``shifted``), as torch's kernels."""
    (plain_from, shifted_from), second = _CHEBYSHEV[kind]
    y = x + x - 1.0 if shifted else x
    two_y = _wide(y + y)
    steps = _steps(known, CHEBYSHEV_STEPS)
    out = _unrolled(torch.ones_like(y), second(y), lambda k, q, p: _fms(two_y, q, p), n, steps)
    if known is None or known > CHEBYSHEV_STEPS:
        out = torch.where(n > CHEBYSHEV_STEPS, _chebyshev_outside(kind, y, n), out)
    out = torch.where(n == 0, 1.0, out)
    trigonometric = (y.abs() < 1) & (n > (shifted_from if shifted else plain_from))
    out = torch.where(trigonometric, _chebyshev_inside(kind, shifted, y, n), out)
    # Torch's special values at the ends of [-1, 1] (x = 0 and x = 1 when shifted).
    top, bottom = (x == 1, x == 0) if shifted else (x == 1, x == -1)
    odd_sign = torch.where(_even(n), 1.0, -1.0)
    at_top = {"t": 1.0, "u": n + 1, "v": 1.0, "w": n + n + 1}[kind]
    at_bottom = {"t": odd_sign, "u": (n + 1) * odd_sign, "v": (n + n + 1) * odd_sign, "w": odd_sign}[kind]
    out = torch.where(top, at_top, torch.where(bottom, at_bottom, out))
    return torch.where(n < 0, 0.0, out)


def _chebyshev_kernel(kind: str, shifted: bool) -> Callable:
    """The kernel of one Chebyshev polynomial, named after its op."""

    def kernel(x: torch.Tensor, n: torch.Tensor, known: int | None) -> torch.Tensor:
        return _chebyshev(kind, shifted, x, n, known)

    name = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    kernel.__name__ = name
    kernel.__doc__ = f"``aten.special_{name}``: see :func:`_chebyshev`."
    return kernel


# ---------------------------------------------------------------------------------------------
# Hermite, Laguerre and Legendre polynomials.

def hermite_polynomial_h(x: torch.Tensor, n: torch.Tensor, known: int | None) -> torch.Tensor:
    """``aten.special_hermite_polynomial_h``: ``H_{k+1} = 2x H_k - 2k H_{k-1}``; NaN past :data:`HERMITE_STEPS`."""
    limit = HERMITE_STEPS[x.dtype][0]
    two_x = x + x
    wide = _wide(two_x)
    out = _unrolled(torch.ones_like(x), two_x, lambda k, q, p: _fms(wide, q, (2 * k) * p), n, _steps(known, limit))
    out = torch.where(n == 0, 1.0, torch.where(n > limit, _NAN, out))
    return torch.where(n < 0, 0.0, out)


def hermite_polynomial_he(x: torch.Tensor, n: torch.Tensor, known: int | None) -> torch.Tensor:
    """``aten.special_hermite_polynomial_he``: ``He_{k+1} = x He_k - k He_{k-1}``; NaN past :data:`HERMITE_STEPS`."""
    limit = HERMITE_STEPS[x.dtype][1]
    wide = _wide(x)
    out = _unrolled(torch.ones_like(x), x, lambda k, q, p: _fms(wide, q, k * p), n, _steps(known, limit))
    out = torch.where(n == 0, 1.0, torch.where(n > limit, _NAN, out))
    return torch.where(n < 0, 0.0, out)


def laguerre_polynomial_l(x: torch.Tensor, n: torch.Tensor, known: int | None) -> torch.Tensor:
    """``aten.special_laguerre_polynomial_l``: ``L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1)``;
    1 at x = 0; NaN past :data:`STEPS`."""
    one_minus_x = 1.0 - x

    def step(k: int, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return _fms(_wide(2 * k + one_minus_x), q, k * p) / (k + 1)

    out = _unrolled(torch.ones_like(x), one_minus_x, step, n, _steps(known, STEPS))
    out = torch.where(n == 0, 1.0, torch.where(n > STEPS, _NAN, out))
    out = torch.where(x == 0, 1.0, out)
    return torch.where(n < 0, 0.0, out)


def legendre_polynomial_p(x: torch.Tensor, n: torch.Tensor, known: int | None) -> torch.Tensor:
    """``aten.special_legendre_polynomial_p``: ``P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1)``;
    torch's values at +-1; NaN past :data:`STEPS`."""

    def step(k: int, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return _fms(_wide((2 * k + 1) * x), q, k * p) / (k + 1)

    out = _unrolled(torch.ones_like(x), x, step, n, _steps(known, STEPS))
    out = torch.where(n == 0, 1.0, torch.where(n > STEPS, _NAN, out))
    out = torch.where(x.abs() == 1, torch.where((x > 0) | _even(n), 1.0, -1.0), out)
    return torch.where(n < 0, 0.0, out)


_KERNELS = {f"{'shifted_' if s else ''}chebyshev_polynomial_{k}": _chebyshev_kernel(k, s)
            for s in (False, True) for k in "tuvw"}
_KERNELS.update({f.__name__: f for f in (hermite_polynomial_h, hermite_polynomial_he, laguerre_polynomial_l,
                                         legendre_polynomial_p)})

#: This module's decompositions (every overload: tensor or number x and n), merged into the table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    getattr(getattr(aten, f"special_{name}"), overload): _polynomial(kernel)
    for name, kernel in _KERNELS.items() for overload in ("default", "x_scalar", "n_scalar")
}
