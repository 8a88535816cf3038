"""torch's device-generic streams and events on neuron: the Python side of the native device guard.

``torch.accelerator.current_stream()``, ``torch.Stream(device="neuron")``, ``torch.Event`` and the
autograd engine (which runs each backward op on the stream its forward op ran on) ask PyTorch's
C++ device guard. The native guard (``device/native_hooks.cpp``) answers from a per-thread mirror
of this thread's current device and streams, and calls :func:`_callback` for everything else:
making a stream current, new streams, events, synchronization. Each generic stream is the
backend's own stream of that id (``runtime/streams.py``), so ``torch.Stream`` and
``torch.neuron.Stream`` order the same work; each generic event is a ``torch.neuron.Event``.

:func:`install` connects the guard; the mirror follows every change the Python side makes
(``process.set_current_device``, ``streams.set_stream`` report to it). At exit the guard is
disconnected before the interpreter goes away (an event destroyed later is dropped silently).
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import threading
from collections.abc import Callable
from typing import Any

from torch_neuronx import process
from torch_neuronx.runtime import streams

__all__ = ["install"]

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double), ctypes.c_void_p,
                             ctypes.c_int)

_lock = threading.Lock()
_events: dict[int, streams.Event] = {}  # handle -> event, while torch's event object lives
_handles = itertools.count(1)
_made: dict[tuple[int, int], streams.Stream] = {}  # streams torch made or any thread made current: kept
_library: Any = None
_connected: Any = None  # the ctypes callback object: must outlive every call from C++


def _stream(device: int, stream_id: int) -> streams.Stream:
    """The backend's stream ``stream_id`` of ``device``."""
    made = _made.get((device, stream_id))
    return made if made is not None else streams.stream_of(device, stream_id)


def _event(handle: int) -> streams.Event:
    event = _events.get(handle)
    if event is None:
        raise RuntimeError(f"neuron: event {handle} does not exist")
    return event


def _set_device(device: int, *_: Any) -> None:
    process.set_current_device(process.checked_device_index(device))


def _set_stream(device: int, stream_id: int, *_: Any) -> None:
    streams.set_stream(_stream(process.checked_device_index(device), stream_id))


def _new_stream(device: int, priority: int, *_: Any) -> int:
    stream = streams.Stream(device, priority)  # (checks the device)
    _made[(device, stream.id)] = stream
    return stream.id


def _record(handle: int, device: int, stream_id: int, timing: float) -> int:
    with _lock:
        if handle == 0:
            handle = next(_handles)
            _events[handle] = streams.Event(enable_timing=bool(timing))
        event = _events[handle]
    event.record(_stream(device, stream_id))
    return handle


def _block(handle: int, device: int, stream_id: int, *_: Any) -> None:
    _event(handle).wait(_stream(device, stream_id))


def _destroy(handle: int, *_: Any) -> None:
    with _lock:
        _events.pop(handle, None)


_OPS: dict[int, Callable[..., Any]] = {
    1: _set_device,
    2: _set_stream,
    3: _new_stream,
    # 4 (record) is called by _callback itself: it also reads the timing flag
    5: _block,
    6: lambda handle, *_: int(_event(handle).query()),
    7: lambda handle, *_: _event(handle).synchronize(),
    8: lambda start, end, *_: _event(start).elapsed_time(_event(end)),
    9: _destroy,
    10: lambda device, stream_id, *_: int(_stream(device, stream_id).query()),
    11: lambda device, stream_id, *_: _stream(device, stream_id).synchronize(),
    12: lambda device, *_: streams.synchronize(process.checked_device_index(device)),
    13: lambda *_: process.device_count(),
}
_RETURNS_FLOAT = 8  # elapsed time: milliseconds in out_double


def _callback(op: int, a: int, b: int, c: int, out: Any, out_double: Any, error: int, error_size: int) -> int:
    """What the native guard asks of the runtime: 0, or 1 with the error's message in ``error``."""
    try:
        if op == 4:  # record: out_double holds the timing flag
            result = _record(a, b, c, out_double[0])
        else:
            result = _OPS[op](a, b, c)
        if op == _RETURNS_FLOAT:
            out_double[0] = float(result)
        elif result is not None:
            out[0] = int(result)
        return 0
    except BaseException as exc:  # never into C++: the guard raises it as a RuntimeError
        message = f"{type(exc).__name__}: {exc}".encode(errors="replace")[: max(error_size, 0)]
        ctypes.memmove(error, message, len(message))
        return 1


def _mirror_device(index: int) -> None:
    _library.torch_neuronx_guard_set_device(index)


def _mirror_stream(device: int, stream_id: int) -> None:
    _library.torch_neuronx_guard_set_stream(device, stream_id)
    if stream_id and (device, stream_id) not in _made:
        # Kept, as torch.Stream's are: autograd runs a backward op on its forward's stream, by id,
        # after the torch.neuron.Stream the forward ran on may have been freed.
        _made[(device, stream_id)] = streams.current_stream(device)


def _disconnect() -> None:
    if _library is not None:
        _library.torch_neuronx_register_guard(_CALLBACK())  # (a null pointer)


def install(library: Any) -> None:
    """Make the native device guard torch's, connected to this module (once per process)."""
    global _library, _connected
    if _library is not None:
        return
    library.torch_neuronx_register_guard.argtypes = [_CALLBACK]
    library.torch_neuronx_guard_set_device.argtypes = [ctypes.c_int]
    library.torch_neuronx_guard_set_stream.argtypes = [ctypes.c_int, ctypes.c_int64]
    _library, _connected = library, _CALLBACK(_callback)
    library.torch_neuronx_register_guard(_connected)
    # This thread's state so far (the mirror starts at device 0 and default streams).
    _mirror_device(process.current_device())
    process.on_set_device(_mirror_device)
    streams.on_set_stream(_mirror_stream)
    streams.generic_event = lambda event: _events.get(int(event.event_id))
    atexit.register(_disconnect)
