"""Launch plans: the route of an eager call seen before, decided once.

The first call of an op with a given signature (each neuron tensor's shape, strides, dtype
and device; each other argument's type, and its value unless it is a float the kernel takes
at run time) goes the whole way through ``device/eager.py``: classification, runtime scalars,
the choice of kernel, the outputs' metadata. Everything that way decides depends only on the
signature, the kernels registered, and a few variables, so its outcome is kept as a
:class:`Plan`: which arguments are the kernel's inputs (and which floats become cached 0-d
tensors), the kernel, and each output's size, strides, dtype and bytes. The next call with
that signature allocates its outputs and queues its kernel, nothing else.

A plan is only made and used while nothing could make the slow way decide otherwise:

- no listener is subscribed (``eager.op`` spans, ``stream.submit`` events),
- no configuration override is active and the variables the decisions read
  (:func:`_environment`) still have the values they had when the plan was made,
- TORCH_NEURONX_ENABLE_STACK_TRACE is off (each op then records its own stack),
- the kernel registry has not changed since (a replaced or dropped kernel; tests inject
  faulty kernels there),
- the call's arguments are neuron tensors of one device, floats (which become runtime inputs),
  and constants (numbers, flags, dtypes, lists of ints), and its kernel is a static-shape one
  whose outputs are known and queued (a dynamic-shape kernel's shapes are promoted to kernels
  of their own first; a kernel whose results are checked on the host runs where it is called).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx import config, observe
from torch_neuronx.device import kernels, queued, scalars
from torch_neuronx.runtime.streams import current_stream
from torch_neuronx.runtime.tensor import NeuronTensor, new_tensor

__all__ = ["Plan", "find", "record"]

_CONSTANT = (int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_LIMIT = 1 << 14
_TENSOR, _FLOAT = 0, 1

_plans: dict[tuple, Plan] = {}
_registry = kernels.registry


class _State:
    """What the plans were made under: the registry's generation and the watched variables."""

    __slots__ = ("generation", "environment")

    def __init__(self) -> None:
        self.generation = -1
        self.environment: tuple = ()


_made_under = _State()


def _environment() -> tuple:
    """The variables the slow way reads on every call (an unchanged one answers from config's
    record of its last read): a plan holds while their values are those it was made under."""
    return (config.get("TORCH_NEURONX_EAGER_DYNAMIC_SHAPES"), config.get("TORCH_NEURONX_COMPILE_ONLY"),
            config.get("TORCH_NEURONX_ENABLE_SCALAR_CACHE"))


def _usable() -> bool:
    """Whether plans may be made and used now (see the module docstring); drops stale plans."""
    if observe.state.active or config.overridden() or queued.stack_traces():
        return False
    generation = _registry.generation
    environment = _environment()
    state = _made_under
    if state.generation != generation or state.environment != environment:
        _plans.clear()
        state.generation, state.environment = generation, environment
    return True


def _describe(sig: list[Any], a: Any) -> bool:
    """Add argument ``a`` to signature ``sig``; False when it cannot be part of a plan."""
    kind = type(a)
    if kind is NeuronTensor:
        sig += (a.shape, a.stride(), a.dtype, a._index)
    elif kind is float:
        sig.append(float)  # a runtime input (the plan checks that it became one)
    elif kind in _CONSTANT:
        sig += (kind, a)
    elif (kind is list or kind is tuple) and all(type(v) is int for v in a):  # sizes, dims
        sig += (kind, tuple(a))
    else:
        return False
    return True


