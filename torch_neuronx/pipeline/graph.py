"""The compiled graph every frontend runs: a plan's NEFF (cache or compiler) behind a callable.

:func:`build_graph` takes an FX graph through the whole pipeline (plan, NEFF,
executable); :func:`executable_graph` and :func:`from_plan` start from a stored
plan (warm starts, the precompile cache, the kernel trace cache, eager HLO-cache
hits). :class:`CompiledGraph` follows aot_autograd's boxed calling convention
and loads its executable on the first call.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx import config, observe
from torch_neuronx.compiler import output_storage as storage_abi
from torch_neuronx.compiler import resident
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.options import ResolvedOptions, compile_only_enabled
from torch_neuronx.compiler.passes import host_checks, random_inputs
from torch_neuronx.compiler.targets import STORAGE_DIALECTS, driver_available, input_dialect
from torch_neuronx.pipeline import shapes
from torch_neuronx.pipeline.artifacts import GraphArtifacts
from torch_neuronx.pipeline.neffs import NeffRequest, get_neff
from torch_neuronx.pipeline.plan import Plan, build_plan, is_object
from torch_neuronx.runtime import random as runtime_random
from torch_neuronx.runtime.errors import NeffLoadError, NeuronRuntimeError
from torch_neuronx.runtime.executable import Executable

_log = logging.getLogger("torch_neuronx.pipeline")


class CompiledGraph:
    """A compiled graph: aot_autograd's boxed calling convention over a NEFF executable."""

    _boxed_call = True

    def __init__(self, name: str, neff: Any, driver: str,
                 template: list[Any], outputs: list[Any], artifacts: GraphArtifacts,
                 complex_inputs: Sequence[int] = (), complex_outputs: Sequence[int] = (),
                 copy_inputs: bool = False, argument_neff: Callable[[], Any] | None = None,
                 random_inputs: Sequence[dict[str, Any]] = (),
                 checks: Sequence[dict[str, Any]] = (), layouts: Sequence[Sequence[Any]] = (),
                 storage_neff: Any = None, shape_function: shapes.ShapeFunction | None = None) -> None:
        self.name = name
        # A kernel with dynamic dimensions: its outputs' shapes from its inputs' (None: static).
        self.shape_function = shape_function
        # The NEFF that writes its results into storage the caller passes (eager ops), when built;
        # ``neff`` may then be a function that makes the plain one, needed only if that one fails.
        self._storage_neff = storage_neff
        self._storage_executable: Executable | None = None
        # Outputs returned in memory order, permuted back to their traced strides on the host.
        self._layouts = tuple((int(i), tuple(inverse)) for i, inverse in layouts)
        # ... and the memory order each such output's storage is written in (:meth:`run_into`).
        self._memory_orders = tuple((i, tuple(inverse.index(d) for d in range(len(inverse))))
                                    for i, inverse in self._layouts)
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
        self._loaded: Executable | None = None  # loaded ahead by load(), taken up by the first call
        self._calls = 0
        # No complex conversion, no constant outputs: results go back exactly as the NEFF returns them.
        self._plain = not (self._complex_inputs or self._complex_outputs or copy_inputs or random_inputs
                           or checks or self._layouts) and all(slot is None for slot in template)
        # Whether some outputs are inputs themselves (see _strip_outputs); opaque ones among them.
        self._returns_inputs = any(slot is not None and slot[0] in ("input", "object") for slot in template)
        self._returns_objects = any(slot is not None and slot[0] == "object" for slot in template)

    def _load(self) -> Executable:
        if self._loaded is not None:
            self._executable, self._loaded = self._loaded, None
            return self._executable
        on_volatile = self._pass_parameters_as_arguments if self._argument_neff is not None else None
        if callable(self._neff):
            self._neff = self._neff()
        self._executable = self._open(self._neff, on_volatile)
        return self._executable

    def load(self) -> None:
        """Load the NEFF now (it loads at the first call otherwise): the runtime's refusal of it
        (``NeuronCompileError`` of the load stage) surfaces here. The first call still takes the
        full path (its tensor dumps, the artifacts' release), then the hot path."""
        if self._executable is None and self._loaded is None and not compile_only_enabled():
            self._load()
            self._loaded, self._executable = self._executable, None

    def _open(self, neff: Any, on_volatile: Callable[[], None] | None = None) -> Executable:
        try:
            with observe.stage("runtime.load", graph=self.name):
                return Executable(neff, self._driver, on_volatile=on_volatile)
        except NeffLoadError as exc:
            raise NeuronCompileError("load", str(exc), graph=self.name, artifacts=exc.path) from exc

    def run_into(self, tensors: list[torch.Tensor], outputs: list[torch.Tensor]) -> bool:
        """Run the graph writing its results into ``outputs`` (fresh, aligned device memory with the
        traced strides: a permuted output is written in its memory order), with no copy after
        execution; False when it cannot (no output-storage NEFF, or
        one whose results need copying into storage: the caller then calls it and copies)."""
        if self._storage_neff is None or compile_only_enabled():
            return False
        executable = self._storage_executable
        if executable is None:
            executable = self._storage_executable = self._open(self._storage_neff)
        if self._layouts:  # outputs with their traced strides: the NEFF writes them in memory order
            outputs = list(outputs)
            for i, order in self._memory_orders:
                outputs[i] = outputs[i].permute(order)
        try:
            executable.run_into(tensors, outputs)
        except NeuronRuntimeError as exc:
            if storage_abi.UNSUPPORTED not in str(exc):
                raise
            _log.debug("%s: results not written by a dispatch; copying them instead", self.name)
            self._storage_neff = self._storage_executable = None
            return False
        artifacts = self._artifacts
        if artifacts is not None and not artifacts.dumps:
            artifacts.release()
            self._artifacts = None
        return True

    def direct_into(self) -> Callable[[list[torch.Tensor], list[torch.Tensor]], None] | None:
        """After a :meth:`run_into` that wrote its outputs: a function doing the same with no
        per-call checks (``Executable.direct_into``), for a launch plan that made them once; None
        when the graph's outputs need more (traced strides, copies) or it has no such NEFF."""
        if self._storage_neff is None or self._storage_executable is None or self._layouts \
                or self._artifacts is not None:
            return None
        return self._storage_executable.direct_into()

    def _pass_parameters_as_arguments(self) -> None:
        """The weights change between calls: switch to the NEFF that takes them as arguments.

        Rebinding resident parameters costs a new VM context per call, more than packing
        them in the call; the switch happens once (calls in flight finish on the old NEFF).
        """
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
        observe.count("volatile_parameter_graphs")

    @property
    def runs_on_host(self) -> bool:
        """Whether each call must run where it is made: the graph returns some of its inputs, checks
        its outputs on the host, or draws random inputs from the host generator."""
        return bool(self._returns_inputs or self._checks or self._random_inputs)

    def output_dtypes(self) -> list[torch.dtype]:
        """The dtype of each output the NEFF computes."""
        return [dtype for _, dtype in self._outputs]

    def _zeros(self, device: torch.device, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        sizes = self.shape_function(tensors) if self.shape_function is not None else [s for s, _ in self._outputs]
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, (_, dtype) in zip(sizes, self._outputs)]
        for i in self._complex_outputs:  # outputs are the (..., 2) real views of complex results
            zeros[i] = torch.view_as_complex(zeros[i])
        return self._relayout(zeros)

    def output_metas(self) -> list[Any] | None:
        """The graph's outputs without running it: meta tensors (shape, dtype) and constants.

        None when they cannot be known ahead of a call or the call must run where it is made:
        the graph has dynamic dimensions (see :attr:`shape_function`), returns some of its inputs,
        checks its outputs on the host, or draws random
        inputs from the host generator (whose order is the caller's program order).
        """
        if self._returns_inputs or self._checks or self._random_inputs or self.shape_function is not None:
            return None
        metas = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in self._outputs]
        for i in self._complex_outputs:
            metas[i] = torch.view_as_complex(metas[i])
        return self._restore(self._relayout(metas), ())

    def _relayout(self, results: list[torch.Tensor]) -> list[torch.Tensor]:
        for i, inverse in self._layouts:
            results[i] = results[i].permute(inverse)
        return results

    def _execute(self, executable: Any, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        tensors.extend(_draw(spec) for spec in self._random_inputs)
        if self._copy_inputs:  # the NEFF may write into its inputs: give it copies
            tensors = [t.clone(memory_format=torch.contiguous_format) for t in tensors]
        for i in self._complex_inputs:
            tensors[i] = torch.view_as_real(tensors[i].resolve_conj())
        results = executable(tensors)
        for i in self._complex_outputs:
            results[i] = torch.view_as_complex(results[i])
        return self._relayout(results)

    def _restore(self, results: list[torch.Tensor], inputs: Sequence[torch.Tensor],
                 objects: Sequence[Any] = ()) -> list[Any]:
        """The graph's outputs: the NEFF's ``results`` in their slots, constants and inputs in theirs."""
        it = iter(results)
        return [next(it) if slot is None else inputs[slot[1]] if slot[0] == "input"
                else objects[slot[1]] if slot[0] == "object" else slot[1] for slot in self._template]

    @classmethod
    def hide_from_dynamo(cls) -> None:
        """Make Dynamo run ``__call__`` without tracing it (``torch._dynamo.disable``); idempotent."""
        if not getattr(cls.__call__, "_torchdynamo_disable", False):
            cls.__call__ = torch._dynamo.disable(cls.__call__)

    def call_unboxed(self, *args: Any) -> list[Any]:
        """Dynamo's calling convention (inference graphs run without aot_autograd's wrapper)."""
        executable = self._executable
        if executable is not None and self._plain and not config.get("TORCH_NEURONX_COMPILE_ONLY"):
            return executable(args)  # the hot path: as few Python frames as possible
        return self(list(args))

    # A backward runs where the user calls .backward(): inside a compiled function's graph
    # break, Dynamo would trace this code (and the lazy backward compile) as user code. Hidden
    # from Dynamo by hide_from_dynamo(), which the torch.compile frontend calls: decorated here,
    # every ``import torch`` (the device's autoload) would import Dynamo (about 1 s).
    def __call__(self, args: list[Any]) -> list[Any]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        objects = [a for a in args if is_object(a)] if self._returns_objects else ()
        args.clear()  # boxed convention: let inputs die as early as possible
        if compile_only_enabled():
            # Outputs live where the inputs do: meta inputs (shapes only) give meta outputs.
            return self._restore(self._zeros(tensors[0].device if tensors else torch.device("cpu"), tensors),
                                 tensors, objects)
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
        return self._restore(results, inputs, objects)


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


def _storable(plan: Plan) -> bool:
    """Whether the NEFF's results are the graph's outputs exactly (no inputs, constants, complex or
    permuted results, checks or random inputs), so they can be written into the caller's storage."""
    return not (plan.copy_inputs or plan.complex_inputs or plan.complex_outputs or plan.random_inputs
                or plan.host_checks or plan.output_layouts) and all(slot is None for slot in plan.template)


def executable_graph(plan: Plan, options: ResolvedOptions, artifacts: GraphArtifacts, *,
                     output_storage: bool = False) -> CompiledGraph:
    """Get the NEFF of a lowered graph (cache or compiler) and wrap it for execution.

    ``output_storage``: also build the NEFF that writes its results into storage the caller
    passes (:meth:`CompiledGraph.run_into`, for eager ops); the plain NEFF is then built only
    if that one cannot serve the graph.
    """
    target = options.target
    stablehlo, kept = _with_resident_parameters(plan)
    inputs = [dict(spec, resident=True) if i in kept else spec for i, spec in enumerate(plan.inputs)]
    signature = {"inputs": inputs, "outputs": plan.outputs, **({"resident": kept} if kept else {})}
    dialect = input_dialect(plan.dialect, plan.stablehlo)
    request = NeffRequest(stablehlo=stablehlo, options=options, graph_name=plan.graph_name,
                          base_repr=plan.raw, signature=signature, keep_f64=plan.keep_f64, dialect=dialect)
    storage_text = storage_abi.with_output_storage(plan.stablehlo) if (
        output_storage and not kept and _storable(plan) and dialect in STORAGE_DIALECTS) else None
    if storage_text is not None:
        storage_neff = get_neff(dataclasses.replace(request, stablehlo=storage_text,
                                                    signature={**signature, "output_storage": True}))
        neff: Any = lambda: get_neff(request)  # noqa: E731 - built on demand
    else:
        storage_neff, neff = None, get_neff(request)
    argument_neff = None
    if kept:
        arguments = dataclasses.replace(request, stablehlo=plan.stablehlo,
                                        signature={"inputs": plan.inputs, "outputs": plan.outputs})

        def argument_neff() -> Any:
            return get_neff(arguments)
    driver = target.driver_for(plan.flops)
    if not compile_only_enabled() and not driver_available(driver):
        raise NeuronCompileError("load", f"NEFFs of target {target.name!r} cannot execute on this host; "
                                 "use TORCH_NEURONX_COMPILE_ONLY=1 to cross-compile", graph=plan.graph_name)
    outputs = [(tuple(o["shape"]), getattr(torch, o["dtype"])) for o in plan.outputs]
    dynamic = shapes.is_dynamic(plan.inputs) or shapes.is_dynamic(plan.outputs)
    shape_function = shapes.ShapeFunction(plan.inputs, plan.outputs) if dynamic else None
    return CompiledGraph(plan.graph_name, neff, driver, plan.template, outputs, artifacts,
                         plan.complex_inputs, plan.complex_outputs, copy_inputs=plan.copy_inputs,
                         argument_neff=argument_neff, random_inputs=plan.random_inputs,
                         checks=plan.host_checks, layouts=plan.output_layouts, storage_neff=storage_neff,
                         shape_function=shape_function)


def _draw(spec: dict[str, Any]) -> torch.Tensor:
    """A fresh value of a graph's random input, from the generator of the device it was placed on."""
    device = spec.get("device")
    if device is None or not device.startswith("neuron"):
        return random_inputs.draw(spec)
    op, args, kwargs = random_inputs.call(spec)
    return runtime_random.draw(op, args, kwargs, device).contiguous()


def build_graph(gm: torch.fx.GraphModule, options: ResolvedOptions, name: str,
                artifacts: GraphArtifacts, *, hlo_cache: bool = True,
                resident: Sequence[int] = (), inputs_as_outputs: bool = False,
                output_storage: bool = False, dialect: str = "stablehlo") -> tuple[CompiledGraph, Plan]:
    """Compile an aot_autograd-style graph: FX passes, lowering (HLO cache), NEFF; return it and its plan.

    ``hlo_cache=False`` lowers without reading or writing the HLO cache. ``resident``: input
    positions to keep resident in the runtime (the graph's parameters).
    ``inputs_as_outputs``: outputs that are inputs come back as those very tensors (for
    aot_autograd's graphs, whose wrapper owns the aliasing of outputs; see
    :func:`~torch_neuronx.pipeline.plan.strip_outputs`); otherwise every tensor output is a new
    tensor. A :class:`NeuronCompileError` leaves with the graph's name and artifact directory
    filled in.
    """
    try:
        plan = build_plan(gm, name, artifacts, hlo_cache=hlo_cache, resident=resident,
                          inputs_as_outputs=inputs_as_outputs, dialect=dialect)
        return executable_graph(plan, options, artifacts, output_storage=output_storage), plan
    except NeuronCompileError as err:
        err.graph = err.graph or name
        err.artifacts = err.artifacts or artifacts.root
        raise


def from_plan(plan: Plan, options: ResolvedOptions, gm: torch.fx.GraphModule | None = None,
              name: str | None = None) -> CompiledGraph:
    """A warm start: the compiled graph of a stored plan, without tracing or lowering.

    ``name``: this compilation's graph name (artifact file names), when it differs from
    the name of the compilation that stored the plan.
    """
    if name is not None:
        plan = dataclasses.replace(plan, graph_name=name)
    artifacts = GraphArtifacts(plan.graph_name, options.preserve_artifacts)
    if artifacts.preserve:
        if gm is not None:
            artifacts.fx_graph(gm)
        artifacts.raw(plan.raw)
        artifacts.stablehlo(plan.stablehlo)
    compiled = executable_graph(plan, options, artifacts)
    observe.count("compiled_graphs")
    observe.count("warm_start_plans")
    return compiled
