"""Autograd version counters of neuron tensors' inner tensors, kept in step with the tensors'.

A ``neuron`` tensor is a wrapper over an inner CPU view of its device memory. Eager autograd
saves the wrappers and checks their version counters; a compiled graph's autograd function
(aot_autograd unwraps the wrappers) saves the inner tensors and checks theirs. Every write of the
device bumps both counters, the inner counters of every live view of the memory
(``runtime/allocation.count_writes``), so an in-place update of a saved tensor is caught either way.

``torch.autograd._unsafe_preserve_version_counter`` hides a write from autograd by setting the
wrapper's counter back (FSDP2's unshard, activation offloading, weight reloads): the inner
counter kept the bump, and the compiled graph's backward then failed with "modified by an
inplace operation". :func:`install` wraps ``torch._C._autograd._unsafe_set_version_counter``
(which that context manager and torch's other users call) so that a neuron tensor's inner tensor
moves back by as much as the tensor itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["install"]

_original: Callable[[tuple[torch.Tensor, ...], tuple[int, ...]], None] | None = None


def _set_version_counters(tensors: Sequence[torch.Tensor], versions: Sequence[int]) -> None:
    """``torch._C._autograd._unsafe_set_version_counter`` that also winds back inner tensors."""
    inner: list[torch.Tensor] = []
    inner_versions: list[int] = []
    seen: set[int] = set()
    for t, version in zip(tensors, versions, strict=False):
        data = getattr(t, "_data", None) if isinstance(t, NeuronTensor) else None
        if data is None or data.is_inference() or t.is_inference():
            continue
        moved = t._version - version
        # every live inner view of the memory: a write counts on all of them (allocation.count_writes)
        allocation = t._allocation
        views = [data] if allocation is None else [data, *allocation.live_views()]
        for view in views:
            if id(view) not in seen and not view.is_inference():
                seen.add(id(view))
                inner.append(view)
                inner_versions.append(max(0, view._version - moved))
    _original(tensors, versions)
    if inner:
        _original(tuple(inner), tuple(inner_versions))


def install() -> None:
    """Wrap ``torch._C._autograd._unsafe_set_version_counter`` (once per process)."""
    global _original
    if _original is None:
        _original = torch._C._autograd._unsafe_set_version_counter
        torch._C._autograd._unsafe_set_version_counter = _set_version_counters
