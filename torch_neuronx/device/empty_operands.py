"""``cat`` without its empty operands.

A call with an empty tensor keeps one kernel per shape (an empty dimension cannot be a dynamic
one), and transformers' ``DynamicCache`` concatenates an empty cache onto each step's keys and
values (``torch.cat([empty(b, h, 0, d), k], -2)``): every new sequence length compiled one more
``cat``. Its empty operands add nothing to the result, so the eager device drops them, after
torch's own checks and result metadata are taken from the whole call on meta tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["CAT", "as_torch_gives", "trimmed_cat"]

CAT = torch.ops.aten.cat.default


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def trimmed_cat(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple, torch.Tensor] | None:
    """``(args, meta)``: a ``cat`` call's arguments without its empty operands, and torch's result of
    the whole call on meta tensors (its checks raise here); None to run the call as it is (no empty
    operand, all empty, or operands that are not all neuron tensors)."""
    tensors = args[0]
    if not any(t.numel() == 0 for t in tensors) or all(t.numel() == 0 for t in tensors) \
            or not all(type(t) is NeuronTensor for t in tensors):
        return None
    meta = CAT([_meta(t) for t in tensors], *args[1:], **kwargs)
    kept = [t for t in tensors if t.numel()]
    return (kept, *args[1:]), meta


def as_torch_gives(result: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """``result`` with the dtype and strides of torch's result (``meta``): an empty operand of a wider
    dtype still promotes the result."""
    if result.dtype == meta.dtype and result.stride() == meta.stride():
        return result
    out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=result.device)
    return out.copy_(result)
