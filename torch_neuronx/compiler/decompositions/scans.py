"""Cumulative ops as prefix scans: ``cumprod``, ``cummax``, ``cummin`` (NaN and ties as
torch's), ``logcumsumexp``; :func:`scan`, the doubling scan they and segmented reductions use.

torch-mlir decomposes ``aten.logcumsumexp`` into ``log(cumsum(exp(x)))``, which overflows to
inf once an element passes 88.7 in float32 (710 in float64) and underflows to -inf where all
elements so far are below -103 (-745): torch's ``[10000.0, 1.0]`` gives ``[10000.0, 10000.0]``,
that lowering ``[inf, inf]``. Here it is a doubling (Hillis-Steele) scan of the stable
``logaddexp`` (log2(n) static steps, :func:`scan`), which never
forms ``exp`` of anything above 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.general import calls_itself
from torch_neuronx.compiler.decompositions.precision import NARROW

aten = torch.ops.aten

def scan(xs: tuple[torch.Tensor, ...], dim: int, combine: Callable) -> tuple[torch.Tensor, ...]:
    """Inclusive prefix scan of ``xs`` along ``dim`` by doubling (Hillis-Steele): log2(n) static steps.

    ``combine(earlier, later)`` merges the results (tuples like ``xs``) over an earlier range
    with those over the range right after it; each step merges every position with the one
    ``shift`` before it.
    """
    n, shift = xs[0].shape[dim], 1
    while shift < n:
        merged = combine(tuple(x.narrow(dim, 0, n - shift) for x in xs),
                         tuple(x.narrow(dim, shift, n - shift) for x in xs))
        xs = tuple(torch.cat([x.narrow(dim, 0, shift), m], dim) for x, m in zip(xs, merged))
        shift *= 2
    return xs


def cumprod(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.cumprod`` (torch-mlir lowers it to nothing) as a doubling scan of products."""
    if dtype is None and not (x.is_floating_point() or x.is_complex()):
        dtype = torch.int64  # as torch: integer and bool inputs accumulate in int64
    x = x if dtype is None else x.to(dtype)
    if x.dim() == 0:
        return x.clone()
    return scan((x,), dim % x.dim(), lambda a, b: (a[0] * b[0],))[0]


def cumsum_scalar(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.cumsum`` of a 0-d tensor: its value (a complex one, split into its real pair, summed
    its real part into its imaginary part along the pair's dimension)."""
    if x.dim():
        return NotImplemented
    if dtype is None and not (x.is_floating_point() or x.is_complex()):
        dtype = torch.int64
    return (x if dtype is None else x.to(dtype)).clone()


@calls_itself
def cumsum(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.cumsum``: of a 0-d tensor, :func:`cumsum_scalar`; a float32 one along more than
    :data:`_LONG_SCAN` elements, in float64 and rounded once, as torch's CPU kernel accumulates
    (float32 running sums drifted: 100000 times 0.1 came to 9998.56, torch 10000.0)."""
    if not x.dim():
        return cumsum_scalar(x, dim, dtype)
    out = x.dtype if dtype is None else dtype
    if out in NARROW and x.dtype in (out, *NARROW):  # torch accumulates these in float32, rounded once
        return aten.cumsum.default(x.to(torch.float32), dim).to(out)
    if dtype in (torch.int8, torch.uint8, torch.int16) and x.dtype != torch.bool:
        # (torch-mlir's lowering of an 8-bit cumsum crashed: SIGSEGV) the sum in int32 wraps to
        # the same narrow values as torch's in the narrow type
        return aten.cumsum.default(x.to(torch.int32), dim).to(out)
    length = x.shape[dim]  # a symbolic length (a dynamic kernel) is not compared: no guard, float64
    if out == torch.float32 and x.dtype in (torch.float32, *NARROW) and (not isinstance(length, int)
                                                                          or length > _LONG_SCAN):
        return aten.cumsum.default(x.to(torch.float64), dim).to(torch.float32)
    return NotImplemented


#: Scans longer than this accumulate float32 in float64 (shorter ones lose under an ulp or two).
_LONG_SCAN = 64


def _cumulative_extreme(x: torch.Tensor, dim: int, later_wins: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    dim = dim % x.dim()
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    index = torch.arange(x.shape[dim], device=x.device).view(shape).expand(x.shape)

    def combine(earlier: tuple, later: tuple) -> tuple:
        take = later_wins(earlier[0], later[0])
        return torch.where(take, later[0], earlier[0]), torch.where(take, later[1], earlier[1])

    return scan((x, index), dim, combine)


def _nan_aware(better: Callable) -> Callable:
    # The later element wins when it is NaN, or when neither is NaN and it is at least as good:
    # ties and NaNs move the index forward, as torch's kernels do.
    def later_wins(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
        if not later.is_floating_point():
            return better(later, earlier)
        return later.isnan() | (earlier.isnan().logical_not() & better(later, earlier))

    return later_wins


def cummax(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.cummax``: running maximum and the index of its latest occurrence."""
    return _cumulative_extreme(x, dim, _nan_aware(torch.ge))


def cummin(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.cummin``: running minimum and the index of its latest occurrence."""
    return _cumulative_extreme(x, dim, _nan_aware(torch.le))


#: Dtypes computed in float32 (eager's CPU kernel accumulates them in float32 too).


def log_add_exp(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """``log(exp(earlier) + exp(later))`` as torch's logcumsumexp kernel combines two values:
    ``max + log1p(exp(min - max))``; NaN if either is NaN, and where both are the same infinity,
    that infinity (``inf - inf`` would make NaN of it)."""
    high, low = torch.maximum(earlier, later), torch.minimum(earlier, later)  # both propagate NaN
    combined = high + torch.log1p(torch.exp(low - high))
    return torch.where((low == high) & high.isinf(), high, combined)


def logcumsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``aten.logcumsumexp``: a doubling scan of :func:`log_add_exp` along ``dim`` (float16 and
    bfloat16 in float32); ``NotImplemented`` for complex and integer tensors, which stay as
    they are (eager rejects integers)."""
    if not x.is_floating_point():
        return NotImplemented
    if x.dim() == 0:
        return x.clone()
    values = x.float() if x.dtype in NARROW else x
    result = scan((values,), dim % x.dim(), lambda a, b: (log_add_exp(a[0], b[0]),))[0]
    return result.to(x.dtype)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.cumprod.default: cumprod,
    aten.cumsum.default: cumsum,
    aten.cummax.default: cummax,
    aten.cummin.default: cummin,
    aten.logcumsumexp.default: logcumsumexp,
    aten._logcumsumexp.default: logcumsumexp,
}
