"""The runtime in a forked child: usable where it can be, an error where not, never a hang.

A child made with ``os.fork()`` inherits the parent's runtime but none of its threads. The
eager kernel compiler makes its own thread in the child (``device/kernels.py``), the streams
their own workers (``runtime/streams.py``), and the lowering worker is the child's own
(``compiler/lowering_worker.py``), so eager ops and compiled graphs on the single-threaded
driver run there (DataLoader workers, ``multiprocessing`` with fork). What cannot: a graph
loaded on the multi-threaded driver (``local-task``), whose executor's workers are not in the
child, raises :class:`ForkedChildError` (:func:`check`) instead of waiting forever; and the
runtime devices the child inherited are never freed (:func:`keep_forever`): freeing one at the
child's exit waited for the parent's executor threads (a hang in interpreter finalization).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["ForkedChildError", "check", "keep_forever", "state"]


class ForkedChildError(RuntimeError):
    """The neuron runtime was used in a child forked from a process that had started it."""


class _State:
    __slots__ = ("started", "forked")

    def __init__(self) -> None:
        self.started = False  # a multi-threaded runtime device was opened in this process
        self.forked = False  # this process is a fork of one where it was


state = _State()
_kept: list[Any] = []


def keep_forever(*objects: Any) -> None:
    """Objects a forked child must never free (their destructors wait for the parent's threads)."""
    _kept.extend(objects)


def check() -> None:
    """Raise :class:`ForkedChildError` in a forked child (see the module docstring)."""
    if state.forked:
        raise ForkedChildError(
            "this compiled graph runs on the multi-threaded runtime driver of the process this one was "
            "forked from, whose threads are not in the child; start workers with the 'spawn' or "
            "'forkserver' start method (multiprocessing.set_start_method('spawn'))")


def _after_fork_in_child() -> None:
    state.forked = state.started
    for obj in _kept:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


os.register_at_fork(after_in_child=_after_fork_in_child)
