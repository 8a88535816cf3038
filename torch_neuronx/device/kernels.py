"""Eager kernels: the keys an op's kernels are found by, and their compilation.

A call is keyed by its *dynamic key* (:func:`dynamic_key`: sizes of 2 and up replaced by which
of them are equal) when its op has a dynamic-shape kernel, else by its *dispatch key*
(:func:`dispatch_key`: shapes, strides, dtypes, other arguments). The first call of a key
traces the op (``pipeline/trace.py``) or reads its trace from the HLO cache
(TORCH_NEURONX_HLO_CACHE_DIR); a dynamic key whose op needs a kernel per shape is marked so
(:data:`STATIC`), in memory and in the HLO cache.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx import config, observe
from torch_neuronx.cache import store
from torch_neuronx.compiler.errors import data_dependent, input_error
from torch_neuronx.compiler.hlo import lowering_versions
from torch_neuronx.compiler.passes.output_layouts import memory_order, stride_order
from torch_neuronx.device import scalars
from torch_neuronx.pipeline import trace as tracing
from torch_neuronx.runtime.tensor import NeuronTensor

_log = logging.getLogger("torch_neuronx.device.eager")

_lock = threading.Lock()
class _Registry(dict):
    """A dict whose ``generation`` moves whenever an entry is replaced or removed: launch plans
    (``device/launch.py``) that hold a kernel stay valid only while its key still maps to it.
    A new key moves nothing: no plan holds a kernel it did not find under its own key."""

    generation = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        if key in self:
            self.generation += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self.generation += 1

    def clear(self) -> None:
        super().clear()
        self.generation += 1

    def pop(self, *args: Any) -> Any:
        self.generation += 1
        return super().pop(*args)


#: Dispatch or dynamic key -> Kernel, UNIMPLEMENTED, or (dynamic keys) STATIC.
registry: _Registry = _Registry()
UNIMPLEMENTED = object()
#: Per op (``str(func)``), why its first kernel could not be made: the eager fallback's warning says it.
unimplemented_because: dict[str, str] = {}
#: Ops (by name) whose result's shape depends on tensor values: no kernel can have it; they run
#: on the host as a synchronization, as CUDA synchronizes for them (not a fallback).
data_dependent_ops: set[str] = set()


def _first_reason(exc: BaseException) -> str:
    """The line of a kernel's compile error that says why (a NeuronCompileError's first line only
    names the stage and graph)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("neuron backend:"):
        reason = lines[1]
        if reason.endswith(":"):  # "iree exited with status 1:" says why on a later line
            reason += " " + next((line for line in lines[2:] if "error" in line.lower()), lines[2] if lines[2:] else "")
        return f"{lines[0].split(': ', 1)[-1]}: {reason.strip()}"
    return lines[0] if lines else type(exc).__name__


STATIC = object()  # a dynamic key whose op needs a kernel per shape
STATIC_ENTRY = "static"  # the HLO cache entry of such a key


def hlo_cache_enabled() -> bool:
    """Whether eager lowerings (and per-shape marks) are read from and written to the HLO cache."""
    # Only its own variable: TORCH_NEURONX_NEFF_DISABLE_CACHE turns off the NEFF cache, not this one.
    return bool(config.get("TORCH_NEURONX_HLO_CACHE"))


def mark_static(key: tuple) -> None:
    """Record, in the HLO cache, that the op family of dynamic ``key`` needs a kernel per shape."""
    if hlo_cache_enabled():
        store.hlo_cache().put(hlo_key(key), STATIC_ENTRY)


def host_view(value: Any) -> Any:
    """A neuron tensor's inner tensor (its device memory seen from the host); anything else as it is."""
    return value._data if isinstance(value, NeuronTensor) else value


# -- compiled execution --------------------------------------------------------------


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        where = "neuron" if isinstance(value, NeuronTensor) else value.device.type
        return ("T", tuple(value.shape), value.stride(), str(value.dtype), where)
    if isinstance(value, list | tuple):
        return (type(value).__name__, *map(_describe, value))
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return str(value)
    return repr(value)


