"""``@torch_neuronx.kernel``: a Python function of tensors, compiled as its own NEFF.

Called eagerly with CPU tensors, a kernel is traced once per argument signature
(tensor shapes and dtypes plus the values of its declared arguments: the ints,
floats, bools, strings, ``None`` and dtypes among its arguments, which may
steer control flow), lowered to StableHLO, compiled through the NEFF cache and
run on the runtime; the result has the structure the function returns, with
CPU tensors. Under ``torch.compile`` (any backend), a tracer such as
``make_fx`` or a functorch transform, the function body simply runs inline, so
it becomes part of the surrounding graph.

Traces persist across processes in the NKI trace cache (see
:mod:`torch_neuronx.kernels.trace_cache`): a hit skips tracing and lowering.
The kernel is assumed to be a pure function of its declared arguments and its
source; a value read from elsewhere that steers control flow must be passed as
an argument, or a change to it may be served a stale trace.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from torch_neuronx import observe
from torch_neuronx.cache.keys import CacheKey, canonical_json
from torch_neuronx.kernels import trace_cache, wheels
from torch_neuronx.pipeline import trace as trace_mod
from torch_neuronx.pipeline.graph import CompiledGraph
from torch_neuronx.pipeline.plan import tensor_spec
from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

_log = logging.getLogger("torch_neuronx.kernels")

P = ParamSpec("P")
R = TypeVar("R")

#: Types a declared (non-tensor) argument may have: their values are part of the trace signature.
DECLARED_TYPES = (type(None), bool, int, float, str, torch.dtype)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _runs_inline(tensors: list[torch.Tensor]) -> bool:
    """Whether the body should run as Python: a tracer or transform is recording it, not executing."""
    return (is_in_torch_dispatch_mode()  # make_fx, FakeTensorMode, ...
            or torch._C._functorch.peek_interpreter_stack() is not None  # vmap, grad, functionalize
            or any(type(t) not in _PLAIN_TENSORS for t in tensors))  # FakeTensor and other subclasses


class Kernel(Generic[P, R]):
    """A user kernel: call it like the function it wraps (see the module docstring).

    Attributes:
        fn: the wrapped Python function.
        name: its module and qualified name, as the trace cache and messages name it.
    """

    def __init__(self, fn: Callable[P, R]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = f"{fn.__module__}.{fn.__qualname__}"
        self._signature = inspect.signature(fn)
        self._compiled: dict[str, tuple[CompiledGraph, pytree.TreeSpec]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<torch_neuronx.kernel {self.name}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        leaves, structure = pytree.tree_flatten(dict(bound.arguments))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if tensors and all(isinstance(t, NeuronTensor) for t in tensors):
            # neuron tensors: the same compiled kernel runs on their device memory.
            data = [t._data for t in tensors]
            values = iter(data)
            host = [next(values) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            result = self(**pytree.tree_unflatten(host, structure))
            return pytree.tree_map(lambda t: from_cpu(t, upload=False) if isinstance(t, torch.Tensor) else t, result)
        if _runs_inline(tensors):
            return self.fn(*args, **kwargs)
        self._check(leaves, tensors)
        declared = {"structure": str(structure),
                    "values": [None if isinstance(leaf, torch.Tensor) else [type(leaf).__name__, leaf]
                               for leaf in leaves]}
        specs = [tensor_spec(t) for t in tensors]
        signature = canonical_json([declared, specs])
        entry = self._compiled.get(signature)
        if entry is None:
            with self._lock:
                entry = self._compiled.get(signature)
                if entry is None:
                    entry = self._compiled[signature] = self._build(leaves, structure, tensors, declared, specs)
        compiled, out_spec = entry
        return pytree.tree_unflatten(compiled(list(tensors)), out_spec)

    def _check(self, leaves: list[Any], tensors: list[torch.Tensor]) -> None:
        for leaf in leaves:
            if not isinstance(leaf, (torch.Tensor, *DECLARED_TYPES)):
                raise TypeError(
                    f"kernel {self.name}: an argument of type {type(leaf).__name__} is neither a tensor nor a "
                    "declared argument (None, bool, int, float, str, torch.dtype); pass plain values, or "
                    "tensors, in lists, tuples or dicts")
        for t in tensors:
            if t.device.type != "cpu" or t.layout != torch.strided:
                raise ValueError(f"kernel {self.name}: eager calls take dense CPU tensors, got a {t.layout} "
                                 f"tensor on {t.device}; move it with .cpu() or call the kernel inside "
                                 "torch.compile")
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise RuntimeError(f"kernel {self.name}: eager kernel calls are not differentiable; call it inside "
                               "torch.compile (which traces its body into the graph) or under torch.no_grad()")

    @functools.cached_property
    def _source(self) -> tuple[str, str] | None:
        """The function's source and file, or None (with a warning) when Python cannot find them."""
        try:
            return inspect.getsource(self.fn), inspect.getsourcefile(self.fn) or self.fn.__code__.co_filename
        except (OSError, TypeError) as exc:
            _log.warning("kernel %s: its source cannot be read (%s), so its traces are not persisted in the "
                         "NKI trace cache", self.name, exc)
            return None

    def _key(self, declared: Any, specs: Any) -> CacheKey | None:
        if self._source is None:
            return None
        source, path = self._source
        return trace_cache.trace_key(kernel=self.name, source=source, declared=declared, tensors=specs,
                                     wheels=list(wheels.versions([path]).values()))

    def _build(self, leaves: list[Any], structure: pytree.TreeSpec, tensors: list[torch.Tensor],
               declared: Any, specs: Any) -> tuple[CompiledGraph, pytree.TreeSpec]:
        key = self._key(declared, specs) if trace_cache.enabled() else None
        found = trace_cache.get(key) if key is not None else None
        if found is not None:
            observe.count("kernel_trace_cache_hits")
            _log.debug("kernel %s: trace cache hit %s", self.name, key.digest)
            return trace_mod.load(found), found.result_spec()
        if key is not None:
            observe.count("kernel_trace_cache_misses")
            _log.info("kernel %s: trace cache miss %s (components %s)", self.name, key.digest, key.components)

        def call(inputs: list[torch.Tensor]) -> Any:
            it = iter(inputs)
            values = [next(it) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            bound = inspect.BoundArguments(self._signature, pytree.tree_unflatten(values, structure))
            return self.fn(*bound.args, **bound.kwargs)

        name = f"kernel_{self.fn.__name__}_{len(self._compiled)}"
        compiled, traced, out_spec = trace_mod.trace(call, name, [t.detach() for t in tensors])
        if key is not None:
            trace_cache.put(key, traced)
        return compiled, out_spec


def kernel(fn: Callable[P, R]) -> Kernel[P, R]:
    """Decorate a function of tensors as a kernel compiled to its own NEFF.

    Example::

        @torch_neuronx.kernel
        def scaled_add(x, y, scale: float = 1.0, square: bool = False):
            out = x + y * scale
            return out * out if square else out

        scaled_add(torch.ones(4), torch.ones(4), scale=2.0)  # traced and compiled once per signature

    Non-tensor arguments (``None``, bool, int, float, str, ``torch.dtype``,
    possibly inside lists, tuples and dicts) are declared arguments: their
    values select the trace, so they may steer control flow. Tensor values
    must not (the kernel is traced once per shape and dtype).
    """
    if not callable(fn):
        raise TypeError(f"torch_neuronx.kernel decorates a function, got {type(fn).__name__}")
    return Kernel(fn)
