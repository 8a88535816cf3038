"""Moving a module to or from ``neuron`` while an autograd graph still holds its parameters.

``module.to("neuron")`` swaps each parameter's contents with a new neuron tensor's
(``torch.utils.swap_tensors``: a neuron tensor is a tensor subclass, so the parameter keeps its
identity only by a swap). torch refuses the swap when anything besides the parameter's own
gradient node holds the tensor: an output computed before the move, kept with its graph
(``ref = model(x); model.to("neuron")``), holds each parameter it saved for backward. On CUDA the
same program works (the parameter's data is replaced in place), so it must here.

:func:`install` wraps ``torch.utils.swap_tensors``: when torch refuses for that reason and one of
the two tensors is a neuron tensor, the swap is done anyway, and the gradient node of the old
contents, which that graph would accumulate into, is poisoned first (torch's own hook for the
case it allows): a backward through the graph from before the move raises a clear error instead
of computing gradients nobody receives. A parameter something holds a weak reference to
(``torch.export`` keeps one to each) is swapped too. Every other refusal (different slots)
stays torch's.
"""

from __future__ import annotations

import copyreg
from typing import Any

import torch

__all__ = ["install", "swap_tensors"]

_original: Any = None


def _poisoned(grad_outputs: Any) -> None:
    raise RuntimeError(
        "this backward pass runs through a graph made before its module moved between devices "
        "(module.to('neuron') or .cpu() after a forward pass whose outputs were kept): the moved "
        "parameters no longer receive its gradients. Run the forward pass again after the move.")


def _refused_for_references(exc: RuntimeError) -> bool:
    return str(exc).startswith("Expected use_count of")


def _is_neuron(t: Any) -> bool:
    from torch_neuronx.runtime.tensor import NeuronTensor

    return isinstance(t, NeuronTensor)


def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """``torch.utils.swap_tensors``, which also swaps a neuron tensor with a tensor an autograd graph
    still holds (that graph's gradient node for it poisoned; see the module docstring)."""
    try:
        return _original(t1, t2)
    except RuntimeError as exc:
        if not ((_refused_for_references(exc) or _refused_for_weakrefs(exc)) and (_is_neuron(t1) or _is_neuron(t2))):
            raise
    for t in (t1, t2):
        if t.is_leaf and t.requires_grad and t._use_count() > 1:
            torch.autograd.graph.get_gradient_edge(t).node.register_prehook(_poisoned)
    _swap(t1, t2)


def _refused_for_weakrefs(exc: RuntimeError) -> bool:
    """torch refuses to swap a tensor something holds a weak reference to (``torch.export`` keeps
    one to each parameter): the holder sees the swapped contents, as it would see CUDA's in-place
    replacement, so a move to or from ``neuron`` proceeds."""
    return "because it has weakref associated with it" in str(exc)


def _swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """What ``torch.utils.swap_tensors`` does once its checks passed (type, attributes, slots, impl)."""
    slots = set(copyreg._slotnames(t1.__class__))  # type: ignore[attr-defined]
    if slots != set(copyreg._slotnames(t2.__class__)):  # type: ignore[attr-defined]
        raise RuntimeError("Cannot swap t1 and t2 if they have different slots")
    for name in ("__class__", "__dict__"):
        first = getattr(t1, name)
        setattr(t1, name, getattr(t2, name))
        setattr(t2, name, first)
    for slot in slots:
        has1, has2 = hasattr(t1, slot), hasattr(t2, slot)
        if has1 and has2:
            first = getattr(t1, slot)
            setattr(t1, slot, getattr(t2, slot))
            setattr(t2, slot, first)
        elif has1:
            setattr(t2, slot, getattr(t1, slot))
            delattr(t1, slot)
        elif has2:
            setattr(t1, slot, getattr(t2, slot))
            delattr(t2, slot)
    torch._C._swap_tensor_impl(t1, t2)


def install() -> None:
    """Wrap ``torch.utils.swap_tensors`` (which ``nn.Module._apply`` calls), once."""
    global _original
    if _original is None:
        _original = torch.utils.swap_tensors
        torch.utils.swap_tensors = swap_tensors
