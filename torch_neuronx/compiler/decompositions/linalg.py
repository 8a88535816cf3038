"""Linear-algebra factorizations and solvers (LU, Cholesky, triangular solves) as matmuls and selects.

torch-mlir lowers none of ``aten.linalg_lu_factor_ex``, ``aten.linalg_lu_solve``,
``aten.lu_unpack``, ``aten.linalg_lu``, ``aten.linalg_solve_triangular``,
``aten.triangular_solve``, ``aten.linalg_cholesky_ex``, ``aten.cholesky``,
``aten.cholesky_solve``, ``aten.cholesky_inverse``, ``aten.linalg_inv_ex``,
``aten._linalg_solve_ex``, ``aten._linalg_det`` and ``aten._linalg_slogdet``:
the ops behind ``torch.linalg.inv``/``solve``/``det``/``slogdet``/``cholesky``/
``solve_triangular``/``lu_factor``/``lu_solve``/``lu``, ``torch.logdet``,
``torch.cholesky_solve`` and ``torch.cholesky_inverse``, and the ops their
autograd formulas call (the backward of ``inv`` is matmuls; those of ``solve``,
``det`` and ``slogdet`` call ``linalg_lu_solve``; those of ``cholesky`` and
``lu_factor`` call ``linalg_solve_triangular`` and ``lu_unpack``). Each is
written here in slices, ``cat``, ``matmul``, arithmetic, ``argmax``, ``gather``
and ``where``. Shapes are static at trace time, so the algorithms are unrolled
over the matrix size:

- LU: right-looking Gaussian elimination with partial pivoting, one step per
  column, as LAPACK's ``getrf`` pivots (the first row of largest ``|value|`` in
  the column); the packed ``LU`` matrix and 1-based ``int32`` pivots as torch
  returns them (rectangular inputs too). A zero pivot leaves its column
  unscaled, as LAPACK does, so a singular matrix's determinant is exactly 0.
- Triangular solves and Cholesky: recursive halving (``X1`` from the leading
  block, then the trailing block against ``B2 - A21 X1``), ``n - 1`` matmul
  steps and no work on the unused triangle, which is never read.
- ``inv``, ``solve``, ``det``, ``slogdet``, ``cholesky_solve`` and
  ``cholesky_inverse`` on those.

Leading batch dimensions broadcast as in eager. Real dtypes only (with a complex
input the op is left as it is).

Errors are eager's. The ``info`` outputs are LAPACK's: for an LU the first exactly
zero diagonal entry of ``U`` (1-based, 0 if none), for a Cholesky factorization the
order of the first leading minor that is not positive-definite. Where eager checks
them (``torch.linalg.inv``, ``solve``, ``cholesky``, ``lu_factor``, the ``_ex``
variants with ``check_errors=True``, ``torch.cholesky``, ``torch.cholesky_inverse``),
the graph calls :data:`CHECK` with the ``info`` tensor; the compile path turns each
such call into an extra output that is checked on the host after the call
(``passes/host_checks.py``), with torch's own ``_linalg_check_errors``: the same
exception and message as eager. Tracing must happen inside
:func:`checks_as_plain_ops` (see there).

Graph size grows linearly with ``n`` (an LU is about 15 ops per column), so
does compile time: measured for ``inv`` forward and backward of a float32
``n x n`` matrix, about 2 s at n = 8, 4 s at n = 32, 13 s at n = 64 and 50 s at
n = 128; past a few hundred, compiles take minutes. Accuracy against eager
(LAPACK) on well-conditioned matrices: about 1e-6 relative in float32, 1e-14
in float64.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch

aten = torch.ops.aten


@torch.library.custom_op("neuron::linalg_check_errors", mutates_args=())
def _check_errors(info: torch.Tensor, api_name: str, is_matrix: bool) -> None:
    """Raise eager's error for a nonzero ``info`` (what this op stands for in a traced graph)."""
    torch._linalg_check_errors(info, api_name, is_matrix=is_matrix)


@_check_errors.register_fake
def _(info: torch.Tensor, api_name: str, is_matrix: bool) -> None:
    return None


