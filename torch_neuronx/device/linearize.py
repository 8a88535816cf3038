"""``torch.func.linearize`` of neuron tensors, as a forward-mode product per call.

torch's ``linearize`` traces the function's ``jvp`` with ``make_fx`` once and replays the
graph; ``make_fx`` over the eager device's tensors records the device's own bookkeeping
instead of the ops (the tangent dropped out of the graph: ``jvp_fn`` returned zeros, or
raised once kernels were cached). For neuron primals, the returned ``jvp_fn`` computes
``torch.func.jvp`` at the saved primals on each call: the same values, evaluated again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

_installed = False


def _has_neuron(values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "neuron" for v in pytree.tree_leaves(values))


def _linearize(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def linearize(func: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
        if not _has_neuron(primals):
            return original(func, *primals)
        output = func(*primals)

        def jvp_fn(*tangents: Any) -> Any:
            return torch.func.jvp(func, primals, tangents)[1]

        return output, jvp_fn

    return linearize


def install() -> None:
    """Route ``torch.func.linearize`` of neuron primals through :func:`torch.func.jvp`; idempotent."""
    global _installed
    if _installed:
        return
    import torch._functorch.eager_transforms as transforms

    wrapped = _linearize(transforms.linearize)
    transforms.linearize = wrapped
    torch.func.linearize = wrapped
    _installed = True
