"""Special functions through the compile path (``decompositions/special.py``) against eager.

erfc, erfinv, erfcx, lgamma, digamma, polygamma, i0, i0e, i1, i1e and frexp
lower to nothing in torch-mlir; they compile as elementwise arithmetic (frexp as
bit manipulation). Each test batches every op into one compiled function (a
compile costs seconds), forward and backward, and compares values with eager:
float32 at ``assert_close``'s default tolerances, float64 far tighter than its
defaults (1e-7), frexp bit for bit, per op, over the whole domain: tails, large
and tiny magnitudes, negative arguments, poles, signed zeros, infinities and NaN
(no subnormal numbers: the compiled code flushes them to zero).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from compare import weighted_backward

_INF, _NAN = float("inf"), float("nan")

#: float64 (rtol, atol) per output: our decompositions reach about 1e-15; eager's digamma is
#: off by up to 1e-12 relative next to negative poles (tan(pi * r) of a rounded pi * r), and
#: lgamma's shift leaves an absolute error of a few 1e-15 where lgamma is near its zeros.
_FLOAT64_TOLERANCE = {
    "erfc": (1e-14, 1e-300), "erfc_tail": (1e-14, 1e-300), "erfcx": (1e-13, 0.0),
    "erfinv": (1e-14, 1e-15), "erfinv_tail": (1e-14, 0.0),
    "lgamma": (1e-13, 1e-13), "gammaln": (1e-13, 1e-13), "lgamma_wide": (1e-13, 1e-13),
    "digamma": (1e-11, 1e-13), "psi": (1e-11, 1e-13), "digamma_wide": (1e-11, 1e-13),
    "trigamma": (1e-13, 0.0),
    "i0": (1e-14, 0.0), "i0e": (1e-14, 0.0), "i1": (1e-14, 0.0), "i1e": (1e-14, 0.0),
    # torch sums zeta term by term from a negative argument; so do we, in another order: both
    # lose digits next to the zeros between negative poles (the values there are ~1e-3).
    "polygamma_2": (1e-12, 1e-13), "polygamma_3": (1e-12, 1e-13),
}

#: Exact in both dtypes: frexp, and kaiser_window (a constant torch's kernel computes at trace time).
_EXACT = ("frexp_mantissa", "frexp_exponent", "kaiser_window")

#: float64 gradients: erfinv's, exp(erfinv(y)**2), magnifies erfinv's last ulp by 2 erfinv(y)**2
#: (up to 70 at 1 - 1e-16); gamma_x's sums digamma (lgamma's) and polygamma(1, .) (psi's).
_FLOAT64_GRAD_TOLERANCE = {"erfc_x": (1e-14, 1e-300), "erfinv_y": (1e-13, 1e-15), "gamma_x": (1e-11, 1e-13),
                           "bessel_x": (1e-13, 1e-300), "polygamma_x": (1e-12, 1e-13), "frexp_x": (0.0, 0.0)}


def _cat(dtype: torch.dtype, *parts) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=torch.float64).flatten() for p in parts]).to(dtype)


def _inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Arguments covering each function's domain; those in ``_GRADED`` get gradients.

    ``bessel_x`` has a row per Bessel function and ``polygamma_x`` one per order, so each
    row's gradient is one function's (summed over several they cancel, hiding errors).
    """
    g = torch.Generator().manual_seed(0)
    double = dtype == torch.float64
    erfc_top = 26.5 if double else 9.1  # past it eager's result is subnormal (the compiled one flushes to 0)
    tail_digits = 15.9 if double else 7.2  # 1 - 10**-digits still below 1
    non_integer = torch.rand(400, generator=g, dtype=torch.float64) * 60 - 40
    erfc_x = _cat(dtype, torch.linspace(-6, erfc_top, 401, dtype=torch.float64), torch.randn(100, generator=g) * 3,
                  [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 8.0, -8.0, 1e-30, -1e-30, _INF, -_INF, _NAN])
    tail = 1 - 10 ** -torch.linspace(1, tail_digits, 120, dtype=torch.float64)
    exp_top = 709.7 if double else 88.7  # i0 and i1 overflow past it (exp does)
    bessel = _cat(torch.float64, torch.linspace(-30, 30, 241, dtype=torch.float64),
                  torch.logspace(-30, math.log10(exp_top), 120, dtype=torch.float64),
                  -torch.logspace(-30, math.log10(exp_top), 120, dtype=torch.float64),
                  [0.0, -0.0, 8.0, -8.0, 8 + 1e-6, 7.999, exp_top + 1, -exp_top - 10, _INF, -_INF, _NAN])
    negative = -torch.rand(200, generator=g, dtype=torch.float64) * 40  # poles, and zeros between them
    polygamma = _cat(torch.float64, torch.logspace(-3, 6, 150, dtype=torch.float64), negative,
                     [0.5, -0.5, 1.0, 2.0, -1e-3, -2 + 1e-3, 0.0, -0.0, -1.0, -3.0, _INF, -_INF, _NAN])
    # Normal numbers only, and in float64 those whose exponent's power of 2 is a normal float32
    # (the gradient divides by exponent.exp2(), a float32). float32's past 2**126 have the
    # gradient 2**-127, subnormal in eager and 0 compiled: within assert_close's default atol.
    scale = torch.logspace(-37, 300 if double else 38, 200, dtype=torch.float64)
    frexp = _cat(torch.float64, torch.randn(200, generator=g, dtype=torch.float64) * 1e3, scale,
                 [1.0, 0.5, 0.75, 2 ** 24 - 1, 1.5 * 2 ** -126, 3.4e38])
    return {
        "erfc_x": erfc_x,
        # float32 gradients stop at 0.99: the gradient exp(erfinv(y)**2) magnifies an ulp of
        # erfinv(y) by 2 erfinv(y)**2, so past it eager's own gradient is that inexact.
        "erfinv_y": _cat(dtype, torch.rand(300, generator=g, dtype=torch.float64) * (2 if double else 1.98) - (
                         1 if double else 0.99), tail if double else [], [0.0, -0.0, 0.5, -0.5, 1e-20, -1e-20]),
        "bessel_x": bessel.repeat(4, 1).to(dtype),
        "polygamma_x": polygamma.repeat(2, 1).to(dtype),
        "frexp_x": _cat(dtype, frexp, -frexp, [0.0, -0.0, _INF, -_INF, _NAN]),
        "gamma_x": _cat(dtype, non_integer, torch.logspace(-6, 3, 100, dtype=torch.float64),
                        -torch.logspace(-3, 3.5, 100, dtype=torch.float64) + 0.37,  # trigamma as eager: |x| < 4096
                        [1.0, 2.0, 1 + 1e-4, 2 - 1e-4, 1.4616321449683623, -2.4570247382208006, -0.5040830082644554,
                         -1e-3, -3 + 1e-3, -3 - 1e-3, 0.0, -0.0, -1.0, -7.0, 6.0, 10.0, 0.5, _INF, -_INF, _NAN]),
        "erfinv_tail": _cat(dtype, tail, -tail, [1.0, -1.0, 1.5, -2.0, 1e-30, -1e-30, _INF, -_INF, _NAN]),
        "erfc_tail": _cat(dtype, torch.linspace(5, 30, 200, dtype=torch.float64), -torch.logspace(0, 30, 30)),
        "gamma_wide": _cat(dtype, torch.logspace(-30, 38 if not double else 307, 200, dtype=torch.float64),
                           -torch.logspace(3.5, 7, 100, dtype=torch.float64) + 0.25, -torch.logspace(7, 30, 30),
                           -torch.arange(1.0, 60.0)),
    }


