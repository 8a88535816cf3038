"""In-place ops on neuron tensors: the functional variant compiled, its result written into the target.

An in-place op (``add_``, ``index_put_``, ``zero_``) runs as its functional variant (compiled,
queued) and a queued copy writes the result into the target; ``zero_``/``fill_`` of a number
are torch's CPU fill over the target's memory; a target whose elements share memory (an
expanded or unfolded view) is written by torch's CPU kernel over the device memory, as on the
CPU. The checks torch makes when the op is called (the result's shape and dtype against the
target's) raise here, before anything is queued.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.device import kernels, math_bits, overlap, queued
from torch_neuronx.device.copies import queue_copy, wrote
from torch_neuronx.device.fallback import warn_fallback
from torch_neuronx.device.queued import on_host
from torch_neuronx.runtime.tensor import NeuronTensor

aten = torch.ops.aten

#: In-place ops whose schema returns nothing (``fsdp.copy_``): their call returns None.
NO_RESULT: set[Any] = set()

#: In-place ops torch lets write a tensor whose elements share memory (an expanded one): every
#: element gets the same value.
_OVERLAP_ALLOWED = frozenset({aten.fill_.Scalar, aten.zero_.default})


def _fill_from_first(target: torch.Tensor, values: torch.Tensor) -> None:
    if values.numel():
        target.fill_(values.reshape(-1)[0].item())


def run(func: Any, functional: Any, args: Sequence[Any], kwargs: dict[str, Any], target: NeuronTensor,
        run_compiled: Callable[[Any, Sequence[Any], dict[str, Any]], Any]) -> Any:
    """An in-place op as its functional variant on ``args``, the result copied into ``target``.

    A target whose elements share memory (an expanded or unfolded view) is written by torch's CPU
    kernel over the device memory, as on the CPU: torch refuses some such writes and defines others
    by its order of writes (``x.unfold(0, 2, 1)[idx] = 9.`` sets both views of an element; the copy
    of a functional result lost one of them). ``run_compiled`` runs the functional variant."""
    if func in _OVERLAP_ALLOWED and _fills_on_host(func, args, kwargs, target):
        return target
    if func not in _OVERLAP_ALLOWED and overlap.shares_memory_within(target._data):
        warn_fallback(func, "a write into a view whose elements share memory")
        return queued.synchronized(args, kwargs, by_cpu_kernel, func, args, kwargs, target)
    if torch.Tag.pointwise in func.tags or torch.Tag.pointwise in functional.tags:  # (copysign_ has no tag)
        overlap.refuse_partial_overlap(target, (*args[1:], *kwargs.values()))
    elif func.overloadpacket in overlap.NO_OVERLAP:
        overlap.refuse_any_overlap(target, pytree.tree_leaves((list(args[1:]), kwargs)))
    result = run_compiled(functional, args, kwargs)
    if isinstance(result, NeuronTensor) and result._index == target._index:
        _check_in_place(target, result)
        if func in _OVERLAP_ALLOWED and torch._debug_has_internal_overlap(target._data) == 1:
            # Every element gets one value, which a copy into shared memory would refuse.
            queued.enqueue(target._index, str(func), [result, target], [target._allocation], _fill_from_first,
                           target._data.detach(), result._data.detach())
            wrote(target)
        else:
            queue_copy(target, result, str(func))
    else:
        on_host(target._index, [target], _write_back, target, result)
    return None if func in NO_RESULT else target


def _fills_on_host(func: Any, args: Sequence[Any], kwargs: dict[str, Any], target: NeuronTensor) -> bool:
    """``zero_()`` or ``fill_(number)``: queued as torch's CPU fill over the target's memory, written
    in place (a kernel would compute the values into new memory and copy them: twice the
    target's memory at the peak, for ``torch.zeros``/``ones``/``full`` too). False for other forms."""
    value = 0 if func is aten.zero_.default else args[1] if len(args) == 2 else None
    if kwargs or type(value) not in (int, float, bool, complex) or target.is_conj() or target.is_neg():
        return False
    queued.enqueue(target._index, str(func), [target], [target._allocation], _fill, target._data.detach(), value)
    wrote(target)
    return True


def _fill(target: torch.Tensor, value: Any) -> None:
    target.fill_(value)


def by_cpu_kernel(func: Any, args: Sequence[Any], kwargs: dict[str, Any], target: NeuronTensor) -> Any:
    """An in-place op by torch's CPU kernel on the host views of its neuron tensors (the device
    memory itself: a view sharing memory keeps its layout), as a synchronization."""
    def host(value: Any) -> Any:
        return kernels.host_view(value) if isinstance(value, NeuronTensor) else value

    with math_bits.host_dispatch():
        func(*pytree.tree_map(host, tuple(args)), **pytree.tree_map(host, kwargs))
    wrote(target)
    return None if func in NO_RESULT else target


@functools.cache
def _scalar_type(dtype: torch.dtype) -> str:
    """The dtype's name in torch's error messages (``Float``, ``Long``, ``BFloat16``)."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def _check_in_place(target: NeuronTensor, result: NeuronTensor) -> None:
    """Raise, as torch does when the op is called, when an in-place op's result cannot be written
    back into its target: another shape (the target does not broadcast to it), or a dtype the
    target's cannot hold (a float result into an integer tensor)."""
    if result.shape != target.shape:
        raise RuntimeError(f"output with shape {list(target.shape)} doesn't match the broadcast shape "
                           f"{list(result.shape)}")
    if result.dtype != target.dtype and not torch.can_cast(result.dtype, target.dtype):
        raise RuntimeError(f"result type {_scalar_type(result.dtype)} can't be cast to the desired output type "
                           f"{_scalar_type(target.dtype)}")


def _write_back(target: NeuronTensor, result: Any) -> None:
    kernels.host_view(target).copy_(kernels.host_view(result))
    wrote(target)
