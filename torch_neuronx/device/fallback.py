"""Ops run by torch's CPU kernels over the host views of neuron tensors' memory.

The route of an op no kernel covers (a fallback, warned about once per op and counted as
``eager_fallbacks``), of a data-dependent op, and of an op writing into its arguments that
has no functional form. Each runs as a synchronization (:func:`.queued.synchronized`): queued
work on the tensors finishes first. Results are placed in the memory of the first neuron
argument's device.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx import observe
from torch_neuronx.compiler.passes.output_layouts import memory_order
from torch_neuronx.device import kernels, math_bits, mutations, queued
from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

aten = torch.ops.aten
_cpu = kernels.host_view
_warned: set[str] = set()
#: How the op being dispatched ran, when not as classified (its ``eager.op`` span's ``how``).
fell_back = threading.local()


def to_device(value: Any, index: int = 0) -> Any:
    """A CPU result of an op on neuron tensors, placed in the memory of device ``index``."""
    if isinstance(value, torch.Tensor) and not isinstance(value, NeuronTensor):
        # a transposed or channels-last result keeps its layout (torch's), a strided or expanded one does not
        return from_cpu(value, value.stride() if memory_order(value) is not None else None, index=index)
    return value


def on_device(index: int) -> Callable[[Any], Any]:
    return lambda value: to_device(value, index)


def first_neuron(args: Any) -> NeuronTensor:
    return next(a for a in pytree.tree_leaves(args) if isinstance(a, NeuronTensor))


def mutated(func: Any) -> list[int]:
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def written(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments ``func`` writes into (by its schema), positional or keyword."""
    schema = func._schema.arguments
    return [args[i] if i < len(args) else kwargs.get(schema[i].name) for i in mutated(func)]


def fallback(func: Any, args: Sequence[Any], kwargs: dict[str, Any], reason: str) -> Any:
    """``func`` on the CPU over the neuron tensors' memory (a synchronization), results placed on the device.

    Warned about once it ran: a call the CPU rejects raises torch's error and nothing else (a kernel
    whose trace failed because the call is invalid is no missing kernel).
    """
    out = queued.synchronized(args, kwargs, run_on_cpu, func, args, kwargs)
    warn_fallback(func, reason)
    return out


def warn_fallback(func: Any, reason: str) -> None:
    observe.count("eager_fallbacks")
    observe.count("aten::" + func._schema.name.split("::")[-1])  # TorchXLA's per-op fallback counter
    fell_back.op = "fallback"
    name = str(func)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"neuron: {name} runs on the CPU ({reason})", RuntimeWarning, stacklevel=5)


#: Results that stay in host memory, as CUDA's kernels leave them (``pack_padded_sequence``'s
#: ``batch_sizes``, which ``PackedSequence`` requires on the CPU).
_HOST_RESULTS = {aten._pack_padded_sequence.default: frozenset({1})}


def run_on_cpu(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    with math_bits.host_dispatch():
        out = func(*pytree.tree_map(_cpu, args), **pytree.tree_map(_cpu, kwargs))
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and (leaf.is_quantized or leaf.layout != torch.strided):
            kind = "quantized" if leaf.is_quantized else f"{leaf.layout}"
            raise NotImplementedError(f"{func} on neuron tensors: its result is a {kind} tensor, which the "
                                      "neuron device does not hold; call it on CPU tensors")
    place = on_device(first_neuron((args, kwargs))._index)
    kept = _HOST_RESULTS.get(func)
    if kept is not None:
        return tuple(o if i in kept else pytree.tree_map(place, o) for i, o in enumerate(out))
    return pytree.tree_map(place, out)


def run_without_functional_form(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An op writing into its arguments that has no functional form: on the CPU over the tensors'
    memory, as a synchronization (a warning names it once)."""
    warn_fallback(func, "an in-place or out= variant without a functional form")
    return queued.synchronized(args, kwargs, _run_writing_on_cpu, func, args, kwargs)


def _run_writing_on_cpu(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An op writing into its arguments (``out=``), on the CPU: the neuron tensors it writes are
    resized and filled (:mod:`.mutations`), its other results placed on the device."""
    with math_bits.host_dispatch():
        out = mutations.run_writing_on_cpu(func, args, kwargs, written(func, args, kwargs))
    return pytree.tree_map(on_device(first_neuron((args, kwargs))._index), out)
