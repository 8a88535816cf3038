"""Tracing a Python function (an eager op, a user kernel) to a compiled graph, and rebuilding it.

A :class:`Trace` is what the eager HLO cache and the NKI trace cache store: the
:class:`~torch_neuronx.pipeline.plan.Plan` of the function's graph (the lowered
StableHLO, input and output specs, output constants, the FLOP count that picks
the runtime driver) plus the pytree structure of the kernel's result.
:func:`trace` records the kernel with ``make_fx`` (functionalized, with the
compile path's decompositions) and hands the graph to the compile path's build
step (FX passes, torch-mlir lowering, NEFF cache, executable); :func:`load`
rebuilds the executable from a stored trace without tracing or lowering.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from torch_neuronx import observe
from torch_neuronx.compiler import decompositions, driver
from torch_neuronx.compiler.decompositions import general
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.options import CompileOptions, ResolvedOptions
from torch_neuronx.compiler.passes import rewrite
from torch_neuronx.pipeline import shapes
from torch_neuronx.pipeline.artifacts import GraphArtifacts
from torch_neuronx.pipeline.graph import CompiledGraph, build_graph, executable_graph
from torch_neuronx.pipeline.plan import Plan

# Bumped when the stored fields change, or when what a trace computes does, so old entries stop
# matching. 3: traces see distinct inputs (format 2 traced ``a * a`` as a one-input kernel).
# 4: dynamic-shape kernels (eager ops), index bounds checked in them.
FORMAT = 4

#: How long a dynamic-shape kernel may take to compile before the op gets a kernel per shape instead
#: (a single op compiles in about a second; IREE took minutes over some dynamic ones, igamma's).
DYNAMIC_COMPILE_SECONDS = 30.0

_DATA_DEPENDENT = (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)


@dataclasses.dataclass(frozen=True)
class Trace:
    """One traced kernel signature: its compile plan and its result's structure (``treespec_dumps``)."""

    plan: Plan
    out_spec: str
    #: A dynamic trace's guards on its sizes (``shapes.SizeGuards``), when the caller allowed them.
    guards: tuple[str, ...] = ()

    def to_json(self) -> str | None:
        """The entry text, or None when it has no JSON form (a non-JSON constant among the outputs, or a
        result structure of custom pytree types): such a trace is not persisted."""
        if not self.out_spec:
            return None
        try:
            return json.dumps({"format": FORMAT, "out_spec": self.out_spec, "plan": dataclasses.asdict(self.plan)},
                              sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):
            return None

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """Parse an entry; raises ValueError, KeyError or TypeError when it is not a trace of this format."""
        fields = json.loads(text)
        if fields["format"] != FORMAT:
            raise ValueError(f"trace entry of format {fields['format']}, expected {FORMAT}")
        return cls(plan=Plan(**fields["plan"]), out_spec=fields["out_spec"])

    def result_spec(self) -> pytree.TreeSpec:
        """The pytree structure the kernel's flat outputs are put back into."""
        return pytree.treespec_loads(self.out_spec)


# Traces hold Dynamo's compile lock (dynamo/tracing_threads.py). A thread that holds it and waits
# for a trace it handed to another thread (an eager kernel compiled on the compile thread while
# Dynamo runs the op) lends it for that trace: acquiring it there would wait forever.
_lent = threading.local()


@contextlib.contextmanager
def compile_lock_lent(lent: bool = True) -> Iterator[None]:
    """Traces in this block run on behalf of a thread that holds Dynamo's compile lock and waits for them."""
    before = getattr(_lent, "active", False)
    _lent.active = lent or before
    try:
        yield
    finally:
        _lent.active = before


def compile_lock_is_lent() -> bool:
    """Whether traces in this thread run under a compile lock another thread holds for them."""
    return getattr(_lent, "active", False)


def compile_lock_held() -> bool:
    """Whether this thread holds Dynamo's compile lock (False when Dynamo is not loaded)."""
    import sys

    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    return convert_frame is not None and convert_frame.compile_lock._is_owned()


def _dumps(spec: pytree.TreeSpec) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception:  # custom pytree nodes without a serialized type name
        return ""


def _reject_input_mutation(gm: torch.fx.GraphModule, name: str) -> None:
    # Functionalization writes a mutated input back with copy_ into its placeholder; the outputs of
    # a NEFF are fresh tensors, so the caller's tensor would silently stay unchanged.
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is torch.ops.aten.copy_.default
                and node.args[0].op == "placeholder"):
            raise NeuronCompileError("trace", f"kernel {name} mutates its input {node.args[0].name} in "
                                     "place; kernels are pure functions: return the new value instead",
                                     graph=name)


