"""torch.special's Bessel functions, orthogonal polynomials, zeta, ndtri, the incomplete gamma
functions and nextafter through the compile path (``decompositions/bessel.py``,
``polynomials.py``, ``special_functions.py``, ``incomplete_gamma.py``) against eager.

torch-mlir lowers none of these ops. Each test batches a family into one compiled function
(a compile costs seconds) over its whole domain: zeros, negative arguments, tails, large
magnitudes, infinities and NaN, and for the polynomials degrees from negative through the
unrolled bounds to past them. Tolerances per op are those the decompositions document:
float32 mostly at ``assert_close``'s defaults, looser where eager's own float32 kernel is
ill-conditioned (the trigonometric Chebyshev forms, the incomplete gamma functions); nextafter
bit for bit. Subnormal results are left out (the compiled code flushes them to zero).
"""

from __future__ import annotations

import pytest
import torch

_INF, _NAN = float("inf"), float("nan")

_BESSEL = ("bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1",
           "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
           "spherical_bessel_j0")
_CHEBYSHEV = tuple(f"{s}chebyshev_polynomial_{k}" for s in ("", "shifted_") for k in "tuvw")
_POLYNOMIALS = (*_CHEBYSHEV, "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
                "legendre_polynomial_p")


def _check(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor],
           tolerance: dict[str, tuple[float, float]]) -> None:
    """assert_close per output with its (rtol, atol) (the dtype's defaults when absent), NaN equal."""
    for name, e in expected.items():
        rtol, atol = tolerance.get(name, (None, None))
        torch.testing.assert_close(got[name], e, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, n=name: f"{n}: {m}")


def _compare(fn, *args, tolerance: dict[str, tuple[float, float]]) -> None:
    """``fn(*args)`` (a dict of tensors) compiled against eager."""
    _check(fn(*args), torch.compile(fn, backend="neuron")(*args), tolerance)


def _grid(dtype: torch.dtype) -> torch.Tensor:
    """Arguments for the Bessel functions: both signs, 0, the ranges' ends, tails, inf and NaN."""
    double = dtype == torch.float64
    top = 2.5 if not double else 2.8
    values = [torch.linspace(-30, 30, 601, dtype=torch.float64), torch.logspace(-30, top, 80, dtype=torch.float64),
              -torch.logspace(-30, top, 80, dtype=torch.float64),
              torch.tensor([0.0, -0.0, 5.0, 5 + 1e-6, 8.0, 8 + 1e-5, 2.0, 2 + 1e-6, 1e-5, 0.5, 0.49999, 1e6,
                            _INF, -_INF, _NAN], dtype=torch.float64)]
    return torch.cat(values).to(dtype)


