"""One NEFF for every size of the dimensions Dynamo marks dynamic (inference graphs).

TorchNeuron compiles static shapes only; here, when Dynamo hands the backend a graph with
symbolic sizes (``dynamic=True``, ``mark_dynamic``, or a second batch size), an inference graph
is traced once with those sizes symbolic (``pipeline/trace.py``, the eager device's dynamic
kernels' route), lowered to linalg-on-tensors with ``?`` dimensions, and compiled to one NEFF
that serves every size: a serving loop whose batch or sequence length varies compiles once.

What Dynamo's graph says about its sizes is kept exactly: each dimension whose size is one of
Dynamo's symbols is traced symbolic, dimensions that share a symbol share one in the trace and
dimensions of distinct symbols never do (the stand-ins' sizes are chosen apart), a dimension
whose size is an expression of symbols (``s0 + 1``: a key-value cache's length plus the new
token, as ``generate()`` grows it) is traced as that expression, and the integer inputs Dynamo
passes for its symbols are read from the tensors' sizes inside the trace. Symbols Dynamo kept
apart that the trace needs equal (each layer's key and value cache lengths, which an attention
decomposition multiplies) are traced as one when the first attempt fails, and each call checks
that they are still equal. Symbols Dynamo left symbolic that the trace needs at a static size
(the feature dimension of ``nn.TransformerEncoderLayer``'s fused inference path, which Dynamo
does not look into) are taken at it when that fails, and each call checks the size. A trace
that compares a size with a bound (``s0 <= 512``: BERT's
slice of its position table) serves the sizes its guards accept, checked on every call; other
sizes take the per-signature route. A graph whose trace fixes a size to a constant, that needs
autograd, of neuron tensors under ``torch.autocast("neuron")`` (the trace's host stand-ins would
miss its casts), or whose dynamic lowering fails, is compiled per signature instead
(``backend._ShapeSpecialized``), and the reason is logged at INFO.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

from torch_neuronx import observe
from torch_neuronx.compiler.options import ResolvedOptions
from torch_neuronx.dynamo import autocopy, stats
from torch_neuronx.dynamo.graph import resident_inputs
from torch_neuronx.pipeline import trace as tracing
from torch_neuronx.pipeline.shapes import SizeGuards
from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

__all__ = ["DynamicGraph", "NotDynamicGraph", "build"]

_log = logging.getLogger("torch_neuronx.dynamo")
_SMALLEST_STAND_IN = 11  # stand-in sizes start here: small sizes invite special cases


class NotDynamicGraph(Exception):
    """The graph cannot have one NEFF for all its sizes (the message says why)."""


def _symbol(size: Any) -> Any:
    """The sympy expression of a size: a symbol of Dynamo's, an expression of its symbols (``s0 + 1``:
    a key-value cache's length plus the new token), or None for a static size."""
    if isinstance(size, int):
        return None
    node = size.node
    expr = node.shape_env.replace(node.expr)  # after the equalities Dynamo's guards established
    if expr.is_number:  # a size Dynamo specialized (a weight's dimension it met)
        return None
    return expr


def _evaluate(expr: Any, values: dict[Any, Any]) -> Any:
    """``expr`` (arithmetic of symbols: +, *, //, %, integer powers) with ``values`` for its symbols,
    which may be SymInts: the size of a stand-in dimension Dynamo gave as an expression."""
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    if expr.is_Symbol:
        return values[expr]
    if expr.is_Integer:
        return int(expr)
    args = [_evaluate(a, values) for a in expr.args]
    if expr.is_Add:
        return functools.reduce(operator.add, args)
    if expr.is_Mul:
        return functools.reduce(operator.mul, args)
    if isinstance(expr, FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, Mod | PythonMod):
        return args[0] % args[1]
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return functools.reduce(operator.mul, [args[0]] * int(expr.exp))
    raise NotDynamicGraph(f"a size is the expression {expr}, which the trace cannot rebuild")


