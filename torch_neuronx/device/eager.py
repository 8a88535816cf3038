"""Eager execution of ATen ops on ``neuron`` tensors, one compiled op at a time.

Each functional op is keyed by its *dispatch key*: the op overload, the
shape/stride/dtype of each tensor argument and the value of every other
argument. The first call of a key traces the op, lowers it through the compile
path (FX passes, torch-mlir, StableHLO) and gets its NEFF from the NEFF cache;
later calls run the executable, queued on the current stream (:mod:`.queued`): the op
returns its outputs, allocated up front, before it runs. With TORCH_NEURONX_HLO_CACHE=1 (the default)
the lowering is stored in TORCH_NEURONX_HLO_CACHE_DIR under the dispatch key,
so a new process neither traces nor lowers an op any process has run before.

Not every op runs compiled:
- views run on the CPU view of the device memory (they only change metadata);
- in-place ops run their functional variant compiled and write the result back;
- random ops run on the host, drawing from their device's generator (:mod:`.random`);
- an op nothing can lower falls back to CPU execution (one warning per op,
  counted as ``eager_fallbacks``; :mod:`.fallback`); an op that lowers but fails to
  execute falls back too, unless TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1;
- copies, host reads and storage changes have handlers of their own (:mod:`.copies`,
  :mod:`.special_ops`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import return_and_correct_aliasing

from torch_neuronx import config, observe
from torch_neuronx.compiler.decompositions import batch_norm_sync
from torch_neuronx.compiler.options import compile_only_enabled
from torch_neuronx.device import (
    choice,
    distributed_ops,
    empty_operands,
    foreach,
    host_kernels,
    in_place,
    kernels,
    launch,
    long_sorts,
    masks,
    math_bits,
    mutations,
    out_variants,
    placement,
    queued,
    random,
    scalar_checks,
    scalars,
    shape_checks,
    special_ops,
)
from torch_neuronx.device.copies import (
    empty_on_device,
    queue_copy,
)
from torch_neuronx.device.fallback import (
    fallback,
    fell_back,
    first_neuron,
    mutated,
    on_device,
    run_on_cpu,
    run_without_functional_form,
    to_device,
    warn_fallback,
    written,
)
from torch_neuronx.device.queued import on_host
from torch_neuronx.runtime.tensor import NeuronTensor, alias, has_neuron_kernel

_log = logging.getLogger("torch_neuronx.device.eager")
aten = torch.ops.aten

_kernels = kernels.registry  # the kernels of every key seen (tests inject faults here)
_cpu = kernels.host_view


def _mixed_devices(func: Any, first: int, other: int) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"neuron:{first} and neuron:{other}! (when checking arguments for {func})")


_synchronized = queued.synchronized


# -- ops whose schema hides a write (the others that are not computations: special_ops.py) --


def _native_batch_norm(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``native_batch_norm``, whose schema does not say it writes the running statistics in
    training (ATen's kernels do): traced as a functional op, their update would be lost. In
    training with running statistics it runs as ``_native_batch_norm_legit_functional`` and
    the new statistics are copied into the running ones."""
    bound = dict(zip(("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"),
                     args), **kwargs)
    running_mean, running_var = bound.get("running_mean"), bound.get("running_var")
    if not (bound.get("training") and isinstance(running_mean, NeuronTensor) and isinstance(running_var, NeuronTensor)):
        return _run_compiled(aten.native_batch_norm.default, args, kwargs)
    out, mean, invstd, new_mean, new_var = _run_compiled(aten._native_batch_norm_legit_functional.default, (
        bound["input"], bound["weight"], bound["bias"], running_mean, running_var, True, bound["momentum"],
        bound["eps"]), {})
    queue_copy(running_mean, new_mean, "aten::native_batch_norm")
    queue_copy(running_var, new_var, "aten::native_batch_norm")
    return out, mean, invstd


