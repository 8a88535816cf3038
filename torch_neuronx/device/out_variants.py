"""``out=`` variants of ops on neuron tensors: the functional op queued on the device, then a
queued copy into ``out``.

``torch.mul(a, b, out=c)`` (``aten.mul.out``; DDP divides gradients this way) has a functional
twin, ``aten.mul.Tensor``, taking the same arguments without ``out``. The twin runs as every
eager op does (compiled, queued, from its launch plan), and its result is copied into ``out`` on
the stream, so no host synchronization happens. Only the plain case is taken: ``out=``
tensors (each written and returned: ``out``, or ``values, indices`` of ``sort``) on the inputs'
device, of their result's shape or empty (``out=torch.empty(0)``, resized as torch resizes it),
and of a dtype the result can be cast to; anything else (a non-empty ``out`` of another shape,
which torch resizes with a warning; no twin) keeps the CPU route over scratch copies
(``mutations.py``).

An ``out`` sharing memory with an input of an op that is not pointwise is written by torch's
CPU kernel over the device memory (``aliased``): torch refuses some of these calls
(``torch.cat([x[:2], x[2:4]], out=x[1:5])``, ``index_select``, ``gather``, ``cumsum``) and
defines others (``mm``), each kernel by its own rule; a functional result copied into ``out``
returned a value where torch raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.device import overlap
from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["functional_twin", "run"]

aten = torch.ops.aten


def _signature(schema: Any) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments]


def _written(schema: Any) -> list[Any]:
    return [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


@functools.cache
def out_names(func: Any) -> tuple[str, ...]:
    """The names of ``func``'s ``out=`` arguments (``out``; ``values, indices`` for ``sort.values``)."""
    return tuple(a.name for a in _written(func._schema))


@functools.cache
def functional_twin(func: Any) -> Any | None:
    """The functional overload whose arguments are ``func``'s without its ``out=`` tensors (keyword-only,
    each returned: ``out``, or ``values, indices``); None when ``func`` is not such a variant."""
    schema = func._schema
    written = _written(schema)
    if not written or len(schema.returns) != len(written) or not all(a.kwarg_only for a in written) \
            or (len(written) == 1 and written[0].name != "out") or str(written[0].type) != "Tensor":
        return None
    namespace, name = schema.name.split("::")
    if namespace != "aten":  # (a library's ``mylib::sigmoid(out=)`` is its own op)
        return None
    names = {a.name for a in written}
    wanted = [s for s in _signature(schema) if s[0] not in names]
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    for name in packet.overloads():
        overload = getattr(packet, name)
        twin = overload._schema
        if twin.is_mutable or len(twin.returns) != len(written):
            continue
        if _signature(twin) == wanted:
            return overload
    return None


def _check_out_device(func: Any, inputs: list[Any], out: Any) -> None:
    """torch's error for an ``out`` tensor on another device than the neuron inputs (the op ran on
    the CPU over copies and wrote ``out`` wherever it was, where CUDA refuses)."""
    index = next((t._index for t in inputs if isinstance(t, NeuronTensor)), None)
    if index is None:
        return
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor) and not (isinstance(t, NeuronTensor) and t._index == index):
            raise RuntimeError(f"Expected out tensor to have device neuron:{index}, but got {t.device} instead "
                               f"(when checking the out= argument of {func})")


def run(func: Any, twin: Any, args: Sequence[Any], kwargs: dict[str, Any],
        functional: Callable[[Any, Sequence[Any], dict[str, Any]], Any],
        copy: Callable[[NeuronTensor, NeuronTensor, str], None],
        fallback: Callable[[Any, Sequence[Any], dict[str, Any]], Any],
        aliased: Callable[[Any, Sequence[Any], dict[str, Any]], Any]) -> Any:
    """``func`` (an ``out=`` variant) as ``twin`` into new tensors, copied into its ``out=`` tensors on
    the stream; ``fallback`` runs it otherwise (see the module docstring)."""
    names = out_names(func)
    outs = [kwargs.get(name) for name in names]
    rest = {k: v for k, v in kwargs.items() if k not in names}
    inputs = pytree.tree_leaves((list(args), rest))
    _check_out_device(func, inputs, outs)
    if not all(isinstance(out, NeuronTensor) and out._allocation is not None for out in outs):
        return fallback(func, args, kwargs)
    if len(outs) > 1 and any(overlap.touches_any(out, outs[i + 1:]) for i, out in enumerate(outs)):
        return fallback(func, args, kwargs)  # outputs sharing memory: torch's kernel decides
    if len(outs) == 1 and torch.Tag.pointwise in twin.tags:  # torch's TensorIterator checks
        overlap.refuse_internal_overlap(outs[0])  # (``torch.neg(x[:4], out=x[2:])``)
        overlap.refuse_partial_overlap(outs[0], (*args, *rest.values()))
    elif any(overlap.touches_any(out, inputs) for out in outs):  # torch's kernel decides
        return aliased(func, args, kwargs) if len(outs) == 1 else fallback(func, args, kwargs)
    result = functional(twin, args, rest)
    results = result if isinstance(result, (tuple, list)) else (result,)
    for out, value in zip(outs, results):
        cast = value.dtype == out.dtype if len(outs) > 1 else torch.can_cast(value.dtype, out.dtype)
        if not isinstance(value, NeuronTensor) or value._index != out._index or not cast \
                or (value.shape != out.shape and out.numel() != 0):  # torch resizes with a warning: its rules
            return fallback(func, args, kwargs)
    for out, value in zip(outs, results):
        if value.shape != out.shape:
            out.resize_(value.shape)  # the ``out=torch.empty(0)`` idiom: resized silently, as by torch
        copy(out, value, str(func))
    return outs[0] if len(outs) == 1 else tuple(outs)