class NotFunctional(Exception):
    """A function traced without functionalization mutates tensors."""


def _mutates(gm: torch.fx.GraphModule) -> bool:
    """Whether the traced graph calls an op that writes into one of its arguments."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable for n in gm.graph.nodes)


def _distinct(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Stand-ins of ``tensors`` for tracing: the same shapes, strides and dtypes, no memory shared.

    A trace is stored under a key of shapes, strides and dtypes, and serves every later call of
    that key. Traced with the caller's tensors, it would depend on more: ``make_fx`` gives one
    tensor passed twice a single placeholder (so ``a * a`` computes from one input and serves
    ``b * a`` wrongly), and views of one memory as aliases. Fresh tensors make the trace a
    function of what the key holds, whatever aliasing the call that traced it had. (Only their
    metadata is read: tracing is fake, and uninitialized memory is never touched.)
    """
    return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in tensors]


#: A dimension of a dynamic trace's stand-in: False (static), True (a symbol of its own; equal
#: sizes share one), or a function giving its size from other dimensions' symbols (``s + 1``:
#: a key-value cache grown by one, whose relation to the cache's size the trace must keep).
DimMark = bool | Callable[[Callable[[int, int], Any]], Any]


def _symbolic(tensors: Sequence[torch.Tensor], dynamic: Sequence[Sequence[DimMark]]) -> list[torch.Tensor]:
    """Stand-ins for a dynamic trace: fake tensors of one new shape environment, contiguous, no
    memory shared (see :func:`_distinct`), with a symbol for each dimension ``dynamic`` marks
    True (equal sizes share one: the caller's key tells them apart), the others static, and a
    dimension marked with a function sized by it, given ``size_of(tensor, dim)``: the symbolic
    size of a True-marked dimension."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    if all(isinstance(m, bool) for marks in dynamic for m in marks):
        fakes = []
        for t, marks in zip(tensors, dynamic):
            context = StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DUCK if m else DimDynamic.STATIC for m in marks])
            fakes.append(mode.from_tensor(torch.empty(t.shape, dtype=t.dtype), symbolic_context=context))
        return fakes
    return _symbolic_expressions(mode, tensors, dynamic)


def _symbolic_expressions(mode: Any, tensors: Sequence[torch.Tensor],
                          dynamic: Sequence[Sequence[DimMark]]) -> list[torch.Tensor]:
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    env = mode.shape_env
    by_size: dict[int, Any] = {}

    def symbol(size: int) -> Any:
        if size not in by_size:
            source = ConstantSource(f"neuron_size_{len(by_size)}")
            expr = env.create_symbol(size, source=source, dynamic_dim=DimDynamic.DUCK)
            by_size[size] = env.create_symintnode(expr, hint=size, source=source)
        return by_size[size]

    def size_of(t: int, d: int) -> Any:
        if dynamic[t][d] is not True:
            raise shapes.NotDynamic(f"a size expression reads dimension {d} of input {t}, which is not a symbol")
        return symbol(int(tensors[t].shape[d]))

    fakes = []
    for t, marks in zip(tensors, dynamic):
        sizes = [int(n) if m is False else symbol(int(n)) if m is True else m(size_of)
                 for n, m in zip(t.shape, marks)]
        with mode:
            fakes.append(torch.empty(sizes, dtype=t.dtype))
    return fakes


@contextlib.contextmanager
def _fake_tensor_errors_unlogged() -> Iterator[None]:
    """Keep torch's fake-tensor mode from logging a failed meta function as an ERROR with its
    traceback: the failure propagates to :func:`trace`'s caller, which reports it (a dynamic
    trace that needs a size fixed is expected to fail, and falls back to one NEFF per signature)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_dynamic_plan(plan: Plan) -> None:
    """A dynamic kernel's plan must be the plain form whose outputs the caller allocates."""
    if (plan.complex_inputs or plan.complex_outputs or plan.random_inputs
            or plan.output_layouts or any(slot is not None for slot in plan.template)):
        raise shapes.NotDynamic("the kernel's outputs are not all fresh tensors it computes")
    if not shapes.is_dynamic(plan.inputs):
        raise shapes.NotDynamic("no dynamic input dimension")


