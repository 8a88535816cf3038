"""List-writing ops (optimizer and AMP updates) queued on the stream as torch's own host kernels.

The neuron device's memory is host memory: a neuron tensor's inner tensor is a CPU view of it.
An in-place op that writes *lists* of tensors (``_foreach_add_``, ``_foreach_lerp_`` and the
other in-place ``_foreach_`` ops, the fused optimizers ``_fused_adam_`` / ``_fused_adamw_``,
GradScaler's ``_amp_foreach_non_finite_check_and_unscale_``; and ``_amp_update_scale_``) is
a whole optimizer step over every parameter. Run as one device kernel per tensor, an AdamW step
of 48 parameters took 45 ms (each of its ~500 ops pays a dispatch); run on the CPU as a
synchronization, 7.7 ms, waiting for the stream each time. Here such an op is *queued* like a
kernel: its arguments are checked where it is called (on meta tensors, once per signature, so
a mismatched list raises torch's error at the user's line), and when the stream reaches it,
torch's CPU kernel runs over the tensors' memory, with the results bit for bit those of the
CPU. The op returns at once; the tensors it writes are the queued op's outputs, so host reads
and other streams wait for it as for any kernel.

A call that writes a host tensor or mixes devices, or whose arguments cannot be checked, takes
the route it had before (``fallback``); a bad call raises there, torch's error (the fused
optimizers without a meta kernel, ``_fused_sgd_`` and the ``tensor_lr`` forms, are checked
against their rule: lists as long as the parameters, per-parameter tensors of their shapes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx.device import foreach, queued
from torch_neuronx.runtime.allocation import count_writes
from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["handler"]

aten = torch.ops.aten
Handler = Callable[[Sequence[Any], dict[str, Any]], Any]

#: Ops writing one tensor that belong to the same class (GradScaler's scale update).
_ALSO = frozenset({"aten::_amp_update_scale_"})
_LIMIT = 1 << 12  # signatures whose check is remembered


def _eligible(func: Any) -> bool:
    """Whether ``func`` is in this module's class: mutable, writing a tensor list (or in
    :data:`_ALSO`), no ``out=`` argument, no metadata change, no random draw, and returning
    nothing or the tensor it writes."""
    schema = func._schema
    if not schema.is_mutable or torch.Tag.inplace_view in func.tags \
            or torch.Tag.nondeterministic_seeded in func.tags:
        return False
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if not written or any(a.is_out for a in written):
        return False
    if not (schema.name in _ALSO or any(str(a.type) == "List[Tensor]" for a in written)):
        return False
    if not schema.returns:
        return True
    return len(schema.returns) == 1 and _returned_argument(func) is not None


def _returned_argument(func: Any) -> int | None:
    """The position of the argument a single-result op returns (its alias set), or None."""
    result = func._schema.returns[0].alias_info
    if result is None:
        return None
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.before_set == result.before_set:
            return i
    return None


def handler(func: Any, fallback: Handler) -> Handler | None:
    """How the eager device runs ``func`` when it is a list-writing update (see the module
    docstring); ``fallback(args, kwargs)`` runs a call this route declines."""
    if not _eligible(func):
        return None
    written = [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    returned = _returned_argument(func) if func._schema.returns else None
    return functools.partial(_run, func, tuple(written), returned, fallback)


def _spec(value: Any) -> Any:
    """An argument as part of a signature: a tensor's metadata; a float's type, not its value
    (learning rates change every step; no check depends on them)."""
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, list | tuple):
        return ("L", *map(_spec, value))
    return float if type(value) is float else value


def _meta(value: Any) -> Any:
    if value is float:
        return 0.5
    if isinstance(value, tuple) and value and value[0] == "T":
        return torch.empty_strided(value[1], value[2], dtype=value[3], device="meta")
    if isinstance(value, tuple) and value and value[0] == "L":
        return [_meta(v) for v in value[1:]]
    return value


@functools.lru_cache(maxsize=_LIMIT)
def _checked(func: Any, signature: tuple) -> BaseException | bool:
    """Whether a call of this signature is valid, tried once on meta tensors: True, the error torch
    raises for it, or False when the op has no meta kernel (it cannot be checked)."""
    args, kwargs = [_meta(a) for a in signature[0]], {k: _meta(v) for k, v in signature[1]}
    try:
        func(*args, **kwargs)
    except NotImplementedError:  # no meta kernel
        return _fused_lists_fit(func, args, kwargs) if func._schema.name.startswith("aten::_fused_") else False
    except Exception as exc:  # torch's own message for a mismatched call
        return exc
    return foreach.elements_fit(func, args, kwargs) or True


def _fused_lists_fit(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> BaseException | bool:
    """A fused optimizer's rule (``_fused_sgd_``, ``_fused_adam_.tensor_lr``: no meta kernel): each
    non-empty tensor list as long as the parameters, each per-parameter tensor of its shape
    (``state_steps`` are scalars)."""
    schema = func._schema.arguments
    values = {a.name: (args[i] if i < len(args) else kwargs.get(a.name)) for i, a in enumerate(schema)}
    params = values[schema[0].name]
    for a in schema[1:]:
        value = values[a.name]
        if str(a.type) != "List[Tensor]" or not value:
            continue
        if len(value) != len(params):
            return RuntimeError(f"{func}: {a.name} has {len(value)} tensors for {len(params)} parameters")
        if a.name != "state_steps":
            for i, (p, t) in enumerate(zip(params, value)):
                if p.shape != t.shape:
                    return RuntimeError(f"{func}: {a.name}[{i}] has shape {list(t.shape)}, its parameter "
                                        f"{list(p.shape)}")
    return True


def _arguments(func: Any, written: tuple[int, ...], args: Sequence[Any],
               kwargs: dict[str, Any]) -> tuple[list[NeuronTensor], int] | None:
    """The neuron tensors of a call and their device; None when the call mixes devices or writes a
    host tensor (this route then declines it)."""
    schema = func._schema.arguments
    writes = {schema[i].name for i in written}
    tensors: list[NeuronTensor] = []
    index = -1
    pairs = [(schema[i].name if i < len(schema) else "", a) for i, a in enumerate(args)] + list(kwargs.items())
    for name, value in pairs:
        for leaf in pytree.tree_leaves(value):
            if type(leaf) is NeuronTensor:
                if index >= 0 and leaf._index != index:
                    return None
                index = leaf._index
                tensors.append(leaf)
            elif isinstance(leaf, torch.Tensor) and name in writes:
                return None
    return (tensors, index) if index >= 0 else None


def _host(value: Any) -> Any:
    """A call's argument as the queued host kernel takes it: a neuron tensor's inner tensor, a host
    tensor copied now (the caller may change it before the kernel runs)."""
    if type(value) is NeuronTensor:
        return value._data
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def _run(func: Any, written: tuple[int, ...], returned: int | None, fallback: Handler,
         args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    found = _arguments(func, written, args, kwargs)
    if found is None:
        return fallback(args, kwargs)
    tensors, index = found
    try:
        verdict = _checked(func, (tuple(map(_spec, args)), tuple((k, _spec(v)) for k, v in kwargs.items())))
    except TypeError:  # an unhashable argument
        verdict = False
    if isinstance(verdict, BaseException) and func._schema.name.startswith("aten::_fused_"):
        raise verdict  # the CPU's kernel would write half the parameters before refusing one
    if verdict is not True:
        return fallback(args, kwargs)  # unchecked: as before; invalid: torch's error, raised where it is called
    targets = _written_tensors(func, written, args, kwargs)
    for t in targets:
        if torch._debug_has_internal_overlap(t._data) == 1:
            return fallback(args, kwargs)  # torch's error for a write into shared elements, raised here
    outputs = list({id(t._allocation): t._allocation for t in targets if t._allocation is not None}.values())
    host_args, host_kwargs = pytree.tree_map(_host, (list(args), kwargs))
    queued.enqueue(index, str(func), tensors, outputs, _call, func, host_args, host_kwargs)
    if targets:  # autograd's version counters of the inner tensors (resident weights watch them)
        count_writes(targets)
    return None if returned is None else (args[returned] if returned < len(args)
                                          else kwargs[func._schema.arguments[returned].name])


def _written_tensors(func: Any, written: tuple[int, ...], args: Sequence[Any],
                     kwargs: dict[str, Any]) -> list[NeuronTensor]:
    schema = func._schema.arguments
    values = [args[i] if i < len(args) else kwargs.get(schema[i].name) for i in written]
    return [t for t in pytree.tree_leaves(values) if type(t) is NeuronTensor]


def _call(func: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """The queued work: torch's CPU kernel over the tensors' memory (on the stream, in inference mode)."""
    func(*args, **kwargs)
