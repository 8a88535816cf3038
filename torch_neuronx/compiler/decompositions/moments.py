"""``var``, ``std`` and their ``_mean`` forms with any ``correction`` (torch-mlir's lowering
takes only the unbiased flag), and ``any``/``all`` as counts of nonzero (zero) elements.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten


def _truth(x: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """A boolean reduction's result in torch's dtype: uint8 for a uint8 input, else bool."""
    return result.to(torch.uint8) if x.dtype == torch.uint8 else result


def any_dims(x, dim=None, keepdim=False):
    """``aten.any.dims`` (which torch-mlir does not lower) as a count of the nonzero elements
    (counting the values themselves missed 0.5, NaN, and a -1 next to a 1)."""
    dims = list(dim) if dim is not None else None
    if dims == []:  # no dims: each element by itself (a sum over [] is over every dim)
        return _truth(x, x != 0)
    return _truth(x, aten.sum.dim_IntList((x != 0).to(torch.int32), dims, keepdim) > 0)


def any_dim(x, dim, keepdim=False):
    """``aten.any.dim`` (see :func:`any_dims`): torch-mlir ORs a uint8 tensor's values (5 for 5)."""
    return any_dims(x, [dim], keepdim)


def any_all(x):
    """``aten.any`` of a whole tensor (see :func:`any_dim`)."""
    return any_dims(x, list(range(x.dim())))


def _all_dims(x, dims: list[int], keepdim: bool) -> torch.Tensor:
    return _truth(x, aten.sum.dim_IntList((x == 0).to(torch.int32), dims, keepdim) == 0)


def all_dims(x, dim=None, keepdim=False):
    """``aten.all.dims``, as a count of the zero elements (see :func:`any_dims`)."""
    if dim is not None and len(dim) == 0:  # no dims: each element by itself
        return _truth(x, x != 0)
    return _all_dims(x, list(dim) if dim is not None else list(range(x.dim())), keepdim)


def _variance(x: torch.Tensor, dim, correction, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Variance and mean over ``dim`` with torch's divisor ``max(n - correction, 0)``, or None
    for what torch-mlir's own lowering handles (non-float or complex tensors)."""
    if not x.is_floating_point():
        return None
    dims = list(range(x.dim())) if dim is None or (isinstance(dim, list | tuple) and not dim) else \
        [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]
    count = 1
    for d in dims:
        count *= x.shape[d] if x.dim() else 1
    mean = x.mean(dims, keepdim=True) if x.dim() else x
    squares = (x - mean).square().sum(dims, keepdim=keepdim) if x.dim() else (x - mean).square()
    divisor = max(count - (1 if correction is None else correction), 0)
    variance = squares / float(divisor)  # 0 gives inf (or NaN), as torch
    return variance, (mean if keepdim or not x.dim() else mean.squeeze(dims))


def var_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False) -> torch.Tensor:
    """``aten.var.correction``: torch-mlir divided by n - correction even below zero (a negative
    variance where torch gives inf)."""
    result = _variance(x, dim, correction, keepdim)
    return NotImplemented if result is None else result[0]


def var_mean_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False):
    """``aten.var_mean.correction`` (see :func:`var_correction`)."""
    return NotImplemented if (result := _variance(x, dim, correction, keepdim)) is None else result


def std_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False) -> torch.Tensor:
    """``aten.std.correction`` (see :func:`var_correction`)."""
    result = _variance(x, dim, correction, keepdim)
    return NotImplemented if result is None else result[0].sqrt()


def std_mean_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False):
    """``aten.std_mean.correction`` (see :func:`var_correction`)."""
    result = _variance(x, dim, correction, keepdim)
    return NotImplemented if result is None else (result[0].sqrt(), result[1])


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.any.dims: any_dims,
    aten.any.dim: any_dim,
    aten.any.default: any_all,
    aten.all.dims: all_dims,
    aten.var.correction: var_correction,
    aten.var_mean.correction: var_mean_correction,
    aten.std.correction: std_correction,
    aten.std_mean.correction: std_mean_correction,
}
