"""Cumulative reductions as prefix scans: ``logcumsumexp``.

torch-mlir decomposes ``aten.logcumsumexp`` into ``log(cumsum(exp(x)))``, which overflows to
inf once an element passes 88.7 in float32 (710 in float64) and underflows to -inf where all
elements so far are below -103 (-745): torch's ``[10000.0, 1.0]`` gives ``[10000.0, 10000.0]``,
that lowering ``[inf, inf]``. Here it is a doubling (Hillis-Steele) scan of the stable
``logaddexp`` (log2(n) static steps, :func:`general._scan <.general._scan>`), which never
forms ``exp`` of anything above 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.general import _scan

aten = torch.ops.aten

#: Dtypes computed in float32 (eager's CPU kernel accumulates them in float32 too).
_NARROW = (torch.float16, torch.bfloat16)


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
    values = x.float() if x.dtype in _NARROW else x
    result = _scan((values,), dim % x.dim(), lambda a, b: (log_add_exp(a[0], b[0]),))[0]
    return result.to(x.dtype)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.logcumsumexp.default: logcumsumexp,
    aten._logcumsumexp.default: logcumsumexp,
}
