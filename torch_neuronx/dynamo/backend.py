"""The ``neuron`` torch.compile backend.

Path of one Dynamo graph::

    Dynamo FX graph → aot_autograd (forward + backward, decompositions)
      → FX passes (transformed FX) → torch-mlir import (raw) → StableHLO
      → NEFF cache / compiler driver → runtime executable

Registered as the ``torch_dynamo_backends`` entry point ``neuron``, so
``torch.compile(model, backend="neuron")`` works without importing this
package. ``options=`` takes a :class:`~torch_neuronx.compiler.CompileOptions`
(or a dict of its fields).

Shapes: the first compilation of a frame is static. When Dynamo later marks
dimensions dynamic (a new batch size, ``dynamic=True``, ``mark_dynamic``), an
inference graph is compiled once with those dimensions dynamic
(:mod:`torch_neuronx.dynamo.dynamic`); where that cannot be (a training graph, a
trace that depends on a size), each distinct concrete input signature is traced
and compiled once (and served from the NEFF cache on later runs).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torch_neuronx import config
from torch_neuronx.compiler import decompositions, lowering_worker
from torch_neuronx.compiler.decompositions import functional, linalg
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.options import CompileOptions, ResolvedOptions
from torch_neuronx.dynamo import (
    aliases,
    autocopy,
    dynamic,
    fallback,
    flat_inputs,
    generators,
    optimizers,
    plans,
    precompile,
    stats,
    tracing_threads,
)
from torch_neuronx.dynamo.graph import compile_graph
from torch_neuronx.pipeline.graph import CompiledGraph, from_plan
from torch_neuronx.runtime import streams
from torch_neuronx.runtime.tensor import NeuronTensor, alias, from_cpu

_log = logging.getLogger("torch_neuronx.dynamo")


def _calls_the_tolerant_registration(compiler_fn: Any = None, name: Any = None, tags: Any = ()) -> Any:
    # Its code becomes torch's register_backend's (whose globals hold the name it calls).
    return _neuron_register_backend(compiler_fn, name, tags)  # noqa: F821


def _concurrent_registration_tolerated() -> None:
    """Threads that make their first ``torch.compile(backend="neuron")`` at once each load this
    entry point and register what it names: torch's ``register_backend`` asserted "duplicate
    name: neuron" in all but one. The same function registered again under its own name is now
    accepted. The racing threads looked ``register_backend`` up before their load imported this
    module, so its code is what changes (the function object they hold runs the new code)."""
    import types

    from torch._dynamo.backends import registry

    function = registry.register_backend
    if "_neuron_register_backend" in function.__globals__:
        return
    original = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                  function.__defaults__, function.__closure__)

    def register_backend(compiler_fn: Any = None, name: Any = None, tags: Any = ()) -> Any:
        if compiler_fn is not None and name is not None and registry._COMPILER_FNS.get(name) is compiler_fn:
            return compiler_fn
        return original(compiler_fn, name, tags)

    function.__globals__["_neuron_register_backend"] = register_backend
    function.__code__ = _calls_the_tolerant_registration.__code__


_concurrent_registration_tolerated()
optimizers.install()  # before Dynamo traces an optimizer.step: this module is imported at the lookup
generators.install()  # before Dynamo wraps a neuron generator

if "TORCH_CACHING_PRECOMPILE" in os.environ:
    # torch itself only accepts "1"; the registry's bool parsing (true/yes/...) decides here.
    torch._dynamo.config.caching_precompile = bool(config.get("TORCH_CACHING_PRECOMPILE"))



def _partition(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """aot_autograd's min-cut partition, with the random ops of checkpointed regions saved.

    Recomputing a random op in the backward (``torch.utils.checkpoint`` around dropout) needs
    the generator state replayed: the partitioner wraps such ops in ``run_and_save_rng_state``
    and ``run_with_rng_state``, which torch-mlir cannot import (every such graph failed). Their
    values are saved instead (a mask's worth of memory), and the region around them is still
    recomputed from them: the backward sees the forward's very draws.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint_module.graph.nodes:
        tags = getattr(node.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags and node.meta.get("recompute") in (
                CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)

def _model_name(options: CompileOptions) -> str:
    if options.model_name:
        return options.model_name
    compile_id = torch._guards.CompileContext.current_compile_id()
    suffix = str(compile_id).replace("/", "_") if compile_id is not None else "0"
    return f"model_{suffix}"


def _is_symbolic(example_inputs: Sequence[Any]) -> bool:
    for value in example_inputs:
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            return True
        if isinstance(value, torch.Tensor) and any(
                not isinstance(d, int) for d in (*value.shape, *value.stride())):
            return True
    return False


@contextlib.contextmanager
def _onednn_off() -> Iterator[None]:
    """oneDNN disabled for torch's decompositions while tracing (``flags()`` would also set TF32,
    which warns on every compile)."""
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def _aot_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: ResolvedOptions, model: str, plan_key: str | None = None) -> Callable:
    lowering_worker.prestart()  # no plan: its start overlaps aot_autograd's trace
    plain: list[tuple[CompiledGraph, plans.Plan]] = []
    on_device = any(isinstance(a, NeuronTensor) for a in example_inputs)

    def keep_plan(plan: plans.Plan, compiled: CompiledGraph) -> None:
        if not on_device:  # a plan runs on host tensors: neuron tensors need _on_device's wrapping
            if plan_key:
                plans.save(plan_key, plan)
            precompile.record(gm, plan, options.options)
        plain.append((compiled, plan))

    random_device = _neuron_device(gm)

    def compiler(kind: str) -> Callable:
        extra = {"on_plan": keep_plan, "dynamo_inputs": list(example_inputs)} if kind == "inference" else {}
        return functools.partial(compile_graph, options=options, model=model, kind=kind,
                                 random_device=random_device, **extra)

    try:
        # torch's aot_compile forces aot_autograd's cache, which stores only inductor's output
        # code: our graphs are serialized as plans instead (precompile.NeuronCompiledFn).
        # oneDNN off while tracing: torch's LSTM decomposition picks mkldnn_rnn_layer (no lowering)
        # for CPU inputs when it is on (nn.LSTM under allow_rnn failed to compile).
        # Counted as torch's aot_autograd backends count themselves: DDPOptimizer (a DDP model's
        # graph split at its buckets) reads the count to know that the first call of what this
        # returns gives fake outputs (``fakify_first_call``) and makes that call itself; uncounted,
        # the user's first call got them (a FakeTensor on the CPU).
        torch._dynamo.utils.counters["aot_autograd"]["total"] += 1
        with options.applied(), linalg.checks_as_plain_ops(), _onednn_off(), \
                torch._functorch.config.patch(force_autograd_cache=False):
            wrapped = aot_module_simplified(
                functional.substitute(gm), list(example_inputs),
                fw_compiler=compiler("forward"),
                bw_compiler=compiler("backward"),
                inference_compiler=compiler("inference"),
                partition_fn=_partition,
                decompositions=decompositions.table(),
                keep_inference_input_mutations=False,
            )
    except (NeuronCompileError, torch._dynamo.exc.RestartAnalysis, *_DATA_DEPENDENT):
        # RestartAnalysis is Dynamo's own control flow: a Python float it made a graph input that
        # cannot stay one (TensorifyScalarRestartAnalysis) makes it trace again with the float fixed.
        # A value read while tracing (``x[torch.tensor(2)]``) is Dynamo's to handle, as it does for
        # inductor: it runs the frame eagerly (wrapped, it was a hard trace-stage error).
        raise
    except RuntimeError as exc:
        if not (on_device and _SUBCLASS_ALIASING in str(exc) and not _needs_grad(example_inputs)):
            return _trace_failed(exc, gm, options, model)
        # Inputs sharing device memory, some written (a view and its base, parameters that are
        # views of one flat buffer): aot_autograd refuses that for a tensor subclass, not for
        # plain tensors. Without autograd the graph runs on the neuron tensors' memory itself.
        return _on_inner_tensors(_aot_compile(gm, _inner(example_inputs), options, model), _device_outputs(gm))
    except Exception as exc:  # aot_autograd / decomposition failures: the trace stage
        return _trace_failed(exc, gm, options, model)
    # A plain inference graph runs as-is on Dynamo's inputs (on the inner tensors of neuron
    # tensors): skip aot_autograd's runtime wrapper, which costs more than the whole NEFF
    # call for small graphs.
    if _fakified_first_call():
        return _neuron_fakes_first(wrapped, _device_outputs(gm), autocopy.call_device(example_inputs))
    if not plain:
        return _on_call_device(wrapped) if on_device else wrapped
    compiled, plan = plain[0]
    if on_device:
        return _on_device(compiled.call_unboxed, _device_outputs(gm))
    return precompile.NeuronCompiledFn(compiled.call_unboxed, plan, options.options)


#: aot_autograd's refusal of inputs that share memory, one of them written, when they are subclasses.
_SUBCLASS_ALIASING = "aliased inputs that are mutated in the graph, but at least one input/output"


def _trace_failed(exc: Exception, gm: torch.fx.GraphModule, options: ResolvedOptions, model: str) -> Callable:
    """The trace stage's error for ``exc`` (aot_autograd's, a decomposition's), raised, or with
    fallback on, warned about and the graph run eagerly."""
    if isinstance(exc, TimeoutError | OSError):  # the NEFF cache's lock or disk, not the trace
        err = NeuronCompileError("compile", f"getting the NEFF failed: {type(exc).__name__}: {exc}", graph=model)
    else:
        err = NeuronCompileError("trace", f"aot_autograd could not trace the graph: {type(exc).__name__}: {exc}",
                                 graph=model)
    if not options.fallback:
        raise err from exc
    fallback.warn(err)
    return gm.forward


def _needs_grad(inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs)


def _inner(inputs: Sequence[Any]) -> list[Any]:
    return [a._data if isinstance(a, NeuronTensor) else a for a in inputs]


def _on_inner_tensors(fn: Callable, outputs: list[int]) -> Callable:
    """``fn``, compiled for the inner (host) tensors of neuron tensor arguments, called with them
    after the work queued on the device's streams; its outputs at ``outputs`` placed in device
    memory (a view of an argument's memory as a view of that argument)."""

    def call(*args: Any) -> list[Any]:
        index = autocopy.call_device(args)
        neuron = [a for a in args if isinstance(a, NeuronTensor)]
        results = list(autocopy.run_on(index, streams.launch, fn, *_inner(args)))
        for i in outputs:
            result = results[i]
            if isinstance(result, torch.Tensor) and not isinstance(result, NeuronTensor):
                source = next((a for a in neuron if result.untyped_storage().data_ptr()
                               == a._data.untyped_storage().data_ptr()), None)
                results[i] = alias(result, source) if source is not None else from_cpu(
                    result, stride=result.stride(), index=index, upload=False)
        return results

    return call


def _on_call_device(fn: Callable) -> Callable:
    """aot_autograd's callable, called with its neuron inputs' device current (it hands the graph
    the inner tensors, which say nothing of their device)."""
    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return autocopy.run_on(autocopy.call_device(args), fn, *args)

    return call


def _fakified_first_call() -> bool:
    context = torch._guards.TracingContext.try_get()
    return bool(context is not None and getattr(context, "fakify_first_call", False))


def _neuron_fakes_first(fn: Callable, positions: list[int], index: int) -> Callable:
    """``fn`` (aot_autograd's callable), whose first call gives fake outputs (``fakify_first_call``:
    DDPOptimizer, which splits a DDP model's graph at its buckets, makes that call while it
    compiles, to trace the next piece with them): those of the dense graph, plain fakes on the
    host, become neuron tensors over them. (Traced with a plain input, the next piece's backward
    handed the one before a plain gradient, which its backward refused.)"""
    first = [True]

    def call(*args: Any) -> Any:
        results = fn(*args)
        if not first[0]:
            return results
        first[0] = False
        results = list(results)
        for i in positions:
            result = results[i]
            if isinstance(result, torch._subclasses.FakeTensor) and not isinstance(result, NeuronTensor):
                results[i] = NeuronTensor(result, None, requires_grad=result.requires_grad, index=index)
        return results

    return call


def _on_device(fn: Callable, outputs: list[int]) -> Callable:
    """``fn`` called on the inner (host) tensors of neuron tensor arguments, with its outputs
    at ``outputs`` placed in device memory: what aot_autograd's wrapper does, in fewer steps."""

    def call(*args: Any) -> list[Any]:
        index = autocopy.call_device(args)
        results = autocopy.run_on(index, fn, *[a._data if type(a) is NeuronTensor else a for a in args])
        for i in outputs:
            results[i] = from_cpu(results[i], stride=results[i].stride(), index=index, upload=False)
        return results

    return call


def _value_key(value: Any) -> tuple:
    """A Python scalar as a key: floats by their bits (``-0.0`` is not ``0.0``: ``x / -0.0`` is
    ``-inf``; a NaN finds its own entry), others by value."""
    if type(value) is float:
        return ("float", value.hex())
    return (type(value).__name__, value)


def shape_specialized(gm: torch.fx.GraphModule, options: CompileOptions, model: str) -> Callable:
    """A graph with dynamic sizes restored from PyTorch's precompile cache, compiled at its calls."""
    return _ShapeSpecialized(gm, options.resolve(), model)


class _ShapeSpecialized(SerializableCallable):
    """Compiles a symbolic-shape Dynamo graph once per concrete input signature.

    Serializable by type only (torch's ``aot_compile`` takes it and runs it in the process): its
    NEFFs are made at its calls, so there is nothing to save; saving says so.

    Python scalars Dynamo turned into tensor inputs (``specialize_float=False``: the graph
    calls ``.item()`` on them) are part of the signature by value and enter the traced graph
    as constants: aot_autograd cannot trace ``.item()`` of a concrete input (Dynamo's own
    remedy, a restart with the scalar fixed, is over once the graph runs)."""

    def __init__(self, gm: torch.fx.GraphModule, options: ResolvedOptions, model: str) -> None:
        self.gm, self.options, self.model = gm, options, model
        self.compiled: dict[tuple, Callable] = {}
        self.scalars = _item_inputs(gm)
        # One NEFF for every size where the graph allows it (dynamo/dynamic.py), per value of the
        # scalars it reads (an attention scale under dynamic=True): decided at the first call with
        # those values, outside Dynamo's compile, whose tracing context a symbolic trace must not share.
        self.dynamic: dict[tuple, Callable | bool] = {}
        self.dynamic_allowed = bool(config.get("TORCH_NEURONX_DYNAMO_DYNAMIC_SHAPES"))

    @classmethod
    def serialize_compile_artifacts(cls, fn: Any) -> bytes:
        raise RuntimeError(
            "a graph Dynamo compiled with dynamic sizes (a second input shape, dynamic=True, or "
            "mark_dynamic) is compiled at its calls and cannot be saved: pass dynamic=False to "
            "torch.compile for one saved callable per shape, or use torch_neuronx.aot_compile (docs/aot.md)")

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        raise RuntimeError("no graph with dynamic sizes is ever saved by the neuron backend")

    @staticmethod
    def signature(args: Sequence[Any]) -> tuple:
        return tuple((tuple(a.shape), tuple(a.stride()), a.dtype, a.requires_grad)
                     if isinstance(a, torch.Tensor) else _value_key(a) for a in args)

    def __call__(self, *args: Any) -> Any:
        values = {i: args[i].item() for i in self.scalars} if self.scalars else {}
        scalars = tuple((i, _value_key(v)) for i, v in values.items())
        if self.dynamic_allowed:
            found = self.dynamic.get(scalars)
            if found is None:
                gm = _with_items_fixed(self.gm, values) if values else self.gm
                made = dynamic.compile_once(gm, args, self.options, self.model)
                self.dynamic[scalars] = made[0] if made is not None else False
                if made is not None:
                    return made[1]  # this call's results, computed (and checked) once
            elif found and found.accepts(args):
                return found(*args)
        key = (self.signature(args), scalars)
        fn = self.compiled.get(key)
        if fn is None:
            name = f"{self.model}_s{len(self.compiled)}"
            _log.info("compiling %s for input signature %s", name, key)
            gm = _with_items_fixed(self.gm, values) if values else self.gm
            fn = self.compiled[key] = _aot_compile(gm, args, self.options, name)
        return fn(*args)


def _is_item(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "item") or \
        (node.op == "call_function" and node.target in (torch.ops.aten._local_scalar_dense.default,
                                                         torch.ops.aten.item.default))


def _item_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the graph's inputs that it reads as Python scalars (``.item()``)."""
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(inputs) if any(_is_item(user) for user in n.users)]


