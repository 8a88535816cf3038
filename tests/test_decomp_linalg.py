"""Linear-algebra factorizations and solvers through the compile path (``decompositions/linalg.py``) against eager.

torch-mlir lowers none of the LU, Cholesky and triangular-solve ops behind
``torch.linalg.inv``/``solve``/``det``/``slogdet``/``cholesky``/
``solve_triangular``/``lu_factor``/``lu_solve``; they compile unrolled over the
matrix size. Each test batches every op into one compiled function (a compile
costs seconds), forward and backward (random upstream weights), on
well-conditioned matrices (``randn + n I``, ``B B^T + I``), batched and not,
including matrices that need row swaps and have negative determinants.
"""

from __future__ import annotations

import pytest
import torch
from compare import weighted_backward

aten = torch.ops.aten

#: (rtol, atol) per dtype: float32 results reach about 1e-6 relative; float64 about 1e-14.
_TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-10, 1e-10)}


def _linalg(a, s, b):
    """Every covered op on a square ``a``, a symmetric positive-definite ``s`` and a right-hand side ``b``."""
    lu, pivots = torch.linalg.lu_factor(a)
    chol = torch.linalg.cholesky(s)
    sign, logabsdet = torch.linalg.slogdet(a)
    p, lower, upper = torch.linalg.lu(a)
    return {
        "inv": torch.linalg.inv(a),
        "solve": torch.linalg.solve(a, b),
        "solve_vector": torch.linalg.solve(a, b[..., 0]),
        "solve_right": torch.linalg.solve(a, b.mT, left=False),
        "det": torch.linalg.det(a),
        "slogdet_sign": sign,
        "logabsdet": logabsdet,
        "logdet": torch.logdet(s),
        "cholesky": chol,
        "cholesky_upper": torch.linalg.cholesky(s, upper=True),
        "cholesky_solve": torch.cholesky_solve(b, chol),
        "cholesky_inverse": torch.cholesky_inverse(chol),
        # Triangles of ``s``: ``a``'s leading entry is zero in the pivoting cases.
        "solve_upper": torch.linalg.solve_triangular(s, b, upper=True),
        "solve_lower_right_unit": torch.linalg.solve_triangular(s, b.mT, upper=False, left=False, unitriangular=True),
        "lu_factor": lu,
        "pivots": pivots,
        "lu_solve": torch.linalg.lu_solve(lu, pivots, b),
        "lu_solve_adjoint": torch.linalg.lu_solve(lu, pivots, b, adjoint=True),
        "lu_p": p,
        "lu_l": lower,
        "lu_u": upper,
    }


def _matrices(n: int, batch: tuple, dtype: torch.dtype, g: torch.Generator, pivoting: bool = False):
    """A well-conditioned ``a``, an SPD ``s`` and a two-column ``b``; ``pivoting``: ``a[..., 0, 0] = 0``."""
    a = torch.randn(*batch, n, n, generator=g, dtype=torch.float64) + n * torch.eye(n, dtype=torch.float64)
    if pivoting:
        a[..., 0, 0] = 0.0  # the first step must swap rows
        a[..., 1:, 0] += torch.arange(1, n, dtype=torch.float64)  # ... with a row past the second
    c = torch.randn(*batch, n, n, generator=g, dtype=torch.float64)
    s = c @ c.mT + torch.eye(n, dtype=torch.float64)
    b = torch.randn(*batch, n, 2, generator=g, dtype=torch.float64)
    return a.to(dtype), s.to(dtype), b.to(dtype)