def _gather_stats(args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``batch_norm_gather_stats_with_counts`` (SyncBatchNorm), which writes the running statistics
    that its schema does not say it writes (as ATen's CUDA kernel does): the merged statistics
    compiled, the running ones updated after."""
    bound = dict(zip(("input", "mean", "invstd", "running_mean", "running_var", "momentum", "eps", "counts"),
                     args), **kwargs)
    mean, invstd = _run_compiled(aten.batch_norm_gather_stats_with_counts.default, args, kwargs)
    for running, new in batch_norm_sync.running_statistics(
            bound["running_mean"], bound["running_var"], bound["mean"], bound["invstd"], bound["momentum"],
            bound["eps"], bound["counts"]):
        queue_copy(running, new, "aten::batch_norm_gather_stats_with_counts")
    return mean, invstd


_SPECIAL: dict[Any, Callable[[Sequence[Any], dict[str, Any]], Any]] = {
    **special_ops.HANDLERS,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.batch_norm_gather_stats_with_counts.default: _gather_stats,
}


def _is_view(func: Any) -> bool:
    """Ops whose result shares its input's memory: views, and ``_unsafe_view``, a view torch's schema
    does not mark (``kron(..., out=out)`` writes ``out`` through one: a copy left ``out`` unwritten)."""
    return func.is_view or func in (aten.alias.default, aten.detach.default, aten._unsafe_view.default)


def _run_view(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    if kwargs or any(isinstance(a, list | tuple) for a in args):
        source = first_neuron(args)
        out = func(*pytree.tree_map(_cpu, args), **pytree.tree_map(_cpu, kwargs))
    else:  # the common case, without pytree's cost
        source = next(a for a in args if isinstance(a, NeuronTensor))
        out = func(*[a._data if isinstance(a, NeuronTensor) else a for a in args])
    if isinstance(out, torch.Tensor):
        return alias(out, source)
    return pytree.tree_map(lambda t: alias(t, source) if isinstance(t, torch.Tensor) else t, out)


def _run_inplace_view(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:  # metadata only
    """An op that changes a tensor's sizes and strides in place: on a new inner tensor over the same
    memory, then on the wrapper itself (``return_and_correct_aliasing`` sets a wrapper's metadata
    without dispatching). Queued ops hold the old inner tensor, whose shape must stay the one they
    were issued with (a ``transpose_`` after ``cat`` must not change what the queued ``cat`` reads)."""
    target = args[0]
    inner = target._data
    fresh = inner.as_strided(inner.shape, inner.stride(), inner.storage_offset())
    func(fresh, *pytree.tree_map(_cpu, args[1:]), **pytree.tree_map(_cpu, kwargs))
    target._data = fresh
    if target._allocation is not None:  # a storage resize repoints it too
        target._allocation.track(fresh)
    return return_and_correct_aliasing(func, args, kwargs, target)


def _argument_types(op: Any) -> list[tuple[str, str, bool]]:
    return [(a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments]


def _functional_variant(func: Any) -> Any | None:
    """The functional op of in-place ``func``: the overload of the same name whose arguments are
    the same (``pow_.Scalar`` is ``pow.Tensor_Scalar``: ``pow.Scalar`` takes a number as self)."""
    namespace, name = func._schema.name.split("::")
    if namespace != "aten" or not name.endswith("_") or func._schema.overload_name == "out":
        return None  # (a library's ``mylib::silu_`` is its own op, not ``aten.silu``)
    packet = getattr(aten, name[:-1], None)
    if packet is None:
        return None
    wanted = _argument_types(func)
    same_name = getattr(packet, func._overloadname, None)
    if same_name is not None and _argument_types(same_name) == wanted:
        return same_name
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if _argument_types(candidate) == wanted:
            return candidate
    if same_name is not None and [a[0] for a in _argument_types(same_name)] != [a[0] for a in wanted]:
        return None  # its arguments in another order (``polygamma_(self, n)``, ``polygamma(n, self)``)
    return same_name


def _run_compiled(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``func`` on neuron tensors through its compiled kernel (floats as runtime inputs: :mod:`.scalars`)."""
    plan = launch.find(func, args, kwargs)
    if plan is not None:  # a call seen before: its route is known (device/launch.py)
        return plan(args, kwargs)
    given = args, kwargs  # what a fallback runs on
    if placement.composite_with_host_operand(func, args, kwargs):
        decomposed = func.decompose(*args, **kwargs)
        if decomposed is not NotImplemented:
            return decomposed
    placement.check(func, args, kwargs)
    shape_checks.check(func, args, kwargs)
    if func in masks.INDEX_PUTS and masks.has_mask(args):  # x[mask] = values
        return _run_compiled(func, masks.expanded(args), kwargs)
    if long_sorts.too_long(func, args, kwargs):  # IREE's sort compares every pair
        fell_back.op = "other"
        return _synchronized(*given, run_on_cpu, func, *given)
    args, kwargs = scalars.as_inputs(func, args, kwargs)
    kernel = choice.kernel_for(func, args, kwargs)
    if kernel is kernels.UNIMPLEMENTED:
        if str(func) in kernels.data_dependent_ops:
            observe.count("eager_data_dependent_ops")
            fell_back.op = "other"
            return _synchronized(*given, run_on_cpu, func, *given)
        if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            # A composite reaches the device only in inference mode (above autograd it decomposes):
            # its decomposition, as outside it (``bool(t)``'s ``is_nonzero`` reads ``t.item()``,
            # which no kernel can: it fell back to the CPU with a warning, once per generated token).
            decomposed = func.decompose(*given[0], **given[1])
            if decomposed is not NotImplemented:
                return decomposed
        return fallback(func, *given, "no neuron kernel: "
                         + kernels.unimplemented_because.get(str(func), "not implemented by the neuron compiler"))
    if kwargs or any(isinstance(a, list | tuple) for a in args):
        leaves = pytree.tree_leaves((list(args), kwargs))
    else:  # the common case, without pytree's cost: positional tensors and scalars
        leaves = args
    tensors, inputs, index = [], [], -1
    for leaf in leaves:
        if isinstance(leaf, NeuronTensor):
            if leaf._index != index:
                if index >= 0:
                    raise _mixed_devices(func, index, leaf._index)
                index = leaf._index
            tensors.append(leaf._data)
            inputs.append(leaf)
        elif isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
    metas = kernel.metas
    if kernel.shapes is not None and not compile_only_enabled():
        device = _device(index)
        shapes, orders = kernel.shapes(tensors), kernels.output_orders(kernel, func, args, kwargs, tensors)
        outputs = [empty_on_device(shape, kernels.strides_in_order(shape, orders[i]) if orders else None, dtype, device)
                   for i, (shape, dtype) in enumerate(zip(shapes, kernel.dtypes))]
    elif metas is None or compile_only_enabled():
        return on_host(index, inputs, _execute_now, kernel, tensors, func, given, index)
    else:
        # with the strides torch gives them (a pointwise op of a transposed tensor: transposed)
        outputs = [empty_on_device(m.shape, m.stride(), m.dtype, _device(index)) if isinstance(m, torch.Tensor)
                   else m for m in metas]
    allocations = [o._allocation for o in outputs if isinstance(o, NeuronTensor)]
    # The queued work gets inner tensors of its own: metadata changed in place later (``transpose_``,
    # aot_autograd's ``as_strided_`` on a compiled graph's inputs) must not change what it reads or writes.
    storage = [o._data.detach() if isinstance(o, NeuronTensor) else None for o in outputs]
    queued.enqueue(index, kernel.name, inputs, allocations, _execute_into, kernel, [t.detach() for t in tensors],
                   storage, func, given, inference=False)
    # A dynamic-shape kernel's plan lasts until its shape may be promoted to a kernel of its own.
    launch.record(func, given, (args, kwargs), kernel, outputs, _execute_into,
                  0.0 if kernel.shapes is None else time.monotonic() + choice.PROMOTE_AFTER_S, runs_into=True)
    if kernel.out_spec.is_leaf():
        return outputs[0]
    return pytree.tree_unflatten(outputs, kernel.out_spec)


@functools.cache
def _device(index: int) -> torch.device:
    return torch.device("neuron", index)


def _execute_now(kernel: kernels.Kernel, tensors: list[torch.Tensor], func: Any, given: tuple, index: int) -> Any:
    """Run a kernel in the calling thread (one that checks its results on the host, or compile-only)."""
    try:
        results = kernel.compiled(tensors)
    except Exception as exc:
        # Bad input (an index out of range, a singular matrix) raises eager's error, never a fallback.
        if getattr(exc, "neuron_input_error", False) or config.get("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"):
            raise
        warn_fallback(func, f"execution failed: {exc}")
        return run_on_cpu(func, *given)
    if kernel.out_spec.is_leaf():
        return to_device(results[0], index)
    return pytree.tree_map(on_device(index), pytree.tree_unflatten(results, kernel.out_spec))


def _execute_into(kernel: kernels.Kernel, tensors: list[torch.Tensor], storage: list[torch.Tensor | None], func: Any,
                  given: tuple) -> None:
    """A queued kernel's work, on its stream: run it with ``storage`` (the outputs' memory; None for a
    constant result) as its results' storage, or copy its results there for a kernel whose results
    no dispatch writes.

    A kernel that fails to execute runs on the CPU instead (unless
    TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1), into the same memory.
    """
    try:
        # (``is not None`` one by one: ``None in storage`` would compare tensors with None)
        if not kernel.copies and all(s is not None for s in storage) and kernel.compiled.run_into(tensors, storage):
            return  # the kernel wrote into the outputs' memory
    except Exception as exc:
        return _execute_failed(exc, storage, func, given)
    with torch.inference_mode():  # (queued without it: this thread's torch ops need it from here)
        try:
            results = kernel.compiled(tensors)
        except Exception as exc:
            return _execute_failed(exc, storage, func, given)
        _copy_results(storage, results)


def _execute_failed(exc: Exception, storage: list[torch.Tensor | None], func: Any, given: tuple) -> None:
    """A queued kernel failed to execute: the op on the CPU, into its outputs' memory."""
    if config.get("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"):
        raise exc
    warn_fallback(func, f"execution failed: {exc}")
    args, kwargs = given
    with torch.inference_mode():
        results = pytree.tree_leaves(func(*pytree.tree_map(_cpu, args), **pytree.tree_map(_cpu, kwargs)))
        _copy_results(storage, results)


def _copy_results(storage: list[torch.Tensor | None], results: Sequence[torch.Tensor]) -> None:
    for out, result in zip(storage, results):
        if out is not None:
            out.copy_(result)


def _declined(func: Any) -> Callable[[Sequence[Any], dict[str, Any]], Any]:
    """The route of a list-writing update that :mod:`.host_kernels` does not queue: per tensor
    (``_foreach_`` ops), else the CPU as a synchronization (torch's error for a bad call)."""
    per_tensor = foreach.handler(func, run_without_functional_form)
    return per_tensor if per_tensor is not None else functools.partial(run_without_functional_form, func)


_SPECIAL_OP, _COMPOSITE_VIEW, _INPLACE_VIEW, _VIEW, _RANDOM, _IN_PLACE, _NO_FUNCTIONAL, _FUNCTIONAL, _BITS = range(9)
_kinds: dict[Any, tuple[int, Any]] = {}


def _classify(func: Any) -> tuple[int, Any]:
    """How ``func`` runs on neuron tensors (computed once per op: schemas are looked at only here)."""
    kind = _kinds.get(func)
    if kind is None:
        twin = None
        if func in _SPECIAL:
            kind = (_SPECIAL_OP, _SPECIAL[func])
        elif (distributed := distributed_ops.handler(func)) is not None:  # collectives, FSDP2's kernels
            kind = (_SPECIAL_OP, distributed)
        elif has_neuron_kernel(func):  # a user's torch.library op with a kernel for the neuron device
            kind = (_SPECIAL_OP, functools.partial(_run_own_kernel, func))
        elif (updates := host_kernels.handler(func, _declined(func))) is not None:  # optimizers' list updates
            kind = (_SPECIAL_OP, updates)
        elif (per_tensor := foreach.handler(func, run_without_functional_form)) is not None:  # _foreach_*_
            kind = (_SPECIAL_OP, per_tensor)
        elif _is_view(func) and func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            # An op that may alias (``to``, ``reshape``): without autograd keys (inference mode)
            # it arrives whole; its decomposition decides between a view and a copy.
            kind = (_COMPOSITE_VIEW, None)
        elif torch.Tag.inplace_view in func.tags:  # transpose_, unsqueeze_: metadata changes in place
            kind = (_INPLACE_VIEW, None)
        elif _is_view(func):
            kind = (_VIEW, None)
        elif torch.Tag.nondeterministic_seeded in func.tags:  # random numbers: the host generator
            kind = (_RANDOM, bool(mutated(func)))
        elif (twin := out_variants.functional_twin(func)) is not None:  # out=: the twin, copied into out
            kind = (_SPECIAL_OP, functools.partial(_run_out_variant, func, twin))
        elif mutated(func):
            functional = _functional_variant(func)
            # A list written in place (``_foreach_copy_``) runs on the CPU over the tensors' memory.
            usable = functional is not None and mutated(func) == [0] \
                and str(func._schema.arguments[0].type) == "Tensor"
            kind = (_IN_PLACE, functional) if usable else (_NO_FUNCTIONAL, None)
            if usable and not func._schema.returns:
                in_place.NO_RESULT.add(func)
        else:
            kind = (_FUNCTIONAL, None)
        if kind[0] in (_FUNCTIONAL, _IN_PLACE) or twin is not None:
            if math_bits.passes_bits(func):  # mm, clone, ...: torch hands them conjugate/negative views
                kind = (_BITS, kind)
        if func.namespace == "aten" or kind[0] == _SPECIAL_OP:  # a user's op may get a neuron kernel later
            _kinds[func] = kind
    return kind


_ON_DEVICE = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _run_own_kernel(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The op's neuron kernel, on the neuron tensors (this dispatcher runs before the backend's key:
    the op's default or CPU kernel ran on host copies instead, and an op with a neuron kernel only
    could not run at all)."""
    return func.redispatch(_ON_DEVICE, *args, **kwargs)


_HOW = {_SPECIAL_OP: "other", _COMPOSITE_VIEW: "view", _INPLACE_VIEW: "view", _VIEW: "view", _RANDOM: "random",
        _IN_PLACE: "compiled", _NO_FUNCTIONAL: "fallback", _FUNCTIONAL: "compiled", _BITS: "compiled"}


def dispatch(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run one ATen op whose arguments include neuron tensors (an ``eager.op`` span when observed)."""
    if not observe.state.active:
        return _dispatch(func, args, kwargs)
    name = func._schema.name.split("::")[-1]
    if func._overloadname != "default":
        name += "." + func._overloadname
    with observe.span("eager.op", op=name, how=_HOW[_classify(func)[0]]) as span:
        fell_back.op = None
        try:
            return _dispatch(func, args, kwargs)
        finally:
            if fell_back.op:
                span.fields["how"] = fell_back.op


#: Ops that take a tensor for its metadata only and a ``device=`` for their result.
_LIKE = frozenset({aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default,
                   aten.full_like.default, aten.rand_like.default, aten.randn_like.default,
                   aten.randint_like.default, aten.randint_like.low_dtype, aten.new_empty.default,
                   aten.new_zeros.default, aten.new_ones.default, aten.new_full.default})
_RANDOM_LIKE = frozenset({aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
                          aten.randint_like.low_dtype})


def _like_elsewhere(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """A ``*_like`` or ``new_*`` op whose ``device=`` names another device than its tensor's: made
    there (it was made on the tensor's device: ``zeros_like(x, device="cpu")`` gave a neuron
    tensor, ``zeros_like(x1, device="neuron:0")`` one on neuron:1). None for other calls."""
    device = kwargs.get("device")
    source = args[0]
    if device is None or func not in _LIKE:
        return None
    device = torch.device(device)
    if device.type == "neuron":
        if device.index is None or device.index == source._index or func in _RANDOM_LIKE:
            return None
    meta = torch.empty_strided(source.shape, source.stride(), dtype=source.dtype, device="meta")
    made = func(meta, *args[1:], **{**kwargs, "device": "cpu" if device.type == "neuron" else device})
    return made.to(device) if device.type == "neuron" else made


def _dispatch(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    if "device" in kwargs:
        made = _like_elsewhere(func, args, kwargs)
        if made is not None:
            return made
    if func in scalar_checks.CHECKED:
        scalar_checks.check(func, args, kwargs)
    kind, extra = _classify(func)
    if kind == _FUNCTIONAL:
        if func is empty_operands.CAT and (trimmed := empty_operands.trimmed_cat(args, kwargs)) is not None:
            return empty_operands.as_torch_gives(_run_compiled(func, trimmed[0], kwargs), trimmed[1])
        return _run_compiled(func, args, kwargs)
    if kind == _IN_PLACE:
        if not isinstance(args[0], NeuronTensor):  # a host tensor written with a neuron operand
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{first_neuron((args, kwargs)).device} and {args[0].device}! (when checking "
                               f"the written-to argument 'self' of {func})")
        return in_place.run(func, extra, args, kwargs, args[0], _run_compiled)
    if kind == _VIEW:
        return _run_view(func, args, kwargs)
    if kind == _COMPOSITE_VIEW:
        return func.decompose(*args, **kwargs)
    if kind == _INPLACE_VIEW:
        return _run_inplace_view(func, args, kwargs)
    if kind == _SPECIAL_OP:
        return extra(args, kwargs)
    if kind == _RANDOM:
        return _synchronized(args, kwargs, _draw, func, args, kwargs, extra)
    if kind == _BITS:
        return _run_resolving_bits(func, *extra, args, kwargs)
    return run_without_functional_form(func, args, kwargs)


def _run_resolving_bits(func: Any, kind: int, extra: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An op torch hands conjugate or negative views (:mod:`.math_bits`) on their values in plain
    memory; what it writes (an in-place op's target, an ``out=``) is written through the view."""
    reading, reading_kwargs = math_bits.resolved(args, kwargs, _resolved_copy, keep=frozenset(("out",)))
    if kind == _IN_PLACE:
        return in_place.run(func, extra, reading, reading_kwargs, args[0], _run_compiled)
    if kind == _FUNCTIONAL:
        return _run_compiled(func, reading, reading_kwargs)
    return extra(reading, reading_kwargs)


def _resolved_copy(t: NeuronTensor) -> NeuronTensor:
    """The values of a conjugate or negative view in plain memory (a queued copy, which resolves them)."""
    out = empty_on_device(t.shape, None, t.dtype, t.device)
    queue_copy(out, t, "aten::resolve_conj" if t._data.is_conj() else "aten::resolve_neg")
    return out


def _run_out_variant(func: Any, twin: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    return out_variants.run(func, twin, args, kwargs, _run_compiled, queue_copy, run_without_functional_form,
                            _run_aliased_out)


def _run_aliased_out(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An ``out=`` op whose ``out`` shares memory with an input: torch's CPU kernel over the device
    memory decides, as on the CPU (:mod:`.out_variants`)."""
    warn_fallback(func, "an out= tensor sharing memory with an input")
    return _synchronized(args, kwargs, in_place.by_cpu_kernel, func, args, kwargs, kwargs["out"])


def _draw(func: Any, args: Sequence[Any], kwargs: dict[str, Any], in_place: bool) -> Any:
    """A random op on the host, from its device's generator (in program order: a synchronization).
    One that writes its arguments (``normal_``, ``randperm(..., out=)``, which may resize its out)
    draws into scratch copies that are then written back (:mod:`.mutations`)."""
    first = first_neuron((args, kwargs))
    if in_place:
        def draw_on_cpu(*cpu_args: Any, **cpu_kwargs: Any) -> Any:
            return random.draw(func, cpu_args, cpu_kwargs, first.device)
        # (its other results, rrelu_with_noise's output beside the noise it writes, placed on the
        # device: they came back as host tensors)
        drawn = mutations.run_writing_on_cpu(draw_on_cpu, args, kwargs, written(func, args, kwargs))
        return pytree.tree_map(on_device(first._index), drawn)
    out = random.draw(func, pytree.tree_map(_cpu, args), pytree.tree_map(_cpu, kwargs), first.device)
    return pytree.tree_map(on_device(first._index), out)