def trace(fn: Callable[[list[torch.Tensor]], Any], name: str, tensors: Sequence[torch.Tensor],
          options: ResolvedOptions | None = None, *, hlo_cache: bool = True,
          output_storage: bool = False,
          dynamic: Sequence[Sequence[DimMark]] | None = None,
          functionalize: bool = True, resident: Sequence[int] = (),
          guards_allowed: bool = False) -> tuple[CompiledGraph, Trace, pytree.TreeSpec]:
    """Trace ``fn(tensors)`` for these tensors' shapes and dtypes, lower and compile it.

    ``fn`` puts the (fake) tensors back among the declared arguments and calls
    the kernel. Returns the executable, the trace to store (its ``out_spec`` is
    empty when the result's structure cannot be serialized) and the result's
    pytree structure. ``output_storage``: the executable can write its results into storage
    the caller passes (``CompiledGraph.run_into``).

    ``dynamic``: per tensor, which dimensions to trace with symbolic sizes (equal sizes share a
    symbol); the graph is lowered to linalg-on-tensors, so the kernel serves every size of them. Raises
    :class:`~torch_neuronx.pipeline.shapes.NotDynamic` when the trace depends on concrete sizes.

    ``functionalize=False``: trace ``fn`` as it is, for a function known to mutate nothing;
    a trace that turns out to mutate raises :class:`NotFunctional`. (Functionalization replays
    views with their traced sizes, which fixes a symbolic size, as a linear layer's 3-d
    ``view`` does.)

    ``resident``: positions of ``tensors`` that are parameters, kept resident in the runtime
    (bound once, their packing hoisted out of the calls; ``compiler/resident.py``).

    ``guards_allowed``: a dynamic trace may guard on its sizes (``s0 <= 512``); the guards come
    back in the :class:`Trace`, and the caller must check them on every call.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    observe.count("kernel_traces")
    specs: list[pytree.TreeSpec] = []

    def flat(*inputs: torch.Tensor) -> tuple[Any, ...]:
        leaves, spec = pytree.tree_flatten(fn(list(inputs)))
        specs.append(spec)
        return tuple(leaves)

    options = options or default_options()
    with options.applied():
        try:
            with observe.stage("pipeline.trace", graph=name), _fake_tensor_errors_unlogged():
                functional = torch.func.functionalize(flat, remove="mutations") if functionalize else flat
                linalg = general.linalg_trace() if dynamic is not None else contextlib.nullcontext()
                with linalg:  # (dynamic kernels lower through linalg: some decompositions differ)
                    gm = make_fx(functional, decomposition_table=decompositions.table(),
                                 tracing_mode="fake" if dynamic is None else "symbolic")(
                                     *(_distinct(tensors) if dynamic is None else _symbolic(tensors, dynamic)))
        except _DATA_DEPENDENT as exc:
            raise NeuronCompileError(
                "trace", f"kernel {name} branches on tensor values ({str(exc).splitlines()[0]}); a kernel is "
                "traced once per signature, so pass values that steer control flow as int/float/bool/str "
                "arguments", graph=name) from exc
        if not functionalize and _mutates(gm):
            raise NotFunctional(f"{name} mutates tensors: it must be traced functionalized")
        gm.graph.eliminate_dead_code()
        gm.recompile()
        _reject_input_mutation(gm, name)
        if dynamic is not None:
            shapes.check_dynamic(gm, guards_allowed)
        with contextlib.ExitStack() as dynamic_only:
            if dynamic is not None:
                dynamic_only.enter_context(rewrite.dynamic_trace())
                dynamic_only.enter_context(driver.time_limit(DYNAMIC_COMPILE_SECONDS))
            compiled, plan = build_graph(gm, options, name, GraphArtifacts(name, options.preserve_artifacts),
                                         hlo_cache=hlo_cache, output_storage=output_storage, resident=resident,
                                         dialect="stablehlo" if dynamic is None else "linalg")
        guards: list[str] = []
        if dynamic is not None:  # the passes and the lowering must not have specialized it either
            guards = shapes.check_dynamic(gm, guards_allowed)
            _check_dynamic_plan(plan)
    return compiled, Trace(plan=plan, out_spec=_dumps(specs[-1]), guards=tuple(guards)), specs[-1]


def load(stored: Trace, options: ResolvedOptions | None = None, *, output_storage: bool = False) -> CompiledGraph:
    """The executable of a stored trace: its NEFF from the NEFF cache (compiled on a miss), no tracing."""
    options = options or default_options()
    return executable_graph(stored.plan, options, GraphArtifacts(stored.plan.graph_name, options.preserve_artifacts),
                            output_storage=output_storage)


def default_options() -> ResolvedOptions:
    """The environment's compile options, resolved now (for eager ops and kernels, which take none)."""
    return CompileOptions().resolve()