def _check(cases: dict, dtype: torch.dtype) -> None:
    """Compile ``_linalg`` over every case at once; compare outputs and gradients of a, s and b with eager."""
    def every(inputs):
        return {f"{case}/{k}": v for case, (a, s, b) in inputs.items() for k, v in _linalg(a, s, b).items()}

    eager_in = {k: tuple(t.clone().requires_grad_() for t in v) for k, v in cases.items()}
    compiled_in = {k: tuple(t.clone().requires_grad_() for t in v) for k, v in cases.items()}
    expected = every(eager_in)
    got = torch.compile(every, backend="neuron")(compiled_in)
    rtol, atol = _TOLERANCE[dtype]
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        if name.endswith("pivots"):
            assert torch.equal(got[name], value), name
        else:
            torch.testing.assert_close(got[name].detach(), value.detach(), rtol=rtol, atol=atol,
                                       msg=lambda m, name=name: f"{name}: {m}")

    g = torch.Generator().manual_seed(1)
    weighted_backward(expected, got, [k for k, v in expected.items() if v.requires_grad], g, dtype)
    for case in cases:
        for which, eager_t, compiled_t in zip("asb", eager_in[case], compiled_in[case]):
            torch.testing.assert_close(compiled_t.grad, eager_t.grad, rtol=rtol, atol=atol,
                                       msg=lambda m, case=case, which=which: f"grad of {case}/{which}: {m}")


def test_float32_sizes_batched_and_unbatched():
    g = torch.Generator().manual_seed(0)
    dtype = torch.float32
    _check({
        "n1_batched": _matrices(1, (2,), dtype, g),
        "n3": _matrices(3, (), dtype, g),
    }, dtype)


@pytest.mark.slow  # about two minutes on two cores: the unrolled 8x8 factorizations and their backwards
def test_float32_eight_by_eight_pivoting_batched():
    g = torch.Generator().manual_seed(1)
    dtype = torch.float32
    _check({"n8_pivoting_batched": _matrices(8, (2, 2), dtype, g, pivoting=True)}, dtype)


@pytest.mark.slow  # CI time: float32 sizes cover the factorizations
def test_float64_pivoting_and_negative_determinant():
    g = torch.Generator().manual_seed(2)
    dtype = torch.float64
    a, s, b = _matrices(5, (3,), dtype, g, pivoting=True)
    a[1] = a[1, [1, 0, 2, 3, 4]]  # one more swap: a negative determinant
    assert (torch.linalg.det(a) < 0).any() and (torch.linalg.det(a) > 0).any()
    assert (torch.linalg.lu_factor(a).pivots[..., 0] != 1).all()
    _check({"n5": (a, s, b)}, dtype)


def test_row_swaps_decide_the_determinant_sign():
    """Permutations of the identity (det +-1 only through the pivots), a zero leading entry, a singular matrix."""
    def fn(perms, zero_lead, singular):
        lu, pivots, info = torch.linalg.lu_factor_ex(zero_lead)
        return (torch.linalg.det(perms), torch.linalg.slogdet(perms), torch.linalg.det(zero_lead), lu, pivots, info,
                torch.linalg.det(singular), torch.linalg.slogdet(singular))

    eye = torch.eye(4)
    perms = torch.stack([eye, eye[[1, 0, 2, 3]], eye[[1, 2, 0, 3]], eye[[3, 2, 1, 0]], eye[[1, 0, 3, 2]]])
    zero_lead = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [-3.0, 1.0, 4.0]])
    singular = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 0.0]])
    got = torch.compile(fn, backend="neuron")(perms, zero_lead, singular)
    expected = fn(perms, zero_lead, singular)
    assert torch.equal(got[0], torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(got, expected)
    assert torch.equal(got[4], torch.tensor([3, 3, 3], dtype=torch.int32))  # the largest |value|: -3 in row 3
    assert torch.equal(got[5], torch.tensor(0, dtype=torch.int32))
    assert got[6] == 0 and got[7][0] == 0 and got[7][1] == float("-inf")


def test_the_compile_path_traces_with_these_decompositions():
    """No other table entry (ours or torch's) shadows them."""
    from torch_neuronx.compiler.decompositions import linalg, table

    assert linalg.DECOMPOSITIONS
    assert all(table()[op] is fn for op, fn in linalg.DECOMPOSITIONS.items())


def test_cholesky_reads_one_triangle():
    """Like LAPACK, the factorization reads only the lower (``upper=True``: upper) triangle."""
    g = torch.Generator().manual_seed(3)
    c = torch.randn(4, 4, generator=g)
    s = c @ c.mT + torch.eye(4)
    ones = torch.ones(4, 4, dtype=torch.bool)
    garbage_above = torch.where(ones.triu(1), torch.full((4, 4), 1e6), s)
    garbage_below = torch.where(ones.tril(-1), torch.full((4, 4), -1e6), s)

    def fn(above, below):
        return torch.linalg.cholesky(above), torch.linalg.cholesky(below, upper=True)

    got = torch.compile(fn, backend="neuron")(garbage_above, garbage_below)
    torch.testing.assert_close(got, fn(garbage_above, garbage_below))
    torch.testing.assert_close(got, fn(s, s))


_SINGULAR = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]])  # U[2, 2] is exactly zero
_NOT_PD = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # the leading minor of order 2 is not positive-definite
_ERROR_CASES = {
    "inv_batched": (lambda a: torch.linalg.inv(a), torch.stack([torch.eye(3), _SINGULAR])),
    "inverse_method": (lambda a: a.inverse(), _SINGULAR),
    "inv_ex_check": (lambda a: torch.linalg.inv_ex(a, check_errors=True), _SINGULAR),
    "solve": (lambda a: torch.linalg.solve(a, torch.ones(3)), _SINGULAR),
    "solve_ex_check": (lambda a: torch.linalg.solve_ex(a, torch.ones(3), check_errors=True), _SINGULAR),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a), _SINGULAR),
    "cholesky": (lambda a: torch.linalg.cholesky(a), _NOT_PD),
    "cholesky_ex_check": (lambda a: torch.linalg.cholesky_ex(a, check_errors=True), _NOT_PD),
    "cholesky_deprecated_upper": (lambda a: torch.cholesky(a, upper=True), torch.stack([torch.eye(2), _NOT_PD])),
    "cholesky_inverse": (lambda a: torch.cholesky_inverse(a), torch.stack([torch.eye(2), torch.zeros(2, 2)])),
}


