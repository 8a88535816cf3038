"""Compiling one aot_autograd graph (forward, backward or inference) to a runnable NEFF.

:func:`compile_graph` is the ``fw_compiler`` / ``bw_compiler`` handed to
aot_autograd. It writes the artifact tree, runs the FX passes, lowers through
torch-mlir, gets the NEFF from the cache (compiling on a miss) and returns a
:class:`CompiledGraph` that executes it. A failure at any stage either raises
a :class:`NeuronCompileError` or, with fallback enabled, returns the graph
itself to run eagerly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx import config, metrics
from torch_neuronx.compiler import hlo, lower, passes, resident
from torch_neuronx.compiler.compile import NeffRequest, get_neff
from torch_neuronx.compiler.cost import graph_flops
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.options import CompileOptions, compile_only_enabled
from torch_neuronx.compiler.passes import host_checks, random_inputs
from torch_neuronx.compiler.targets import driver_available
from torch_neuronx.device.tensor import NeuronTensor
from torch_neuronx.dynamo import fallback, plans
from torch_neuronx.dynamo.artifacts import GraphArtifacts
from torch_neuronx.dynamo.plans import Plan

_log = logging.getLogger("torch_neuronx.dynamo")


def tensor_spec(val: Any) -> dict[str, Any]:
    """The ``{"shape", "dtype"}`` description of a tensor (real or fake) in NEFF signatures and plans."""
    return {"shape": list(val.shape), "dtype": str(val.dtype).removeprefix("torch.")}


def _strip_outputs(gm: torch.fx.GraphModule, inputs_as_outputs: bool) -> list[Any]:
    """Drop the outputs the NEFF need not compute from the graph; return the output template.

    The template has one slot per original output: ``None`` for a tensor the NEFF
    returns, ``("constant", value)`` for a non-tensor (``None`` gradients, constants:
    backward graphs return ``None`` for inputs that need no gradient, and torch-mlir
    cannot import a ``None`` result), and with ``inputs_as_outputs``,
    ``("input", i)`` for an output that is the graph's ``i``-th tensor input itself.

    aot_autograd's forward graphs return the inputs saved for backward (the step's
    input, the weights); backward graphs can pass a gradient straight through.
    Those come back as the very input tensors, as inductor returns them: a NEFF would
    hand back the input's own buffer, which then had to be copied (see
    ``runtime/executable.py:_unaliased``) on every call.
    """
    tensor_inputs = (n for n in gm.graph.nodes if n.op == "placeholder"
                     and isinstance(n.meta.get("val"), torch.Tensor))
    position = {n: i for i, n in enumerate(tensor_inputs)} if inputs_as_outputs else {}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0]
    values = list(values) if isinstance(values, list | tuple) else [values]
    template, kept = [], []
    for value in values:
        if isinstance(value, torch.fx.Node) and value in position:
            template.append(("input", position[value]))
        elif isinstance(value, torch.fx.Node):
            template.append(None)
            kept.append(value)
        else:
            template.append(("constant", value))
    output.args = (tuple(kept),)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return template


def _boxed_eager(gm: torch.fx.GraphModule) -> Callable:
    def run(args: list[Any]) -> Any:
        return gm(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


class CompiledGraph:
    """A compiled graph: aot_autograd's boxed calling convention over a NEFF executable."""

    _boxed_call = True

    def __init__(self, name: str, neff: Any, driver: str,
                 template: list[Any], outputs: list[Any], artifacts: GraphArtifacts,
                 complex_inputs: Sequence[int] = (), complex_outputs: Sequence[int] = (),
                 copy_inputs: bool = False, argument_neff: Callable[[], Any] | None = None,
                 random_inputs: Sequence[dict[str, Any]] = (),
                 checks: Sequence[dict[str, Any]] = (), layouts: Sequence[Sequence[Any]] = ()) -> None:
        self.name = name
        # Outputs returned in memory order, permuted back to their traced strides on the host.
        self._layouts = tuple((int(i), tuple(inverse)) for i, inverse in layouts)
        # Error checks of the trailing outputs, run on the host after every call (passes/host_checks.py).
        self._checks = tuple(checks)
        # Random values the graph takes as its last inputs, drawn on the host at every call.
        self._random_inputs = tuple(random_inputs)
        # For a NEFF with resident parameters: how to get the one that takes them as arguments.
        self._argument_neff = argument_neff
        self._copy_inputs = copy_inputs
        # Complex tensors cross as their (..., 2) real views (see passes/complex_to_real.py).
        self._complex_inputs = tuple(complex_inputs)
        self._complex_outputs = tuple(complex_outputs)
        self._neff = neff
        self._driver = driver
        self._template = template
        self._outputs = outputs  # (shape, dtype) of each compiled output
        self._artifacts: GraphArtifacts | None = artifacts
        self._executable = None
        self._calls = 0
        # No complex conversion, no constant outputs: results go back exactly as the NEFF returns them.
        self._plain = not (self._complex_inputs or self._complex_outputs or copy_inputs or random_inputs
                           or checks or self._layouts) and all(slot is None for slot in template)
        # Whether some outputs are inputs themselves (see _strip_outputs).
        self._returns_inputs = any(slot is not None and slot[0] == "input" for slot in template)

    def _load(self):
        from torch_neuronx.runtime.executable import Executable

        on_volatile = self._pass_parameters_as_arguments if self._argument_neff is not None else None
        self._executable = Executable(self._neff, self._driver, on_volatile=on_volatile)
        return self._executable

    def _pass_parameters_as_arguments(self) -> None:
        """The weights change between calls: switch to the NEFF that takes them as arguments.

        Rebinding resident parameters costs a new VM context per call, more than packing
        them in the call; the switch happens once (calls in flight finish on the old NEFF).
        """
        from torch_neuronx.runtime.executable import Executable

        make, self._argument_neff = self._argument_neff, None
        if make is None:
            return
        try:
            neff = make()
            executable = Executable(neff, self._driver)
        except Exception as exc:  # keep the resident NEFF, which works, just slower here
            _log.warning("%s: could not switch to parameters as arguments: %s", self.name, exc)
            return
        _log.info("%s: parameters change between calls; passing them as call arguments from now on",
                  self.name)
        self._neff, self._executable = neff, executable
        metrics.increment("volatile_parameter_graphs")

    def _zeros(self, device: torch.device) -> list[torch.Tensor]:
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in self._outputs]
        for i in self._complex_outputs:  # outputs are the (..., 2) real views of complex results
            zeros[i] = torch.view_as_complex(zeros[i])
        return self._relayout(zeros)

    def _relayout(self, results: list[torch.Tensor]) -> list[torch.Tensor]:
        for i, inverse in self._layouts:
            results[i] = results[i].permute(inverse)
        return results

    def _execute(self, executable: Any, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        tensors.extend(random_inputs.draw(spec) for spec in self._random_inputs)
        if self._copy_inputs:  # the NEFF may write into its inputs: give it copies
            tensors = [t.clone(memory_format=torch.contiguous_format) for t in tensors]
        for i in self._complex_inputs:
            tensors[i] = torch.view_as_real(tensors[i].resolve_conj())
        results = executable(tensors)
        for i in self._complex_outputs:
            results[i] = torch.view_as_complex(results[i])
        return self._relayout(results)

    def _restore(self, results: list[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[Any]:
        """The graph's outputs: the NEFF's ``results`` in their slots, constants and inputs in theirs."""
        it = iter(results)
        return [next(it) if slot is None else inputs[slot[1]] if slot[0] == "input" else slot[1]
                for slot in self._template]

    def call_unboxed(self, *args: Any) -> list[Any]:
        """Dynamo's calling convention (inference graphs run without aot_autograd's wrapper)."""
        executable = self._executable
        if executable is not None and self._plain and not config.get("TORCH_NEURONX_COMPILE_ONLY"):
            return executable(args)  # the hot path: as few Python frames as possible
        return self(list(args))

    # A backward runs where the user calls .backward(): inside a compiled function's graph
    # break, Dynamo would trace this code (and the lazy backward compile) as user code.
    @torch._dynamo.disable
    def __call__(self, args: list[Any]) -> list[Any]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        args.clear()  # boxed convention: let inputs die as early as possible
        if compile_only_enabled():
            # Outputs live where the inputs do: meta inputs (shapes only) give meta outputs.
            return self._restore(self._zeros(tensors[0].device if tensors else torch.device("cpu")), tensors)
        executable = self._executable
        if executable is not None and self._plain:  # the hot path: nothing to convert or record
            return executable(tensors)
        executable = executable or self._load()
        artifacts = self._artifacts
        if artifacts is not None and artifacts.dumps:
            artifacts.dump_tensors("inputs", self._calls, tensors)
        inputs = tuple(tensors) if self._returns_inputs else ()  # _execute replaces some in the list
        results = self._execute(executable, tensors)
        if artifacts is not None:
            if artifacts.dumps:
                artifacts.dump_tensors("outputs", self._calls, results)
            else:
                artifacts.release()
                self._artifacts = None
        self._calls += 1
        if self._checks:
            results = host_checks.run_checks(self._checks, results)
        if self._artifacts is not None:
            self._plain = False  # keep dumping tensors on every call
        return self._restore(results, inputs)


def _lower_with_artifacts(gm: torch.fx.GraphModule, artifacts: GraphArtifacts, hlo_cache: bool) -> lower.Lowered:
    try:
        lowered = hlo.lower_cached(gm, use_cache=hlo_cache)
    except NeuronCompileError as err:
        raw = getattr(err, "raw_text", None) or gm.print_readable(print_output=False)
        artifacts.torch_mlir_error(f"// {err}\n{raw}")
        raise
    artifacts.raw(lowered.raw)
    artifacts.stablehlo(lowered.stablehlo)
    return lowered


def _prepare(gm: torch.fx.GraphModule, name: str,
             inputs_as_outputs: bool) -> tuple[torch.fx.GraphModule, list[Any]]:
    try:
        template = _strip_outputs(gm, inputs_as_outputs)
        gm = passes.run(gm)
    except NeuronCompileError:
        raise
    except Exception as exc:
        raise NeuronCompileError("trace", f"an FX pass failed: {type(exc).__name__}: {exc}",
                                 graph=name) from exc
    return gm, template


# StableHLO ops that IREE 3.13 lowers to operations tied to their operand (sort and scatter
# run in place on it). When that operand is a function argument, IREE writes into the caller's
# input buffer (iree-org/iree#16168): torch.compile(lambda x: x.sort().values) would sort x.
_TIED_OPS = ("stablehlo.sort", "stablehlo.scatter")


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


def resident_inputs(dynamo_inputs: Sequence[Any]) -> list[int]:
    """Positions of the inputs an inference graph may keep resident in the runtime: its parameters.

    Only for graphs that run as-is on Dynamo's inputs (positions are the NEFF's input positions).
    """
    return [i for i, t in enumerate(dynamo_inputs)
            if _is_parameter(t) and t.numel() > 0 and not t.is_complex()]


def _is_parameter(t: Any) -> bool:
    """An ``nn.Parameter``: a plain one, or a neuron tensor made one by ``module.to("neuron")``."""
    return type(t) is torch.nn.Parameter or (type(t) is NeuronTensor and getattr(t, "_is_param", False))


def _with_resident_parameters(plan: Plan) -> tuple[str, list[int]]:
    """The StableHLO to compile for ``plan`` and the input positions bound as parameters."""
    if not plan.resident or plan.copy_inputs or not config.get("TORCH_NEURONX_RESIDENT_PARAMETERS"):
        return plan.stablehlo, []
    kept = sorted(set(plan.resident) - set(plan.complex_inputs))
    rewritten = resident.bind_parameters(plan.stablehlo, kept) if kept else None
    if rewritten is None:
        _log.debug("%s: parameters stay call arguments (module signature not rewritable)", plan.graph_name)
        return plan.stablehlo, []
    return rewritten, kept


def executable_graph(plan: Plan, options: CompileOptions, artifacts: GraphArtifacts) -> CompiledGraph:
    """Get the NEFF of a lowered graph (cache or compiler) and wrap it for execution."""
    target = options.resolved_target()
    stablehlo, kept = _with_resident_parameters(plan)
    inputs = [dict(spec, resident=True) if i in kept else spec for i, spec in enumerate(plan.inputs)]
    signature = {"inputs": inputs, "outputs": plan.outputs, **({"resident": kept} if kept else {})}
    request = NeffRequest(stablehlo=stablehlo, options=options, target=target, graph_name=plan.graph_name,
                          base_repr=plan.raw, signature=signature, keep_f64=plan.keep_f64)
    neff = get_neff(request)
    argument_neff = None
    if kept:
        arguments = dataclasses.replace(request, stablehlo=plan.stablehlo,
                                        signature={"inputs": plan.inputs, "outputs": plan.outputs})

        def argument_neff() -> Any:
            with options.applied():
                return get_neff(arguments)
    driver = target.driver_for(plan.flops)
    if not compile_only_enabled() and not driver_available(driver):
        raise NeuronCompileError("load", f"NEFFs of target {target.name!r} cannot execute on this host; "
                                 "use TORCH_NEURONX_COMPILE_ONLY=1 to cross-compile", graph=plan.graph_name)
    outputs = [(tuple(o["shape"]), getattr(torch, o["dtype"])) for o in plan.outputs]
    return CompiledGraph(plan.graph_name, neff, driver, plan.template, outputs, artifacts,
                         plan.complex_inputs, plan.complex_outputs, copy_inputs=plan.copy_inputs,
                         argument_neff=argument_neff, random_inputs=plan.random_inputs,
                         checks=plan.host_checks, layouts=plan.output_layouts)


def build_graph(gm: torch.fx.GraphModule, options: CompileOptions, name: str,
                artifacts: GraphArtifacts, *, hlo_cache: bool = True,
                resident: Sequence[int] = (), inputs_as_outputs: bool = False) -> tuple[CompiledGraph, Plan]:
    """Compile an aot_autograd-style graph: FX passes, lowering (HLO cache), NEFF; return it and its plan.

    ``hlo_cache=False`` lowers without reading or writing the HLO cache. ``resident``: input
    positions to keep resident in the runtime (see :func:`resident_inputs`).
    ``inputs_as_outputs``: outputs that are inputs come back as those very tensors (for
    aot_autograd's graphs, whose wrapper owns the aliasing of outputs; see :func:`_strip_outputs`);
    otherwise every tensor output is a new tensor. A :class:`NeuronCompileError` leaves with the
    graph's name and artifact directory filled in.
    """
    try:
        return _build(gm, options, name, artifacts, hlo_cache, resident, inputs_as_outputs)
    except NeuronCompileError as err:
        err.graph = err.graph or name
        err.artifacts = err.artifacts or artifacts.root
        raise


def _build(gm: torch.fx.GraphModule, options: CompileOptions, name: str,
           artifacts: GraphArtifacts, hlo_cache: bool, resident: Sequence[int],
           inputs_as_outputs: bool) -> tuple[CompiledGraph, Plan]:
    artifacts.fx_graph(gm)
    gm, template = _prepare(gm, name, inputs_as_outputs)
    artifacts.transformed_fx(gm)
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = [n.meta.get("val") for n in next(n for n in gm.graph.nodes if n.op == "output").args[0]]
    lowered = _lower_with_artifacts(gm, artifacts, hlo_cache)
    plan = Plan(graph_name=name, raw=lowered.raw, stablehlo=lowered.stablehlo,
                template=[None if slot is None else list(slot) for slot in template],
                outputs=[tensor_spec(v) for v in outputs],
                inputs=[tensor_spec(v) for v in placeholders if isinstance(v, torch.Tensor)],
                complex_inputs=list(gm.meta.get("complex_inputs", ())),
                complex_outputs=list(gm.meta.get("complex_outputs", ())), flops=graph_flops(gm),
                keep_f64=_has_float64(gm), copy_inputs=writes_its_inputs(lowered.stablehlo),
                resident=list(resident), random_inputs=list(gm.meta.get("random_inputs", ())),
                host_checks=list(gm.meta.get("host_checks", ())),
                output_layouts=list(gm.meta.get("output_layouts", ())))
    return executable_graph(plan, options, artifacts), plan


def from_plan(plan: Plan, options: CompileOptions, gm: torch.fx.GraphModule | None = None,
              name: str | None = None) -> CompiledGraph:
    """A warm start: the compiled graph of a stored plan, without tracing or lowering.

    ``name``: this compilation's graph name (artifact file names), when it differs from
    the name of the compilation that stored the plan.
    """
    if name is not None:
        plan = dataclasses.replace(plan, graph_name=name)
    with options.applied():
        artifacts = GraphArtifacts(plan.graph_name)
        if artifacts.preserve:
            if gm is not None:
                artifacts.fx_graph(gm)
            artifacts.raw(plan.raw)
            artifacts.stablehlo(plan.stablehlo)
        compiled = executable_graph(plan, options, artifacts)
        metrics.increment("compiled_graphs")
        metrics.increment("warm_start_plans")
        return compiled


def from_plan_unboxed(plan: Plan, options: CompileOptions) -> Callable:
    """:func:`from_plan` with Dynamo's calling convention (what a Dynamo cache entry installs)."""
    return from_plan(plan, options).call_unboxed


@torch._dynamo.disable
def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: CompileOptions, model: str, kind: str,
                  on_plan: Callable[[Plan, CompiledGraph], None] | None = None,
                  dynamo_inputs: Sequence[Any] = ()) -> Callable:
    """aot_autograd's compiler hook: compile ``gm`` or, with fallback enabled, run it eagerly.

    ``on_plan`` (inference graphs) receives the graph's plan and compiled graph when
    aot_autograd's metadata shows the graph runs as-is on Dynamo's inputs: the plan
    serves warm starts, and the compiled graph can be called without aot_autograd's
    runtime wrapper.
    """
    name = f"{model}_{kind}"
    with options.applied():
        artifacts = GraphArtifacts(name)
        plain = on_plan is not None and plans.plain_inference(dynamo_inputs, example_inputs)
        try:
            compiled, plan = build_graph(gm, options, name, artifacts, inputs_as_outputs=True,
                                         resident=resident_inputs(dynamo_inputs) if plain else ())
        except NeuronCompileError as err:
            if not fallback.enabled():
                raise
            fallback.warn(err)
            return _boxed_eager(gm)
        metrics.increment("compiled_graphs")
        if plain:
            on_plan(plan, compiled)
        if compile_only_enabled():
            artifacts.release()
        return compiled