#: float32 (rtol, atol) of the Bessel functions: eager's and ours round differently near the
#: zeros of j and y past 5 (the asymptotic form cancels there), and k0/k1 go below 1e-38
#: (subnormal in eager, flushed here) past x ~ 85.
_BESSEL_TOLERANCE = {torch.float32: {name: (2e-6, 1e-6) for name in _BESSEL},
                     torch.float64: {name: (1e-13, 1e-15) for name in _BESSEL}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bessel_functions(dtype):
    x = _grid(dtype)

    def fn(x):
        return {name: getattr(torch.special, name)(x) for name in _BESSEL}

    _compare(fn, x, tolerance=_BESSEL_TOLERANCE[dtype])


def _polynomial_grid(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, n) pairs: x over [-3, 3], the ends of [-1, 1] and [0, 1], near them, large, inf and NaN;
    degrees from negative through the recurrences and past the unrolled bounds, non-integer,
    NaN and infinite ones."""
    xs = torch.cat([torch.linspace(-3, 3, 61, dtype=torch.float64),
                    torch.tensor([0.0, 1.0, -1.0, 0.5, 1 + 1e-6, 1 - 6e-8, -1 + 6e-8, 1.01, 8.48, -8.48, 3e-8, _INF,
                                  -_INF, _NAN], dtype=torch.float64)])
    ns = torch.cat([torch.arange(-2, 30, dtype=torch.float64),
                    torch.tensor([40, 55, 57, 63, 64, 65, 100, 500, 3.61, -1.77, -0.5, 0.5, _NAN, _INF, -_INF, 1e20],
                                 dtype=torch.float64)])
    x, n = torch.meshgrid(xs, ns, indexing="ij")
    return x.flatten().to(dtype), n.flatten().to(dtype)


def _polynomial_expected(x: torch.Tensor, n: torch.Tensor) -> dict[str, torch.Tensor]:
    """Eager's values, with the degrees past our unrolled bounds (NaN there: documented) masked to
    NaN, except where torch returns its special values (Laguerre at x = 0, Legendre at +-1)."""
    from torch_neuronx.compiler.decompositions.polynomials import STEPS

    out = {name: getattr(torch.special, name)(x, n) for name in _POLYNOMIALS}
    past = (torch.trunc(n) > STEPS) & (n < 2.0 ** 63)
    out["laguerre_polynomial_l"] = torch.where(past & (x != 0), _NAN, out["laguerre_polynomial_l"])
    out["legendre_polynomial_p"] = torch.where(past & (x.abs() != 1), _NAN, out["legendre_polynomial_p"])
    return out


def _polynomial_tolerance() -> dict[str, tuple[float, float]]:
    """float32: the recurrences are eager's bit for bit (fused multiply-adds emulated); where
    torch's Chebyshev kernels take ``cos(n acos x)`` and kin (|x| < 1, n > 4..8) one ulp of acos
    becomes ``n`` ulps of the result, and past the unrolled steps (|x| > 1) eager's recurrence
    drifts from our closed form by up to ~n**2 ulps next to |x| = 1 (7e-4 relative at n = 500)."""
    tolerance = {name: (2e-3, 5e-4) for name in _CHEBYSHEV}
    tolerance.update({name: (0.0, 0.0) for name in _POLYNOMIALS if name not in _CHEBYSHEV})
    return tolerance


@pytest.mark.slow  # about a minute of tracing and compiling on two cores
def test_polynomials_float32():
    x, n = _polynomial_grid(torch.float32)

    def fn(x, n):
        return {name: getattr(torch.special, name)(x, n) for name in _POLYNOMIALS}

    _check(_polynomial_expected(x, n), torch.compile(fn, backend="neuron")(x, n), _polynomial_tolerance())


def test_polynomial_overloads():
    """Python-number degrees (x_scalar, n_scalar overloads) unroll just that many steps; integer
    tensors compute in the default dtype; one-element arguments keep their shape."""
    x = torch.linspace(-2, 2, 41)
    ints = torch.arange(-1, 12)
    one = torch.tensor(0.3)  # one element: computed on two (see special_functions.one_element_padded)

    def fn(x, ints, one):
        special = torch.special
        return {"t_n5": special.chebyshev_polynomial_t(x, 5), "u_n20": special.chebyshev_polynomial_u(x, 20),
                "h_n7": special.hermite_polynomial_h(x, 7), "l_n3": special.laguerre_polynomial_l(x, 3.5),
                "p_x": special.legendre_polynomial_p(0.3, ints), "he_x": special.hermite_polynomial_he(-1.5, ints),
                "w_int": special.shifted_chebyshev_polynomial_w(ints, ints),
                "v_neg": special.chebyshev_polynomial_v(x, -2), "t_one": special.chebyshev_polynomial_t(one, 9),
                "j0_one": special.bessel_j0(one)}

    _compare(fn, x, ints, one, tolerance={})


def test_polynomials_float64():
    """float64 (Chebyshev and Laguerre; eager's fused multiply-adds are not emulated there: 1e-12
    relative after hundreds of steps)."""
    x, n = _polynomial_grid(torch.float64)
    names = ("chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "laguerre_polynomial_l")

    def fn(x, n):
        return {name: getattr(torch.special, name)(x, n) for name in names}

    expected = {k: v for k, v in _polynomial_expected(x, n).items() if k in names}
    _check(expected, torch.compile(fn, backend="neuron")(x, n), {name: (1e-11, 1e-12) for name in names})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta_ndtri_nextafter(dtype):
    double = dtype == torch.float64
    g = torch.Generator().manual_seed(0)
    xs = torch.tensor([1.0, 1.5, 2, 3, 4, 5, 7, 10, 20, 50, 0.5, -1, 1 + 1e-6, _INF, _NAN], dtype=torch.float64)
    qs = torch.tensor([1.0, 2, 0.5, 1e-3, 9, 10, 100, 1e6, 0, -1, -2.5, -0.5, -8.48, -1.77, -30.3, _INF, -_INF, _NAN],
                      dtype=torch.float64)
    x, q = (t.flatten().to(dtype) for t in torch.meshgrid(xs, qs, indexing="ij"))
    tiny = 1e-300 if double else 1e-37
    y = torch.cat([torch.rand(200, generator=g, dtype=torch.float64), torch.logspace(-300 if double else -37, 0, 60,
                                                                                      dtype=torch.float64),
                   1 - torch.logspace(-16 if double else -7.5, 0, 60, dtype=torch.float64),
                   torch.tensor([0, 1, 0.5, 0.135335, 0.865, -0.1, 1.1, tiny, _NAN, _INF, -_INF], dtype=torch.float64)])
    y = y.to(dtype)
    special = [0.0, -0.0, 1.0, -1.0, _INF, -_INF, _NAN, 3e38, 1e-45 if not double else 5e-324, -1e-40]
    a = torch.cat([torch.randn(60, generator=g, dtype=torch.float64) * 10, torch.tensor(special, dtype=torch.float64)])
    s = torch.tensor(special, dtype=torch.float64)
    a, b = a[:, None].expand(-1, len(s)).flatten().to(dtype), s[None, :].expand(len(a), -1).flatten().to(dtype)

    def fn(x, q, y, a, b):
        out = {"zeta": torch.special.zeta(x, q), "ndtri": torch.special.ndtri(y), "nextafter": torch.nextafter(a, b)}
        if not double:  # the scalar overloads (each one more zeta in the graph) in one dtype
            out.update(zeta_scalar=torch.special.zeta(2.0, q), zeta_other_scalar=torch.special.zeta(x, 3.0))
        return out

    expected = fn(x, q, y, a, b)
    got = torch.compile(fn, backend="neuron")(x, q, y, a, b)
    bits = torch.int64 if double else torch.int32
    assert torch.equal(got["nextafter"].view(bits), expected["nextafter"].view(bits))
    # float64: zeta at negative q sums terms that cancel (eager sums them in another order).
    tolerance = {"zeta": (1e-10, 1e-14), "ndtri": (1e-14, 1e-15)} if double else {}
    _check({k: v for k, v in expected.items() if k != "nextafter"}, got, tolerance)


@pytest.mark.slow  # about a minute (float32) and a minute and a half (float64) on two cores
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_incomplete_gamma(dtype):
    double = dtype == torch.float64
    values = torch.cat([torch.logspace(-6, 3, 40, dtype=torch.float64),
                        torch.tensor([0.0, 0.5, 1, 1.05, 1.1, 2, 20, 21, 150, 199, 201, 5000, 1e5, -1, _INF, _NAN],
                                     dtype=torch.float64)])
    a, x = (t.flatten() for t in torch.meshgrid(values, values, indexing="ij"))
    near = torch.logspace(1, 4, 30, dtype=torch.float64)
    offsets = torch.linspace(-12, 12, 13, dtype=torch.float64)
    near_a, near_x = (t.flatten() for t in torch.meshgrid(near, offsets, indexing="ij"))
    near_x = (near_a + near_x * near_a.sqrt()).clamp(min=1e-3)  # x within 12 sqrt(a) of a
    a, x = torch.cat([a, near_a]).to(dtype), torch.cat([x, near_x]).to(dtype)

    # float64 compiles igammac alone (igamma is the same graph with other selections): a compile
    # of either costs seconds per thousand unrolled ops.
    names = ("igammac",) if double else ("igamma", "igammac")

    def fn(a, x):
        return {name: getattr(torch, name)(a, x) for name in names}

    # float32: eager's kernel loses digits where a log x - x - lgamma(a) cancels; ours computes in float64.
    tolerance = {name: (1e-10, 1e-12) if double else (3e-5, 2e-6) for name in names}
    _compare(fn, a, x, tolerance=tolerance)


def _airy_grid(dtype: torch.dtype) -> torch.Tensor:
    """Arguments for Ai: every range (both asymptotic forms, the series between), their ends,
    the oscillating tail far out, past the underflow at 103.892, infinities and NaN."""
    ends = [2.09, 2.0899999, 8.3203353, 103.892, 103.9, 0.0, -0.0, -2.09, -2.0900001, 1e-20, -1e-20, _INF, -_INF,
            _NAN]
    values = [torch.linspace(-30, 30, 601, dtype=torch.float64), -torch.logspace(0.3, 4, 60, dtype=torch.float64),
              torch.linspace(2, 40, 77, dtype=torch.float64), torch.tensor(ends, dtype=torch.float64)]
    return torch.cat(values).to(dtype)


#: (rtol, atol): the series is eager's bit for bit; the asymptotic forms differ by ulps (sin and
#: cos of the oscillating tail's phase, exp past 2.09), absolutely near the zeros of Ai; below
#: 1e-38 (x past ~26) float32 values are subnormal in eager, 0 here.
_AIRY_TOLERANCE = {torch.float32: (5e-7, 1e-7), torch.float64: (1e-15, 2e-16)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_airy_ai(dtype):
    _compare(lambda x: {"airy_ai": torch.special.airy_ai(x)}, _airy_grid(dtype),
             tolerance={"airy_ai": _AIRY_TOLERANCE[dtype]})
