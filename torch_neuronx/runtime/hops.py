"""Higher-order operators on neuron tensors: ``torch.cond``, and ``auto_functionalized``.

PyTorch dispatches a higher-order operator on a tensor subclass to a rule registered for
that subclass (``cond_op.py_impl(NeuronTensor)``), after any active mode's rule. Two cases:

* device memory (eager, or the ``eager`` backend that ``torch.cond`` compiles itself with):
  the predicate is read on the host and the taken branch runs on the neuron tensors, as
  torch's own eager rule does for host tensors;
* traced values (inside torch.compile): the operator runs on the inner tensors, each branch
  wrapped so that the user's function sees neuron tensors, and its results come back wrapped.
  The fake-tensor rule of torch 2.13 asserts that branch results are plain fake tensors, so
  it is given the subclass's turn first (:func:`install` wraps it to decline neuron tensors).

``auto_functionalized`` (a mutating custom op of a compiled graph that has a neuron kernel, which
``dynamo/collectives.py`` runs on neuron tensors) takes its eager implementation: clone the
written inputs, call the op. Without a rule it raised "There was no rule registered for HOP ...
and subclass NeuronTensor".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.runtime.tensor import NeuronTensor, _inner

__all__ = ["install"]

_installed = False


def _neuron_leaves(values: Any) -> list[NeuronTensor]:
    return [a for a in pytree.tree_leaves(values) if isinstance(a, NeuronTensor)]


def _on_inner(fn: Callable[..., Any], index: int) -> Callable[..., Any]:
    """``fn`` (a branch taking and returning neuron tensors) as a function of inner tensors."""
    def run(*inner: Any) -> Any:
        wrapped = pytree.tree_map_only(torch.Tensor, lambda t: NeuronTensor(t, None, index=index), inner)
        return pytree.tree_map_only(torch.Tensor, _inner, fn(*wrapped))

    return run


def _cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Sequence[Any]) -> Any:
    """``torch.cond`` with neuron tensors among its predicate and operands."""
    leaves = _neuron_leaves((pred, operands))
    if all(type(t._data) is torch.Tensor for t in leaves):  # device memory: run the taken branch
        taken = bool(pred.item()) if isinstance(pred, torch.Tensor) else bool(pred)
        return (true_fn if taken else false_fn)(*operands)
    index = leaves[0]._index
    inner_pred = _inner(pred) if isinstance(pred, torch.Tensor) else pred
    inner_operands = pytree.tree_map_only(torch.Tensor, _inner, tuple(operands))
    out = torch.ops.higher_order.cond(inner_pred, _on_inner(true_fn, index), _on_inner(false_fn, index),
                                      inner_operands)
    return pytree.tree_map_only(torch.Tensor, lambda t: NeuronTensor(t, None, index=index), out)


def install() -> None:
    """Register the neuron-tensor rules of ``torch.cond`` and ``auto_functionalized`` (once)."""
    global _installed
    if _installed:
        return
    from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2

    for hop in (auto_functionalized, auto_functionalized_v2):
        if NeuronTensor not in hop.python_key_table:
            hop.py_impl(NeuronTensor)(hop.py_kernels[torch._C.DispatchKey.CompositeExplicitAutograd])
    from torch._higher_order_ops.cond import cond_op
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_rule = cond_op.python_key_table.get(FakeTensorMode)
    if fake_rule is None:  # another torch: leave it as it is
        return

    def fake_or_declined(mode: Any, pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> Any:
        if _neuron_leaves((pred, operands)):
            return NotImplemented  # the neuron-tensor rule runs it on the inner tensors
        return fake_rule(mode, pred, true_fn, false_fn, operands)

    cond_op.python_key_table[FakeTensorMode] = fake_or_declined
    cond_op.py_impl(NeuronTensor)(_cond)
    cond_op._dispatch_cache.clear()
    _installed = True
