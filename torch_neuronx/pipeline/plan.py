"""From an FX graph to a :class:`Plan`: output template, FX passes, lowering (HLO cache).

A plan is everything needed to run a compiled graph without tracing it again:
the lowered StableHLO, the specs of its inputs and outputs, where outputs that
are not computed come from, and what the runtime call must do around the NEFF
(complex views, random inputs, host checks, output layouts). Warm starts, the
precompile cache and the kernel trace cache store plans as JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import observe
from torch_neuronx.compiler import passes
from torch_neuronx.compiler.cost import graph_flops
from torch_neuronx.compiler.errors import DataDependentShapeError, NeuronCompileError
from torch_neuronx.compiler.passes import nan_bounds
from torch_neuronx.pipeline import shapes
from torch_neuronx.pipeline.artifacts import GraphArtifacts
from torch_neuronx.pipeline.lowering import lower_with_artifacts


@dataclasses.dataclass
class Plan:
    """Everything needed to run a compiled graph without re-tracing it."""

    graph_name: str
    raw: str
    stablehlo: str
    # Per output: None (a compiled tensor), ["constant", value], ["input", i] or ["object", i]
    # (see strip_outputs).
    template: list[Any]
    outputs: list[dict[str, Any]]  # {"shape", "dtype"} of each compiled output
    inputs: list[dict[str, Any]]
    complex_inputs: list[int]
    complex_outputs: list[int]
    flops: int
    keep_f64: bool = False
    copy_inputs: bool = False  # see writes_its_inputs
    resident: list[int] = dataclasses.field(default_factory=list)  # inputs kept resident (parameters)
    # Trailing NEFF inputs drawn on every call (compiler/passes/random_inputs.py).
    random_inputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # Checks of trailing outputs run on the host after every call (compiler/passes/host_checks.py).
    host_checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # [output, inverse permutation] of outputs the NEFF returns in memory order
    # (compiler/passes/output_layouts.py).
    output_layouts: list[list[Any]] = dataclasses.field(default_factory=list)
    # The dialect of ``stablehlo``: "stablehlo", or "linalg" (linalg-on-tensors) for a kernel with
    # dynamic dimensions, whose input and output shapes then hold expressions (pipeline/shapes.py).
    dialect: str = "stablehlo"
    # Nodes of the graph as the pipeline received it (the graph_stats row of a warm start reports it).
    node_count: int = 0


def tensor_spec(val: Any) -> dict[str, Any]:
    """The ``{"shape", "dtype"}`` description of a tensor (real or fake) in NEFF signatures and plans;
    a symbolic dimension is its expression's text (:func:`~torch_neuronx.pipeline.shapes.dimension`)."""
    return {"shape": [shapes.dimension(d) for d in val.shape], "dtype": str(val.dtype).removeprefix("torch.")}


