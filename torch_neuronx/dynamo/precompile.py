"""Our backend's result, serializable: PyTorch's precompile cache and ``aot_compile``.

The backend returns a :class:`NeuronCompiledFn` for every graph that runs from a plan
(plain inference graphs on host tensors): a :class:`SerializableCallable`, so
``torch.compile(m, backend="neuron", fullgraph=True).forward.aot_compile(...)`` can save
it; its serialized form is the plan and the compile options (:func:`payload`).

With TORCH_CACHING_PRECOMPILE=1 PyTorch saves whole Dynamo frames (bytecode,
guards and each graph's backend result) under ``{TORCHINDUCTOR_CACHE_DIR}/dynamo``
and a later process installs them without tracing. The neuron backend's result
is the compiled graph's plan (its StableHLO and calling metadata, see
``plans.py``): restoring it only fetches the NEFF from the NEFF cache and loads it. A graph
with dynamic sizes is stored as the Dynamo graph itself (:func:`record_graph`), compiled at
its calls in the new process.
Entries are split per rank (``dynamo/rank{RANK}``) when RANK is set, and saved at
process exit. Graphs that need aot_autograd at run time (training graphs) are
not stored: PyTorch then traces their frame again. A saved frame PyTorch cannot
install (a Hugging Face model's frame failed in torch's guard code with an
AttributeError, which ``torch.compile`` let through, killing the serving process;
its own fallback for a RuntimeError fails too) is dropped with a warning, and the
frame is traced again (:func:`_installs_or_retraces`).
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import itertools
import json
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

from torch_neuronx import observe, process
from torch_neuronx.compiler.options import CompileOptions
from torch_neuronx.dynamo import plans

_log = logging.getLogger("torch_neuronx.dynamo.precompile")
_save_registered = False


def enabled() -> bool:
    """Whether PyTorch's precompile cache is on (torch reads TORCH_CACHING_PRECOMPILE at import)."""
    return bool(torch._dynamo.config.caching_precompile)


@dataclasses.dataclass
class NeuronPrecompileArtifact(BackendCacheArtifact[Any]):
    """A plan (JSON) and the compile options it was built with, restored as a callable graph."""

    def after_deserialization(self) -> Any:
        observe.count("precompile_restores")
        _separate_global_names()
        return restore(self.content)


_names_separated = False


def _separate_global_names() -> None:
    """Start this process's Dynamo global names where a restored frame's cannot be.

    A restored frame installs the globals its guards read under the names its saving
    process gave them (``__builtins_dict___0``: a counter, no uuid). A recompile of that
    frame here (a new shape) counts from 0 too, takes the same name and Dynamo stops
    with "Name '__builtins_dict___0' already exists in scope". Moving this process's
    counter to a random 48-bit offset keeps the names apart.
    """
    global _names_separated
    if _names_separated:
        return
    _names_separated = True
    from torch._dynamo import bytecode_transformation

    start = max(next(bytecode_transformation._unique_id_counter), secrets.randbits(48))
    bytecode_transformation._unique_id_counter = itertools.count(start)


def option_fields(options: CompileOptions) -> dict[str, Any]:
    """The fields of ``options`` that are set (JSON); :meth:`CompileOptions.from_any` reads them back."""
    return {k: v for k, v in dataclasses.asdict(options).items() if v not in (None, ())}


def payload(plan: plans.Plan, options: CompileOptions) -> str:
    """The serialized form of a compiled graph: its plan and the options it was built with (JSON)."""
    return json.dumps({"plan": dataclasses.asdict(plan), "options": option_fields(options)})


def read_payload(content: str | bytes) -> tuple[plans.Plan, CompileOptions]:
    """The plan and options of a :func:`payload`."""
    return _plan_fields(json.loads(content))


def _plan_fields(fields: dict[str, Any]) -> tuple[plans.Plan, CompileOptions]:
    return plans.Plan(**fields["plan"]), CompileOptions.from_any(fields["options"])


def restore(content: str | bytes) -> Any:
    """The compiled graph of a :func:`payload`: its NEFF from the NEFF cache (compiled from the
    plan's StableHLO on a miss), loaded: no tracing, no lowering. A graph with dynamic sizes
    (:func:`record_graph`) is its Dynamo graph again, compiled at its calls."""
    from torch_neuronx.dynamo.graph import from_plan_unboxed

    fields = json.loads(content)
    if "graph" in fields:
        return _restore_graph(fields)
    plan, options = _plan_fields(fields)
    return NeuronCompiledFn(from_plan_unboxed(plan, options.resolve()), plan, options)


#: Node metadata a pickled Dynamo graph leaves out (module stacks and sources name live objects).
_UNPICKLED_META = ("nn_module_stack", "source_fn_stack", "stack_trace")


