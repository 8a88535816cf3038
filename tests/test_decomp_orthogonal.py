"""QR, eigh and SVD through the compile path (``decompositions/orthogonal.py``) against eager.

QR follows LAPACK's sign conventions, so ``Q`` and ``R`` are compared directly.
Eigenvectors and singular vectors are unique only up to sign, so they are
compared through sign-invariant quantities (reconstructions, ``|v|``,
orthonormality), and gradients through losses that do not depend on the signs.
"""

from __future__ import annotations

import pytest
import torch
from compare import weighted_backward

_TOLERANCE = {torch.float32: (2e-4, 2e-4), torch.float64: (1e-10, 1e-10)}


def _close(got, expected, dtype, name):
    rtol, atol = _TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _qr_outputs(tall, wide, square):
    q, r = torch.linalg.qr(tall)
    qc, rc = torch.linalg.qr(tall.detach(), mode="complete")
    qw, rw = torch.linalg.qr(wide)
    return {"q": q, "r": r, "q_complete": qc, "r_complete": rc, "q_wide": qw, "r_wide": rw,
            "r_only": torch.linalg.qr(square.detach(), mode="r").R, "q_square": torch.linalg.qr(square).Q}


def test_qr_matches_eager_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        torch._dynamo.reset()
        inputs = [torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
                  for shape in ((2, 6, 4), (3, 5), (4, 4))]
        inputs[2][1:, 0] = 0  # a column already reduced: LAPACK reflects nothing there
        eager_in = [t.clone().requires_grad_() for t in inputs]
        compiled_in = [t.clone().requires_grad_() for t in inputs]
        expected = _qr_outputs(*eager_in)
        got = torch.compile(_qr_outputs, backend="neuron")(*compiled_in)
        for name, value in expected.items():
            assert got[name].shape == value.shape, name
            _close(got[name].detach(), value.detach(), dtype, name)
        weighted_backward(expected, got, ("q", "r", "q_square"), g, dtype)
        for which, (e, c) in enumerate(zip(eager_in, compiled_in)):
            if e.grad is not None:
                _close(c.grad, e.grad, dtype, f"grad {which}")


def _spectral_outputs(sym, tall, wide):
    w, v = torch.linalg.eigh(sym)
    u, s, vh = torch.linalg.svd(tall, full_matrices=False)
    uw, sw, vhw = torch.linalg.svd(wide)  # full_matrices=True: U 3x3, Vh 5x5
    return {
        "eigenvalues": w, "eigvalsh_upper": torch.linalg.eigvalsh(sym, UPLO="U"),
        "eig_reconstruction": v @ torch.diag_embed(w) @ v.mT, "eigvectors_abs": v.abs(),
        "v_orthonormal": v.mT @ v,
        "singular_values": s, "svd_reconstruction": (u * s.unsqueeze(-2)) @ vh, "u_abs": u.abs(),
        "vh_abs": vh.abs(), "u_orthonormal": u.mT @ u,
        "singular_values_wide": sw, "u_wide_orthonormal": uw.mT @ uw, "vh_wide_orthonormal": vhw @ vhw.mT,
        "svd_wide_reconstruction": (uw * sw.unsqueeze(-2)) @ vhw[..., :3, :],
        "svdvals": torch.linalg.svdvals(tall), "norm2": torch.linalg.matrix_norm(tall, ord=2),
        "nuclear": torch.linalg.matrix_norm(wide, ord="nuc"), "pinv": torch.linalg.pinv(tall),
        "pinv_hermitian": torch.linalg.pinv(sym, hermitian=True),
    }


@pytest.mark.slow  # about 100 s on two cores (Jacobi sweeps unrolled, forward and backward); the
# rank-deficient SVD, pinv and parametrization tests keep eigh and SVD in the fast suite
def test_eigh_and_svd_match_eager_forward_and_backward():
    """Odd and even sizes (an odd size pads one index), batched, lower and upper triangles."""
    g = torch.Generator().manual_seed(1)
    dtype = torch.float32
    b = torch.randn(2, 5, 5, generator=g, dtype=torch.float64)
    above = 3 * torch.randn(2, 5, 5, generator=g, dtype=torch.float64)
    sym = torch.tril(b) + torch.tril(b, -1).mT + torch.triu(above, 1)  # the upper triangle: another matrix
    inputs = [sym.to(dtype), torch.randn(2, 6, 4, generator=g).to(dtype), torch.randn(3, 5, generator=g).to(dtype)]
    eager_in = [t.clone().requires_grad_() for t in inputs]
    compiled_in = [t.clone().requires_grad_() for t in inputs]
    expected = _spectral_outputs(*eager_in)
    got = torch.compile(_spectral_outputs, backend="neuron")(*compiled_in)
    for name, value in expected.items():
        assert got[name].shape == value.shape, name
        _close(got[name].detach(), value.detach(), dtype, name)
    # eigvalsh(UPLO="U") read the other triangle: another matrix.
    assert (got["eigvalsh_upper"] - got["eigenvalues"]).abs().max() > 1
    invariant = ("eigenvalues", "eig_reconstruction", "singular_values", "svd_reconstruction", "nuclear",
                 "norm2", "eigvalsh_upper", "pinv", "pinv_hermitian")
    weighted_backward(expected, got, invariant, g, dtype)
    for which, (e, c) in enumerate(zip(eager_in, compiled_in)):
        _close(c.grad, e.grad, dtype, f"grad {which}")


