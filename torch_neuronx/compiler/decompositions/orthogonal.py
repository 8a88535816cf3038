"""Orthogonal factorizations (QR, symmetric eigendecomposition, SVD) as matmuls and arithmetic.

torch-mlir lowers none of ``aten.linalg_qr``, ``aten._linalg_eigh`` and
``aten._linalg_svd``: the ops behind ``torch.linalg.qr``, ``eigh``,
``eigvalsh``, ``svd``, ``svdvals``, ``pinv``, ``householder_product``,
``matrix_norm`` of order 2 and nuclear, ``cond`` and ``matrix_rank``; nor LAPACK's
``geqrf`` and ``ormqr``, which torch exposes as they are. Shapes are static at trace time, so each is
unrolled over the matrix size:

- QR: Householder reflections, one per column, with LAPACK's conventions
  (``geqrf``: ``R``'s diagonal is ``-sign(x0) * norm``, no reflection where the
  part below the diagonal is already zero), so ``Q`` and ``R`` match eager's
  signs. Modes ``reduced``, ``complete`` and ``r``.
- ``eigh``: cyclic Jacobi rotations in parallel (round-robin pairing: each round
  rotates ``n/2`` disjoint pairs as one orthogonal matrix, ``A <- J^T A J``, so a
  sweep is ``n - 1`` rounds of three matmuls), a fixed number of sweeps chosen
  for the dtype and size (Jacobi converges quadratically once the off-diagonal
  part is small). Eigenvalues ascending, as eager returns them. The matrix is
  read from the ``UPLO`` triangle only.
- SVD: one-sided Jacobi (Hestenes): the same rounds rotate pairs of columns of
  ``A`` until they are orthogonal; the singular values are the column norms,
  descending. ``U`` is made orthonormal (and completed to a square matrix for
  ``full_matrices``) by the QR above, so columns for zero singular values are an
  orthonormal completion, as LAPACK's are. Wide matrices go through their
  transpose.

Eigenvectors and singular vectors are unique only up to sign (and within
repeated values, up to rotation): eager's LAPACK and these choose differently,
as eager's CPU and CUDA results do. Compare them through sign-invariant
quantities (reconstructions, projections ``V V^T``, ``|v|``).

Graph size and compile time grow with the size: ``eigh`` and ``svd`` are about
``25 * n * sweeps`` ops (``sweeps`` is 8 to 14); meant for matrices up to a few
dozen rows.
"""

from __future__ import annotations

import math

import torch

from torch_neuronx.compiler.decompositions.linalg import real_only
from torch_neuronx.compiler.decompositions.literals import literal

aten = torch.ops.aten


def _sign(x: torch.Tensor) -> torch.Tensor:
    """-1 for negative entries, else 1 (LAPACK's ``SIGN(1, x)``: zero counts as positive)."""
    one = torch.ones((), dtype=x.dtype, device=x.device)
    return torch.where(x < 0, -one, one)


def _reflector(r: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Column ``j`` of ``r`` from the diagonal down, as LAPACK's ``larfg`` sees it: its head
    (the diagonal entry) and the part below, ``beta = -sign(head) * norm`` (the new diagonal
    entry), and where nothing is to be reflected (the part below is zero)."""
    x = r[..., j:, j:j + 1]
    head, below = x[..., :1, :], x[..., 1:, :]
    tail = (below * below).sum(-2, keepdim=True)
    return head, below, -_sign(head) * torch.sqrt(head * head + tail), tail == 0


def _householder(a: torch.Tensor, complete: bool, with_q: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(Q, R)`` of ``a`` (``..., m, n``) by Householder reflections; ``Q`` is ``m x m`` (or None)."""
    m, n = a.shape[-2], a.shape[-1]
    r = a
    q = torch.eye(m, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], m, m) if with_q else None
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    for j in range(min(m - 1, n)):
        head, below, beta, no_reflection = _reflector(r, j)
        v = torch.cat([head - beta, below], dim=-2)
        # H = I - scale v v^T; LAPACK reflects nothing (tau = 0) when ``below`` is zero.
        scale = torch.where(no_reflection, zero, 2 / torch.where(no_reflection, 1, (v * v).sum(-2, keepdim=True)))
        block = r[..., j:, :]
        r = torch.cat([r[..., :j, :], block - v * (scale * torch.matmul(v.mT, block))], dim=-2)
        if q is not None:
            columns = q[..., :, j:]
            q = torch.cat([q[..., :, :j], columns - torch.matmul(torch.matmul(columns, v) * scale, v.mT)], dim=-1)
    return q, r.triu()


