"""In-place ``torch._foreach_*`` ops on neuron tensors as one op per tensor, each queued on the device.

Optimizers with ``foreach=True``, gradient clipping, DDP and FSDP2 call the ``_foreach_`` ops
(``_foreach_add_``, ``_foreach_lerp_``, ``_foreach_addcmul_`` and the rest). A call is normally
queued whole as torch's host kernel (:mod:`.host_kernels`, which checks its elements with
:func:`elements_fit`); one that route declines (a host tensor written, tensors of two devices)
would otherwise run on the CPU as a synchronization of the stream. Each is run instead as its per-tensor op
(``_foreach_add_.List(xs, ys, alpha=a)`` as ``add_(x, y, alpha=a)`` for every pair): the element's
arguments are the list arguments' i-th elements and the other arguments as they are, and the
per-tensor op is the one PyTorch's overload resolution picks for them. That pick is made once per
foreach overload, on meta tensors, before anything runs: an op without a per-tensor counterpart
(or whose arguments do not fit one) keeps the CPU route. Out-of-place foreach ops are functional
and compile as one kernel, as every other op does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["handler"]

aten = torch.ops.aten
Handler = Callable[[Sequence[Any], dict[str, Any]], Any]
_PREFIX = "aten::_foreach_"
_KEYWORD_ONLY = ("alpha", "value")  # keyword-only in the per-tensor ops, positional in some foreach ones
#: Per-tensor ops whose foreach forms take the scalar operand as ``scalars``: there it is ``value``.
_SCALARS_ARE_VALUE = ("addcdiv", "addcdiv_", "addcmul", "addcmul_")


def _per_tensor(func: Any) -> tuple[Any, list[int], list[str]] | None:
    """An in-place ``_foreach_`` op's per-tensor op, the positions of its list arguments and the
    argument names the per-tensor op knows them by; None for any other op."""
    name = func._schema.name
    if not name.startswith(_PREFIX) or not func._schema.is_mutable:
        return None
    packet = getattr(aten, name[len(_PREFIX):], None)
    if packet is None:
        return None
    arguments = func._schema.arguments
    lists = [i for i, a in enumerate(arguments) if isinstance(a.type, torch._C.ListType)]
    names = [a.name for a in arguments]
    if packet.__name__ in _SCALARS_ARE_VALUE:
        names = ["value" if n == "scalars" else n for n in names]
        # ``.Tensor`` overloads pass the scalars as one host tensor: element i is its i-th value.
        lists += [i for i, a in enumerate(arguments) if a.name == "scalars" and str(a.type) == "Tensor"]
    return packet, lists, names


def handler(func: Any, fallback: Callable[..., Any]) -> Handler | None:
    """How the eager device runs ``func`` when it is an in-place ``_foreach_`` op with a per-tensor
    counterpart; ``fallback(func, args, kwargs)`` runs a call whose arguments fit none. (Out-of-place
    ones, ``_foreach_sqrt``, are functional: they compile as one kernel like any other op.)"""
    found = _per_tensor(func)
    return None if found is None else functools.partial(_run, func, *found, fallback)


def elements_fit(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> BaseException | None:
    """Torch's error for the first element of an in-place ``_foreach_`` call (meta tensors welcome)
    that its per-tensor op refuses (shapes that do not broadcast, which a foreach op's meta kernel
    does not check), or None."""
    found = _per_tensor(func)
    if found is None:
        return None
    packet, lists, names = found
    count = len(args[lists[0]]) if lists else 0
    for i in range(count):
        try:
            call_args, call_kwargs = _element(args, kwargs, lists, names, i)
            packet(*call_args, **call_kwargs)
        except Exception as exc:
            return exc
    return None


def _element(args: Sequence[Any], kwargs: dict[str, Any], lists: list[int], names: list[str],
             i: int) -> tuple[list[Any], dict[str, Any]]:
    """The per-tensor call of element ``i``: list arguments indexed, keyword-only ones by name."""
    call_args: list[Any] = []
    call_kwargs: dict[str, Any] = {}
    for position, value in enumerate(args):
        if position in lists:
            value = value[i]
            if isinstance(value, torch.Tensor) and value.dim() == 0 and names[position] == "value":
                # a host tensor of scalars (``.Tensor`` overloads); a meta one (a check) has no values
                value = value.item() if value.device.type != "meta" else 1.0
        if names[position] in _KEYWORD_ONLY:
            call_kwargs[names[position]] = value
        else:
            call_args.append(value)
    for key, value in kwargs.items():
        position = names.index(key) if key in names else -1
        call_kwargs[key] = value[i] if position in lists else value
    return call_args, call_kwargs


class _Spec(tuple):
    """A tensor argument's metadata, hashable: stands for a meta tensor in :func:`_fits`."""

    def __new__(cls, t: torch.Tensor) -> _Spec:
        return super().__new__(cls, (tuple(t.shape), tuple(t.stride()), t.dtype))

    def meta(self) -> torch.Tensor:
        return torch.empty_strided(self[0], self[1], dtype=self[2], device="meta")


def _signature(call_args: list[Any], call_kwargs: dict[str, Any]) -> tuple:
    spec = pytree.tree_map(lambda v: _Spec(v) if isinstance(v, torch.Tensor) else v, (call_args, call_kwargs))
    return tuple(spec[0]), tuple(sorted(spec[1].items()))


@functools.lru_cache(maxsize=4096)
def _fits(packet: Any, signature: tuple) -> bool:
    """Whether the per-tensor op accepts an element call of this signature (tried on meta tensors,
    once per signature): if it does, every element of a call binds the same way."""
    args, kwargs = signature
    build = lambda v: v.meta() if isinstance(v, _Spec) else v  # noqa: E731
    try:
        packet(*pytree.tree_map(build, list(args)), **{k: pytree.tree_map(build, v) for k, v in kwargs})
    except Exception:
        return False
    return True


def _run(func: Any, packet: Any, lists: list[int], names: list[str], fallback: Callable[..., Any],
         args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    count = len(args[lists[0]]) if lists else 0
    calls = [_element(args, kwargs, lists, names, i) for i in range(count)]
    for call_args, call_kwargs in calls:  # all bind before any runs: a half-applied update is never left
        try:
            fits = _fits(packet, _signature(call_args, call_kwargs))
        except TypeError:  # an unhashable argument
            fits = False
        if not fits:
            return fallback(func, args, kwargs)
    for call_args, call_kwargs in calls:
        packet(*call_args, **call_kwargs)
    return None
