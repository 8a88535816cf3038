"""The ``*_copy`` forms of views, and other ops torch decomposes but its core table leaves whole.

``view_copy``, ``permute_copy``, ``unbind_copy``, ``as_strided_copy``, ``narrow_copy``
and ``new_empty_strided`` reached torch-mlir whole, which fails on them (``failed to
legalize operation 'torch.constant.int'``): torch's own decompositions (outside its core
ATen table) write each as a view plus a copy. ``fmax`` and ``fmin`` (torch-mlir mistyped
their broadcast compare for a 0-d operand; torch's decomposition is a prim) are a
``where`` of ``maximum``/``minimum`` and ``isnan`` here.
"""

from __future__ import annotations

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten


def _ignoring_nan(extreme: object) -> object:
    """``fmax``/``fmin``: ``extreme`` of the two, or the one that is not NaN."""

    def decomposition(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype = torch.result_type(a, b)
        a, b = torch.broadcast_tensors(a.to(dtype), b.to(dtype))
        if not dtype.is_floating_point:
            return extreme(a, b)
        return torch.where(a.isnan(), b, torch.where(b.isnan(), a, extreme(a, b)))

    return decomposition


DECOMPOSITIONS = {
    aten.fmax.default: _ignoring_nan(torch.maximum),
    aten.fmin.default: _ignoring_nan(torch.minimum),
}
DECOMPOSITIONS |= get_decompositions([
    aten.view_copy.default,
    aten.permute_copy.default,
    aten.unbind_copy.int,
    aten.as_strided_copy.default,
    aten.narrow_copy.default,
    aten.new_empty_strided.default,
])
