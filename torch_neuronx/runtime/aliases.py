"""Which parameters may be written without their version counter moving: ``.data`` aliases.

A resident parameter (:class:`~.executable.Executable`) is bound, and its matmul operands
packed, once; it is bound again when the tensor changed: another object, another address, or
an in-place update, which moves the tensor's version counter. ``p.data`` returns a tensor over
the same memory with a version counter of its own, so ``p.data.mul_(2)`` or
``p.data.copy_(new)`` (EMA updates, weight hot-swaps, older optimizers and loaders) changed the
values unseen, and the compiled graph kept computing with the old ones.

Here the ``data`` property of ``torch.nn.Parameter`` is wrapped: each read bumps :data:`state`'s
epoch and remembers the alias it returned (weakly). A binding records the epoch; a call whose
epoch moved binds again, and a binding made while an alias is still alive (one kept in a
variable, which may be written later) is used for one call only, so every call reads the values
as they are then (after a few such calls the graph switches to its NEFF that takes the
parameters as arguments: ``Executable``'s ``on_volatile``). A temporary alias
(``p.data.normal_()``, ``p.data.norm()``) is gone by the next call, so initialization code and
logging cost one binding each time they run, no more.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

__all__ = ["held", "install", "state"]


class _State:
    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0  # bumped by every ``.data`` read of a parameter


state = _State()
#: id of a parameter -> weak references to the aliases its ``.data`` returned. Keyed by id: a
#: tensor's ``==`` compares values, and a weak reference to the parameter itself would make
#: ``module.to(...)`` fail (``torch.utils.swap_tensors`` refuses a tensor that has one). An id
#: reused by a later parameter can only make it look held (one binding per call: still correct).
_aliases: dict[int, list[weakref.ref]] = {}
_PRUNE = 4096  # entries kept before those without a live alias are dropped
_lock = threading.Lock()
_base = torch._C.TensorBase.data  # the getset descriptor every tensor's ``data`` is


@functools.cache
def _inherited(kind: type) -> Any:
    """The ``data`` descriptor ``kind`` would have without this wrapper: the next one after
    ``torch.nn.Parameter`` in its MRO (a subclass that also derives from a tensor subclass with a
    ``data`` of its own, as a lazy module's neuron placeholder does, keeps it)."""
    mro = kind.__mro__
    for klass in mro[mro.index(torch.nn.Parameter) + 1:]:
        if "data" in klass.__dict__:
            return klass.__dict__["data"]
    return _base


def _get(self: torch.Tensor) -> torch.Tensor:
    alias = _inherited(type(self)).__get__(self)
    with _lock:
        state.epoch += 1
        refs = _aliases.setdefault(id(self), [])
        refs[:] = [r for r in refs if r() is not None]
        refs.append(weakref.ref(alias))
        if len(_aliases) > _PRUNE:
            for key in [k for k, v in _aliases.items() if not any(r() is not None for r in v)]:
                del _aliases[key]
    return alias


def _set(self: torch.Tensor, value: torch.Tensor) -> None:
    _inherited(type(self)).__set__(self, value)


def held(t: torch.Tensor) -> bool:
    """Whether an alias ``t.data`` returned is still alive (it may be written at any time)."""
    with _lock:
        return any(r() is not None for r in _aliases.get(id(t), ()))


_installed = False


def install() -> None:
    """Wrap ``torch.nn.Parameter.data`` (once per process)."""
    global _installed
    if not _installed:
        torch.nn.Parameter.data = property(_get, _set, doc=_base.__doc__)
        _installed = True
