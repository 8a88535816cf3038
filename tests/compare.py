"""Helpers the tests share: running a function eagerly and compiled on the same inputs, forward
and backward, and finding the graph the last compile produced."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch


def forward_backward(fn: Callable, inputs: Sequence[torch.Tensor], generator: torch.Generator):
    """``(expected, got, eager_grads, compiled_grads)``: ``fn``'s outputs (a list of tensors) eagerly
    and through ``torch.compile(backend="neuron")``, and the inputs' gradients of one random
    weighting of the outputs (the same weights for both)."""
    eager_in = [t.clone().requires_grad_() for t in inputs]
    compiled_in = [t.clone().requires_grad_() for t in inputs]
    expected, got = list(fn(*eager_in)), list(torch.compile(fn, backend="neuron")(*compiled_in))
    weighted_backward(expected, got, range(len(expected)), generator)
    return expected, got, [t.grad for t in eager_in], [t.grad for t in compiled_in]


def weighted_backward(expected: Any, got: Any, keys: Iterable, generator: torch.Generator,
                      dtype: torch.dtype | None = None) -> None:
    """Backpropagate ``sum(output * w)`` over ``keys`` of both output collections (dicts or lists),
    one random ``w`` per key, drawn in the order of ``keys`` and shared by both."""
    weights = {k: torch.randn(expected[k].shape, generator=generator, dtype=dtype) for k in keys}
    for outputs in (expected, got):
        sum((outputs[k] * w).sum() for k, w in weights.items()).backward()


def compiled_graphs() -> list[Any]:
    """Every live ``CompiledGraph``, as the garbage collector lists them (oldest first in practice)."""
    import gc

    from torch_neuronx.pipeline.graph import CompiledGraph

    return [o for o in gc.get_objects() if type(o) is CompiledGraph]


def last_compiled_graph() -> Any:
    """The ``CompiledGraph`` of the last neuron compile that has run (with its executable loaded)."""
    return [g for g in compiled_graphs() if g._executable is not None][-1]
