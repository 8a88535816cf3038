"""One NEFF for every size of the dimensions Dynamo marks dynamic (inference graphs).

TorchNeuron compiles static shapes only; here, when Dynamo hands the backend a graph with
symbolic sizes (``dynamic=True``, ``mark_dynamic``, or a second batch size), an inference graph
is traced once with those sizes symbolic (``pipeline/trace.py``, the eager device's dynamic
kernels' route), lowered to linalg-on-tensors with ``?`` dimensions, and compiled to one NEFF
that serves every size: a serving loop whose batch or sequence length varies compiles once.

What Dynamo's graph says about its sizes is kept exactly: each dimension whose size is one of
Dynamo's symbols is traced symbolic, dimensions that share a symbol share one in the trace and
dimensions of distinct symbols never do (the stand-ins' sizes are chosen apart), and the
integer inputs Dynamo passes for its symbols are read from the tensors' sizes inside the trace.
A graph whose trace depends on a size (a guard, a reshape to a given size), whose sizes are
expressions rather than symbols, that needs autograd, or whose dynamic lowering fails, is
compiled per signature instead (``backend._ShapeSpecialized``), and the reason is logged at INFO.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx.compiler.options import ResolvedOptions
from torch_neuronx.dynamo.graph import resident_inputs
from torch_neuronx.pipeline import trace as tracing
from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

__all__ = ["DynamicGraph", "NotDynamicGraph", "build"]

_log = logging.getLogger("torch_neuronx.dynamo")
_SMALLEST_STAND_IN = 11  # stand-in sizes start here: small sizes invite special cases


class NotDynamicGraph(Exception):
    """The graph cannot have one NEFF for all its sizes (the message says why)."""


def _symbol(size: Any) -> Any:
    """The sympy symbol a size is, None for a static size; an expression of symbols is refused."""
    if isinstance(size, int):
        return None
    node = size.node
    expr = node.shape_env.replace(node.expr)  # after the equalities Dynamo's guards established
    if expr.is_number:  # a size Dynamo specialized (a weight's dimension it met)
        return None
    if not expr.is_Symbol:
        raise NotDynamicGraph(f"a size is the expression {expr}, not one of Dynamo's symbols")
    return expr


class _Layout:
    """Where Dynamo's graph inputs are and what their sizes are made of."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs):
            raise NotDynamicGraph("the graph's inputs do not match its example inputs")
        self.tensors: list[int] = []  # positions of tensor inputs
        self.dims: list[list[Any]] = []  # per tensor input: per dimension its symbol, or None
        self.ints: dict[int, Any] = {}  # position of an int input -> its symbol
        for position, (node, example) in enumerate(zip(placeholders, example_inputs)):
            value = node.meta.get("example_value")
            if isinstance(example, torch.Tensor):
                if not isinstance(value, torch.Tensor):
                    raise NotDynamicGraph("a tensor input without Dynamo's example value")
                self.tensors.append(position)
                self.dims.append([_symbol(s) for s in value.shape])
            elif isinstance(example, torch.SymInt | int) and isinstance(value, torch.SymInt):
                self.ints[position] = _symbol(value)
            else:
                raise NotDynamicGraph(f"an input of type {type(example).__name__}")
        found = {s for dims in self.dims for s in dims if s is not None}
        if not found:
            raise NotDynamicGraph("no dynamic dimension")
        missing = [s for s in self.ints.values() if s not in found]
        if missing:
            raise NotDynamicGraph(f"the symbols {missing} are not sizes of any tensor input")
        # Where the trace reads each symbol's value: the first tensor dimension of that size.
        self.source: dict[Any, tuple[int, int]] = {}
        for t, dims in enumerate(self.dims):
            for d, s in enumerate(dims):
                if s is not None:
                    self.source.setdefault(s, (t, d))

    def stand_in_sizes(self, examples: Sequence[torch.Tensor]) -> list[list[int]]:
        """Sizes for the trace's stand-ins: each symbol gets a size of its own, unlike every other
        symbol's and every static size (a symbolic trace gives equal sizes one symbol, and a size
        that happens to equal a static one, or 2, lets a decomposition specialize on it). The
        trace holds for every size or is rejected, so the values themselves do not matter."""
        chosen: dict[Any, int] = {}
        taken = {int(examples[t].shape[d]) for t, dims in enumerate(self.dims)
                 for d, s in enumerate(dims) if s is None}
        for s, (t, d) in self.source.items():
            size = max(int(examples[t].shape[d]), _SMALLEST_STAND_IN)
            while size in taken:
                size += 1
            chosen[s] = size
            taken.add(size)
        return [[chosen[s] if s is not None else int(examples[t].shape[d]) for d, s in enumerate(dims)]
                for t, dims in enumerate(self.dims)]


