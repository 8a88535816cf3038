"""Torch's argument checks for an eager op, run once per signature on meta tensors.

An op's kernel is traced with the compile path's decompositions, which replace the op
before its meta kernel could check the call: ``F.pad(x, (5, 5), mode="reflect")`` of a
3-wide row, or a reflection pad of an empty dimension, traced into gathers that read
clamped positions and returned a tensor where the CPU raises. :func:`check` runs the op
on meta tensors first, once per signature (``launch.signature``); a meta error is torch's
error for the call when the CPU kernel agrees (run on host copies of the operands, or for large
ones zero-filled host tensors of the same metadata: a meta kernel stricter than the CPU's must
not reject a call that works).

Meta kernels also skip rules the CPU's kernels enforce on an op's indices, targets and masks
(``index_select`` with an int8 index, ``index_fill`` with an int32 one, ``nll_loss`` with an
int32 target, ``index_put(accumulate=True)`` with a uint8 or bool mask of the wrong shape),
and the compiled kernel then reads or writes wherever the values point: a call whose index-like
argument is not int64 runs the CPU's check as well (zero-filled operands: zero is a valid index;
a boolean or uint8 mask keeps its values, since how many elements it selects decides the shapes).
Matrix products of bool tensors, which torch's CPU kernels do not implement, run its check too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.device import launch, queued
from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["check"]

_LIMIT = 1 << 14
#: Arguments an op reads as indices, targets or masks (the names of aten's schemas).
_INDEX_ARGS = frozenset({"index", "indices", "target", "mask", "offsets"})
#: Above this many bytes of operands the CPU's check of a narrow index is skipped (its zero-filled copies).
_HOST_CHECK_BYTES = 1 << 28
#: Up to this many bytes of operands, the CPU's confirmation of a rejected call reads their values.
_HOST_VALUES_BYTES = 1 << 24
_passed: dict[tuple, bool] = {}
#: What a meta run that cannot judge the call raises: no meta kernel, a size that depends on values.
_UNJUDGED = (NotImplementedError, torch._subclasses.fake_tensor.DynamicOutputShapeException,
             torch._subclasses.fake_tensor.DataDependentOutputException)


def check(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Raise torch's error when ``func`` rejects a call of this signature (see the module docstring)."""
    sig = _signature(func, args, kwargs)
    if sig is not None and sig in _passed:
        return
    if _meta_error(func, args, kwargs) or _narrow_index(func, args, kwargs) or _bool_product(func, args):
        error = _cpu_error(func, args, kwargs)
        if error is not None:
            raise error
    if sig is not None:
        if len(_passed) >= _LIMIT:
            _passed.clear()
        _passed[sig] = True


def _signature(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple | None:
    """The call's plan key (``launch.signature``), or one that also describes lists of tensors (a
    recurrent layer's weights); None when an argument cannot be described."""
    sig = launch.signature(func, args, kwargs)
    if sig is not None:
        return sig
    leaves, spec = pytree.tree_flatten((list(args), kwargs))
    parts: list[Any] = [func, spec]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append((leaf.shape, leaf.stride(), leaf.dtype, leaf.device))
        elif type(leaf) is float:
            parts.append(float)
        elif isinstance(leaf, int | bool | str | type(None) | torch.dtype | torch.device):
            parts.append((type(leaf), leaf))
        else:
            return None
    return tuple(parts)


@functools.cache
def _index_arguments(func: Any) -> tuple[tuple[int, str], ...]:
    """Positions and names of ``func``'s index-like arguments (none for a function without a schema)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple((i, a.name) for i, a in enumerate(schema.arguments) if a.name in _INDEX_ARGS)


def _narrow_index(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether an index, target or mask of this call is not int64 (a dtype meta kernels do not judge),
    with operands small enough to check on the host."""
    narrow = False
    for pos, name in _index_arguments(func):
        value = args[pos] if pos < len(args) else kwargs.get(name)
        for leaf in value if isinstance(value, list | tuple) else (value,):
            if isinstance(leaf, torch.Tensor) and leaf.dtype is not torch.int64:
                narrow = True
    if not narrow:
        return False
    tensors = [t for t in pytree.tree_leaves((list(args), kwargs)) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) <= _HOST_CHECK_BYTES


#: Matrix products, whose CPU kernels (and CUDA's) implement no bool ("addmm_impl_cpu_" not
#: implemented for 'Bool') while their meta kernels accept it: the compiled kernel multiplied.
_PRODUCTS = frozenset({"mm", "bmm", "addmm", "addbmm", "baddbmm", "mv", "addmv", "dot", "vdot", "matmul",
                       "_addmm_activation"})


def _bool_product(func: Any, args: Sequence[Any]) -> bool:
    """Whether ``func`` is a matrix product of a bool tensor (the CPU's check runs on zeros)."""
    schema = getattr(func, "_schema", None)
    return (schema is not None and schema.name.split("::")[-1] in _PRODUCTS
            and any(isinstance(a, torch.Tensor) and a.dtype is torch.bool for a in args))


def _meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _host_values(value: Any) -> Any:
    """A host copy of a neuron tensor's values (after the work queued on it)."""
    if isinstance(value, NeuronTensor):
        return queued.on_host(value._index, [value], lambda: value._data.clone())
    return value


def _zeros(value: Any) -> Any:
    if isinstance(value, NeuronTensor):
        if value.dtype in (torch.bool, torch.uint8):  # a mask: its count of selected elements is a shape
            return _host_values(value)
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).zero_()
    return value


def _meta_error(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``func``'s meta kernel raises for this call (False: accepted, or cannot judge)."""
    if _unjudged(func):
        return False
    meta_args, meta_kwargs = pytree.tree_map(_meta, (list(args), kwargs))
    try:
        func(*meta_args, **meta_kwargs)
    except _UNJUDGED:
        return False
    except (RuntimeError, IndexError, ValueError, TypeError, AssertionError):
        # (AssertionError: some of torch's decompositions check arguments with ``assert``, where its
        # CPU kernel raises a RuntimeError of the same text, which is what the caller gets.)
        return True
    return False


@functools.cache
def _unjudged(func: Any) -> bool:
    """Ops whose meta run says nothing: random draws (checked where they are drawn)."""
    return torch.Tag.nondeterministic_seeded in func.tags


def _cpu_error(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> BaseException | None:
    """The error torch's CPU kernel raises for this call, or None: on host copies of the operands'
    values when they are small (zero-filled ones gave value errors of their own: lengths ``[5, 3, 1]``
    of ``pack_padded_sequence`` were "an element in 'lengths' that is <= 0"), else on zero-filled
    operands of the same metadata."""
    tensors = [t for t in pytree.tree_leaves((list(args), kwargs)) if isinstance(t, torch.Tensor)]
    small = sum(t.numel() * t.element_size() for t in tensors) <= _HOST_VALUES_BYTES
    host_args, host_kwargs = pytree.tree_map(_host_values if small else _zeros, (list(args), kwargs))
    try:
        func(*host_args, **host_kwargs)
    except Exception as exc:  # noqa: BLE001 - the CPU's rejection, raised as the op's error
        return exc
    return None
