"""``out=`` variants of ops on neuron tensors: the functional op queued on the device, then a
queued copy into ``out``.

``torch.mul(a, b, out=c)`` (``aten.mul.out``; DDP divides gradients this way) has a functional
twin, ``aten.mul.Tensor``, taking the same arguments without ``out``. The twin runs as every
eager op does (compiled, queued, from its launch plan), and its result is copied into ``out`` on
the stream, so no host synchronization happens. Only the plain case is taken: one ``out``
tensor (written, returned), on the inputs' device, of the result's shape, and of a dtype the
result can be cast to; anything else (``out`` of another shape, which torch would resize; an
op with several outputs; no twin) keeps the CPU route over scratch copies (``mutations.py``).

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


@functools.cache
def functional_twin(func: Any) -> Any | None:
    """The functional overload whose arguments are ``func``'s without its single ``out``; None
    when ``func`` is not such an ``out=`` variant."""
    schema = func._schema
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) != 1 or written[0].name != "out" or len(schema.returns) != 1:
        return None
    namespace, name = schema.name.split("::")
    if namespace != "aten":  # (a library's ``mylib::sigmoid(out=)`` is its own op)
        return None
    wanted = [s for s in _signature(schema) if s[0] != "out"]
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    for name in packet.overloads():
        overload = getattr(packet, name)
        twin = overload._schema
        if twin.is_mutable or len(twin.returns) != 1:
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
    """``func`` (an ``out=`` variant) as ``twin`` into a new tensor, copied into ``out`` on the stream;
    ``fallback`` runs it otherwise (see the module docstring)."""
    out = kwargs.get("out")
    rest = {k: v for k, v in kwargs.items() if k != "out"}
    _check_out_device(func, pytree.tree_leaves((list(args), rest)), out)
    if not isinstance(out, NeuronTensor) or out._allocation is None:
        return fallback(func, args, kwargs)
    if torch.Tag.pointwise in twin.tags:  # torch's TensorIterator checks (``torch.neg(x[:4], out=x[2:])``)
        overlap.refuse_internal_overlap(out)
        overlap.refuse_partial_overlap(out, (*args, *rest.values()))
    elif overlap.touches_any(out, pytree.tree_leaves((list(args), rest))):
        return aliased(func, args, kwargs)
    result = functional(twin, args, rest)
    if not isinstance(result, NeuronTensor) or result._index != out._index or result.shape != out.shape \
            or not torch.can_cast(result.dtype, out.dtype):
        return fallback(func, args, kwargs)
    copy(out, result, str(func))
    return out