@pytest.mark.slow  # CI time: matrix_exp trains through the orthogonal parametrizations, svd's
# full-rank cases stay
def test_svd_of_a_rank_deficient_matrix_has_orthonormal_singular_vectors():
    """Columns for zero singular values are an orthonormal completion, as LAPACK's are (float64)."""
    g = torch.Generator().manual_seed(2)
    low_rank = torch.randn(6, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 4, generator=g,
                                                                                  dtype=torch.float64)

    def fn(a):
        return (torch.linalg.svd(a), torch.linalg.eigvalsh(a.mT @ a), torch.linalg.qr(torch.zeros_like(a)),
                torch.linalg.pinv(a), torch.linalg.matrix_rank(a))

    (u, s, vh), w, (q, r), pinv, rank = torch.compile(fn, backend="neuron")(low_rank)
    (_, s_e, _), w_e, (q_e, r_e), pinv_e, rank_e = fn(low_rank)
    _close(pinv, pinv_e, torch.float64, "pinv")  # the zero singular values are dropped, as in eager
    assert rank == rank_e == 2
    _close(s, s_e, torch.float64, "singular values")
    _close(w, w_e, torch.float64, "eigenvalues")
    _close(u.mT @ u, torch.eye(6, dtype=torch.float64), torch.float64, "U^T U")
    _close(vh @ vh.mT, torch.eye(4, dtype=torch.float64), torch.float64, "Vh Vh^T")
    _close((u[:, :4] * s) @ vh, low_rank, torch.float64, "reconstruction")
    assert torch.equal(q, q_e) and torch.equal(r, r_e)  # zeros: no reflection at all


def test_the_compile_path_traces_with_these_decompositions():
    from torch_neuronx.compiler.decompositions import orthogonal, table

    assert orthogonal.DECOMPOSITIONS
    assert all(table()[op] is fn for op, fn in orthogonal.DECOMPOSITIONS.items())


def test_orthogonal_parametrizations_train_as_in_eager():
    """``nn.utils.parametrizations.orthogonal``: matrix_exp (square) and householder_product (tall)."""
    from torch.nn.utils import parametrizations

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(parametrizations.orthogonal(torch.nn.Linear(4, 4)),
                                   parametrizations.orthogonal(torch.nn.Linear(4, 6)), torch.nn.Tanh())

    eager, compiled_model = make(), make()
    compiled = torch.compile(compiled_model, backend="neuron")
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    expected, got = eager(x), compiled(x)
    _close(got, expected, torch.float32, "output")
    expected.square().sum().backward()
    got.square().sum().backward()
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        _close(p_compiled.grad, p_eager.grad, torch.float32, f"grad of {name}")


@pytest.mark.slow  # CI time: matrix_exp trains through the orthogonal parametrizations, svd's
# full-rank cases stay
def test_matrix_exp_matches_eager_forward_and_backward():
    """Small, unit and large norms (up to overflow), batched, float32 and float64."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64):
        torch._dynamo.reset()
        scales = torch.tensor([1e-6, 0.3, 1.0, 8.0, 1.0], dtype=torch.float64)
        a = torch.randn(5, 4, 4, generator=g, dtype=torch.float64) * scales[:, None, None]
        a[4] = a[4] + 1000 * torch.eye(4, dtype=torch.float64)  # overflows (to nan, in eager too)
        a = a.to(dtype)
        eager_in, compiled_in = a.clone().requires_grad_(), a.clone().requires_grad_()
        expected = torch.linalg.matrix_exp(eager_in)
        got = torch.compile(torch.linalg.matrix_exp, backend="neuron")(compiled_in)
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12

        def relative_error(a, b):  # per matrix, relative to its largest entry
            return ((a - b).abs().amax((-2, -1)) / b.abs().amax((-2, -1))).max().item()

        assert relative_error(got[:4].detach(), expected[:4].detach()) < tolerance
        assert torch.equal(got[4].isfinite(), expected[4].isfinite()) and not expected[4].isfinite().any()
        weights = torch.randn(4, 4, 4, generator=g, dtype=dtype)
        (expected[:4] * weights).sum().backward()
        (got[:4] * weights).sum().backward()
        assert relative_error(compiled_in.grad[:4], eager_in.grad[:4]) < 10 * tolerance


def _lapack_qr(a, b, c, w, reflectors, tau, other):
    outs = [*torch.geqrf(a), *torch.geqrf(b), *torch.geqrf(c), *torch.geqrf(w)]
    return outs + [torch.ormqr(reflectors, tau, other, left, transpose)
                   for left in (True, False) for transpose in (True, False)]


def test_geqrf_and_ormqr_match_lapack():
    """LAPACK's raw forms: square, tall, wide and batched geqrf (a column already zero below the
    diagonal gets tau = 0), and ormqr's four products on arbitrary reflectors."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 4, 3, generator=g)
    w[0, 1:, 0] = 0
    args = (torch.randn(5, 5, generator=g), torch.randn(5, 2, generator=g), torch.randn(2, 5, generator=g), w,
            torch.randn(5, 5, generator=g), torch.randn(5, generator=g), torch.randn(5, 5, generator=g))
    expected = _lapack_qr(*args)
    got = torch.compile(_lapack_qr, backend="neuron")(*args)
    for i, (x, e) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(x, e, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"output {i}: {m}")