class DynamicGraph:
    """A Dynamo graph compiled once for all sizes of its symbolic dimensions (see the module)."""

    def __init__(self, compiled: Any, layout: _Layout, name: str) -> None:
        self.compiled, self.layout, self.name = compiled, layout, name

    def __call__(self, *args: Any) -> list[Any]:
        on_device = False
        tensors = []
        for i in self.layout.tensors:
            t = args[i]
            if type(t) is NeuronTensor:
                on_device = True
                t = t._data
            tensors.append(t)
        results = self.compiled.call_unboxed(*tensors)
        if on_device:  # outputs of a graph on the device go to the device
            return [from_cpu(r, stride=r.stride()) if type(r) is torch.Tensor else r for r in results]
        return results


def _inference(example_inputs: Sequence[Any]) -> bool:
    return not torch.is_grad_enabled() or not any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs)


def build(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: ResolvedOptions,
          name: str) -> DynamicGraph:
    """Trace and compile ``gm`` once with its symbolic sizes; raises :class:`NotDynamicGraph`
    (or the trace's or lowering's error) when it cannot serve every size."""
    if not _inference(example_inputs):
        raise NotDynamicGraph("the graph needs autograd (a training graph compiles per signature)")
    layout = _Layout(gm, example_inputs)
    examples = [example_inputs[i] for i in layout.tensors]
    sizes = layout.stand_in_sizes(examples)
    stand_ins = [torch.empty(size, dtype=t.dtype) for size, t in zip(sizes, examples)]
    marks = [[s is not None for s in dims] for dims in layout.dims]
    positions = layout.tensors
    count = len(example_inputs)

    def call(tensors: list[torch.Tensor]) -> Any:
        args: list[Any] = [None] * count
        for position, t in zip(positions, tensors):
            args[position] = t
        for position, symbol in layout.ints.items():
            t, d = layout.source[symbol]
            args[position] = tensors[t].shape[d]
        return gm(*args)

    # The weights stay resident in the runtime, as a static graph's do: bound once, their packing
    # for the matmuls hoisted out of the calls.
    resident = resident_inputs(examples)
    try:  # unfunctionalized first: functionalization fixes the sizes of a 3-d linear layer's views
        compiled, _, _ = tracing.trace(call, name, stand_ins, options, hlo_cache=False, dynamic=marks,
                                       functionalize=False, resident=resident)
    except tracing.NotFunctional:
        compiled, _, _ = tracing.trace(call, name, stand_ins, options, hlo_cache=False, dynamic=marks,
                                       resident=resident)
    return DynamicGraph(compiled, layout, name)


def _host(value: Any) -> Any:
    return value._data if type(value) is NeuronTensor else value


def _agrees(expected: Any, got: list[Any]) -> bool:
    """Whether a dynamic NEFF's results ``got`` are what the graph computes in eager PyTorch.
    torch-mlir's linalg lowering of a symbolic trace is younger than its StableHLO path: the
    eager device found one that computed a wrong value, so a dynamic NEFF serves only once it
    agreed on its first call."""
    expected = expected if isinstance(expected, list | tuple) else [expected]
    if len(expected) != len(got):
        return False
    for e, g in zip(expected, got):
        if isinstance(e, torch.Tensor):
            g = g.cpu() if isinstance(g, torch.Tensor) else g
            if not isinstance(g, torch.Tensor) or g.shape != e.shape or g.dtype != e.dtype:
                return False
            if e.is_floating_point() or e.is_complex():
                if not torch.allclose(g, e, rtol=1e-3, atol=1e-4, equal_nan=True):
                    return False
            elif not torch.equal(g, e):
                return False
        elif e != g:
            return False
    return True


def compile_once(gm: torch.fx.GraphModule, args: Sequence[Any], options: ResolvedOptions,
                 name: str) -> tuple[DynamicGraph, list[Any]] | None:
    """The graph's one NEFF for all sizes, made on its first call (``args``) and checked against
    eager on it, with that call's results; None (logged at INFO) when it needs one per signature."""
    try:
        graph = build(gm, args, options, f"{name}_dynamic")
        got = graph(*args)
        if not _agrees(gm.forward(*[_host(a) for a in args]), got):  # forward: fx prints a failure
            raise NotDynamicGraph("the dynamic NEFF disagreed with eager on its first call")
    except Exception as exc:  # any failure keeps the per-signature route, which always works
        _log.info("%s: one NEFF per input signature (%s: %s)", name, type(exc).__name__,
                  str(exc).splitlines()[0] if str(exc) else "")
        return None
    _log.info("%s: one NEFF serves every size of its dynamic dimensions", name)
    return graph, got
