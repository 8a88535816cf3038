"""Process identity: which rank of which job this process is, and which neuron devices it sees.

One small module every layer may ask: :func:`rank`, :func:`local_rank` and
:func:`world_size` come from torch.distributed once it is initialized, else from
torchrun's RANK / LOCAL_RANK / WORLD_SIZE; :func:`job_id` names this run (start
time and pid, so concurrent jobs never share a directory); :func:`rank_dir` is a
per-rank directory under a root (the artifact tree, the profiles, the metric
tables). :func:`device_index` parses the many ways a neuron device is named (one named
without an index is this thread's current device, :func:`current_device`, as CUDA's is), and
:func:`device_count` says how many this process sees (TORCH_NEURONX_VISIBLE_DEVICES).

Nothing here imports torch at module import: torch.distributed is consulted only
when torch is already loaded.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from torch_neuronx import config

_job_id: str | None = None


def _distributed() -> Any | None:
    """torch.distributed when it is loaded and initialized, else None."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # a half-torn-down process group at exit
        return None
    return None


#: The rank and world size torch.distributed last reported: after ``destroy_process_group()`` a
#: process started without RANK in its environment (``mp.spawn``, an explicit ``rank=``) is still
#: that rank (every rank wrote its metric tables at exit as rank 0's, over each other's).
_last_group: tuple[int, int] | None = None


def rank() -> int:
    """The global rank of this process (0 when not distributed)."""
    return _group_value(0, "RANK")


def note_default_group(group_rank: int, size: int) -> None:
    """Remember the default process group's rank and size as it is created (see :data:`_last_group`)."""
    global _last_group
    _last_group = (group_rank, size)


def world_size() -> int:
    """How many ranks the job has (1 when not distributed)."""
    return _group_value(1, "WORLD_SIZE")


def _group_value(index: int, variable: str) -> int:
    """The rank (0) or world size (1): torch.distributed's, else the group it last reported where the
    environment does not say (:data:`_last_group`), else the environment variable's."""
    global _last_group
    dist = _distributed()
    if dist is not None:
        _last_group = (dist.get_rank(), dist.get_world_size())
    elif _last_group is None or variable in os.environ:
        return config.get(variable)
    return _last_group[index]


def local_rank() -> int:
    """This process's rank among the ranks of its host (torchrun's LOCAL_RANK; 0 when unset)."""
    return config.get("LOCAL_RANK")


def is_distributed() -> bool:
    """Whether this process is one rank of several (by torch.distributed or torchrun's environment)."""
    return world_size() > 1 or "RANK" in os.environ


def job_id() -> str:
    """This process's job id: ``%Y%m%d_%H%M%S_{pid}``, fixed at its first use."""
    global _job_id
    if _job_id is None:
        _job_id = f"{datetime.datetime.now():%Y%m%d_%H%M%S}_{os.getpid()}"
    return _job_id


def rank_dir(root: str, *parts: str) -> str:
    """``{root}/rank{rank}/{parts...}``: where this rank writes under a shared ``root``."""
    return os.path.join(root, f"rank{rank()}", *parts)


# -- neuron devices -------------------------------------------------------------------


def device_count() -> int:
    """The number of neuron devices this process sees: TORCH_NEURONX_VISIBLE_DEVICES, else 1.

    The variable is a count (``4``) or a list of indices and ranges (``0,1``, ``0-3``), as
    NEURON_RT_VISIBLE_CORES is; this process numbers the devices it sees from 0.
    """
    return len(config.get("TORCH_NEURONX_VISIBLE_DEVICES")) or 1


class _Current(threading.local):
    device = 0  # this thread's current neuron device index


_current = _Current()


def current_device() -> int:
    """This thread's current neuron device index (0 unless set)."""
    return _current.device


_device_listener: Callable[[int], None] | None = None


def set_current_device(index: int) -> None:
    """Make ``index`` this thread's current neuron device (checked by the caller)."""
    _current.device = index
    if _device_listener is not None:
        _device_listener(index)


def on_set_device(listener: Callable[[int], None]) -> None:
    """Call ``listener(index)`` in the thread that changes its current device, on every change (the
    native device guard's mirror of it, ``device/generic_streams.py``); one listener."""
    global _device_listener
    _device_listener = listener


def device_index(device: Any = None) -> int:
    """A neuron device index from an int, "neuron:N" or a ``torch.device``; None, "neuron" and
    ``torch.device("neuron")`` name this thread's current device (as "cuda" names CUDA's)."""
    if device is None:
        return _current.device
    if isinstance(device, bool):
        raise ValueError(f"expected a neuron device, got {device!r}")
    if isinstance(device, int):
        index = device
    else:
        kind, index = _device_parts(device)
        if kind != "neuron":
            raise ValueError(f"expected a neuron device (an int, 'neuron', 'neuron:N' or "
                             f"torch.device('neuron', N)), got {device!r}")
        index = _current.device if index is None else index
    if index < 0:
        raise ValueError(f"device index must be non-negative, got {device!r}")
    return index


def checked_device_index(device: Any = None) -> int:
    """:func:`device_index`, which must also name a device this process sees."""
    index = device_index(device)
    count = device_count()
    if index >= count:
        raise ValueError(f"neuron device {index} does not exist; device_count() is {count} "
                         "(TORCH_NEURONX_VISIBLE_DEVICES sets how many this process sees)")
    return index


def _device_parts(device: Any) -> tuple[str, int | None]:
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if index and not index.isdigit():
            raise ValueError(f"malformed device string {device!r}; expected 'neuron' or 'neuron:N'")
        return kind, int(index) if index else None
    if hasattr(device, "type") and hasattr(device, "index"):  # torch.device, without importing torch
        return device.type, device.index
    raise ValueError(f"expected a neuron device (an int, 'neuron:N' or torch.device), got {device!r}")


_at_termination: list[Any] = []
_previous_handler: Any = None


def at_termination(fn: Any) -> bool:
    """Run ``fn()`` when the process receives SIGTERM (torchrun stopping its workers after one
    failed, a scheduler's preemption or time limit), before it ends as it would have: the
    handler found before runs next, or, for the default action, the process dies of the signal
    (exit status 143). Nothing is installed when SIGTERM is ignored or handled outside Python,
    or off the main thread (where Python cannot set handlers): False then.

    The handler runs in the main thread wherever the signal found it, maybe holding a lock that
    ``fn`` takes: the locks of what such hooks read (metrics, events, samples, directories) are
    reentrant, and a second SIGTERM during the hooks is ignored (both hung the process for good).
    """
    import signal
    import threading

    global _previous_handler
    if fn in _at_termination:
        return True
    if not _at_termination:
        if threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN or previous is None:
            return False
        _previous_handler = previous
        signal.signal(signal.SIGTERM, _on_sigterm)
    _at_termination.append(fn)
    return True


_terminating = False


def _on_sigterm(signum: int, frame: Any) -> None:
    import signal

    global _terminating
    if _terminating:  # a second SIGTERM while the hooks run: they finish, then the process ends
        return
    _terminating = True
    for fn in list(_at_termination):
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failing hook must not keep the process alive
            pass
    previous = _previous_handler
    if callable(previous) and previous is not signal.SIG_DFL:
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
