"""Conjugate and negative views (torch's "math bits") on neuron tensors.

``x.conj()`` of a complex tensor and ``torch._neg_view(x)`` are views that share ``x``'s memory
and carry a bit saying that the values are the conjugate (the negation) of what the memory holds.
Torch resolves the bit above the backend: for almost every op, its Conjugate and Negative
dispatch keys copy such an input into plain memory before the op reaches ``__torch_dispatch__``.
Two things make that work on neuron tensors:

- the wrapper carries the bits its inner tensor has (``runtime.tensor.alias``, for every view),
  so that torch sees them: without them an op would read the memory as it is, un-negated;
- the ops torch lets through with the bits set (``clone``, ``mm``, ``addmm``, ``bmm``, ``dot``,
  ``repeat_interleave`` ..., :func:`passes_bits`) get their inputs resolved here
  (:func:`resolved`), since a compiled kernel reads raw memory. Copies resolve the bits
  themselves: they run torch's own CPU copy over the inner tensors, which carry the bits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["host_dispatch", "passes_bits", "resolved"]

_KEYS = (torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative)
# Ops torch lets through with the bits set that read no values (metadata, allocation), or that
# resolve the bits themselves (copies): nothing to resolve for them.
_NO_VALUES = frozenset({
    "copy_", "set_", "resize_", "as_strided_", "detach_", "requires_grad_", "empty", "empty_like",
    "empty_strided", "full_like", "_new_zeros_with_same_feature_meta", "_has_same_storage_numel", "size",
    "stride", "is_complex", "is_floating_point", "_to_copy",
})


@functools.cache
def passes_bits(func: Any) -> bool:
    """Whether torch hands ``func`` inputs with their bits set (its Conjugate or Negative key lets
    it through) and ``func`` reads their values, so its inputs must be resolved here."""
    if func.is_view or torch.Tag.inplace_view in func.tags:
        return False
    name = func._schema.name
    if name.split("::")[-1] in _NO_VALUES:
        return False
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name if func._overloadname == "default"
                                                              else f"{name}.{func._overloadname}", key)
               for key in _KEYS)


def _has_bits(t: Any) -> bool:
    return type(t) is NeuronTensor and (t._data.is_conj() or t._data.is_neg())


def resolved(args: Sequence[Any], kwargs: dict[str, Any], resolve: Callable[[NeuronTensor], NeuronTensor],
             keep: frozenset[str] = frozenset()) -> tuple[Sequence[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` with each neuron tensor that carries a bit replaced by ``resolve(t)``,
    a tensor of the same values in plain memory; the keywords named in ``keep`` (an ``out=`` the op
    writes) stay as they are."""
    leaves = pytree.tree_leaves((list(args), {k: v for k, v in kwargs.items() if k not in keep}))
    if not any(_has_bits(t) for t in leaves):
        return args, kwargs

    def plain(value: Any) -> Any:
        return pytree.tree_map(lambda t: resolve(t) if _has_bits(t) else t, value)

    return plain(tuple(args)), {k: v if k in keep else plain(v) for k, v in kwargs.items()}


def host_dispatch() -> torch._C._ForceDispatchKeyGuard:
    """The Conjugate and Negative keys back on for host ops run from ``__torch_dispatch__``.

    A CPU fallback runs below the Python key, where torch excludes the math-bit keys: a composite
    CPU op that makes a conjugate view itself (``linalg_pinv``'s ``vh.mH @ ...``) then multiplied
    the raw memory, unconjugated (a complex pseudo-inverse 1.8 off).
    """
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _KEYS:
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)
