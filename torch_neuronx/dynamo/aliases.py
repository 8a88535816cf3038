"""Outputs of a compiled graph that are views of its inputs keep their conjugate and negative bits.

aot_autograd does not return such an output from the compiled graph: it rebuilds it from the
input at run time (``gen_alias_from_base``). For a neuron tensor it cannot replay the traced
views (they were recorded on the inner tensors), so it takes ``as_strided`` of the input, which
drops a view's math bits: ``torch.compile(lambda t: t.conj())`` returned ``t``. The traced
output's bits travel in its flatten metadata (``runtime/tensor.py``, ``_traced_bits`` on the
graph's output); the rebuilt view gets them here, through ``conj()`` / ``_neg_view`` so that
autograd sees them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch._aot_autograd import runtime_wrappers

from torch_neuronx.runtime.tensor import CONJ, NEG, NeuronTensor, math_bits

_original = runtime_wrappers.gen_alias_from_base


def _with_math_bits(aliased_base_tensor: torch.Tensor, target_meta_tensor: torch.Tensor, *args: Any,
                    **kwargs: Any) -> torch.Tensor:
    wanted = getattr(target_meta_tensor, "_traced_bits", None)
    if wanted is not None and isinstance(aliased_base_tensor, NeuronTensor):
        # the view is rebuilt over the base's memory (``view_as_real`` refuses a conjugate base),
        # then given the traced output's bits
        aliased_base_tensor = _toggled(aliased_base_tensor, math_bits(aliased_base_tensor))
    out = _original(aliased_base_tensor, target_meta_tensor, *args, **kwargs)
    if wanted is None or not isinstance(out, NeuronTensor):
        return out
    return _toggled(out, math_bits(out) ^ wanted)


def _toggled(t: torch.Tensor, bits: int) -> torch.Tensor:
    """``t`` with the math bits in ``bits`` flipped, as views autograd sees."""
    if bits & CONJ:
        t = t.conj()
    if bits & NEG:
        t = torch._neg_view(t)
    return t


def install() -> None:
    """Wrap aot_autograd's rebuilding of output views (idempotent)."""
    if runtime_wrappers.gen_alias_from_base is _original:
        runtime_wrappers.gen_alias_from_base = _with_math_bits
