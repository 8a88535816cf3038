"""Ahead-of-time compilation: a model compiled once into a guard-free callable, saved and loaded.

:func:`aot_compile` traces ``model`` with Dynamo once (``fullgraph=True``, static shapes,
no grad) through PyTorch's ``aot_compile`` path, whose result runs Dynamo's transformed
bytecode without the frame hook and, here, without Dynamo's guards. :class:`AOTCompiled`
replaces those guards with its own checks of what the graph was compiled for: the number of
arguments, each tensor's shape, dtype and device, each Python scalar's value; a mismatch is an
:class:`AOTInputError` naming the argument, never a wrong result.

:meth:`AOTCompiled.save` writes a package (:mod:`torch_neuronx.dynamo.package`): PyTorch's
serialized function, whose backend state is the graph's plan, and the NEFFs it runs.
:func:`aot_load` restores it in a serving process without tracing, lowering or compiling:
the NEFFs go from the package straight to the runtime.

What is not checked per call: grad mode (outputs never require grad: inference only), the
module's parameters (read from the module at each call, as ``torch.compile`` reads them;
:func:`aot_load` checks their names, shapes and dtypes once), global state Dynamo would guard.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any
from unittest import mock

import torch
import torch.utils._pytree as pytree
from torch._dynamo.aot_compile import AOTCompiledFunction
from torch._dynamo.convert_frame import get_traced_fn
from torch._dynamo.eval_frame import innermost_fn

from torch_neuronx.cache import store
from torch_neuronx.compiler.options import CompileOptions
from torch_neuronx.dynamo import package
from torch_neuronx.dynamo.precompile import NeuronCompiledFn, option_fields
from torch_neuronx.format import neff as neff_format

__all__ = ["AOTCompileError", "AOTCompiled", "AOTInputError", "aot_compile", "aot_load"]

_log = logging.getLogger("torch_neuronx.dynamo.aot")
_MODEL = "model"  # the external-data key of the module in PyTorch's serialized function
_MARKS = ("dynamic", "weak_dynamic", "unbacked", "strict_unbacked")  # Dynamo's per-tensor dim marks
_HEADER_FIELDS = ("name", "inputs", "module", "bound", "parameters", "options", "environment")


class AOTCompileError(RuntimeError):
    """A model that :func:`aot_compile` cannot compile into a serializable callable."""


class AOTInputError(ValueError):
    """A call of an :class:`AOTCompiled` with inputs other than those it was compiled for."""


def _spec(value: Any, where: str) -> list[Any]:
    """The JSON description of one example input: a tensor's shape, dtype and device, or a scalar."""
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise AOTCompileError(f"aot_compile: {where} is a {type(value).__name__}; AOT-compiled "
                                  "callables take plain host tensors")
        marked = sorted(set().union(*(getattr(value, f"_dynamo_{kind}_indices", ()) for kind in _MARKS)))
        if marked:
            raise AOTCompileError(
                f"aot_compile: {where} has dimension(s) {marked} marked dynamic (torch._dynamo.mark_dynamic "
                "or its kin); an AOT-compiled callable serves the example inputs' exact shapes. Compile "
                "one per shape (on an unmarked tensor), or serve varying sizes through torch.compile("
                "model, backend='neuron', dynamic=True), which compiles one NEFF for every size")
        return ["tensor", list(value.shape), str(value.dtype).removeprefix("torch."), str(value.device)]
    if value is None or type(value) in (bool, int, float, str):
        return ["value", value]
    raise AOTCompileError(f"aot_compile: {where} is a {type(value).__name__}; AOT-compiled callables "
                          "take tensors and Python scalars (bool, int, float, str, None)")


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types an AOT callable takes


def _check(spec: list[Any]) -> tuple[Any, ...]:
    """The per-call form of a spec: (torch.Size, dtype, device) or (None, value, type)."""
    if spec[0] == "tensor":
        return torch.Size(spec[1]), getattr(torch, spec[2]), torch.device(spec[3])
    return None, spec[1], type(spec[1])


def _describe(spec: list[Any]) -> str:
    if spec[0] == "tensor":
        return f"a {spec[3]} tensor of shape {tuple(spec[1])} and dtype {spec[2]}"
    return f"the {type(spec[1]).__name__} {spec[1]!r}"


