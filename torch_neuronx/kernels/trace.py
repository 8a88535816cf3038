"""Tracing a kernel to StableHLO, and turning a trace into a runnable executable.

A :class:`Trace` is what the NKI trace cache stores: the lowered StableHLO
text and everything needed to run it without the Python function (input and
output specs, the pytree structure of the result, constants among the outputs,
the FLOP count that picks the runtime driver). :func:`trace` makes one with
``make_fx`` (functionalized, core ATen decompositions), the compile path's FX
passes and the torch-mlir lowering; :func:`load` gets its NEFF through the
NEFF cache and wraps it in the compile path's :class:`CompiledGraph`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from torch_neuronx import metrics
from torch_neuronx.compiler import decompositions
from torch_neuronx.compiler.compile import NeffRequest, get_neff
from torch_neuronx.compiler.cost import graph_flops
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.options import CompileOptions, compile_only_enabled
from torch_neuronx.compiler.targets import driver_available
from torch_neuronx.dynamo.artifacts import GraphArtifacts
from torch_neuronx.dynamo.graph import CompiledGraph, _lower_with_artifacts, _prepare, _spec

FORMAT = 1  # bumped when the stored fields change, so old entries stop matching


@dataclasses.dataclass(frozen=True)
class Trace:
    """One traced kernel signature, lowered to StableHLO.

    ``template`` has one slot per flattened output: ``None`` for a tensor the
    NEFF returns, ``["constant", value]`` for a non-tensor output put back as
    is. ``out_spec`` is the result's pytree structure (``treespec_dumps``).
    """

    name: str
    stablehlo: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    template: list[Any]
    out_spec: str
    flops: int
    complex_inputs: list[int] = dataclasses.field(default_factory=list)
    complex_outputs: list[int] = dataclasses.field(default_factory=list)

    def to_json(self) -> str | None:
        """The entry text, or None when it cannot be persisted (a constant output or a result structure
        without a JSON form)."""
        if not self.out_spec:
            return None
        try:
            return json.dumps({"format": FORMAT, **dataclasses.asdict(self)}, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):
            return None

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """Parse an entry; raises ValueError, KeyError or TypeError when it is not a trace of this format."""
        fields = json.loads(text)
        if fields.pop("format") != FORMAT:
            raise ValueError("trace entry of another format")
        return cls(**fields)


_DATA_DEPENDENT = (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)


def _reject_input_mutation(gm: torch.fx.GraphModule, name: str) -> None:
    # Functionalization writes a mutated input back with copy_ into its placeholder; results of a
    # NEFF are fresh tensors, so the caller's tensor would silently stay unchanged.
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0].op == "placeholder":
            raise NeuronCompileError("trace", f"kernel {name} mutates its input {node.args[0].name} in "
                                     "place; kernels must be pure functions: return the new value instead",
                                     graph=name)


def trace(fn: Callable[..., Any], name: str, tensors: Sequence[torch.Tensor],
          call: Callable[[Callable[..., Any], list[torch.Tensor]], Any]) -> tuple[Trace, pytree.TreeSpec]:
    """Trace ``call(fn, tensors)`` for these tensors' shapes and dtypes and lower it to StableHLO.

    ``call`` puts the (fake) tensors back among the declared arguments and calls ``fn``.
    Returns the trace and the result's pytree structure (``Trace.out_spec`` is
    empty when that structure cannot be serialized).
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    metrics.increment("kernel_traces")
    out_spec: list[pytree.TreeSpec] = []

    def flat(*inputs: torch.Tensor) -> tuple[Any, ...]:
        leaves, spec = pytree.tree_flatten(call(fn, list(inputs)))
        out_spec.append(spec)
        return tuple(leaves)

    artifacts = GraphArtifacts(name)
    try:
        functional = torch.func.functionalize(flat, remove="mutations")
        gm = make_fx(functional, decomposition_table=decompositions.table(), tracing_mode="fake")(*tensors)
    except _DATA_DEPENDENT as exc:
        raise NeuronCompileError("trace", f"kernel {name} branches on tensor values ({exc}); a kernel is "
                                 "traced once per signature, so pass values that steer control flow as "
                                 "int/float/bool/str arguments", graph=name) from exc
    gm.graph.eliminate_dead_code()
    gm.recompile()
    try:
        _reject_input_mutation(gm, name)
        artifacts.fx_graph(gm)
        gm, template = _prepare(gm, name)
        artifacts.transformed_fx(gm)
        inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        outputs = [n.meta["val"] for n in next(n for n in gm.graph.nodes if n.op == "output").args[0]]
        lowered = _lower_with_artifacts(gm, artifacts)
    except NeuronCompileError as err:
        err.graph = err.graph or name
        err.artifacts = err.artifacts or artifacts.root
        raise
    artifacts.release()
    spec = out_spec[-1]
    return Trace(
        name=name, stablehlo=lowered.stablehlo, inputs=[_spec(v) for v in inputs],
        outputs=[_spec(v) for v in outputs],
        template=[None if slot is None else list(slot) for slot in template],
        out_spec=_dumps(spec),
        flops=graph_flops(gm), complex_inputs=list(gm.meta.get("complex_inputs", ())),
        complex_outputs=list(gm.meta.get("complex_outputs", ()))), spec


def _dumps(spec: pytree.TreeSpec) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception:  # custom pytree nodes without a serialized type name
        return ""


def load(trace: Trace, options: CompileOptions | None = None) -> CompiledGraph:
    """The executable of ``trace``: its NEFF from the NEFF cache (compiled on a miss), ready to call."""
    options = options or CompileOptions()
    with options.applied():
        target = options.resolved_target()
        request = NeffRequest(
            stablehlo=trace.stablehlo, options=options, target=target, graph_name=trace.name,
            base_repr=trace.stablehlo, signature={"inputs": trace.inputs, "outputs": trace.outputs})
        neff = get_neff(request)
        driver = target.driver_for(trace.flops)
        if not compile_only_enabled() and not driver_available(driver):
            raise NeuronCompileError("load", f"NEFFs of target {target.name!r} cannot execute on this host; "
                                     "use TORCH_NEURONX_COMPILE_ONLY=1 to cross-compile", graph=trace.name)
    outputs = [torch.empty(s["shape"], dtype=getattr(torch, s["dtype"]), device="meta") for s in trace.outputs]
    return CompiledGraph(trace.name, lambda: neff, driver, [None if s is None else tuple(s) for s in trace.template],
                         outputs, GraphArtifacts(trace.name), trace.complex_inputs, trace.complex_outputs)