def strip_outputs(gm: torch.fx.GraphModule, inputs_as_outputs: bool) -> list[Any]:
    """Drop the outputs the NEFF need not compute from the graph; return the output template.

    The template has one slot per original output: ``None`` for a tensor the NEFF
    returns, ``("constant", value)`` for a non-tensor (``None`` gradients, constants:
    backward graphs return ``None`` for inputs that need no gradient, and torch-mlir
    cannot import a ``None`` result), and with ``inputs_as_outputs``,
    ``("input", i)`` for an output that is the graph's ``i``-th tensor input itself, and
    ``("object", i)`` for one that is its ``i``-th opaque input (:func:`is_object`: a DTensor
    output's device mesh, which aot_autograd passes through the graph to rebuild it).

    aot_autograd's forward graphs return the inputs saved for backward (the step's
    input, the weights); backward graphs can pass a gradient straight through.
    Those come back as the very input tensors, as inductor returns them: a NEFF would
    hand back the input's own buffer, which then had to be copied (see
    ``runtime/executable.py:_unaliased``) on every call.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensor_inputs = (n for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor))
    position = {n: i for i, n in enumerate(tensor_inputs)} if inputs_as_outputs else {}
    objects = {n: i for i, n in enumerate(n for n in placeholders if is_object(n.meta.get("val")))}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0]
    values = list(values) if isinstance(values, list | tuple) else [values]
    template, kept = [], []
    for value in values:
        if isinstance(value, torch.fx.Node) and value in position:
            template.append(("input", position[value]))
        elif isinstance(value, torch.fx.Node) and value in objects:
            template.append(("object", objects[value]))
        elif isinstance(value, torch.fx.Node):
            template.append(None)
            kept.append(value)
        else:
            template.append(("constant", value))
    output.args = (tuple(kept),)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return template


def is_object(val: Any) -> bool:
    """Whether a graph input's example value is an opaque object (a script object: not a tensor,
    a number or a symbolic size), which a graph can only pass through."""
    return val is not None and not isinstance(val, torch.Tensor | int | float | bool | torch.SymInt
                                              | torch.SymFloat | torch.SymBool)


def _data_dependent_shape(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The first node whose result's shape depends on tensor values (an unbacked size: ``nonzero``,
    ``unique``, ``masked_select``, a size read with ``.item()``), which no NEFF can have."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        for val in vals if isinstance(vals, list | tuple) else (vals,):
            if isinstance(val, torch.Tensor) and free_unbacked_symbols(val.shape):
                return node
    return None


def _prepare(gm: torch.fx.GraphModule, name: str,
             inputs_as_outputs: bool) -> tuple[torch.fx.GraphModule, list[Any]]:
    culprit = _data_dependent_shape(gm)
    if culprit is not None:
        raise DataDependentShapeError(
            "trace", f"{culprit.target} (node {culprit.name}) gives a tensor whose shape depends on tensor "
            "values; a compiled graph has shapes known before it runs. Dynamo splits the graph at such ops by "
            "default: leave torch._dynamo.config.capture_dynamic_output_shape_ops (and capture_scalar_outputs "
            "for sizes read with .item()) off", op=str(culprit.target), graph=name)
    try:
        template = strip_outputs(gm, inputs_as_outputs)
        with observe.stage("pipeline.fx_passes", graph=name):
            gm = passes.run(gm)
    except NeuronCompileError:
        raise
    except Exception as exc:
        raise NeuronCompileError("trace", f"an FX pass failed: {type(exc).__name__}: {exc}",
                                 graph=name) from exc
    return gm, template


# StableHLO ops (and their linalg-on-tensors forms, torch-mlir's tm_tensor ops) that IREE 3.13
# lowers to operations tied to their operand (sort and scatter run in place on it). When that
# operand is a function argument, IREE writes into the caller's input buffer
# (iree-org/iree#16168): torch.compile(lambda x: x.sort().values) would sort x.
_TIED_OPS = ("stablehlo.sort", "stablehlo.scatter", "tm_tensor.sort", "tm_tensor.scatter")


def writes_its_inputs(stablehlo: str) -> bool:
    """Whether the compiled module may write into its input buffers (so callers must pass copies)."""
    return any(op in stablehlo for op in _TIED_OPS)


def _has_float64(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        vals = node.meta.get("val")
        for val in vals if isinstance(vals, list | tuple) else (vals,):
            if isinstance(val, torch.Tensor) and val.dtype == torch.float64:
                return True
    return False


def build_plan(gm: torch.fx.GraphModule, name: str, artifacts: GraphArtifacts, *, hlo_cache: bool = True,
               resident: Sequence[int] = (), inputs_as_outputs: bool = False, dialect: str = "stablehlo") -> Plan:
    """The plan of ``gm``: FX passes, then lowering through the HLO cache (see :func:`strip_outputs`
    for ``inputs_as_outputs``; ``resident``: input positions to keep resident in the runtime;
    ``dialect``: what to lower to, see :func:`~torch_neuronx.compiler.lower.lower`)."""
    artifacts.fx_graph(gm)
    node_count = len(gm.graph.nodes)  # as received, before the passes rewrite it
    gm, template = _prepare(gm, name, inputs_as_outputs)
    if dialect != "stablehlo":  # torch-mlir's linalg lowering drops NaN in clamps, maxima, minima
        gm = nan_bounds.nan_propagating_bounds(gm)
    artifacts.transformed_fx(gm)
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = [n.meta.get("val") for n in next(n for n in gm.graph.nodes if n.op == "output").args[0]]
    with observe.stage("pipeline.lower", graph=name):
        lowered = lower_with_artifacts(gm, artifacts, hlo_cache, dialect)
    return Plan(graph_name=name, raw=lowered.raw, stablehlo=lowered.stablehlo,
                template=[None if slot is None else list(slot) for slot in template],
                outputs=[tensor_spec(v) for v in outputs],
                inputs=[tensor_spec(v) for v in placeholders if isinstance(v, torch.Tensor)],
                complex_inputs=list(gm.meta.get("complex_inputs", ())),
                complex_outputs=list(gm.meta.get("complex_outputs", ())), flops=graph_flops(gm),
                keep_f64=_has_float64(gm), copy_inputs=writes_its_inputs(lowered.stablehlo),
                resident=list(resident), random_inputs=list(gm.meta.get("random_inputs", ())),
                host_checks=list(gm.meta.get("host_checks", ())),
                output_layouts=list(gm.meta.get("output_layouts", ())), dialect=dialect,
                node_count=node_count)