class AOTCompiled:
    """A compiled model's guard-free callable with its own input checks; :meth:`save` packages it.

    Call it as the model is called. It runs Dynamo's transformed bytecode (which reads the
    module's parameters and calls the compiled graph) after checking the inputs against the
    example inputs it was compiled for.
    """

    def __init__(self, function: AOTCompiledFunction, model: torch.nn.Module | None,
                 inputs: Mapping[str, Any], name: str, source: str = "", bound: Any = None) -> None:
        """``model``: the module the package needs at load (its parameters); ``bound``: the object the
        traced function takes first (``self`` of a module's ``__call__``), or None."""
        compiled_fn = function._artifacts.compiled_fn
        if not isinstance(compiled_fn, NeuronCompiledFn):
            raise AOTCompileError(f"aot_compile: {name}'s graph is not served by the neuron backend's "
                                  f"plan (got {type(compiled_fn).__name__})")
        function.disable_guard_check()
        self.name, self.source = name, source
        self._function, self._model, self._compiled_fn, self._bound = function, model, compiled_fn, bound
        self._inputs = {"args": [list(s) for s in inputs["args"]],
                        "kwargs": {k: list(s) for k, s in inputs["kwargs"].items()}}
        specs = [*enumerate(self._inputs["args"]), *self._inputs["kwargs"].items()]
        self._checks = tuple((key, *_check(spec)) for key, spec in specs)  # key: position or name
        self._nargs, self._kwarg_names = len(self._inputs["args"]), frozenset(self._inputs["kwargs"])
        self._parameter_specs = _parameters(model)  # as compiled (a package records these)
        self._tied = _tied(model)
        forward = function.fn  # Dynamo's bytecode as a plain function: no guards, no frame hook
        self._forward = forward if bound is None else functools.partial(forward, bound)
        names = forward.__globals__  # this function's own globals: the bytecode calls the
        if names.get(function._artifacts.backend_id) is compiled_fn:  # graph through one of them
            names[function._artifacts.backend_id] = compiled_fn.fn  # one Python frame less per call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) != self._nargs or (kwargs.keys() != self._kwarg_names):
            raise self._mismatch(args, kwargs)
        for key, shape, dtype, device in self._checks:  # device: a scalar's type
            value = args[key] if key.__class__ is int else kwargs[key]
            if shape is None:
                # (a NaN compiled for is the NaN given: ``!=`` alone refused it at every call)
                if type(value) is not device or (value != dtype and (value == value or dtype == dtype)):
                    raise self._mismatch(args, kwargs)
            elif (value.__class__ not in _PLAIN or value.shape != shape or value.dtype != dtype
                  or value.device != device):
                raise self._mismatch(args, kwargs)
        if self._tied:
            self._check_tied()
        return self._forward(*args, **kwargs)

    def _check_tied(self) -> None:
        """Parameters that were one tensor when compiled (an embedding tied to the LM head) must
        still be: the graph reads one of them for all (it computed with the old one, silently)."""
        for paths in self._tied:
            first = functools.reduce(getattr, paths[0], self._model)
            for path in paths[1:]:
                if functools.reduce(getattr, path, self._model) is not first:
                    raise AOTInputError(
                        f"AOT-compiled {self.name}: {'.'.join(path)} and {'.'.join(paths[0])} were one tensor "
                        "(tied) when it was compiled and are two now; the compiled graph reads one for "
                        "both. Compile it again for the untied module.")

    def _mismatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> AOTInputError:
        """The error for a call whose inputs differ from the compiled ones, naming the first that does."""
        where = f"AOT-compiled {self.name}" + (f" (from {self.source})" if self.source else "")
        expected = self._inputs
        if len(args) != len(expected["args"]):
            return AOTInputError(f"{where} takes {len(expected['args'])} positional arguments, got {len(args)}")
        if kwargs.keys() != expected["kwargs"].keys():
            return AOTInputError(f"{where} takes keyword arguments {sorted(expected['kwargs'])}, "
                                 f"got {sorted(kwargs)}")
        given = [(f"args[{i}]", a, s) for i, (a, s) in enumerate(zip(args, expected["args"]))]
        given += [(f"kwargs[{k!r}]", kwargs[k], s) for k, s in expected["kwargs"].items()]
        for label, value, spec in given:
            if isinstance(value, torch.Tensor) and type(value) not in _PLAIN and value.device.type == "cpu":
                return AOTInputError(f"{where}: {label} is a {type(value).__name__} (a tensor subclass); "
                                     f"it was compiled for {_describe(spec)}: pass a plain tensor")
            if isinstance(value, torch.Tensor):
                actual = ["tensor", list(value.shape), str(value.dtype).removeprefix("torch."), str(value.device)]
            else:
                actual = ["value", value] if value is None or type(value) in (bool, int, float, str) else []
            if actual != spec or (actual[0] == "value" and type(actual[1]) is not type(spec[1])):
                got = _describe(actual) if actual else f"a {type(value).__name__}"
                return AOTInputError(f"{where}: {label} is {got}; it was compiled for {_describe(spec)}. "
                                     "Compile it again for these inputs (shapes are static).")
        return AOTInputError(f"{where}: inputs differ from those it was compiled for")

    @property
    def compiled_graph(self) -> Any:
        """The :class:`~torch_neuronx.pipeline.graph.CompiledGraph` the callable runs."""
        return self._compiled_fn.compiled_graph

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the package (Dynamo state, plan, NEFFs) to ``path`` atomically."""
        sections, header = self._package("save")
        package.write(path, sections, header)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle (and ``copy.deepcopy``) as the package's bytes and the module, which is pickled too."""
        sections, header = self._package("pickle")
        return _unpickle, (package.encode(sections, header), self._model, self.name)

    def _package(self, verb: str) -> tuple[dict[str, bytes], dict[str, Any]]:
        """The sections and header of this callable's package; ``verb`` names the caller in errors."""
        if self._bound is not None and self._bound is not self._model:
            raise AOTCompileError(f"cannot {verb} AOT-compiled {self.name}: it is a method of a "
                                  f"{type(self._bound).__name__}, which a package cannot supply at load")
        graph = self.compiled_graph
        neff = graph._neff() if callable(graph._neff) else graph._neff
        graph._neff = neff
        # A graph with resident parameters ships its NEFF that takes them as arguments too: the
        # one a server runs with TORCH_NEURONX_RESIDENT_PARAMETERS=0 or weights changing per call.
        neffs = [neff] + ([graph._argument_neff()] if graph._argument_neff is not None else [])
        sections = {f"neff/{n.header.key}": neff_format.encode(
            bytes(n.payload), target=n.header.target, compiler_version=n.header.compiler_version,
            key=n.header.key, signature=n.header.signature, metadata=n.header.metadata) for n in neffs}
        external = {_MODEL: self._model} if self._model is not None else {}
        try:
            dynamo = AOTCompiledFunction.serialize(self._function, external).serialized_data
        except RuntimeError as exc:
            raise AOTCompileError(f"cannot {verb} AOT-compiled {self.name}: {exc}") from exc
        options = self._compiled_fn.options
        return {"dynamo": dynamo, **sections}, {
            "name": self.name, "inputs": self._inputs, "module": self._model is not None,
            "bound": self._bound is not None,
            "parameters": self._parameter_specs,
            "options": option_fields(options),
            "environment": package.environment(options.resolve()),
        }