_GRADED = ("erfc_x", "erfinv_y", "gamma_x", "bessel_x", "polygamma_x", "frexp_x")


def _special(erfc_x, erfinv_y, bessel_x, polygamma_x, frexp_x, gamma_x, erfinv_tail, erfc_tail, gamma_wide):
    mantissa, exponent = torch.frexp(frexp_x)
    return {
        "erfc": torch.erfc(erfc_x),
        "erfinv": torch.erfinv(erfinv_y),
        "lgamma": torch.lgamma(gamma_x),
        "psi": torch.special.psi(gamma_x),
        "erfcx": torch.special.erfcx(erfc_x.detach()),  # its gradient 2x erfcx(x) - 2/sqrt(pi) cancels
        "erfinv_tail": torch.special.erfinv(erfinv_tail),
        "erfc_tail": torch.special.erfc(erfc_tail),
        "gammaln": torch.special.gammaln(gamma_x.detach()),
        "lgamma_wide": torch.lgamma(gamma_wide),
        "digamma_wide": torch.digamma(gamma_wide),
        "trigamma": torch.polygamma(1, gamma_x.detach()),
        "i0": torch.i0(bessel_x[0]),
        "i0e": torch.special.i0e(bessel_x[1]),
        "i1": torch.special.i1(bessel_x[2]),
        "i1e": torch.special.i1e(bessel_x[3]),
        "polygamma_2": torch.polygamma(2, polygamma_x[0]),  # gradient polygamma(3, .)
        "polygamma_3": torch.special.polygamma(3, polygamma_x[1]),  # gradient polygamma(4, .)
        "frexp_mantissa": mantissa,  # gradient 1 / exponent.exp2()
        "frexp_exponent": exponent,
        "kaiser_window": torch.kaiser_window(64, periodic=True, beta=8.0, dtype=bessel_x.dtype),
    }