#: The op a traced graph keeps where eager checks an ``info`` tensor. It returns nothing,
#: so it is marked side-effecting for dead-code elimination (not for functionalization,
#: which would thread effect tokens through it that torch-mlir cannot import).
CHECK = torch.ops.neuron.linalg_check_errors.default
torch.fx.node.has_side_effect(CHECK)


@contextlib.contextmanager
def checks_as_plain_ops() -> Iterator[None]:
    """Trace ``aten._linalg_check_errors`` as a plain op while the block runs.

    torch 2.13 registers it as an ordered side effect, so functionalization wraps it in
    ``with_effects`` before any decomposition table sees it, and aot_autograd threads
    effect tokens through the graph. Unmarked, it reaches the table, which rewrites it
    to :data:`CHECK`. The registration is process-wide, so it is restored on exit;
    Dynamo compiles under one global lock, so no other backend traces meanwhile.
    """
    try:
        holder = torch._library.simple_registry.singleton.find("aten::_linalg_check_errors").effect
    except AttributeError:  # a torch without effect registrations
        yield
        return
    previous = holder.effect
    holder.register(None)
    try:
        yield
    finally:
        holder.register(previous)


def _batch_broadcast(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand the leading (batch) dimensions of two matrix stacks to their common shape."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])


def _solve_lower(a: torch.Tensor, b: torch.Tensor, unit: bool) -> torch.Tensor:
    """``X`` with ``tril(a) X = b`` (batches already broadcast); reads only ``a``'s lower triangle."""
    n = a.shape[-1]
    if n == 1:
        return b if unit else b / a[..., :1, :1]
    h = n // 2
    x1 = _solve_lower(a[..., :h, :h], b[..., :h, :], unit)
    x2 = _solve_lower(a[..., h:, h:], b[..., h:, :] - torch.matmul(a[..., h:, :h], x1), unit)
    return torch.cat([x1, x2], dim=-2)


def _solve_upper(a: torch.Tensor, b: torch.Tensor, unit: bool) -> torch.Tensor:
    """``X`` with ``triu(a) X = b`` (batches already broadcast); reads only ``a``'s upper triangle."""
    n = a.shape[-1]
    if n == 1:
        return b if unit else b / a[..., :1, :1]
    h = n // 2
    x2 = _solve_upper(a[..., h:, h:], b[..., h:, :], unit)
    x1 = _solve_upper(a[..., :h, :h], b[..., :h, :] - torch.matmul(a[..., :h, h:], x2), unit)
    return torch.cat([x1, x2], dim=-2)


def _solve_triangular(a: torch.Tensor, b: torch.Tensor, upper: bool, left: bool, unit: bool) -> torch.Tensor:
    """``torch.linalg.solve_triangular``: ``A X = B`` (``left``) or ``X A = B``, batches broadcast."""
    a, b = _batch_broadcast(a, b)
    if not left:  # X A = B  <=>  A^T X^T = B^T, and A^T has the other triangle
        return _solve_triangular(a.mT, b.mT, not upper, True, unit).mT
    return _solve_upper(a, b, unit) if upper else _solve_lower(a, b, unit)


def _lu(a: torch.Tensor, pivot: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed LU factors and 1-based ``int32`` pivots of ``a`` (``..., m, n``), as ``getrf`` returns them."""
    m, n = a.shape[-2], a.shape[-1]
    batch = a.shape[:-2]
    k_count = min(m, n)
    # Index arithmetic in int32: IREE fails to compile int64 constants broadcast to the batch.
    rows = torch.arange(m, device=a.device, dtype=torch.int32).unsqueeze(-1)  # (m, 1)
    pivots = []
    lu = a
    for k in range(k_count):
        if pivot:
            p = torch.argmax(lu[..., k:, k].abs(), dim=-1, keepdim=True) + k  # (..., 1): first largest
            pivots.append(p)
            row_p = torch.gather(lu, -2, p.unsqueeze(-1).expand(*batch, 1, n))
            row_k = lu[..., k:k + 1, :]
            lu = torch.where(rows == k, row_p, torch.where(rows == p.to(torch.int32).unsqueeze(-1), row_k, lu))
        if k + 1 < m:
            column = lu[..., k + 1:, k:k + 1]
            pivot_value = lu[..., k:k + 1, k:k + 1]
            # LAPACK leaves the column unscaled when the pivot is exactly zero.
            lower = torch.where(pivot_value == 0, column, column / pivot_value)
            trailing = lu[..., k + 1:, k + 1:] - lower * lu[..., k:k + 1, k + 1:]
            bottom = torch.cat([lu[..., k + 1:, :k], lower, trailing], dim=-1)
            lu = torch.cat([lu[..., :k + 1, :], bottom], dim=-2)
    if pivot and k_count:
        pivots_tensor = (torch.cat(pivots, dim=-1) + 1).to(torch.int32)
    else:
        pivots_tensor = (torch.arange(k_count, device=a.device, dtype=torch.int32) + 1).expand(*batch, k_count)
    return lu, pivots_tensor


def _permutation(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """``perm`` (``int64``, ``..., m``) with ``P^T A = A[perm]``: the pivots' row swaps applied in order."""
    batch = pivots.shape[:-1]
    # int32 throughout: IREE fails to compile an int64 constant broadcast to the batch.
    positions = torch.arange(m, device=pivots.device, dtype=torch.int32)
    perm = positions.expand(*batch, m)
    swaps = pivots - 1
    for k in range(pivots.shape[-1]):
        p = swaps[..., k:k + 1]
        at_p = torch.gather(perm, -1, p.to(torch.int64))
        at_k = perm[..., k:k + 1]
        perm = torch.where(positions == k, at_p, torch.where(positions == p, at_k, perm))
    return perm.to(torch.int64)


def _gather_rows(b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``b[..., index, :]`` per batch (``index`` is ``..., m``)."""
    return torch.gather(b, -2, index.unsqueeze(-1).expand(*b.shape))


def _lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, left: bool = True,
              adjoint: bool = False) -> torch.Tensor:
    """``torch.linalg.lu_solve`` for real inputs."""
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return _lu_solve(lu, pivots, b.mT, True, not adjoint).mT
    n = lu.shape[-1]
    batch = torch.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    lu = lu.expand(*batch, n, n)
    b = b.expand(*batch, *b.shape[-2:])
    perm = _permutation(pivots, n).expand(*batch, n)
    if not adjoint:  # A = P L U:  X = U^-1 L^-1 P^T B
        y = _solve_lower(lu, _gather_rows(b, perm), unit=True)
        return _solve_upper(lu, y, unit=False)
    # A^T = U^T L^T P^T:  X = P L^-T U^-T B, and (P Z)[perm[i]] = Z[i].
    z = _solve_upper(lu.mT, _solve_lower(lu.mT, b, unit=False), unit=True)
    positions = torch.arange(n, device=lu.device, dtype=torch.int32)
    inverse = ((perm.to(torch.int32).unsqueeze(-1) == positions).to(torch.int32) * positions.unsqueeze(-1)).sum(-2)
    return _gather_rows(z, inverse.to(torch.int64))


def _first_index(mask: torch.Tensor) -> torch.Tensor:
    """The 1-based position of the first true entry along the last dimension, 0 if none (``int32``)."""
    k = mask.shape[-1]
    positions = torch.arange(1, k + 1, dtype=torch.int32, device=mask.device)
    first = torch.where(mask, positions, k + 1).amin(-1)
    return torch.where(first > k, 0, first).to(torch.int32)


def _zero_diagonal_info(lu: torch.Tensor) -> torch.Tensor:
    """``getrf``'s ``info`` (and ``potri``'s): the first exactly zero diagonal entry of a triangular factor."""
    return _first_index(lu.diagonal(0, -2, -1) == 0)


def _cholesky_info(factor: torch.Tensor) -> torch.Tensor:
    """``potrf``'s ``info``: the first leading minor that is not positive-definite.

    Its factor's diagonal entry is ``sqrt`` of a non-positive number (zero or ``nan``),
    and every earlier one depends on earlier minors only.
    """
    return _first_index(~(factor.diagonal(0, -2, -1) > 0))


def _check(info: torch.Tensor, api_name: str, a: torch.Tensor) -> None:
    """Check ``info`` as eager's ``api_name`` does (on the host, after the compiled call)."""
    CHECK(info, api_name, a.dim() == 2)


def _eye_like(a: torch.Tensor) -> torch.Tensor:
    n = a.shape[-1]
    return torch.eye(n, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], n, n)


def _permutation_sign(pivots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``det(P)``: -1 for an odd number of actual row swaps, else 1."""
    positions = torch.arange(1, pivots.shape[-1] + 1, device=pivots.device, dtype=torch.int32)
    odd = ((pivots != positions).to(torch.int32).sum(-1) % 2) == 1
    one = torch.ones((), dtype=dtype, device=pivots.device)
    return torch.where(odd, -one, one)


def _cholesky_lower(a: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor from ``a``'s lower triangle, by recursive halving."""
    n = a.shape[-1]
    if n == 1:
        return torch.sqrt(a)
    h = n // 2
    l11 = _cholesky_lower(a[..., :h, :h])
    l21 = _solve_lower(l11, a[..., h:, :h].mT, unit=False).mT  # A21 L11^-T
    l22 = _cholesky_lower(a[..., h:, h:] - torch.matmul(l21, l21.mT))
    zeros = torch.zeros((*a.shape[:-2], h, n - h), dtype=a.dtype, device=a.device)
    return torch.cat([torch.cat([l11, zeros], dim=-1), torch.cat([l21, l22], dim=-1)], dim=-2)


def _cholesky(a: torch.Tensor, upper: bool) -> torch.Tensor:
    """``torch.linalg.cholesky``: the upper factor comes from the upper triangle, as in eager."""
    return _cholesky_lower(a.mT).mT if upper else _cholesky_lower(a)


def _cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """``torch.cholesky_solve``: ``A X = B`` with ``A = L L^T`` (or ``U^T U``)."""
    factor, b = _batch_broadcast(factor, b)
    lower = factor.mT if upper else factor
    return _solve_upper(lower.mT, _solve_lower(lower, b, unit=False), unit=False)


def _is_vector_rhs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``linalg.solve`` reads ``b`` as a (batch of) vector(s), as eager decides."""
    return b.dim() == 1 or (a.dim() - 1 == b.dim() and tuple(b.shape) == tuple(a.shape[:-1]))


def linalg_lu_factor_ex(a: torch.Tensor, pivot: bool = True, check_errors: bool = False):
    """``aten.linalg_lu_factor_ex``: ``(LU, pivots, info)``."""
    lu, pivots = _lu(a, pivot)
    info = _zero_diagonal_info(lu)
    if check_errors:
        _check(info, "torch.linalg.lu_factor_ex", a)
    return lu, pivots, info


def linalg_lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, left: bool = True,
                    adjoint: bool = False) -> torch.Tensor:
    """``aten.linalg_lu_solve``."""
    return _lu_solve(lu, pivots, b, left, adjoint)


def lu_unpack(lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True):
    """``aten.lu_unpack``: ``(P, L, U)`` with ``A = P L U`` (empty tensors for what is not unpacked)."""
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    empty = lu.new_zeros([0])
    if unpack_pivots:
        positions = torch.arange(m, device=lu.device, dtype=torch.int32)
        perm = _permutation(pivots, m).to(torch.int32)
        p = (perm.unsqueeze(-1) == positions).to(lu.dtype).mT  # P[j, i] = (perm[i] == j)
        p = p.expand(*lu.shape[:-2], m, m)
    else:
        p = empty
    if not unpack_data:
        return p, empty, empty
    rows = torch.arange(m, device=lu.device, dtype=torch.int32).unsqueeze(-1)
    cols = torch.arange(k, device=lu.device, dtype=torch.int32)
    below = lu[..., :, :k]
    one = torch.ones((), dtype=lu.dtype, device=lu.device)
    lower = torch.where(rows > cols, below, torch.where(rows == cols, one, torch.zeros_like(one)))
    rows_u = torch.arange(k, device=lu.device, dtype=torch.int32).unsqueeze(-1)
    cols_u = torch.arange(n, device=lu.device, dtype=torch.int32)
    upper = torch.where(rows_u <= cols_u, lu[..., :k, :], torch.zeros_like(one))
    return p, lower, upper


def linalg_lu(a: torch.Tensor, pivot: bool = True):
    """``aten.linalg_lu``: ``(P, L, U)`` (``P`` empty without pivoting, as in eager)."""
    lu, pivots = _lu(a, pivot)
    return lu_unpack(lu, pivots, True, pivot)


def linalg_solve_triangular(a: torch.Tensor, b: torch.Tensor, upper: bool, left: bool = True,
                            unitriangular: bool = False) -> torch.Tensor:
    """``aten.linalg_solve_triangular``."""
    return _solve_triangular(a, b, upper, left, unitriangular)


def triangular_solve(b: torch.Tensor, a: torch.Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False):
    """``aten.triangular_solve`` (deprecated API): ``(solution, cloned_coefficient)``."""
    a, b = _batch_broadcast(a, b)
    coefficient = a.mT if transpose else a
    solution = _solve_triangular(coefficient, b, upper != transpose, True, unitriangular)
    return solution, a.clone()


def linalg_cholesky_ex(a: torch.Tensor, upper: bool = False, check_errors: bool = False):
    """``aten.linalg_cholesky_ex``: ``(L, info)``."""
    factor = _cholesky(a, upper)
    info = _cholesky_info(factor)
    if check_errors:
        _check(info, "linalg.cholesky_ex", a)
    return factor, info


def cholesky(a: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """``aten.cholesky`` (deprecated API), which checks like ``torch.linalg.cholesky``."""
    factor = _cholesky(a, upper)
    _check(_cholesky_info(factor), "cholesky", a)
    return factor


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """``aten.cholesky_solve``."""
    return _cholesky_solve(b, factor, upper)


def cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """``aten.cholesky_inverse``: ``(L L^T)^-1`` (or ``(U^T U)^-1``); a zero on the factor's diagonal raises."""
    _check(_zero_diagonal_info(factor), "cholesky_inverse", factor)
    return _cholesky_solve(_eye_like(factor), factor, upper)


def linalg_inv_ex(a: torch.Tensor, check_errors: bool = False):
    """``aten.linalg_inv_ex``: ``(inverse, info)``."""
    lu, pivots = _lu(a)
    info = _zero_diagonal_info(lu)
    if check_errors:
        _check(info, "linalg.inv_ex", a)
    return _lu_solve(lu, pivots, _eye_like(a)), info


def _linalg_solve_ex(a: torch.Tensor, b: torch.Tensor, left: bool = True, check_errors: bool = False):
    """``aten._linalg_solve_ex``: ``(result, LU, pivots, info)``."""
    lu, pivots = _lu(a)
    info = _zero_diagonal_info(lu)
    if check_errors:
        _check(info, "torch.linalg.solve_ex", a)
    if _is_vector_rhs(a, b):
        result = _lu_solve(lu, pivots, b.unsqueeze(-1), left).squeeze(-1)
    else:
        result = _lu_solve(lu, pivots, b, left)
    return result, lu, pivots, info


def _det_lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LU eager's det and slogdet return (their backwards solve with it): of ``A^T`` for a contiguous ``A``."""
    return _lu(a.mT if a.is_contiguous() else a)


def _linalg_det(a: torch.Tensor):
    """``aten._linalg_det``: ``(det, LU, pivots)``."""
    lu, pivots = _det_lu(a)
    det = torch.prod(lu.diagonal(0, -2, -1), dim=-1) * _permutation_sign(pivots, a.dtype)
    return det, lu, pivots


def _linalg_slogdet(a: torch.Tensor):
    """``aten._linalg_slogdet``: ``(sign, logabsdet, LU, pivots)``; a singular matrix gives ``(0, -inf)``."""
    lu, pivots = _det_lu(a)
    diagonal = lu.diagonal(0, -2, -1)
    sign = torch.prod(torch.sign(diagonal), dim=-1) * _permutation_sign(pivots, a.dtype)
    return sign, torch.log(diagonal.abs()).sum(-1), lu, pivots


#: Taylor terms of the matrix exponential after scaling.
_EXP_TERMS = 18
#: 1-norms the degree-18 Taylor polynomial takes unscaled, by dtype: its truncation error,
#: ``theta**19 / 19!``, stays below half the unit roundoff (float32 1e-8, float64 4e-17). Eager's
#: bounds for its degree 18 (Bader, Blanes and Casas 2019), so both square as often.
_EXP_THETA = {torch.float64: 1.090863719290036, torch.float32: 3.010066362817634}
#: Squarings the scaled exponential can undo: 1-norms up to 2**40 theta.
_EXP_MAX_SQUARINGS = 40


def linalg_matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """``aten.linalg_matrix_exp``: scaling and squaring, a degree-18 Taylor polynomial (Horner).

    Each matrix is scaled by ``2**-s`` to a 1-norm of at most :data:`_EXP_THETA` (``s`` from its
    norm, at most 40), the polynomial evaluated, and the result squared ``s`` times: the
    squarings are unrolled to the maximum and each is kept only where the matrix needs it. Every
    squaring doubles the rounding error the result carries, so none is spent below theta (a
    1-norm of 1 in float32 took one more squaring than eager for norms past 3, and twice its
    error). Eager picks a lower degree for small norms; both are within rounding of the
    exponential.
    """
    n = a.shape[-1]
    if n == 1:
        return torch.exp(a)
    theta = _EXP_THETA.get(a.dtype, _EXP_THETA[torch.float32])
    norm = a.abs().sum(-2).amax(-1)
    squarings = torch.ceil(torch.log2(norm * (1.0 / theta))).clamp(0, _EXP_MAX_SQUARINGS)
    squarings = torch.where(norm > 0, squarings, 0)
    scaled = a / torch.exp2(squarings)[..., None, None]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    result = eye + scaled / _EXP_TERMS
    for k in range(_EXP_TERMS - 1, 0, -1):
        result = eye + torch.matmul(scaled, result) / k
    for i in range(_EXP_MAX_SQUARINGS):
        result = torch.where((squarings > i)[..., None, None], torch.matmul(result, result), result)
    return result


def _linalg_check_errors(info: torch.Tensor, api_name: str, is_matrix: bool) -> None:
    """``aten._linalg_check_errors`` (``inv``, ``solve``, ``cholesky`` and ``lu_factor`` call it): :data:`CHECK`."""
    CHECK(info, api_name, is_matrix)


def real_only(fn: Callable) -> Callable:
    """Decline (``NotImplemented``: the op stays as it is) when a tensor argument is complex, or
    has no elements (the degenerate_shapes pass computes such an op from its shapes)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        if any(t.is_complex() or t.numel() == 0 for t in tensors):
            return NotImplemented
        return fn(*args, **kwargs)

    return wrapper


DECOMPOSITIONS: dict = {op: real_only(fn) for op, fn in {
    aten.linalg_lu_factor_ex.default: linalg_lu_factor_ex,
    aten.linalg_lu_solve.default: linalg_lu_solve,
    aten.lu_unpack.default: lu_unpack,
    aten.linalg_lu.default: linalg_lu,
    aten.linalg_solve_triangular.default: linalg_solve_triangular,
    aten.triangular_solve.default: triangular_solve,
    aten.linalg_cholesky_ex.default: linalg_cholesky_ex,
    aten.cholesky.default: cholesky,
    aten.cholesky_solve.default: cholesky_solve,
    aten.cholesky_inverse.default: cholesky_inverse,
    aten.linalg_inv_ex.default: linalg_inv_ex,
    aten._linalg_solve_ex.default: _linalg_solve_ex,
    aten._linalg_det.default: _linalg_det,
    aten._linalg_slogdet.default: _linalg_slogdet,
    aten.linalg_matrix_exp.default: linalg_matrix_exp,
}.items()}
DECOMPOSITIONS[aten._linalg_check_errors.default] = _linalg_check_errors
