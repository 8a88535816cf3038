"""Running a function eagerly and compiled on the same inputs, forward and backward."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def forward_backward(fn: Callable, inputs: Sequence[torch.Tensor], generator: torch.Generator):
    """``(expected, got, eager_grads, compiled_grads)``: ``fn``'s outputs (a list of tensors) eagerly
    and through ``torch.compile(backend="neuron")``, and the inputs' gradients of one random
    weighting of the outputs (the same weights for both)."""
    eager_in = [t.clone().requires_grad_() for t in inputs]
    compiled_in = [t.clone().requires_grad_() for t in inputs]
    expected, got = list(fn(*eager_in)), list(torch.compile(fn, backend="neuron")(*compiled_in))
    weights = [torch.randn(e.shape, generator=generator) for e in expected]
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    sum((c * w).sum() for c, w in zip(got, weights)).backward()
    return expected, got, [t.grad for t in eager_in], [t.grad for t in compiled_in]