def _graph_bytes(gm: torch.fx.GraphModule) -> bytes:
    """``gm`` pickled with its nodes' symbolic values (what its dynamic NEFF's trace reads), or
    without the placeholders' ``example_value`` when those do not pickle."""
    from torch.fx._graph_pickler import GraphPickler, Options

    kept = [(node, {k: node.meta.pop(k) for k in _UNPICKLED_META if k in node.meta}) for node in gm.graph.nodes]
    try:
        try:
            return GraphPickler.dumps(gm, Options(ops_filter=None))
        except Exception:  # noqa: BLE001 - a value that does not pickle: the metadata torch itself drops
            values = [(node, node.meta.pop("example_value")) for node in gm.graph.nodes if "example_value" in node.meta]
            try:
                return GraphPickler.dumps(gm, Options(ops_filter=None))
            finally:
                for node, value in values:
                    node.meta["example_value"] = value
    finally:
        for node, meta in kept:
            node.meta.update(meta)


def record_graph(gm: torch.fx.GraphModule, options: CompileOptions, model: str) -> None:
    """Offer ``gm`` itself as its backend result to PyTorch's precompile cache: a graph with dynamic
    sizes, whose NEFFs are made at its calls (a frame that saw a second batch size was never
    restored: torch found no backend for that graph and dropped the whole frame)."""
    backend_id = getattr(gm, "_backend_id", None)
    if not enabled() or backend_id is None:
        return
    try:
        graph = base64.b64encode(_graph_bytes(gm)).decode()
    except Exception as exc:  # noqa: BLE001 - not stored: the frame is traced again in a new process
        _log.info("a graph with dynamic sizes is not stored in the precompile cache: %s", exc)
        return
    content = json.dumps({"graph": graph, "options": option_fields(options), "model": model})
    _record(NeuronPrecompileArtifact(key=backend_id, content=content))


def _restore_graph(fields: dict[str, Any]) -> Any:
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from torch_neuronx.dynamo.backend import shape_specialized

    gm = GraphPickler.loads(base64.b64decode(fields["graph"]), FakeTensorMode(shape_env=ShapeEnv()))
    gm.meta.pop("dynamo_compile_id", None)  # no Dynamo sources to guard on: aot_autograd's plain route
    gm.recompile()
    return shape_specialized(gm, CompileOptions.from_any(fields["options"]), fields["model"])


class NeuronCompiledFn(SerializableCallable):
    """The backend's result for a graph that runs from a plan: Dynamo's calling convention
    over the compiled graph, serializable as its plan (``torch._dynamo.aot_compile``)."""

    __slots__ = ("fn", "plan", "options")

    def __init__(self, fn: Callable[..., Any], plan: plans.Plan, options: CompileOptions) -> None:
        self.fn, self.plan, self.options = fn, plan, options

    @property
    def compiled_graph(self) -> Any:
        """The :class:`~torch_neuronx.pipeline.graph.CompiledGraph` that runs the graph."""
        return getattr(self.fn, "__self__", None)

    @classmethod
    def serialize_compile_artifacts(cls, fn: NeuronCompiledFn) -> bytes:
        return payload(fn.plan, fn.options).encode()

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> NeuronCompiledFn:
        return restore(data)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _installs_or_retraces() -> None:
    """Make a failure of ``CompilePackage.install`` a warning and a fresh package (the frame is
    traced again): ``torch.compile`` let any error but a RuntimeError through, and for a
    RuntimeError re-initialized the package, which asserts that it is not initialized."""
    from torch._dynamo.package import CompilePackage

    install = CompilePackage.install
    if getattr(install, "_neuron_wrapped", False):
        return

    def install_or_start_afresh(self: Any, backends: Any) -> Any:
        try:
            return install(self, backends)
        except Exception as exc:  # noqa: BLE001 - any saved frame that cannot be installed
            _log.warning("could not install a saved Dynamo frame (%s: %s); tracing it again",
                         type(exc).__name__, exc)
            fn = self._innermost_fn
            try:
                self.uninstall()
            except Exception:  # noqa: BLE001 - what the failed install left is dropped below
                pass
            self._initialized = False
            self.initialize(fn, None, ignore_inlined_sources=False)
            return None

    install_or_start_afresh._neuron_wrapped = True  # type: ignore[attr-defined]
    CompilePackage.install = install_or_start_afresh  # type: ignore[method-assign]


_installs_or_retraces()


def _per_rank_store() -> None:
    """Point PyTorch's Dynamo cache at a rank{RANK} subdirectory when RANK is set."""
    if "RANK" not in os.environ:
        return
    from torch._dynamo.package import DynamoCache, cache_dir

    root = os.path.join(cache_dir(), "dynamo")
    DynamoCache.path_prefix = lambda: process.rank_dir(root)  # type: ignore[method-assign]


def _save_at_exit() -> None:
    try:
        PrecompileContext.save_to_dynamo_cache()
    except Exception as exc:  # a cache write must never fail the program at exit
        _log.warning("could not save the Dynamo precompile cache: %s", exc)


def record(gm: torch.fx.GraphModule, plan: plans.Plan, options: CompileOptions) -> None:
    """Offer ``plan`` as the backend result of ``gm`` to PyTorch's precompile cache."""
    backend_id = getattr(gm, "_backend_id", None)
    if not enabled() or backend_id is None:
        return
    _record(NeuronPrecompileArtifact(key=backend_id, content=payload(plan, options)))


def _record(artifact: NeuronPrecompileArtifact) -> None:
    global _save_registered
    PrecompileContext.record_artifact(artifact)
    if not _save_registered:
        _per_rank_store()
        atexit.register(_save_at_exit)
        _save_registered = True