def _with_items_fixed(gm: torch.fx.GraphModule, values: dict[int, Any]) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose ``.item()`` of input ``i`` is the constant ``values[i]``."""
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, value in values.items():
        for item in [user for user in inputs[i].users if _is_item(user)]:
            for user in list(item.users):
                user.args, user.kwargs = torch.fx.node.map_arg(
                    (user.args, user.kwargs), lambda n, item=item, value=value: value if n is item else n)
            gm.graph.erase_node(item)
    gm.recompile()
    return gm


def _neuron_device(gm: torch.fx.GraphModule) -> str | None:
    """The neuron device the Dynamo graph computes on (its first such value's), or None: its random
    ops draw from that device's generator, as they do in eager (aot_autograd's graph of it holds
    the neuron tensors' inner host tensors, and so its random ops are placed on the host)."""
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return f"neuron:{value.device.index or 0}"
    return None


def _device_outputs(gm: torch.fx.GraphModule, factories_only: bool = False) -> list[int]:
    """Positions of the Dynamo graph's outputs on the ``neuron`` device.

    ``factories_only``: those made by factories alone (``torch.zeros(device="neuron")``).
    Traced, such values are plain tensors rather than neuron tensors (fake tensors know
    the device only by name), so aot_autograd does not place them: the backend does.
    """
    outputs = gm.graph.output_node().args[0]
    values = [node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
              for node in (outputs if isinstance(outputs, list | tuple) else ())]
    return [i for i, v in enumerate(values) if isinstance(v, torch.Tensor) and v.device.type == "neuron"
            and not (factories_only and isinstance(v, NeuronTensor))]


def _placing_outputs(fn: Callable, positions: list[int]) -> Callable:
    """``fn`` with its host-tensor outputs at ``positions`` moved into device memory."""

    def call(*args: Any) -> Any:
        index = autocopy.call_device(args)
        results = list(autocopy.run_on(index, fn, *args))
        for i in positions:
            result = results[i]
            if type(result) is torch.Tensor:
                # One that autograd tracks (a factory's tensor written with values that require
                # grad) moves by a differentiable copy: placed as is, it lost its grad_fn.
                results[i] = result.to(f"neuron:{index}") if result.requires_grad else from_cpu(
                    result, stride=result.stride(), index=index, upload=False)
        return results

    return call


#: ``torch.compile``'s modes: accepted, and compiled alike (the NEFF is the same whichever is asked for).
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   options: CompileOptions | dict | None = None, mode: str | None = None, **_: Any) -> Callable:
    """The ``neuron`` backend: compile a Dynamo graph through the Neuron compile path.

    CPU inputs of a graph on the device are copied there on each call, or refused with
    TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY=1 (:mod:`torch_neuronx.dynamo.autocopy`).
    ``mode`` is one of ``torch.compile``'s, all compiled alike; another is an error, as inductor's.
    """
    if mode not in _MODES:
        raise ValueError(f"Unrecognized mode={mode}, should be one of: {', '.join(m for m in _MODES if m)} "
                         "(the neuron backend compiles every mode alike)")
    if any(isinstance(x, list | tuple | dict) for x in example_inputs):
        # Graphs with bumpy inputs: compiled autograd's backward graph takes its inputs as one
        # list (aot_autograd refused it: "all flat_args must be KNOWN_TYPES"). Flattened as
        # torch's own aot_autograd backends do, then compiled as any graph.
        return flat_inputs.compiled_flat(gm, example_inputs, functools.partial(neuron_backend, options=options),
                                         _is_symbolic)
    tracing_threads.install()  # before aot_autograd's trace patches nn.Module for the process
    aliases.install()
    cpu_inputs, index = autocopy.cpu_inputs(example_inputs)
    if cpu_inputs:
        if autocopy.autocopy_disabled():
            return autocopy.refusing_inputs(gm, example_inputs, cpu_inputs, index)
        example_inputs = autocopy.traced_as_neuron(gm, example_inputs, cpu_inputs, index)
    compiled = _compile_dynamo_graph(gm, example_inputs, options)
    # Without a neuron tensor among its inputs, the graph was traced, and runs, on plain tensors:
    # every output on the device is placed (``torch.tensor([...], device="neuron")``, whose traced
    # value is a neuron tensor, came back on the host). With one, those made by factories alone.
    positions = _device_outputs(gm, factories_only=any(isinstance(a, NeuronTensor) for a in example_inputs))
    if positions:
        compiled = _placing_outputs(compiled, positions)
    return autocopy.copying_inputs(compiled, cpu_inputs, index) if cpu_inputs else compiled


_DATA_DEPENDENT = (torch._subclasses.fake_tensor.DataDependentOutputException,
                   torch._subclasses.fake_tensor.DynamicOutputShapeException)


def _compile_dynamo_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                          options: CompileOptions | dict | None) -> Callable:
    opts = CompileOptions.from_any(options)
    resolved = opts.resolve()  # once, for the whole compilation; an unknown target fails here
    model = _model_name(opts)
    if _is_symbolic(example_inputs):
        precompile.record_graph(gm, opts, model)
        return _ShapeSpecialized(gm, resolved, model)
    plan_key = plans.dynamo_key(gm, example_inputs, resolved)
    plan = plans.load(plan_key) if plan_key else None
    if plan is not None:
        _log.info("warm start of %s from plan %s", model, plan_key)
        precompile.record(gm, plan, opts)
        with resolved.applied(), stats.compiling(gm, model, "inference", node_count=plan.node_count):
            compiled = from_plan(plan, resolved, gm, name=f"{model}_inference")
        return precompile.NeuronCompiledFn(compiled.call_unboxed, plan, opts)
    return _aot_compile(gm, example_inputs, resolved, model, plan_key)
