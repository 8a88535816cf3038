"""aot_autograd's compiler hook: one forward, backward or inference graph through the pipeline.

:func:`compile_graph` is the ``fw_compiler`` / ``bw_compiler`` handed to
aot_autograd. It hands the graph to the compile pipeline
(:func:`torch_neuronx.pipeline.graph.build_graph`: artifacts, FX passes,
lowering, NEFF) and returns the :class:`~torch_neuronx.pipeline.graph.CompiledGraph`
that executes it. A failure at any stage either raises a
:class:`NeuronCompileError` or, with fallback enabled, returns the graph itself
to run eagerly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx import observe
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.options import ResolvedOptions, compile_only_enabled
from torch_neuronx.compiler.passes import random_inputs
from torch_neuronx.dynamo import collectives, fallback, plans, stats
from torch_neuronx.pipeline.artifacts import GraphArtifacts
from torch_neuronx.pipeline.graph import CompiledGraph, build_graph, from_plan
from torch_neuronx.pipeline.plan import Plan
from torch_neuronx.runtime.tensor import NeuronTensor


def _boxed_eager(gm: torch.fx.GraphModule) -> Callable:
    def run(args: list[Any]) -> Any:
        return gm(*args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def resident_inputs(dynamo_inputs: Sequence[Any]) -> list[int]:
    """Positions of the inputs an inference graph may keep resident in the runtime: its parameters.

    Only for graphs that run as-is on Dynamo's inputs (positions are the NEFF's input positions).
    """
    return [i for i, t in enumerate(dynamo_inputs)
            if _is_parameter(t) and t.numel() > 0 and not t.is_complex()]


def _is_parameter(t: Any) -> bool:
    """An ``nn.Parameter``: a plain one, or a neuron tensor made one by ``module.to("neuron")``."""
    return type(t) is torch.nn.Parameter or (type(t) is NeuronTensor and getattr(t, "_is_param", False))


def from_plan_unboxed(plan: Plan, options: ResolvedOptions) -> Callable:
    """:func:`~torch_neuronx.pipeline.graph.from_plan` with Dynamo's calling convention
    (what a Dynamo cache entry installs)."""
    with options.applied():
        return from_plan(plan, options).call_unboxed


@torch._dynamo.disable
def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: ResolvedOptions, model: str, kind: str,
                  on_plan: Callable[[Plan, CompiledGraph], None] | None = None,
                  dynamo_inputs: Sequence[Any] = (), random_device: str | None = None) -> Callable:
    """aot_autograd's compiler hook: compile ``gm`` or, with fallback enabled, run it eagerly.

    ``on_plan`` (inference graphs) receives the graph's plan and compiled graph when
    aot_autograd's metadata shows the graph runs as-is on Dynamo's inputs: the plan
    serves warm starts, and the compiled graph can be called without aot_autograd's
    runtime wrapper. aot_autograd calls a backward hook lazily, at the first
    ``.backward()``: the resolved options apply here again for the FX passes.
    ``random_device``: the neuron device whose generator the graph's random ops draw from.
    """
    name = f"{model}_{kind}"
    with options.applied():
        artifacts = GraphArtifacts(name, options.preserve_artifacts)
        plain = on_plan is not None and plans.plain_inference(dynamo_inputs, example_inputs)
        # The pipeline rewrites the graph it compiles in place (outputs stripped, checks appended):
        # with fallback enabled it compiles a copy, so that a failure runs aot_autograd's graph as is.
        target = copy.deepcopy(gm) if options.fallback else gm
        if random_device is not None:
            target.meta[random_inputs.DEVICE_META] = random_device
        try:
            with stats.compiling(gm, model, kind):
                if collectives.present(target):  # compute compiled; collectives, custom ops as they are
                    split = collectives.compile_split(target, options, name)
                    observe.count("compiled_graphs")
                    return split
                compiled, plan = build_graph(target, options, name, artifacts, inputs_as_outputs=True,
                                             resident=resident_inputs(dynamo_inputs) if plain else ())
                # Loaded now, not at the first call (which follows at once): a NEFF the runtime
                # refuses falls back like any failed compile, and leaves no plan to warm-start from.
                compiled.load()
        except NeuronCompileError as err:
            if err.stage in ("import", "lowering"):
                err.eager_error = _eager_refusal(gm, example_inputs)
            if not options.fallback:
                raise
            fallback.warn(err)
            return _boxed_eager(gm)
        observe.count("compiled_graphs")
        if plain:
            on_plan(plan, compiled)
        if compile_only_enabled():
            artifacts.release()
        return compiled


#: The most elements :func:`_eager_refusal` makes inputs of (a check, not a second run of a big model).
_EAGER_CHECK_ELEMENTS = 1 << 24


def _eager_refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Eager PyTorch's error for ``gm`` run on zeros of its inputs' shapes and dtypes, if it raises
    one: a graph torch-mlir cannot lower because the program is wrong (``float64_input @
    float32_weight``: "mat1 and mat2 must have the same dtype") then says so."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if collectives.present(gm) or any(not isinstance(n, int) for t in tensors for n in t.shape) \
            or sum(t.numel() for t in tensors) > _EAGER_CHECK_ELEMENTS \
            or any(isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool) for a in example_inputs):
        return None
    # (no peers to meet: a graph with collectives is not run; the host generator is left as it was)
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        inputs = [torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in example_inputs]
        try:
            gm(*inputs)
        except Exception as exc:  # noqa: BLE001 - only torch's own kinds of refusal are reported
            if isinstance(exc, RuntimeError | TypeError | ValueError | IndexError) and str(exc):
                return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None