def dispatch_key(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    """The dispatch key of a call: op overload, tensor shapes/strides/dtypes, other argument values."""
    return (str(func), tuple(map(_describe, args)), tuple((k, _describe(v)) for k, v in kwargs.items()))


def _ints(values: Any, found: set[int]) -> set[int]:
    """The ints among a call's non-tensor arguments (nested lists too), added to ``found``."""
    for value in values:
        if type(value) is int:
            found.add(value)
        elif isinstance(value, list | tuple):
            _ints(value, found)
    return found


class _Empty(Exception):
    """A tensor argument has no elements: the call takes the kernel of its shapes."""


def _describe_dynamic(value: Any, sizes: dict[int, int], fixed: set[int]) -> Any:
    if isinstance(value, torch.Tensor):
        where = "neuron" if isinstance(value, NeuronTensor) else value.device.type
        # Sizes 0 and 1, and sizes some int argument equals (a layer norm's normalized shape), as
        # they are; the others by which earlier size they equal (the trace's symbols).
        if 0 in value.shape:
            raise _Empty
        dims = tuple(d if d < 2 or d in fixed else sizes.setdefault(d, -1 - len(sizes)) for d in value.shape)
        return ("D", dims, str(value.dtype), where)
    if isinstance(value, list | tuple):
        return (type(value).__name__, *(_describe_dynamic(v, sizes, fixed) for v in value))
    return _describe(value)


def dynamic_key(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple | None:
    """The key of a call's dynamic-shape kernel: :func:`dispatch_key` with each tensor's dimensions
    of size 2 and up (unless an int argument has their size) replaced by the class of equal sizes
    they belong to, and no strides (the kernel is traced for contiguous inputs; the runtime passes
    others contiguous). None when no dimension is dynamic, or a tensor has no elements (the passes
    that handle empty tensors need their sizes)."""
    sizes: dict[int, int] = {}
    fixed = _ints(kwargs.values(), _ints(args, set()))
    try:
        key = ("dynamic", str(func), tuple(_describe_dynamic(a, sizes, fixed) for a in args),
               tuple((k, _describe_dynamic(v, sizes, fixed)) for k, v in kwargs.items()))
    except _Empty:
        return None
    return key if sizes else None


def _dynamic_dims(tensors: Sequence[torch.Tensor], args: Sequence[Any], kwargs: dict[str, Any]) -> list[list[bool]]:
    """Which dimensions of each tensor a dynamic trace makes symbolic (see :func:`dynamic_key`)."""
    fixed = _ints(kwargs.values(), _ints(args, set()))
    return [[d >= 2 and d not in fixed for d in t.shape] for t in tensors]


@functools.cache
def _tracing_sources() -> str:
    """A digest of the code that decides what an eager call traces to besides the lowering's
    (the runtime-scalar rewrites, the tracer, this module): a change there never serves old kernels."""
    h = hashlib.sha256()
    for path in (scalars.__file__, tracing.__file__, __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def hlo_key(key: tuple) -> str:
    """The HLO cache key of a dispatch key: with the lowering and trace versions, so entries that
    older code wrote (format 2 traced ``a * a`` as a one-input kernel) are never looked up."""
    text = f"{lowering_versions()}|trace-format-{tracing.FORMAT}|{_tracing_sources()}|{key!r}"
    return "eager-" + hashlib.sha256(text.encode()).hexdigest()


class Kernel:
    """One dispatch key's compiled kernel: the graph, its result's structure, and its outputs'
    metadata when the op can be queued (``metas``: per result leaf, a meta tensor or a constant;
    None when the kernel must run where it is called, see ``CompiledGraph.output_metas``)."""

    __slots__ = ("compiled", "out_spec", "metas", "name", "shapes", "dtypes", "orders", "copies")

    def __init__(self, compiled: Any, out_spec: pytree.TreeSpec, name: str) -> None:
        self.compiled, self.out_spec, self.name = compiled, out_spec, name
        metas = compiled.output_metas()
        self.metas = metas if metas is not None and len(metas) == out_spec.num_leaves else None
        # A queued dynamic-shape kernel: its outputs' shapes come from each call's inputs (one whose
        # outputs are checked on the host runs where it is called, as static ones do).
        self.shapes = None if compiled.runs_on_host else compiled.shape_function
        self.dtypes = compiled.output_dtypes() if self.shapes is not None else None
        # A dynamic kernel's outputs in torch's memory order, per layout of its inputs (see
        # :func:`output_orders`): the same kernel serves row-major and transposed inputs.
        self.orders: dict[tuple, list[list[int] | None] | None] = {}
        # Results copied into outputs laid out as torch lays them out, not written by the NEFF: a
        # decomposition's layout can differ from the op's (max_pool2d of channels-last, linalg).
        self.copies = False

    def follow_torchs_layout(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Outputs with torch's strides where this static kernel's trace laid them out otherwise."""
        if self.metas is None or not any(isinstance(m, torch.Tensor) and m.dim() > 1 for m in self.metas):
            return
        orders = _output_orders(func, args, kwargs, missing=False)
        if orders is None or len(orders) != len(self.metas):
            return
        metas = list(self.metas)
        for i, (m, order) in enumerate(zip(metas, orders, strict=True)):
            if isinstance(m, torch.Tensor) and memory_order(m) != order:
                stride = strides_in_order(m.shape, order) or torch.empty(m.shape, device="meta").stride()
                metas[i] = torch.empty_strided(m.shape, stride, dtype=m.dtype, device="meta")
                self.copies = True
        self.metas = metas


def _layout(t: torch.Tensor) -> tuple | None:
    """The memory order of an input's dimensions, outermost first, and which are broadcast (stride
    0: an expanded tensor and a channels-last one have one order); None: row-major."""
    if t.is_contiguous():
        return None
    stride = t.stride()
    return tuple(stride_order(stride)), tuple(s == 0 for s in stride)


def output_orders(kernel: Kernel, func: Any, args: Sequence[Any], kwargs: dict[str, Any],
                  tensors: Sequence[torch.Tensor]) -> list[list[int] | None] | None:
    """The memory order of each output of a dynamic kernel's call (None: all row-major), as torch
    lays out the op's results for inputs laid out as these are (found once per layout)."""
    layout = tuple(map(_layout, tensors))
    orders = kernel.orders
    if layout not in orders:
        if len(orders) >= 64:
            orders.clear()
        orders[layout] = _output_orders(func, args, kwargs)
    return orders[layout]


def _output_orders(func: Any, args: Sequence[Any], kwargs: dict[str, Any],
                   missing: bool = True) -> list[list[int] | None] | None:
    """The memory order of each result of ``func`` (see :attr:`Kernel.orders`), run on fake CPU
    tensors laid out as the call's; None when the op has no meta kernel, or (``missing``) when all
    are row-major."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake(value: Any) -> Any:
        if isinstance(value, torch.Tensor):  # on the CPU: layouts that depend on the device are the CPU's
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu")
        return value

    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            fakes = pytree.tree_map(fake, (list(args), kwargs))
            try:  # torch's own layout for the op: its traced rewrite may lay results out otherwise
                called, named = _numbers_for_scalars(func, *fakes)  # (addcmul of expanded and transposed)
                results = func(*called, **named)
            except Exception:
                results = scalars.call(func, *fakes)
            results = pytree.tree_leaves(results)
    except Exception:  # no meta kernel (or it disagrees with these inputs): row-major
        return None
    orders = [memory_order(r) if isinstance(r, torch.Tensor) else None for r in results]
    return orders if not missing or any(o is not None for o in orders) else None


def _numbers_for_scalars(func: Any, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``func``'s call with a Python number for each runtime scalar (a 0-d tensor given for a
    ``Scalar`` argument, which torch's op does not take): the layout of its results does not
    depend on the value."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)

    def number(t: torch.Tensor) -> float | int:
        return 1.0 if t.is_floating_point() else 1

    for position, argument in enumerate(schema.arguments):
        if not isinstance(argument.type, torch.NumberType):  # (a ``Scalar`` argument)
            continue
        if position < len(args) and not argument.kwarg_only:
            if isinstance(args[position], torch.Tensor):
                args[position] = number(args[position])
        elif isinstance(kwargs.get(argument.name), torch.Tensor):
            kwargs[argument.name] = number(kwargs[argument.name])
    return args, kwargs


def strides_in_order(shape: Sequence[int], order: Sequence[int] | None) -> list[int] | None:
    """Dense strides of ``shape`` whose dimensions lie in memory ``order``, outermost first (None: row-major)."""
    if order is None or len(order) != len(shape):
        return None
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return strides


def _compile(func: Any, key: tuple, args: Sequence[Any], kwargs: dict[str, Any], dynamic: bool) -> Any:
    """The compiled kernel of ``func`` for this dispatch key (HLO cache, else trace and lower);
    for a dynamic key, :data:`STATIC` when the op needs a kernel per shape."""
    compiled = _compile_graph(func, key, args, kwargs, dynamic)
    if compiled is STATIC:
        return STATIC
    kernel = Kernel(*compiled, name=str(func))
    if kernel.shapes is None:
        kernel.follow_torchs_layout(func, args, kwargs)
    return kernel


def _compile_lent(lent: bool, *args: Any) -> Any:
    with tracing.compile_lock_lent(lent):
        return _compile(*args)


def _compile_graph(func: Any, key: tuple, args: Sequence[Any], kwargs: dict[str, Any], dynamic: bool) -> Any:
    use_hlo_cache = hlo_cache_enabled()
    name = f"eager_{func._schema.name.split('::')[1]}"
    if use_hlo_cache:
        text = store.hlo_cache().get(hlo_key(key))
        if text == STATIC_ENTRY:
            return STATIC
        if text is not None:
            try:
                stored = tracing.Trace.from_json(text)
                observe.count("eager_hlo_cache_hits")
                return tracing.load(stored, output_storage=not dynamic), stored.result_spec()
            except (ValueError, KeyError, TypeError):
                _log.warning("ignoring a malformed eager HLO cache entry for %s", func)
    leaves, spec = pytree.tree_flatten((list(args), kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def call(tensors: list[torch.Tensor]) -> Any:
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
        return scalars.call(func, call_args, call_kwargs)

    cpu_tensors = [host_view(leaves[i]) for i in positions]
    try:
        dims = _dynamic_dims(cpu_tensors, args, kwargs) if dynamic else None
        # Dynamic kernels return their results and these are copied into the outputs: IREE does not
        # check output storage against the size a dynamic result turns out to have, and a kernel
        # whose result size disagreed with its shape function (native_batch_norm_backward's linalg
        # lowering) wrote past its outputs' memory. A copy of a mismatched result raises instead.
        compiled, stored, out_spec = tracing.trace(call, name, cpu_tensors, hlo_cache=use_hlo_cache,
                                                   output_storage=dims is None, dynamic=dims)
    except Exception as exc:
        if not dynamic:
            raise
        # Depends on sizes (a reshape to given sizes), or the dynamic lowering fails: a kernel per
        # shape. Stored, so no process tries again (the key holds the lowering's versions).
        _log.debug("%s keeps a kernel per shape: %s", func, exc)
        mark_static(key)
        return STATIC
    observe.count("eager_ops_compiled")
    text = stored.to_json()
    if use_hlo_cache and text is not None:
        store.hlo_cache().put(hlo_key(key), text)
    return compiled, out_spec


@functools.cache
def _compiler_thread() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="neuron-eager-compile")


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: a kernel compiled on the inherited
    executor waited forever. The child makes its own (and its own lock, which a parent's thread
    may have held at the fork)."""
    global _lock
    _lock = threading.Lock()
    _compiler_thread.cache_clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def stored(key: tuple) -> bool:
    """Whether the HLO cache holds an entry for ``key`` (a trace, or the mark of a per-shape op)."""
    return hlo_cache_enabled() and store.hlo_cache().get(hlo_key(key), counted=False) is not None


def compiled_kernel(func: Any, key: tuple, args: Sequence[Any], kwargs: dict[str, Any], dynamic: bool) -> Any:
    """The kernel of ``key`` (compiled on its first call): a :class:`Kernel`, :data:`UNIMPLEMENTED`,
    or for a dynamic key :data:`STATIC`."""
    with _lock:
        kernel = registry.get(key)
        if kernel is None:
            try:
                # On a fresh thread: inside __torch_dispatch__ the Python dispatch key is
                # excluded (thread-locally), which would blind make_fx's tracing modes.
                lent = tracing.compile_lock_held()  # this thread waits: the trace may not take it
                kernel = _compiler_thread().submit(_compile_lent, lent, func, key, args, kwargs, dynamic).result()
            except Exception as exc:  # nothing lowers this op: it is unimplemented here
                bad_input = input_error(exc)
                if bad_input is not None:  # torch's kernel rejects these arguments: its error, nothing kept
                    raise bad_input from None
                _log.info("%s is not implemented on neuron: %s", func, exc)
                unimplemented_because.setdefault(str(func), _first_reason(exc))
                if data_dependent(exc):
                    data_dependent_ops.add(str(func))
                kernel = UNIMPLEMENTED
            registry[key] = kernel
    return kernel


def agrees_with_cpu(kernel: Kernel, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool | None:
    """Whether a new dynamic-shape kernel computes, on the call that made it, what the CPU does,
    and leaves its inputs alone; None when the CPU rejects the call (bad input: no verdict). The
    caller has synchronized: the tensors' memory is readable.

    torch-mlir's linalg lowering of a symbolic trace is younger than its StableHLO path; a kernel
    that computes a wrong value (native_batch_norm_backward's did) or writes into an input
    (a scatter tied to its operand) is never used: the op keeps a kernel per shape. The kernel
    runs on copies of the inputs; checked once per dynamic key and process.
    """
    leaves = pytree.tree_leaves((list(args), kwargs))
    originals = [host_view(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor)]
    tensors = [t.clone() for t in originals]
    try:
        on_host = pytree.tree_map(_on_host, (list(args), kwargs))
        expected = pytree.tree_leaves(scalars.call(func, *on_host))
    except Exception as exc:  # bad input (an index out of range): nothing to judge the kernel by
        _log.debug("%s: dynamic kernel not checked on this call (%s)", func, exc)
        return None
    try:
        if kernel.shapes is None:  # checked on the host: runs where it is called
            outputs = kernel.compiled(list(tensors))
        else:
            outputs = [torch.empty(shape, dtype=dtype) for shape, dtype in zip(kernel.shapes(tensors), kernel.dtypes)]
            if not kernel.compiled.run_into(tensors, outputs):
                outputs = kernel.compiled(list(tensors))
    except Exception as exc:
        _log.debug("%s: dynamic kernel not checked (%s); keeping a kernel per shape", func, exc)
        return False
    if len(outputs) != len(expected) or not all(map(_same, outputs, expected)):
        _log.info("%s: its dynamic-shape kernel disagrees with the CPU; keeping a kernel per shape", func)
        return False
    if not all(torch.equal(copy, t) or (t.is_floating_point() and torch.allclose(copy, t, rtol=0, atol=0,
                                                                                   equal_nan=True))
               for copy, t in zip(tensors, originals)):
        _log.info("%s: its dynamic-shape kernel writes into an input; keeping a kernel per shape", func)
        return False
    return True


def _on_host(value: Any) -> Any:
    """A call's argument as the CPU reference takes it: a neuron tensor's inner tensor, the CPU for a
    neuron device (``new_zeros(..., device=...)`` computed its reference on the device, and the
    comparison then warned that ``allclose`` ran on the CPU)."""
    if isinstance(value, torch.device) and value.type == "neuron":
        return torch.device("cpu")
    return host_view(value)


def _same(got: Any, want: Any) -> bool:
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        return False
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.is_floating_point() or want.is_complex():
        # float32 closeness, as tight as the OpInfo sweep's: the linalg path approximates some
        # functions less accurately than the StableHLO one (gelu's erf was 5e-5 off).
        return torch.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    return torch.equal(got, want)