def _live(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value reaches the graph's output or an op that may act by itself."""
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current.op == "output" or (not current.users and current.target not in _PURE_SYMBOLIC):
            return True
        for user in current.users:
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return False


#: Functions of symbolic ints Dynamo leaves in a graph that compute nothing by themselves.
_PURE_SYMBOLIC = frozenset({torch.sym_sum, torch.sym_max, torch.sym_min, torch.sym_int, torch.sym_float,
                            operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
                            operator.truediv, operator.neg, operator.eq, operator.ne, operator.lt,
                            operator.le, operator.gt, operator.ge})


class _Layout:
    """Where Dynamo's graph inputs are and what their sizes are made of."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], merge: bool = False,
                 pin: bool = False) -> None:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs):
            raise NotDynamicGraph("the graph's inputs do not match its example inputs")
        self.tensors: list[int] = []  # positions of tensor inputs
        self.dims: list[list[Any]] = []  # per tensor input: per dimension its symbol, or None
        self.ints: dict[int, Any] = {}  # position of an int input -> its symbol, expression or constant
        for position, (node, example) in enumerate(zip(placeholders, example_inputs)):
            value = node.meta.get("example_value")
            if isinstance(example, torch.Tensor):
                if not isinstance(value, torch.Tensor):
                    raise NotDynamicGraph("a tensor input without Dynamo's example value")
                self.tensors.append(position)
                self.dims.append([_symbol(s) for s in value.shape])
            elif isinstance(example, torch.SymInt | int) and isinstance(value, torch.SymInt):
                symbol = _symbol(value)
                # an int only dead nodes read (a ``sym_sum`` Dynamo left unused, whose symbol is no
                # tensor's size: it refused generate()'s graph on neuron tensors) keeps its value
                unread = not any(_live(user) for user in node.users)
                self.ints[position] = sympy.Integer(int(example)) if symbol is None or unread else symbol
            else:
                raise NotDynamicGraph(f"an input of type {type(example).__name__}")
        found = {s for dims in self.dims for s in dims if s is not None and s.is_Symbol}
        if not found:
            raise NotDynamicGraph("no dynamic dimension")
        used = {f for e in [*self.ints.values(), *(s for dims in self.dims for s in dims)] if e is not None
                for f in e.free_symbols}
        missing = [s for s in used if s not in found]
        if missing:
            self._outer_sizes(placeholders, example_inputs, missing)
            missing = [s for s in missing if any(s in e.free_symbols for e in self.ints.values() if e is not None)]
        if missing:
            raise NotDynamicGraph(f"the symbols {missing} are not sizes of any tensor input")
        self.source = self._sources()
        # Pairs of dimensions (tensor, dim) whose sizes the trace assumes equal: see _merge.
        self.assumed: list[tuple[tuple[int, int], tuple[int, int]]] = []
        # Dimensions (tensor, dim) the trace takes at a fixed size: see _pin.
        self.pinned: list[tuple[tuple[int, int], int]] = []
        if pin:
            self._pin([example_inputs[i] for i in self.tensors])
        if merge:
            self._merge([example_inputs[i] for i in self.tensors])

    def _outer_sizes(self, placeholders: list[torch.fx.Node], example_inputs: Sequence[Any],
                     missing: list[Any]) -> None:
        """Read each missing symbol that is a size of a neuron input's inner tensor
        (``L['x']._data.size()[0]``: the size of an intermediate ``h = x * 2`` that the graph
        reshapes by ``h.shape``) as the input's own size there (``L['x'].size()[0]``), which it
        always equals."""
        values = [node.meta.get("example_value") for node in placeholders]
        env = next((v.node.shape_env for v in values if isinstance(v, torch.SymInt)), None)
        if env is None:
            return
        outer = {}  # source name of a neuron input's size -> its symbol
        for position, dims in zip(self.tensors, self.dims):
            if isinstance(example_inputs[position], NeuronTensor):
                for symbol in dims:
                    if symbol is not None and symbol.is_Symbol:
                        outer.update({source.name: symbol for source in env.var_to_sources.get(symbol, ())})
        renamed = {}
        for symbol in missing:
            for source in env.var_to_sources.get(symbol, ()):
                found = outer.get(source.name.replace("._data.size()[", ".size()[", 1))
                if "._data.size()[" in source.name and found is not None:
                    renamed[symbol] = found
                    break
        if renamed:
            self.ints = {p: e.xreplace(renamed) if e is not None else e for p, e in self.ints.items()}

    def _sources(self) -> dict[Any, tuple[int, int]]:
        """Where the trace reads each symbol's value: the first tensor dimension that is that symbol."""
        source: dict[Any, tuple[int, int]] = {}
        for t, dims in enumerate(self.dims):
            for d, s in enumerate(dims):
                if s is not None and s.is_Symbol:
                    source.setdefault(s, (t, d))
        return source

    def _merge(self, examples: Sequence[torch.Tensor]) -> None:
        """Treat Dynamo's symbols of equal size in this call as one: Dynamo keeps sizes it never had
        to compare apart (each layer's key-value cache length, whose attention decomposition then
        multiplies a key by a value of another symbol), which a trace with the sizes apart cannot
        follow. The equalities assumed are checked on every call (:meth:`accepts`)."""
        representative: dict[int, Any] = {}
        renamed = {}
        for s, (t, d) in sorted(self.source.items(), key=lambda item: item[1]):
            size = int(examples[t].shape[d])
            first = representative.setdefault(size, s)
            if first is not s:
                renamed[s] = first
                self.assumed.append(((t, d), self.source[first]))
        if not renamed:
            raise NotDynamicGraph("no two dynamic sizes to treat as one")
        self.dims = [[None if s is None else s.xreplace(renamed) for s in dims] for dims in self.dims]
        self.ints = {p: s.xreplace(renamed) for p, s in self.ints.items()}
        self.source = self._sources()

    def _pin(self, examples: Sequence[torch.Tensor]) -> None:
        """Take Dynamo's symbols whose size in this call is a static size of the graph as that size:
        a fused op Dynamo does not look into (``nn.TransformerEncoderLayer``'s inference fast path)
        leaves the feature dimension symbolic under ``dynamic=True``, which a trace meeting the
        weights cannot follow. Every call is checked to have those sizes (:meth:`accepts`)."""
        static = {int(examples[t].shape[d]) for t, dims in enumerate(self.dims) for d, s in enumerate(dims)
                  if s is None}
        fixed = {s: sympy.Integer(int(examples[t].shape[d])) for s, (t, d) in self.source.items()
                 if int(examples[t].shape[d]) in static}
        if not fixed or len(fixed) == len(self.source):
            raise NotDynamicGraph("no dynamic size to take at a static size" if not fixed else
                                  "every dynamic size is a static size of the graph")
        self.pinned = [((t, d), int(fixed[s])) for t, dims in enumerate(self.dims) for d, s in enumerate(dims)
                       if s is not None and s.is_Symbol and s in fixed]
        self.dims = [[None if s is None or s.xreplace(fixed).is_number else s.xreplace(fixed) for s in dims]
                     for dims in self.dims]
        self.ints = {p: s.xreplace(fixed) for p, s in self.ints.items()}
        self.source = self._sources()

    def accepts(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether a call's tensor inputs keep the equalities the trace assumed."""
        return all(tensors[t1].shape[d1] == tensors[t2].shape[d2] for (t1, d1), (t2, d2) in self.assumed) and \
            all(tensors[t].shape[d] == size for (t, d), size in self.pinned)

    def int_value(self, position: int, tensors: Sequence[Any]) -> Any:
        """The value of the int input at ``position`` (Dynamo's symbol, or an expression of them)
        from the tensors' sizes (symbolic in the trace)."""
        expr = self.ints[position]
        return _evaluate(expr, {f: tensors[self.source[f][0]].shape[self.source[f][1]] for f in expr.free_symbols})

    def marks(self) -> list[list[Any]]:
        """The trace's mark of each tensor input's dimensions (``pipeline.trace.DimMark``): False
        for a static size, True for a symbol, a function rebuilding an expression of symbols."""
        def mark(s: Any) -> Any:
            if s is None:
                return False
            if s.is_Symbol:
                return True
            return lambda size_of, e=s: _evaluate(e, {f: size_of(*self.source[f]) for f in e.free_symbols})
        return [[mark(s) for s in dims] for dims in self.dims]

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
        return [[int(examples[t].shape[d]) if s is None else chosen[s] if s.is_Symbol
                 else int(s.subs(chosen)) for d, s in enumerate(dims)]
                for t, dims in enumerate(self.dims)]


class DynamicGraph:
    """A Dynamo graph compiled once for all sizes of its symbolic dimensions (see the module)."""

    def __init__(self, compiled: Any, layout: _Layout, name: str, guards: SizeGuards | None = None) -> None:
        self.compiled, self.layout, self.name, self.guards = compiled, layout, name, guards

    def accepts(self, args: Sequence[Any]) -> bool:
        """Whether this call keeps the equalities of sizes the trace assumed (see ``_Layout._merge``)
        and satisfies the guards it recorded (``s0 <= 512``)."""
        if not self.layout.assumed and self.guards is None:
            return True
        tensors = [args[i] for i in self.layout.tensors]
        return self.layout.accepts(tensors) and (self.guards is None or self.guards(tensors))

    def __call__(self, *args: Any) -> list[Any]:
        on_device = False
        tensors = []
        for i in self.layout.tensors:
            t = args[i]
            if type(t) is NeuronTensor:
                on_device = True
                t = t._data
            tensors.append(t)
        if on_device:
            index = autocopy.call_device([args[i] for i in self.layout.tensors])
        results = self.compiled.call_unboxed(*tensors)
        if on_device:  # outputs of a graph on the device go to its device
            return [from_cpu(r, stride=r.stride(), index=index, upload=False) if type(r) is torch.Tensor else r
                    for r in results]
        return results


def _inference(example_inputs: Sequence[Any]) -> bool:
    return not torch.is_grad_enabled() or not any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs)


def _on_host(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with the neuron devices its factories name made the host's: the trace runs on host
    stand-ins (``torch.arange(n, device=neuron)`` beside them failed with a device mismatch)."""
    def names_neuron(node: torch.fx.Node) -> bool:
        named = node.kwargs.get("device")
        return (isinstance(named, str) and named.startswith("neuron")) or any(
            isinstance(v, torch.device) and v.type == "neuron" for v in pytree.tree_leaves((node.args, node.kwargs)))

    if not any(names_neuron(n) for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = torch.fx.GraphModule(gm, graph)
    host = torch.device("cpu")
    for node in copy.graph.nodes:
        node.args, node.kwargs = pytree.tree_map_only(
            torch.device, lambda d: host if d.type == "neuron" else d, (node.args, node.kwargs))
        named = node.kwargs.get("device")
        if isinstance(named, str) and named.startswith("neuron"):
            node.kwargs = {**node.kwargs, "device": host}
    copy.recompile()
    return copy


def build(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: ResolvedOptions,
          name: str, merge: bool = False, pin: bool = False) -> DynamicGraph:
    """Trace and compile ``gm`` once with its symbolic sizes; raises :class:`NotDynamicGraph`
    (or the trace's or lowering's error) when it cannot serve every size. ``merge``: Dynamo's
    symbols of equal size in ``example_inputs`` are one (``_Layout._merge``); ``pin``: those whose
    size is a static size of the graph are that size (``_Layout._pin``)."""
    if not _inference(example_inputs):
        raise NotDynamicGraph("the graph needs autograd (a training graph compiles per signature)")
    if torch.is_autocast_enabled("neuron") and any(
            isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in example_inputs):
        # The trace runs on host stand-ins, which autocast("neuron") does not reach: its casts were
        # dropped and the graph gave float32 where eager gives bfloat16.
        raise NotDynamicGraph("autocast is on for neuron tensors (a graph under autocast compiles per signature)")
    layout = _Layout(gm, example_inputs, merge, pin)
    examples = [example_inputs[i] for i in layout.tensors]
    sizes = layout.stand_in_sizes(examples)
    stand_ins = [torch.empty(size, dtype=t.dtype) for size, t in zip(sizes, examples)]
    marks = layout.marks()
    positions = layout.tensors
    count = len(example_inputs)
    on_host = _on_host(gm)

    def call(tensors: list[torch.Tensor]) -> Any:
        args: list[Any] = [None] * count
        for position, t in zip(positions, tensors):
            args[position] = t
        for position in layout.ints:
            args[position] = layout.int_value(position, tensors)
        return on_host(*args)

    # The weights stay resident in the runtime, as a static graph's do: bound once, their packing
    # for the matmuls hoisted out of the calls.
    resident = resident_inputs(examples)
    try:  # unfunctionalized first: functionalization fixes the sizes of a 3-d linear layer's views
        compiled, traced, _ = tracing.trace(call, name, stand_ins, options, hlo_cache=False, dynamic=marks,
                                            functionalize=False, resident=resident, guards_allowed=True)
    except tracing.NotFunctional:
        compiled, traced, _ = tracing.trace(call, name, stand_ins, options, hlo_cache=False, dynamic=marks,
                                            resident=resident, guards_allowed=True)
    guards = None
    if traced.guards:  # the trace compared a size with a bound: the NEFF serves the sizes it accepts
        if len(traced.plan.inputs) != len(stand_ins):
            raise NotDynamicGraph("the trace guards on sizes of inputs it does not take in order")
        try:
            guards = SizeGuards(traced.plan.inputs, traced.guards)
        except ValueError as exc:
            raise NotDynamicGraph(f"the trace guards on sizes: {exc}") from None
        _log.info("%s: its dynamic NEFF serves the sizes for which %s", name, " and ".join(traced.guards))
    return DynamicGraph(compiled, layout, name, guards)


def _host(value: Any) -> Any:
    return value._data if type(value) is NeuronTensor else value


#: How far a dynamic NEFF's first results may be from eager's, by dtype: a wrong lowering is far off;
#: float16 and bfloat16 results differ from eager's in their last bits (computed in float32 inside
#: a fused dispatch, rounded where stored), and a float16 MLP with a LayerNorm compiled one NEFF
#: per batch size under float32's bounds.
_TOLERANCES = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}


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
                rtol, atol = _TOLERANCES.get(e.dtype, (1e-3, 1e-4))
                if not torch.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
                    return False
            elif not torch.equal(g, e):
                return False
        elif e != g:
            return False
    return True


def _build_either_way(gm: torch.fx.GraphModule, args: Sequence[Any], options: ResolvedOptions,
                      name: str) -> DynamicGraph:
    """:func:`build` with every symbol apart, else with Dynamo's symbols of equal size as one, else
    with those of a static size at that size, else both (the first attempt's error when all fail)."""
    try:
        return build(gm, args, options, name)
    except NotDynamicGraph:
        raise
    except Exception as first:  # sizes Dynamo kept apart that the trace needs equal, or fixed
        _log.debug("%s: a dynamic trace with every symbol apart failed: %s", name, first)
        for how in ({"merge": True}, {"pin": True}, {"merge": True, "pin": True}):
            try:
                return build(gm, args, options, name, **how)
            except NotDynamicGraph:
                continue
            except Exception as again:
                _log.debug("%s: a dynamic trace with %s failed: %s", name, how, again)
        raise first from None


def compile_once(gm: torch.fx.GraphModule, args: Sequence[Any], options: ResolvedOptions,
                 name: str) -> tuple[DynamicGraph, list[Any]] | None:
    """The graph's one NEFF for all sizes, made on its first call (``args``) and checked against
    eager on it, with that call's results; None (logged at INFO) when it needs one per signature."""
    try:
        with stats.compiling(gm, name, "dynamic"):  # its graph_stats row, when it serves
            graph = _build_either_way(gm, args, options, f"{name}_dynamic")
            if not graph.accepts(args):
                raise NotDynamicGraph(f"the first call's sizes fail the trace's guards {graph.guards.guards}")
            got = graph(*args)
            if not _agrees(_on_host(gm).forward(*[_host(a) for a in args]), got):  # forward: fx prints a failure
                raise NotDynamicGraph("the dynamic NEFF disagreed with eager on its first call")
            observe.count("compiled_graphs")
    except Exception as exc:  # any failure keeps the per-signature route, which always works
        _log.info("%s: one NEFF per input signature (%s: %s)", name, type(exc).__name__,
                  str(exc).splitlines()[0] if str(exc) else "")
        _log.debug("%s: the dynamic NEFF failed with the whole error:\n%s", name, exc)  # (a compile
        return None  # error's first line names only its stage; the lowering's message follows)
    _log.info("%s: one NEFF serves every size of its dynamic dimensions", name)
    return graph, got