def _outcome(fn, a):
    try:
        return "returned", fn(a)
    except Exception as exc:  # the exception itself is compared
        return type(exc), str(exc)


@pytest.mark.parametrize("case", sorted(_ERROR_CASES))
def test_bad_input_raises_eagers_error(case):
    """A singular or non-positive-definite input raises what eager raises, message and all."""
    fn, a = _ERROR_CASES[case]
    expected = _outcome(fn, a)
    assert expected[0] != "returned", "the case must make eager raise"
    assert _outcome(torch.compile(fn, backend="neuron"), a) == expected


def test_info_outputs_are_lapacks():
    """The ``_ex`` variants return LAPACK's info (first zero pivot, first non-PD minor) and do not raise."""
    def fn(singular, not_pd, good):
        return (torch.linalg.inv_ex(singular).info, torch.linalg.lu_factor_ex(singular).info,
                torch.linalg.cholesky_ex(not_pd).info, torch.linalg.inv_ex(good).info,
                torch.linalg.cholesky_ex(good).info)

    singular = torch.stack([_SINGULAR, torch.eye(3), torch.zeros(3, 3)])
    not_pd = torch.stack([_NOT_PD, torch.eye(2), -torch.eye(2)])
    good = 2 * torch.eye(4)
    got = torch.compile(fn, backend="neuron")(singular, not_pd, good)
    expected = fn(singular, not_pd, good)
    assert [t.tolist() for t in got] == [t.tolist() for t in expected] == [
        [2, 0, 1], [2, 0, 1], [2, 0, 1], 0, 0]


def test_checks_survive_a_warm_start_and_leave_torchs_registry_as_it_was():
    """A graph started from a stored plan still raises; the side-effect mark is restored after tracing."""
    from torch_neuronx import metrics

    holder = torch._library.simple_registry.singleton.find("aten::_linalg_check_errors").effect
    before = holder.effect

    def fn(a):
        return torch.linalg.inv(a) * 2

    good = 2 * torch.eye(3)
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(good), fn(good))
    assert holder.effect == before
    torch._dynamo.reset()
    plans_before = metrics.counter("warm_start_plans")
    warm = torch.compile(fn, backend="neuron")
    torch.testing.assert_close(warm(good), fn(good))
    assert metrics.counter("warm_start_plans") == plans_before + 1
    with pytest.raises(torch.linalg.LinAlgError, match="The diagonal element 2 is zero"):
        warm(_SINGULAR)
