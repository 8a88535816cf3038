"""Which host (CPU) tensors an eager op accepts beside neuron tensors, as torch.cuda decides.

A CUDA op refuses a CPU tensor operand with "Expected all tensors to be on the same device",
except a 0-d one (a scalar, which TensorIterator ops take from anywhere), the operands of
the ops that move them themselves (indexing takes CPU indices; copies and conversions take
any device), and those of composite ops, which have no backend kernel to check them. The
eager device computed with the CPU tensor instead, so code that fails on an accelerator ran
here silently. :func:`check` raises torch's error for such an operand.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["check", "composite_with_host_operand"]

# Ops whose non-0-d CPU operands CUDA takes: indices of indexing, sources of copies.
_ACCEPTING = frozenset((
    "index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put",
    "_to_copy", "copy", "copy_", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy",
))


# Composite ops whose CUDA path checks devices in the kernels they decompose into (``embedding``
# is an ``index_select``, ``stack`` a ``cat``, ``allclose`` elementwise ops); the eager device runs
# its own kernel for them.
_CHECKED_COMPOSITES = frozenset(("embedding", "stack", "hstack", "vstack", "allclose", "isclose"))
# (whose 0-d operands become rows of a ``cat``: no scalars there)
_STACKS = frozenset((torch.ops.aten.stack.default, torch.ops.aten.hstack.default, torch.ops.aten.vstack.default))
_INDEXING = frozenset(("index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"))


def composite_with_host_operand(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` is a composite op (one the eager device would run as a kernel of its own)
    given a host tensor that is not a scalar: it then runs as torch's decomposition, whose ops
    check devices as CUDA's do. (Composites reach the device whole under ``inference_mode``, where
    ``cpu_x @ neuron_w`` ran on neuron; ``_pack_padded_sequence``'s CPU lengths still work.)"""
    if func.name().split("::")[-1] in _ACCEPTING or not _accepts_host_tensors(func):
        return False
    leaves = pytree.tree_leaves((list(args), kwargs))
    return any(_host_operand(leaf) for leaf in leaves) and any(isinstance(leaf, NeuronTensor) for leaf in leaves)


def _host_operand(leaf: Any, scalars_too: bool = False) -> bool:
    """Whether ``leaf`` is a host tensor CUDA refuses beside device tensors (a 0-d one only with ``scalars_too``)."""
    return (isinstance(leaf, torch.Tensor) and not isinstance(leaf, NeuronTensor)
            and (leaf.dim() > 0 or scalars_too) and leaf.device.type == "cpu")


def check(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Raise torch's error when ``func`` has a host tensor operand CUDA would refuse."""
    if _accepts_host_tensors(func):
        if args and func._schema.name.split("::")[-1] in _INDEXING:
            _check_indexed(args[0])
        return
    if kwargs or any(isinstance(a, list | tuple) for a in args):
        leaves = pytree.tree_leaves((list(args), kwargs))
    else:
        leaves = args
    for leaf in leaves:
        if _host_operand(leaf, func in _STACKS):
            device = next((t.device for t in leaves if isinstance(t, NeuronTensor)), "neuron")
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {device} "
                f"and cpu! (when checking arguments for {func}; move the CPU tensor with .to('{device}'), "
                "or use a 0-d tensor or a Python number for a scalar)")


@functools.cache
def _accepts_host_tensors(func: Any) -> bool:
    """Ops CUDA runs without checking devices: the indexing and copy ops above, and composite ops
    (``_pack_padded_sequence`` takes its lengths on the CPU), which have no backend kernel of their
    own (the generated device check sits in backend kernels; composites check in the ops they call)."""
    name = func._schema.name.split("::")[-1]
    if name in _ACCEPTING:
        return True
    if name in _CHECKED_COMPOSITES:
        return False
    return not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CPU")


def _check_indexed(indexed: Any) -> None:
    """A host tensor indexed by neuron indices (``cpu_tensor[neuron_mask]``): torch's CUDA error,
    not a neuron result."""
    if isinstance(indexed, torch.Tensor) and not isinstance(indexed, NeuronTensor) and indexed.device.type == "cpu":
        raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor (cpu)")