def linalg_qr(a: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.linalg_qr``: ``(Q, R)``; mode ``r`` returns an empty ``Q``, as eager does."""
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' "
                         "(default), 'r', or 'complete'")
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    q, r = _householder(a, complete=mode == "complete", with_q=mode != "r")
    if mode == "complete":
        return q, r
    r = r[..., :k, :]
    if mode == "r":
        return a.new_zeros([0]), r
    return q[..., :, :k], r


def linalg_householder_product(a: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``aten.linalg_householder_product`` (LAPACK's ``orgqr``): the first ``n`` columns of
    ``H_1 ... H_k``, ``H_i = I - tau_i v_i v_i^T``, ``v_i`` = ``(0, ..., 0, 1, a[i+1:, i])``.

    What ``torch.nn.utils.parametrizations.orthogonal`` uses for non-square weights.
    """
    m, n = a.shape[-2], a.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
    rows = torch.arange(m, device=a.device).unsqueeze(-1)
    one = torch.ones((), dtype=a.dtype, device=a.device)
    q = torch.eye(m, n, dtype=a.dtype, device=a.device).expand(*batch, m, n)
    for i in reversed(range(tau.shape[-1])):
        v = torch.where(rows > i, a[..., :, i:i + 1], torch.where(rows == i, one, 0 * one))
        q = q - tau[..., i:i + 1].unsqueeze(-1) * torch.matmul(v, torch.matmul(v.mT, q))
    return q


def geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.geqrf`` (LAPACK's ``geqrf``): ``R`` on and above the diagonal, each reflector's
    ``v`` (``v[0] = 1`` implied) below it, and the ``tau`` of ``H = I - tau v v^T``; ``tau = 0``
    (no reflection) where a column is already zero below the diagonal, as ``larfg`` does."""
    m, n = a.shape[-2], a.shape[-1]
    r, columns, taus = a, [], []
    one = torch.ones((), dtype=a.dtype, device=a.device)
    for j in range(min(m, n)):
        head, below, beta, no_reflection = _reflector(r, j)
        v_below = torch.where(no_reflection, 0 * one, below / torch.where(no_reflection, one, head - beta))
        tau = torch.where(no_reflection, 0 * one, (beta - head) / torch.where(no_reflection, one, beta))
        v = torch.cat([one.expand(head.shape), v_below], dim=-2)
        block = r[..., j:, :]
        r = torch.cat([r[..., :j, :], block - v * (tau * torch.matmul(v.mT, block))], dim=-2)
        columns.append(torch.cat([torch.zeros_like(r[..., :j + 1, :1]), v_below], dim=-2))
        taus.append(tau[..., 0, 0])
    columns += [torch.zeros_like(r[..., :, :1])] * (n - len(columns))
    rows, cols = torch.arange(m, device=a.device).unsqueeze(-1), torch.arange(n, device=a.device)
    out = torch.where(rows > cols, torch.cat(columns, dim=-1), r) if columns else r
    tau = torch.stack(taus, dim=-1) if taus else a.new_zeros((*a.shape[:-2], 0))
    return out, tau


def ormqr(a: torch.Tensor, tau: torch.Tensor, other: torch.Tensor, left: bool = True,
          transpose: bool = False) -> torch.Tensor:
    """``aten.ormqr`` (LAPACK's ``ormqr``): ``other`` times ``Q = H_1 ... H_k`` of :func:`geqrf`'s
    reflectors in ``a`` and ``tau``: ``Q C``, ``Q^T C``, ``C Q`` or ``C Q^T``."""
    m = a.shape[-2]
    rows = torch.arange(m, device=a.device).unsqueeze(-1)
    one = torch.ones((), dtype=a.dtype, device=a.device)
    order = range(tau.shape[-1])
    # Q C and C Q^T apply H_k first; Q^T C and C Q apply H_1 first.
    for i in reversed(order) if left != transpose else order:
        v = torch.where(rows > i, a[..., :, i:i + 1], torch.where(rows == i, one, 0 * one))
        t = tau[..., i:i + 1].unsqueeze(-1)
        if left:
            other = other - t * torch.matmul(v, torch.matmul(v.mT, other))
        else:
            other = other - t * torch.matmul(torch.matmul(other, v), v.mT)
    return other


def _pairings(n: int) -> list[tuple[list[int], list[int]]]:
    """Round-robin rounds over ``range(N)`` (``n`` rounded up to even): ``N - 1`` rounds of ``N/2`` disjoint pairs.

    Each round is ``(partner, sign)``: ``partner[i]`` is the index ``i`` is paired
    with, ``sign[i]`` is 1 for the smaller index of the pair and -1 for the larger.
    """
    size = n + n % 2
    players = list(range(size))
    rounds = []
    for _ in range(size - 1):
        partner, sign = [0] * size, [0] * size
        for i in range(size // 2):
            p, q = sorted((players[i], players[size - 1 - i]))
            partner[p], partner[q], sign[p], sign[q] = q, p, 1, -1
        rounds.append((partner, sign))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _sweeps(n: int, dtype: torch.dtype) -> int:
    """Jacobi sweeps for an ``n x n`` problem: enough for the dtype's precision on clustered spectra."""
    bits = math.ceil(math.log2(max(n, 2)))
    return (7 if dtype == torch.float64 else 5) + bits


class _Round:
    """One round of rotations as constants: the partner permutation matrix and the pair signs."""

    def __init__(self, partner: list[int], sign: list[int], like: torch.Tensor) -> None:
        size = len(partner)
        # partners[i, partner[i]] = 1: literals of the graph, not ops.
        self.partners = literal(lambda: torch.eye(size, dtype=like.dtype)[partner], like.device)
        self.sign = literal(lambda: torch.tensor(sign, dtype=like.dtype), like.device)
        self.eye = torch.eye(size, dtype=like.dtype, device=like.device)

    def of_partner(self, values: torch.Tensor) -> torch.Tensor:
        """``values[..., partner[i]]`` for each ``i``."""
        return (values.unsqueeze(-2) * self.partners).sum(-1)

    def rotation(self, diagonal_gap: torch.Tensor, coupling: torch.Tensor) -> torch.Tensor:
        """The rotation ``J`` that zeroes each pair's ``coupling``.

        ``diagonal_gap[i]`` is ``d[partner[i]] - d[i]`` and ``coupling[i]`` the pair's
        off-diagonal term; for the pair ``(p, q)``, ``J[p, p] = J[q, q] = c``,
        ``J[p, q] = s``, ``J[q, p] = -s`` with ``t = s / c`` the smaller root of
        ``t**2 + 2 theta t - 1``, ``theta = (d[q] - d[p]) / (2 coupling)``.
        """
        zero = coupling == 0
        theta = self.sign * diagonal_gap / (2 * torch.where(zero, 1, coupling))
        t = _sign(theta) / (theta.abs() + torch.sqrt(theta * theta + 1))
        t = torch.where(zero, 0, t)
        c = torch.rsqrt(t * t + 1)
        s = t * c * self.sign
        return c.unsqueeze(-1) * self.eye + s.unsqueeze(-1) * self.partners


def _padded(a: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    return torch.nn.functional.pad(a, (0, columns, 0, rows)) if rows or columns else a


def _jacobi_eigh(a: torch.Tensor, compute_v: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eigenvalues (unsorted) and eigenvectors of the symmetric ``a`` by parallel cyclic Jacobi."""
    n = a.shape[-1]
    odd = n % 2
    # An odd size gets an isolated extra index: its off-diagonal terms are zero, so it never rotates.
    a = _padded(a, odd, odd)
    size = n + odd
    v = torch.eye(size, dtype=a.dtype, device=a.device).expand(a.shape) if compute_v else None
    rounds = [_Round(partner, sign, a) for partner, sign in _pairings(n)]
    for _ in range(_sweeps(n, a.dtype)):
        for rnd in rounds:
            d = a.diagonal(0, -2, -1)
            j = rnd.rotation(rnd.of_partner(d) - d, (a * rnd.partners).sum(-1))
            a = torch.matmul(torch.matmul(j.mT, a), j)
            if v is not None:
                v = torch.matmul(v, j)
    w = a.diagonal(0, -2, -1)[..., :n]
    return w, (v[..., :n, :n] if v is not None else None)


def _symmetric_from(a: torch.Tensor, uplo: str) -> torch.Tensor:
    """The symmetric matrix ``a``'s ``uplo`` triangle describes (the other is never read)."""
    if uplo.upper() == "L":
        return a.tril() + a.tril(-1).mT
    return a.triu() + a.triu(1).mT


def _linalg_eigh(a: torch.Tensor, uplo: str = "L", compute_v: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._linalg_eigh``: ``(eigenvalues ascending, eigenvectors)``; an empty tensor without ``compute_v``."""
    w, v = _jacobi_eigh(_symmetric_from(a, uplo), compute_v)
    w, order = torch.sort(w, dim=-1)
    if v is None:
        return w, a.new_zeros([0])
    return w, torch.gather(v, -1, order.unsqueeze(-2).expand(v.shape))


def _one_sided_jacobi(a: torch.Tensor, compute_v: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Columns of ``a`` (``..., m, n``, ``m >= n``) rotated until orthogonal, and the rotations' product."""
    n = a.shape[-1]
    odd = n % 2
    u = _padded(a, 0, odd)  # an extra zero column: never rotates
    size = n + odd
    v = torch.eye(size, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], size, size) if compute_v else None
    rounds = [_Round(partner, sign, a) for partner, sign in _pairings(n)]
    for _ in range(_sweeps(n, a.dtype)):
        for rnd in rounds:
            gram = torch.matmul(u.mT, u)
            norms = gram.diagonal(0, -2, -1)
            j = rnd.rotation(rnd.of_partner(norms) - norms, (gram * rnd.partners).sum(-1))
            u = torch.matmul(u, j)
            if v is not None:
                v = torch.matmul(v, j)
    return u[..., :n], (v[..., :n, :n] if v is not None else None)


def _orthonormal_columns(u: torch.Tensor, complete: bool) -> torch.Tensor:
    """An orthonormal basis from ``u`` (``m >= n``), whose columns are orthonormal or zero.

    ``u = Q R`` with ``R``'s diagonal +-1 for orthonormal columns (so ``Q``'s column is
    the same up to that sign) and 0 for zero columns, whose ``Q`` column completes the
    basis; ``complete`` keeps all ``m`` columns of ``Q``.
    """
    n = u.shape[-1]
    q, r = _householder(u, complete=True)
    first = q[..., :, :n] * _sign(r.diagonal(0, -2, -1)).unsqueeze(-2)
    return torch.cat([first, q[..., :, n:]], dim=-1) if complete else first


def _svd_tall(a: torch.Tensor, full_matrices: bool, compute_uv: bool):
    """SVD of ``a`` with ``m >= n``: ``(U, S descending, V)`` (``U``/``V`` None without ``compute_uv``)."""
    u, v = _one_sided_jacobi(a, compute_uv)
    s = torch.sqrt((u * u).sum(-2))
    s, order = torch.sort(s, dim=-1, descending=True)
    if not compute_uv:
        return None, s, None
    u = torch.gather(u, -1, order.unsqueeze(-2).expand(u.shape))
    v = torch.gather(v, -1, order.unsqueeze(-2).expand(v.shape))
    nonzero = s > 0
    u = torch.where(nonzero.unsqueeze(-2), u / torch.where(nonzero, s, 1).unsqueeze(-2), 0)
    return _orthonormal_columns(u, full_matrices), s, v


def _linalg_svd(a: torch.Tensor, full_matrices: bool = False, compute_uv: bool = True,
                driver: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten._linalg_svd``: ``(U, S, Vh)``; empty ``U`` and ``Vh`` without ``compute_uv``."""
    m, n = a.shape[-2], a.shape[-1]
    wide = m < n
    u, s, v = _svd_tall(a.mT if wide else a, full_matrices, compute_uv)
    if not compute_uv:
        empty = a.new_zeros([0])
        return empty, s, empty
    if wide:  # A^T = U' S V'^T, so A = V' S U'^T
        u, v = v, u
    return u, s, v.mT


def linalg_pinv(a: torch.Tensor, *, atol: torch.Tensor | None = None, rtol: torch.Tensor | None = None,
                hermitian: bool = False) -> torch.Tensor:
    """``aten.linalg_pinv.atol_rtol_tensor``, as eager computes it (SVD, or ``eigh`` when ``hermitian``).

    Singular values (``|eigenvalues|``) at or below ``max(atol, rtol * largest)`` are
    dropped; ``rtol`` defaults to ``eps * max(m, n)``, or to zero when only a positive
    ``atol`` is given.
    """
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    default_rtol = torch.full((), torch.finfo(a.dtype).eps * max(a.shape[-2], a.shape[-1]),
                              dtype=a.dtype, device=a.device)
    if rtol is None:
        rtol = default_rtol if atol is None else torch.where(atol > 0, zero, default_rtol)
    atol = zero if atol is None else atol
    if hermitian:
        values, vectors = _linalg_eigh(a)
        size = values.abs()
        largest = size.amax(-1, keepdim=True)
    else:
        u, values, vh = _linalg_svd(a, full_matrices=False)
        size, largest = values, values[..., :1]
    tolerance = torch.maximum(atol.unsqueeze(-1), rtol.unsqueeze(-1) * largest)
    kept = size > tolerance
    inverse = torch.where(kept, 1 / torch.where(kept, values, 1), zero)
    if hermitian:
        return torch.matmul(vectors * inverse.unsqueeze(-2), vectors.mT)
    return torch.matmul(vh.mT * inverse.unsqueeze(-2), u.mT)


DECOMPOSITIONS: dict = {op: real_only(fn) for op, fn in {
    aten.linalg_qr.default: linalg_qr,
    aten._linalg_eigh.default: _linalg_eigh,
    aten._linalg_svd.default: _linalg_svd,
    aten.linalg_pinv.atol_rtol_tensor: linalg_pinv,
    aten.linalg_householder_product.default: linalg_householder_product,
    aten.geqrf.default: geqrf,
    aten.ormqr.default: ormqr,
}.items()}