def _assert_matches(got: torch.Tensor, expected: torch.Tensor, name: str, tolerance: tuple | None) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, name
    rtol, atol = tolerance if tolerance is not None else (None, None)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{name}: {m}")
    # Signed zeros and infinities too (assert_close lets -0.0 equal 0.0).
    extreme = ((expected == 0) & (got == 0)) | expected.isinf()
    assert torch.equal(got.signbit()[extreme], expected.signbit()[extreme]), name


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.float64, marks=pytest.mark.slow)])  # CI time
def test_special_functions_match_eager_forward_and_backward(dtype):
    inputs = _inputs(dtype)
    eager_in = {k: v.clone().requires_grad_(k in _GRADED) for k, v in inputs.items()}
    compiled_in = {k: v.clone().requires_grad_(k in _GRADED) for k, v in inputs.items()}
    expected = _special(**eager_in)
    got = torch.compile(_special, backend="neuron")(**compiled_in)
    for name in expected:
        tolerance = (0.0, 0.0) if name in _EXACT else _FLOAT64_TOLERANCE[name] if dtype == torch.float64 else None
        _assert_matches(got[name].detach(), expected[name].detach(), name, tolerance)

    # Gradients: lgamma's is digamma, digamma's is polygamma(1, .), erfc's and erfinv's use exp,
    # i0's is i1, i1's i0 and i1, i0e's and i1e's i0e, i1e and sgn, polygamma(n, .)'s polygamma(n + 1, .).
    g = torch.Generator().manual_seed(1)
    weighted_backward(expected, got, [k for k, v in expected.items() if v.requires_grad], g, dtype)
    for name in _GRADED:
        tolerance = _FLOAT64_GRAD_TOLERANCE[name] if dtype == torch.float64 else None
        _assert_matches(compiled_in[name].grad, eager_in[name].grad, f"grad of {name}", tolerance)


def test_half_precision_and_integer_inputs_compute_in_float32():
    """float16 and bfloat16 compute in float32 and round back; integers give the default dtype.

    (One wrapper serves every elementwise op: bfloat16 is checked through one, and frexp's.
    log_ndtr, which torch decomposes into erfc and erfcx, compiles too.)
    """
    def fn(h, b, i):
        ops = (torch.erfc, torch.erfinv, torch.lgamma, torch.digamma, lambda t: torch.polygamma(1, t),
               lambda t: torch.polygamma(2, t), torch.special.i0e, torch.special.i1)
        return [op(h) for op in ops] + [torch.digamma(b), *torch.frexp(b), torch.lgamma(i), torch.i0(i),
                                        torch.special.log_ndtr(h.float()), torch.kaiser_window(16, dtype=h.dtype)]

    g = torch.Generator().manual_seed(2)
    values = torch.cat([torch.rand(64, generator=g) * 1.8 - 0.9, torch.tensor([0.0, -0.5, 0.25, 3.0, -2.5])])
    args = (values.half(), values.bfloat16(), torch.arange(-3, 6))
    for got, expected in zip(torch.compile(fn, backend="neuron")(*args), fn(*args)):
        _assert_matches(got, expected, str(expected.dtype), None)


def test_lgamma_at_the_largest_negative_poles_is_inf():
    """Every float32 past 2**23 is an integer, a pole of Gamma: +inf as eager, also where the
    reflection's lgamma(1 - x) overflows (-3e38 gave NaN, inf - inf)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([-3e38, -3.4e38, -1e30, -2.5e7, -1.0], dtype=torch.float64)
        if dtype == torch.float64:
            x = torch.cat([x, torch.tensor([-1.7e308, -1e300])])
        x = x.to(dtype)
        got = torch.compile(torch.lgamma, backend="neuron")(x)
        assert torch.equal(got, torch.lgamma(x)), (dtype, got)


def test_the_compile_path_traces_with_these_decompositions():
    """No other table entry (ours or torch's) shadows them."""
    from torch_neuronx.compiler.decompositions import special, table

    aten = torch.ops.aten
    ops = (aten.erfc.default, aten.erfinv.default, aten.special_erfcx.default, aten.lgamma.default,
           aten.digamma.default, aten.polygamma.default, aten.i0.default, aten.special_i0e.default,
           aten.special_i1.default, aten.special_i1e.default, aten.frexp.Tensor, aten.exp2.default,
           aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
    # (precision.py wraps some of them, computing float16 and bfloat16 in float32)
    assert all(inspect.unwrap(table()[op]) is inspect.unwrap(special.DECOMPOSITIONS[op]) for op in ops)