def signature(func: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> tuple | None:
    """The plan key of a call: the op, and per argument its class and metadata (a constant's value);
    None when an argument cannot be part of a plan (a host tensor, a list of tensors)."""
    sig: list[Any] = [func]
    for a in args:
        kind = type(a)
        if kind is NeuronTensor:  # the common case, inline
            sig += (a.shape, a.stride(), a.dtype, a._index)
        elif not _describe(sig, a):
            return None
    if kwargs:
        for name, a in kwargs.items():
            sig.append(name)
            if not _describe(sig, a):
                return None
    return tuple(sig)


def find(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Plan | None:
    """The plan of this call, when there is one and plans are usable now."""
    if not _plans or not _usable():
        return None
    sig = signature(func, args, kwargs)
    if sig is None:
        return None
    plan = _plans.get(sig)
    if plan is not None and plan.expires and time.monotonic() > plan.expires:
        del _plans[sig]
        return None
    return plan


class Plan:
    """One signature's route: the kernel's inputs, the kernel, the outputs' metadata."""

    __slots__ = ("func", "kernel", "inputs", "float_dtype", "rounding", "outputs", "index", "leaf", "spec", "work",
                 "expires", "direct", "tries", "out_bytes")

    def __init__(self, func: Any, kernel: Any, inputs: list[tuple[Any, int]], float_dtype: Any,
                 outputs: list[Any], index: int, work: Callable[..., None], expires: float = 0.0,
                 runs_into: bool = False) -> None:
        self.func, self.kernel, self.work = func, kernel, work
        # A plan over an op family's dynamic-shape kernel ends (time.monotonic) when its shape may get
        # a kernel of its own (``choice.PROMOTE_AFTER_S``): the slow way then decides again. 0: never.
        self.expires = expires
        self.inputs = inputs  # the kernel's inputs in order: (position or keyword, _TENSOR or _FLOAT)
        self.float_dtype = float_dtype
        self.rounding = None  # the float16/bfloat16 dtype floats are rounded to first (scalars.rounding)
        self.outputs = outputs  # per result leaf: (size, stride, dtype, nbytes), or a constant in a 1-tuple
        self.index = index
        self.spec = kernel.out_spec
        self.leaf = kernel.out_spec.is_leaf()
        # The kernel's run without per-call checks (``CompiledGraph.direct_into``), for small
        # kernels of an idle stream: asked for at the first calls (the kernel's first run, which
        # opens its executable, may still be queued when the plan is made).
        self.direct: Callable[[list, list], None] | None = None
        self.tries = 3 if runs_into and _direct_possible(kernel, outputs) else 0
        self.out_bytes = sum(out[3] for out in outputs if len(out) > 1)

    def __call__(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Allocate the outputs and queue the kernel (as ``eager._run_compiled`` does); a small one
        whose stream is idle runs at once (:func:`queued.run_small`)."""
        index = self.index
        neuron, tensors = [], []
        nbytes, ready = self.out_bytes, True
        for where, kind in self.inputs:
            value = args[where] if where.__class__ is int else kwargs[where]
            if kind is _TENSOR:
                neuron.append(value)
                tensors.append(value._data)
                allocation = value._allocation
                if allocation is not None:
                    nbytes += allocation.nbytes
                    writer = allocation.writer
                    if allocation.error is not None or (writer is not None and not writer.done()):
                        ready = False
            else:
                tensors.append(scalars.scalar_tensor(value, self.float_dtype, self.rounding))
        stream = current_stream(index)
        stream_id = stream._queue.id
        results, allocations, storage = [], [], []
        for out in self.outputs:
            if len(out) == 1:  # a constant result
                results.append(out[0])
                storage.append(None)
                continue
            tensor = new_tensor(*out, index, stream_id)
            results.append(tensor)
            allocations.append(tensor._allocation)
            storage.append(tensor._data)
        kernel, direct = self.kernel, self.direct
        if direct is None and self.tries:
            direct = self._direct()
        if direct is None or not ready or nbytes > queued.INLINE_BYTES or not queued.run_small(
                stream, direct, tensors, storage, (index, kernel.name, neuron, allocations, self.work,
                                                   (kernel, tensors, storage, self.func, (args, kwargs)))):
            # Queued: the work gets inner tensors of its own, whose metadata a later in-place view
            # op (``transpose_``) cannot change before it runs.
            tensors = [t.detach() for t in tensors]
            storage = [None if t is None else t.detach() for t in storage]
            queued.enqueue(index, kernel.name, neuron, allocations, self.work, kernel, tensors, storage,
                           self.func, (args, kwargs), stream=stream, inference=False)
        if self.leaf:
            return results[0]
        return pytree.tree_unflatten(results, self.spec)

    def _direct(self) -> Callable[[list, list], None] | None:
        self.tries -= 1
        make = getattr(self.kernel.compiled, "direct_into", None)
        self.direct = direct = None if make is None else make()
        if direct is not None:
            self.tries = 0
        return direct


def _direct_possible(kernel: Any, outputs: Sequence[Any]) -> bool:
    """Whether a plan's kernel can run without per-call checks: it writes its outputs' memory (no
    copies), every output is a tensor, and each is contiguous (the memory the kernel writes)."""
    if kernel.copies or not outputs:
        return False
    for out in outputs:
        if len(out) == 1:
            return False
        size, stride = out[0], out[1]
        expected = 1
        for s, st in zip(reversed(size), reversed(stride)):
            if s != 1 and st != expected:
                return False
            expected *= s
    return True


def _inputs(given: tuple[Sequence[Any], dict[str, Any]],
            computed: tuple[Sequence[Any], dict[str, Any]]) -> tuple[list[tuple[Any, int]], Any, int] | None:
    """The kernel's inputs of a call in the order ``eager._run_compiled`` passes them (positional
    arguments, then keywords in their order), the runtime floats' dtype, and the device index;
    None when the call cannot have a plan (tensors of two devices, a float kept as a constant)."""
    inputs: list[tuple[Any, int]] = []
    float_dtype, index = None, -1
    (args, kwargs), (args_after, kwargs_after) = given, computed
    pairs = [(i, a, args_after[i]) for i, a in enumerate(args)]
    pairs += [(name, a, kwargs_after[name]) for name, a in kwargs.items()]
    for where, before, after in pairs:
        if type(before) is NeuronTensor:
            if index >= 0 and before._index != index:
                return None
            index = before._index
            inputs.append((where, _TENSOR))
        elif type(before) is float:
            if not isinstance(after, torch.Tensor):
                return None  # a constant of the kernel: its value would be part of the signature
            float_dtype = after.dtype
            inputs.append((where, _FLOAT))
        elif type(before) is int and isinstance(after, torch.Tensor):  # (the signature holds its value)
            float_dtype = after.dtype
            inputs.append((where, _FLOAT))
    return None if index < 0 else (inputs, float_dtype, index)


def record(func: Any, given: tuple[Sequence[Any], dict[str, Any]], computed: tuple[Sequence[Any], dict[str, Any]],
           kernel: Any, outputs: Sequence[Any], work: Callable[..., None], expires: float = 0.0,
           runs_into: bool = False) -> None:
    """Keep the route ``eager._run_compiled`` just took as the plan of this call's signature.

    ``given`` are the call's arguments and keywords, ``computed`` the same after runtime scalars
    replaced its floats, ``outputs`` the results it allocated and queued, ``work`` what it queued;
    ``runs_into``: ``work(kernel, tensors, storage, ...)`` runs the kernel into the outputs' memory
    (and falls back when it cannot), so a small call may run the kernel directly instead.
    """
    if not _usable():
        return
    sig = signature(func, *given)
    if sig is None or len(given[0]) != len(computed[0]) or list(given[1]) != list(computed[1]):
        return
    found = _inputs(given, computed)
    if found is None:
        return
    inputs, float_dtype, index = found
    specs: list[Any] = []
    for out in outputs:
        if isinstance(out, NeuronTensor):
            if out._allocation is None or out._index != index or out.storage_offset():
                return
            specs.append((tuple(out.shape), tuple(out.stride()), out.dtype, out._allocation.nbytes))
        elif isinstance(out, torch.Tensor):
            return
        else:
            specs.append((out,))
    if len(_plans) >= _LIMIT:
        _plans.clear()
    plan = _plans[sig] = Plan(func, kernel, inputs, float_dtype, specs, index, work, expires, runs_into)
    if float_dtype is torch.float32:
        plan.rounding = scalars.rounding(func, *given)

