"""Eager execution of ATen ops on ``neuron`` tensors, one compiled op at a time.

Each functional op is keyed by its *dispatch key*: the op overload, the
shape/stride/dtype of each tensor argument and the value of every other
argument. The first call of a key traces the op, lowers it through the compile
path (FX passes, torch-mlir, StableHLO) and gets its NEFF from the NEFF cache;
later calls run the executable. With TORCH_NEURONX_HLO_CACHE=1 (the default)
the lowering is stored in TORCH_NEURONX_HLO_CACHE_DIR under the dispatch key,
so a new process neither traces nor lowers an op any process has run before.

Not every op runs compiled:
- views run on the CPU view of the device memory (they only change metadata);
- in-place ops run their functional variant compiled and write the result back;
- random ops run on the host, drawing from their device's generator (:mod:`.random`);
- an op nothing can lower falls back to CPU execution (one warning per op,
  counted as ``eager_fallbacks``); an op that lowers but fails to execute falls
  back too, unless TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import return_and_correct_aliasing

from torch_neuronx import config, observe
from torch_neuronx.cache import store
from torch_neuronx.compiler.hlo import lowering_versions
from torch_neuronx.device import random, scalars
from torch_neuronx.pipeline import trace as tracing
from torch_neuronx.process import checked_device_index
from torch_neuronx.runtime.device import current_index as current_device
from torch_neuronx.runtime.tensor import NeuronTensor, alias, allocate, from_cpu

_log = logging.getLogger("torch_neuronx.device.eager")
aten = torch.ops.aten

_lock = threading.Lock()
_kernels: dict[tuple, Any] = {}  # dispatch key -> (compiled graph, output treespec) or _UNIMPLEMENTED
_UNIMPLEMENTED = object()
_warned: set[str] = set()


def _cpu(value: Any) -> Any:
    return value._data if isinstance(value, NeuronTensor) else value


def _to_device(value: Any, index: int = 0) -> Any:
    """A CPU result of an op on neuron tensors, placed in the memory of device ``index``."""
    if isinstance(value, torch.Tensor) and not isinstance(value, NeuronTensor):
        return from_cpu(value, index=index)
    return value


def _on_device(index: int) -> Callable[[Any], Any]:
    return lambda value: _to_device(value, index)


def _mixed_devices(func: Any, first: int, other: int) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"neuron:{first} and neuron:{other}! (when checking arguments for {func})")


def _first_neuron(args: Any) -> NeuronTensor:
    return next(a for a in pytree.tree_leaves(args) if isinstance(a, NeuronTensor))


# -- ops that are not computations -------------------------------------------------


def _to_copy(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    source = args[0]
    device = kwargs.get("device")
    plain = {k: v for k, v in kwargs.items() if k != "device"}
    copied = aten._to_copy.default(_cpu(source), **plain)
    if device is not None and torch.device(device).type != "neuron":
        if observe.state.active:
            observe.emit("transfer.device_to_host", copied.nbytes, device=source.device.index)
        return copied.to(device)  # neuron -> cpu (or another device): leaves device memory
    index = torch.device(device).index if device is not None else None
    return from_cpu(copied, index=source._index if index is None else checked_device_index(index))


def wrote(*tensors: Any) -> None:
    """Count a write into the device memory of each neuron tensor among ``tensors`` (lists too).

    Inside ``__torch_dispatch__`` autograd's version counting is off for the inner tensors
    an op writes through, so their version counters would never move; compiled graphs
    that keep weights resident watch those counters to see in-place updates.
    """
    inner = [t._data for t in pytree.tree_leaves(tensors) if isinstance(t, NeuronTensor)]
    if inner:
        torch._C._increment_version(inner)


def _copy_(args: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    dst, src = args[0], args[1]
    _cpu(dst).copy_(_cpu(src), **kwargs)
    wrote(dst)
    return dst


def _local_scalar_dense(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    return _cpu(args[0]).item()


_SPECIAL: dict[Any, Callable[[Sequence[Any], dict[str, Any]], Any]] = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
}


def _is_view(func: Any) -> bool:
    return func.is_view or func in (aten.alias.default, aten.detach.default)


def _mutated(func: Any) -> list[int]:
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _run_view(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    if kwargs or any(isinstance(a, list | tuple) for a in args):
        source = _first_neuron(args)
        out = func(*pytree.tree_map(_cpu, args), **pytree.tree_map(_cpu, kwargs))
    else:  # the common case, without pytree's cost
        source = next(a for a in args if isinstance(a, NeuronTensor))
        out = func(*[a._data if isinstance(a, NeuronTensor) else a for a in args])
    if isinstance(out, torch.Tensor):
        return alias(out, source)
    return pytree.tree_map(lambda t: alias(t, source) if isinstance(t, torch.Tensor) else t, out)


def _run_inplace_view(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An op that changes a tensor's sizes and strides in place: on the inner tensor, then on the
    wrapper itself (``return_and_correct_aliasing`` sets a wrapper's metadata without dispatching)."""
    func(*pytree.tree_map(_cpu, args), **pytree.tree_map(_cpu, kwargs))
    return return_and_correct_aliasing(func, args, kwargs, args[0])


