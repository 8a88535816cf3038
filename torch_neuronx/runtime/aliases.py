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
#: id of a parameter -> (a weak reference to it, weak references to the aliases its ``.data`` returned);
#: keyed by id, not by tensor (a tensor's ``==`` compares values)
_aliases: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}
_lock = threading.RLock()  # reentrant: a weak reference's callback may run inside (garbage collection)
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
    key = id(self)
    with _lock:
        state.epoch += 1
        entry = _aliases.get(key)
        if entry is None or entry[0]() is not self:
            entry = _aliases[key] = (weakref.ref(self, lambda _, key=key: _forget(key)), [])
        refs = entry[1]
        refs[:] = [r for r in refs if r() is not None]
        refs.append(weakref.ref(alias))
    return alias


def _forget(key: int) -> None:
    with _lock:
        entry = _aliases.get(key)
        if entry is not None and entry[0]() is None:
            del _aliases[key]


def _set(self: torch.Tensor, value: torch.Tensor) -> None:
    _inherited(type(self)).__set__(self, value)


def held(t: torch.Tensor) -> bool:
    """Whether an alias ``t.data`` returned is still alive (it may be written at any time)."""
    with _lock:
        entry = _aliases.get(id(t))
        return entry is not None and entry[0]() is t and any(r() is not None for r in entry[1])


_installed = False


def install() -> None:
    """Wrap ``torch.nn.Parameter.data`` (once per process)."""
    global _installed
    if not _installed:
        torch.nn.Parameter.data = property(_get, _set, doc=_base.__doc__)
        _installed = True
