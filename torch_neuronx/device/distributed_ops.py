"""Ops of torch.distributed on neuron tensors: functional collectives and FSDP2's kernels.

The eager dispatcher (:mod:`.eager`) hands these here instead of compiling them: a functional
collective (``_c10d_functional.all_reduce``, ...) runs its CPU kernel on the host views of the
tensors' memory, which calls the group's process group (the ``neuron`` c10d backend);
``fsdp.all_gather_copy_in`` runs torch's own PrivateUse1 kernel on the neuron tensors, so that
its input stays a view of its output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.device import kernels, queued
from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

Handler = Callable[[Sequence[Any], dict[str, Any]], Any]


def handler(func: Any) -> Handler | None:
    """How the eager device runs ``func``, when it is one of torch.distributed's ops."""
    if func.namespace == "_c10d_functional":
        return _collective(func)
    if func._schema.name == "fsdp::all_gather_copy_in":  # defined when FSDP2 is imported
        return _torch_kernel(func)
    return None


def _placed(index: int) -> Callable[[Any], Any]:
    return lambda v: from_cpu(v, index=index) if isinstance(v, torch.Tensor) and not isinstance(v, NeuronTensor) \
        else v


def _collective(func: Any) -> Handler:
    """A functional collective: its CPU kernel on the host views of the tensors' memory, its result
    waited for and placed on the device. ``wait_tensor`` of a neuron tensor has nothing left to
    wait for: the collective that made it already ended."""
    if func.__name__.startswith("wait_tensor"):
        return lambda args, kwargs: args[0]

    def run(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        def on_cpu() -> Any:
            out = func(*pytree.tree_map(kernels.host_view, args), **pytree.tree_map(kernels.host_view, kwargs))
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    torch.ops._c10d_functional.wait_tensor(t)
            first = next(a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, NeuronTensor))
            return pytree.tree_map(_placed(first._index), out)
        return queued.synchronized(args, kwargs, on_cpu)
    return run


def _torch_kernel(func: Any) -> Handler:
    """``func`` through torch's own PrivateUse1 kernel, on the neuron tensors themselves: its views
    stay views (``fsdp.all_gather_copy_in`` returns its input as a view of its output)."""
    return lambda args, kwargs: func._op_dk(torch._C.DispatchKey.PrivateUse1, *args, **kwargs)