def _functional_variant(func: Any) -> Any | None:
    name = func._schema.name.split("::")[1]
    if not name.endswith("_") or func._schema.overload_name == "out":
        return None
    packet = getattr(aten, name[:-1], None)
    overload = func._overloadname
    return getattr(packet, overload, None) if packet is not None else None


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


def _hlo_key(key: tuple) -> str:
    """The HLO cache key of a dispatch key: with the lowering and trace versions, so entries that
    older code wrote (format 2 traced ``a * a`` as a one-input kernel) are never looked up."""
    text = f"{lowering_versions()}|trace-format-{tracing.FORMAT}|{key!r}"
    return "eager-" + hashlib.sha256(text.encode()).hexdigest()


def _compile(func: Any, key: tuple, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The compiled kernel of ``func`` for this dispatch key (HLO cache, else trace and lower)."""
    use_hlo_cache = config.get("TORCH_NEURONX_HLO_CACHE") and not config.get("TORCH_NEURONX_NEFF_DISABLE_CACHE")
    name = f"eager_{func._schema.name.split('::')[1]}"
    if use_hlo_cache:
        text = store.hlo_cache().get(_hlo_key(key))
        if text is not None:
            try:
                stored = tracing.Trace.from_json(text)
                observe.count("eager_hlo_cache_hits")
                return tracing.load(stored), stored.result_spec()
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

    cpu_tensors = [_cpu(leaves[i]) for i in positions]
    compiled, stored, out_spec = tracing.trace(call, name, cpu_tensors, hlo_cache=use_hlo_cache)
    observe.count("eager_ops_compiled")
    text = stored.to_json()
    if use_hlo_cache and text is not None:
        store.hlo_cache().put(_hlo_key(key), text)
    return compiled, out_spec


@functools.cache
def _compiler_thread() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="neuron-eager-compile")


def _fallback(func: Any, args: Sequence[Any], kwargs: dict[str, Any], reason: str) -> Any:
    observe.count("eager_fallbacks")
    name = str(func)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"neuron: {name} runs on the CPU ({reason})", RuntimeWarning, stacklevel=4)
    out = func(*pytree.tree_map(_cpu, args), **pytree.tree_map(_cpu, kwargs))
    return pytree.tree_map(_on_device(_first_neuron((args, kwargs))._index), out)


def _run_compiled(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``func`` on neuron tensors through its compiled kernel (floats as runtime inputs: :mod:`.scalars`)."""
    given = args, kwargs  # what a fallback runs on
    args, kwargs = scalars.as_inputs(func, args, kwargs)
    key = dispatch_key(func, args, kwargs)
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                try:
                    # On a fresh thread: inside __torch_dispatch__ the Python dispatch key is
                    # excluded (thread-locally), which would blind make_fx's tracing modes.
                    kernel = _compiler_thread().submit(_compile, func, key, args, kwargs).result()
                except Exception as exc:  # nothing lowers this op: it is unimplemented here
                    _log.info("%s is not implemented on neuron: %s", func, exc)
                    kernel = _UNIMPLEMENTED
                _kernels[key] = kernel
    if kernel is _UNIMPLEMENTED:
        return _fallback(func, *given, "not implemented by the neuron compiler")
    compiled, out_spec = kernel
    if kwargs or any(isinstance(a, list | tuple) for a in args):
        leaves = pytree.tree_leaves((list(args), kwargs))
    else:  # the common case, without pytree's cost: positional tensors and scalars
        leaves = args
    tensors, index = [], -1
    for leaf in leaves:
        if isinstance(leaf, NeuronTensor):
            if leaf._index != index:
                if index >= 0:
                    raise _mixed_devices(func, index, leaf._index)
                index = leaf._index
            tensors.append(leaf._data)
        elif isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
    try:
        results = compiled(tensors)
    except Exception as exc:
        # Bad input (an index out of range, a singular matrix) raises eager's error, never a fallback.
        if getattr(exc, "neuron_input_error", False) or config.get("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"):
            raise
        return _fallback(func, *given, f"execution failed: {exc}")
    if out_spec.is_leaf():
        return _to_device(results[0], index)
    return pytree.tree_map(_on_device(index), pytree.tree_unflatten(results, out_spec))


_SPECIAL_OP, _COMPOSITE_VIEW, _INPLACE_VIEW, _VIEW, _RANDOM, _IN_PLACE, _NO_FUNCTIONAL, _FUNCTIONAL = range(8)
_kinds: dict[Any, tuple[int, Any]] = {}


def _classify(func: Any) -> tuple[int, Any]:
    """How ``func`` runs on neuron tensors (computed once per op: schemas are looked at only here)."""
    kind = _kinds.get(func)
    if kind is None:
        if func in _SPECIAL:
            kind = (_SPECIAL_OP, _SPECIAL[func])
        elif _is_view(func) and func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            # An op that may alias (``to``, ``reshape``): without autograd keys (inference mode)
            # it arrives whole; its decomposition decides between a view and a copy.
            kind = (_COMPOSITE_VIEW, None)
        elif torch.Tag.inplace_view in func.tags:  # transpose_, unsqueeze_: metadata changes in place
            kind = (_INPLACE_VIEW, None)
        elif _is_view(func):
            kind = (_VIEW, None)
        elif torch.Tag.nondeterministic_seeded in func.tags:  # random numbers: the host generator
            kind = (_RANDOM, bool(_mutated(func)))
        elif _mutated(func):
            functional = _functional_variant(func)
            usable = functional is not None and _mutated(func) == [0]
            kind = (_IN_PLACE, functional) if usable else (_NO_FUNCTIONAL, None)
        else:
            kind = (_FUNCTIONAL, None)
        _kinds[func] = kind
    return kind


def dispatch(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run one ATen op whose arguments include neuron tensors."""
    kind, extra = _classify(func)
    if kind == _FUNCTIONAL:
        return _run_compiled(func, args, kwargs)
    if kind == _IN_PLACE:
        result = _run_compiled(extra, args, kwargs)
        _cpu(args[0]).copy_(_cpu(result))
        wrote(args[0])
        return args[0]
    if kind == _VIEW:
        return _run_view(func, args, kwargs)
    if kind == _COMPOSITE_VIEW:
        return func.decompose(*args, **kwargs)
    if kind == _INPLACE_VIEW:
        return _run_inplace_view(func, args, kwargs)
    if kind == _SPECIAL_OP:
        return extra(args, kwargs)
    if kind == _RANDOM:
        out = random.draw(func, pytree.tree_map(_cpu, args), pytree.tree_map(_cpu, kwargs), _first_neuron(args).device)
        if extra:
            wrote(args[0])
            return args[0]
        return pytree.tree_map(_on_device(_first_neuron(args)._index), out)
    out = _fallback(func, args, kwargs, "an in-place or out= variant without a functional form")
    wrote(*_written(func, args, kwargs))
    return out


def _written(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments ``func`` writes into (by its schema), positional or keyword."""
    schema = func._schema.arguments
    return [args[i] if i < len(args) else kwargs.get(schema[i].name) for i in _mutated(func)]


def empty_on_device(size: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype | None,
                    device: Any = None) -> NeuronTensor:
    """A new uninitialized neuron tensor on ``device`` (``neuron:N``; no index: the current device)."""
    index = device.index if isinstance(device, torch.device) and device.index is not None else current_device()
    data, allocation = allocate(size, stride, dtype or torch.get_default_dtype(), checked_device_index(index))
    return NeuronTensor(data, allocation, index=index)
