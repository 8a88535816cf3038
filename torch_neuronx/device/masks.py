"""Boolean-mask indices of ``index_put`` (``x[mask] = values``) as integer indices.

torch-mlir cannot lower a boolean index, so ``x[mask] = values`` (one value per selected
element) fell back to the CPU with a warning. CUDA's kernel expands each boolean (or uint8)
index into the integer indices of its true elements first (``nonzero``, a synchronization:
their number is data), which is what :func:`expanded` does here; the integer form then runs on
its compiled kernel. A ``k``-d mask becomes ``k`` index tensors, in place of the mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["INDEX_PUTS", "expanded", "has_mask"]

aten = torch.ops.aten
INDEX_PUTS = frozenset((aten.index_put.default, aten._unsafe_index_put.default))


def has_mask(args: Sequence[Any]) -> bool:
    """Whether the indices (``args[1]``) hold a boolean or uint8 index of one or more dimensions."""
    return len(args) > 1 and any(_is_mask(i) for i in args[1])


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) and index.dim() > 0


def expanded(args: Sequence[Any]) -> tuple[Any, ...]:
    """``args`` with each mask index replaced by the integer indices of its true elements."""
    indices: list[Any] = []
    for index in args[1]:
        if _is_mask(index):
            indices.extend(torch.nonzero(index).unbind(1))
        else:
            indices.append(index)
    return (args[0], indices, *args[2:])