def _unpickle(data: bytes, model: torch.nn.Module | None, name: str) -> AOTCompiled:
    """An :class:`AOTCompiled` from its pickled package bytes (checked as a package file is)."""
    return _restore(package.decode(data, f"<pickled {name}>"), f"<pickled {name}>", model)


def _parameters(model: torch.nn.Module | None) -> dict[str, list[Any]]:
    """Name → [shape, dtype, device type] of the module's parameters and buffers (checked once at
    load; packages written before the device was recorded hold [shape, dtype])."""
    if model is None:
        return {}
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: [list(t.shape), str(t.dtype).removeprefix("torch."), t.device.type] for name, t in tensors.items()}


def _run_as_is_under_dynamo() -> None:
    """An AOT callable inside a compiled function runs as it is, between the graphs around it:
    Dynamo neither inlines it (this module is in its skip list) nor traces the frames it calls
    (its ``__call__`` skips them all). Dynamo tracing into a loaded callable's deserialized
    function failed ("InternalTorchDynamoError: KeyError: __builtins__"), as torch's own loaded
    AOT functions do."""
    from torch._C._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    torch._dynamo.trace_rules.add(__name__)
    set_code_exec_strategy(AOTCompiled.__call__.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


def _tied(model: torch.nn.Module | None) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """The attribute paths of each tensor the module holds under several names (tied weights)."""
    if model is None:
        return ()
    names: dict[int, list[tuple[str, ...]]] = collections.defaultdict(list)
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names[id(t)].append(tuple(name.split(".")))
    return tuple(tuple(paths) for paths in names.values() if len(paths) > 1)


@contextlib.contextmanager
def _lean_bytecode() -> Iterator[None]:
    """Dynamo's bytecode for the frame without per-call work a host-tensor graph has no use for.

    With the ``neuron`` device registered, ``torch.accelerator`` is available, so Dynamo
    registers the current stream of every frame it traces and the bytecode fetches it
    (``torch.accelerator.current_stream``) and stores a weak reference to it on every call,
    for graphs that use streams; ``record_runtime_overhead`` adds a profiler record around
    the pre-graph code. Together about 7 us per call here. A frame that does use streams
    then fails to trace (an error, not a wrong result). The patch holds for the whole process
    while ``aot_compile`` traces (another thread tracing then also sees no current stream).
    """
    from torch._dynamo.variables import streams

    def no_current_stream(state: Any) -> None:
        state.cur_stream_stack = collections.deque()

    with torch._dynamo.config.patch(record_runtime_overhead=False), \
            mock.patch.object(streams.SymbolicStreamState, "__init__", no_current_stream):
        yield


def aot_compile(model: Any, example_inputs: Any, example_kwargs: Mapping[str, Any] | None = None, *,
                options: CompileOptions | Mapping[str, Any] | None = None) -> AOTCompiled:
    """Compile ``model`` (a module or function) for ``example_inputs`` into an :class:`AOTCompiled`.

    ``example_inputs``: a tuple of positional arguments (or one tensor); ``example_kwargs``:
    keyword arguments. Inputs are host tensors and Python scalars; the graph is compiled
    for their exact shapes and dtypes, for inference (without grad), and must be one graph
    (``fullgraph=True``) that runs from a plan: no input mutations, no outputs aliasing inputs.
    ``options``: :class:`~torch_neuronx.compiler.CompileOptions` (or a dict of its fields).
    """
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    kwargs = dict(example_kwargs or {})
    inputs = {"args": [_spec(a, f"args[{i}]") for i, a in enumerate(args)],
              "kwargs": {k: _spec(v, f"kwargs[{k!r}]") for k, v in kwargs.items()}}
    opts = CompileOptions.from_any(options)
    fields = option_fields(opts)
    is_module = isinstance(model, torch.nn.Module)
    name = type(model).__name__ if is_module else getattr(model, "__qualname__", repr(model))
    compiled = torch.compile(model, backend="neuron", fullgraph=True, dynamic=False, options=fields or None)
    with torch.no_grad(), _lean_bytecode():
        try:
            target = compiled.forward if is_module else compiled
            function = target.aot_compile(_distinct(args, kwargs))
        except torch._dynamo.exc.PackageError as exc:
            raise AOTCompileError(
                f"aot_compile: torch cannot serialize what {name}'s code needs checked at call time "
                f"({exc}); a limit of torch's aot_compile that every backend shares (Hugging Face "
                "models hit it through their activation modules and decorators). Call it through "
                "torch.compile instead (docs/aot.md)") from exc
        except RuntimeError as exc:
            if "SerializableCallable" not in str(exc):
                raise
            raise AOTCompileError(
                f"aot_compile: {name} does not compile to a graph that runs from a plan (training "
                "graphs, inputs mutated in place, outputs that alias inputs, neuron tensors, or a "
                "compile that fell back to eager); call it through torch.compile instead") from exc
    # What PyTorch traced: a function, or a bound method (a module's __call__) taking its object first.
    _, bound = get_traced_fn(innermost_fn(target))
    module = model if is_module else bound if isinstance(bound, torch.nn.Module) else None
    return AOTCompiled(function, module, inputs, name, bound=bound)


def _distinct(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The example inputs with a tensor given for several arguments (``attention(q, q, q)``) given
    once, the others as copies: Dynamo makes such repeats one graph input, guarded by an identity
    check that the compiled callable drops, so later calls with distinct tensors computed as if
    each repeat were the first one."""
    seen: set[int] = set()

    def once(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in seen:
            return value.clone()
        seen.add(id(value))
        return value

    return pytree.tree_map(once, (args, kwargs))


def aot_load(path: str | os.PathLike[str], model: torch.nn.Module | None = None) -> AOTCompiled:
    """Load a package written by :meth:`AOTCompiled.save`: no tracing, lowering or compiling.

    ``model``: the module it was compiled from (its parameters are read at each call), for a
    package of a module. Raises :class:`~torch_neuronx.dynamo.package.PackageError` for a
    file that is not a package, is truncated or corrupt, or was built for another version
    or target, or when ``model``'s parameters differ from the compiled module's.
    """
    path = os.fspath(path)
    return _restore(package.read(path), path, model)


def _restore(content: tuple[dict[str, Any], dict[str, bytes]], path: str,
             model: torch.nn.Module | None) -> AOTCompiled:
    """The callable of a verified package's header and sections (``path`` names it in messages)."""
    header, sections = content
    missing = [k for k in _HEADER_FIELDS if k not in header] + [k for k in ("dynamo",) if k not in sections]
    if missing:
        raise package.PackageError(f"AOT package {path} lacks {missing}: not written by this torch_neuronx")
    options = CompileOptions.from_any(header["options"])
    package.check_environment(path, header["environment"], package.environment(options.resolve()))
    _check_model(path, header, model)
    neffs = {}
    for name, data in sections.items():
        if name.startswith("neff/"):
            try:
                neffs[name[5:]] = neff_format.decode(data, path=f"{path}:{name}")
            except neff_format.NeffFormatError as exc:
                raise package.PackageError(f"AOT package {path}: {exc}") from exc
    cache = store.neff_cache()
    if not cache.enabled:
        _log.warning("the NEFF cache is disabled (TORCH_NEURONX_NEFF_DISABLE_CACHE): the NEFFs of %s "
                     "are compiled again instead of loaded from the package", path)
    for key, neff in neffs.items():  # the NEFF lookup of the plan's restore finds them in memory
        cache._memory_put(key, neff)
    external = {_MODEL: model} if header["module"] else {}
    try:
        function = AOTCompiledFunction.deserialize(sections["dynamo"], external_closure_data=external)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise package.PackageError(f"AOT package {path}: its Dynamo state does not load here: "
                                   f"{type(exc).__name__}: {exc}") from exc
    loaded = AOTCompiled(function, model if header["module"] else None, header["inputs"], header["name"],
                         source=path, bound=model if header["bound"] else None)
    key = getattr(loaded.compiled_graph._neff, "header", None)
    if key is not None and key.key not in neffs:
        _log.warning("%s: the NEFF of %s was compiled again (key %s not in the package)", path,
                     header["name"], key.key[:16])
    return loaded


def _check_model(path: str, header: Mapping[str, Any], model: torch.nn.Module | None) -> None:
    if not header["module"]:
        return
    if not isinstance(model, torch.nn.Module):
        raise package.PackageError(f"AOT package {path} holds the compiled {header['name']} module: "
                                   "pass the module (its parameters) as aot_load(path, model)")
    expected, actual = header["parameters"], _parameters(model)
    differs = [f"{name}: compiled {expected.get(name)}, given {actual.get(name)}"
               for name in sorted(expected.keys() | actual.keys())
               if expected.get(name) is None or actual.get(name) is None
               or expected[name] != actual[name][:len(expected[name])]]
    if differs:
        raise package.PackageError(f"AOT package {path}: the given {type(model).__name__}'s parameters "
                                   "differ from the compiled module's (shape, dtype, device; keep the module "
                                   "where it was compiled):\n  " + "\n  ".join(differs[:10]))


_run_as_is_under_dynamo()
