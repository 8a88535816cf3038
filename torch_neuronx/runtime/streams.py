"""Neuron streams and events on the CPU target, named as ``torch.cuda``'s.

A :class:`Stream` is an in-order work queue of one device (:mod:`.work_queue`): ``stream.submit(fn)``
returns at once and a worker thread runs the submitted callables one after
another. An :class:`Event` marks a point in a stream's queue; it completes when
everything submitted before it has run. ``current_stream``, ``set_stream`` and
the ``stream(...)`` context manager keep a per-thread current stream per
device, as torch.cuda does.

Two variables change the behaviour, read when a stream is created:

* ``NEURON_LAUNCH_BLOCKING=1``: ``submit`` runs the work synchronously in the
  caller's thread, so errors surface at the call that caused them.
* ``TORCH_NEURONX_ENABLE_STREAMS=0``: every stream aliases the device's
  default stream (same id, same queue).

An exception raised by work on a worker thread is logged and re-raised, as
:class:`StreamError`, by the next ``synchronize()`` of that stream.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torch_neuronx import config, memory, observe, process
from torch_neuronx.observe.events import state as _observing
from torch_neuronx.process import checked_device_index, device_index
from torch_neuronx.runtime.work_queue import NO_KWARGS, Pending, StreamError, WorkQueue, in_worker, submitted
from torch_neuronx.runtime.work_queue import local as _local

__all__ = ["Event", "Pending", "Stream", "StreamError", "current_stream", "default_stream", "in_worker",
           "set_stream", "stream", "submitted", "synchronize"]

_log = logging.getLogger("torch_neuronx.runtime.streams")
_EXIT_WAIT_S = 600.0  # at interpreter exit, how long the queued work may still run
_FORK_WAIT_S = 600.0  # before os.fork(), how long the queued work may still run
_DRAIN_WAIT_S = 60.0  # the longest an allocation waits for queued work before growing the pool

_registry_lock = threading.Lock()
_defaults: dict[int, Stream] = {}  # read without the lock on the hot path
_queues: dict[int, weakref.WeakSet[WorkQueue]] = collections.defaultdict(weakref.WeakSet)
_next_ids: dict[int, Iterator[int]] = collections.defaultdict(lambda: itertools.count(1))


def _default_stream(device: int) -> Stream:
    stream = _defaults.get(device)
    if stream is None:
        with _registry_lock:
            stream = _defaults.get(device)
            if stream is None:
                config.get("TORCH_NEURONX_ENABLE_STREAMS")  # a value other than 0 and 1 raises at first use
                queue = WorkQueue(device, 0)
                _queues[device].add(queue)
                stream = _defaults[device] = Stream._wrap(queue)
    return stream


def stream_of(device: int, stream_id: int) -> Stream:
    """The stream ``stream_id`` of neuron device ``device`` (0: its default stream)."""
    if stream_id == 0:
        return _default_stream(device)
    with _registry_lock:
        queue = next((q for q in _queues[device] if q.id == stream_id), None)
    if queue is None:
        raise RuntimeError(f"neuron:{device} has no stream {stream_id} (the torch.neuron.Stream was freed)")
    return Stream._wrap(queue)


def as_stream(stream: Any) -> Any:
    """``stream`` as this module's :class:`Stream`: torch's device-generic ``torch.Stream`` of a
    neuron device is the stream of its id (``torch.Stream(device="neuron")`` and
    ``torch.accelerator.current_stream()`` give those); anything else is refused."""
    if isinstance(stream, Stream):
        return stream
    if isinstance(stream, torch.Stream) and stream.device.type == "neuron":
        return stream_of(stream.device_index, stream.stream_id)
    raise TypeError(f"expected a torch.neuron.Stream or a torch.Stream of a neuron device, got "
                    f"{stream!r} ({type(stream).__name__})")


#: The backend event behind a device-generic ``torch.Event`` (set by the native device guard,
#: ``device/generic_streams.py``): None for an event never recorded.
generic_event: Callable[[Any], Event | None] | None = None


def _as_event(event: Any) -> Event:
    """``event`` as this module's :class:`Event` (a ``torch.Event`` of a neuron device too)."""
    if isinstance(event, Event):
        return event
    if isinstance(event, torch.Event) and generic_event is not None and event.device.type == "neuron":
        return generic_event(event) or Event()  # (never recorded: nothing to wait for, as CUDA's)
    raise TypeError(f"expected a torch.neuron.Event or a torch.Event of a neuron device, got {type(event).__name__}")


class Stream:
    """An in-order queue of work on a neuron device (``torch.cuda.Stream``'s counterpart).

    Not a ``torch.Stream`` subclass (as ``torch.cuda.Stream`` is): Dynamo handles those itself
    inside compiled functions (FSDP2's), and fails on this one's queue. torch.neuron's calls take
    ``torch.Stream``s of neuron devices; torch's own calls take those, not this class.
    """

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        index = checked_device_index(device)  # as torch.cuda.Stream: a device that does not exist is an error
        self.priority = priority  # kept for API compatibility; all streams are equal here
        if not config.get("TORCH_NEURONX_ENABLE_STREAMS"):
            self._queue = _default_stream(index)._queue  # streams disabled: alias the default stream
            return
        with _registry_lock:
            self._queue = WorkQueue(index, next(_next_ids[index]))
            _queues[index].add(self._queue)

    @classmethod
    def _wrap(cls, queue: WorkQueue) -> Stream:
        stream = cls.__new__(cls)
        stream.priority = 0
        stream._queue = queue
        return stream

    def __enter__(self) -> Stream:
        """``with stream:`` as ``with torch.neuron.stream(stream):`` (torch.Stream's form)."""
        block = stream(self)
        block.__enter__()
        _local.__dict__.setdefault("entered", []).append(block)  # (per thread: blocks nest)
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.entered.pop().__exit__(None, None, None)

    @property
    def device_index(self) -> int:
        return self._queue.device

    @property
    def device(self) -> str:
        return f"neuron:{self._queue.device}"

    @property
    def id(self) -> int:
        """The stream's id on its device; 0 is the default stream."""
        return self._queue.id

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)`` to run after everything submitted before it."""
        if _observing.active:
            observe.emit("stream.submit", device=self._queue.device, stream=self._queue.id)
        self._queue.submit(fn, args, kwargs)

    def enqueue(self, fn: Callable[..., Any], *args: Any) -> Pending | None:
        """Queue ``fn(*args)`` (an op's work) and return the point it marks in this stream, which
        completes once it has run; None when it already ran (launch blocking: synchronously, its
        error raised to the caller)."""
        queue = self._queue
        if _local.in_worker:  # work a stream runs issues its ops synchronously (it is in order already)
            fn(*args)
            return None
        if _observing.active:
            observe.emit("stream.submit", device=queue.device, stream=queue.id)
        seq = queue.submit(fn, args, NO_KWARGS)
        return None if queue.blocking else Pending(queue, seq)

    def enqueue_small(self, fn: Callable[..., Any], *args: Any) -> Pending | None:
        """:meth:`enqueue` for a small op: run at once in the calling thread when nothing is
        queued or running on this stream (:meth:`WorkQueue.run_inline`), else queued."""
        queue = self._queue
        if queue.blocking or _local.in_worker:
            return self.enqueue(fn, *args)
        if _observing.active:
            observe.emit("stream.submit", device=queue.device, stream=queue.id)
        if queue.run_inline(fn, args):
            return None
        return Pending(queue, queue.submit(fn, args, NO_KWARGS))

    def drain(self) -> None:
        """Block until the work submitted so far has run (at once from a stream's own thread, whose
        work issues its ops synchronously). Errors stay the stream's to report."""
        queue = self._queue
        if queue.completed < queue.submitted and not _local.in_worker:
            queue.wait(queue.submitted)

    def query(self) -> bool:
        """True when all submitted work has completed."""
        queue = self._queue
        return queue.completed >= queue.submitted

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in this stream's order: after the work queued before it, and returning its
        result (raising its error) to the caller, as a synchronous launch on this stream.

        With nothing queued it runs at once in the calling thread.
        """
        queue = self._queue
        if queue.blocking or queue.completed >= queue.submitted or _local.in_worker:
            return fn(*args)  # (work a stream runs launches inline: it already runs in stream order)
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append((True, fn(*args)))
            except BaseException as exc:  # handed to the caller, not kept for synchronize()
                outcome.append((False, exc))

        queue.wait(queue.submit(call, (), {}))
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for all submitted work; re-raise the first error a task raised since the last call."""
        queue = self._queue
        if not queue.wait(queue.submitted, timeout):
            raise TimeoutError(f"{self!r} did not finish its work within {timeout} s")
        queue.raise_error()

    @property
    def position(self) -> int:
        """How many tasks were ever submitted to this stream (a point in its queue, see :meth:`Event.at`)."""
        return self._queue.submitted

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) at the current end of this stream's queue."""
        event = event if event is not None else Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Make work submitted to this stream from now on wait for ``event``."""
        _as_event(event).wait(self)

    def wait_stream(self, stream: Stream) -> None:
        """Make work submitted to this stream from now on wait for ``stream``'s current work
        (a ``torch.neuron.Stream``, or a ``torch.Stream`` of a neuron device)."""
        self.wait_event(as_stream(stream).record_event())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._queue is self._queue

    def __hash__(self) -> int:
        return hash((self._queue.device, self._queue.id))

    def __repr__(self) -> str:
        return f"<torch_neuronx.runtime.streams.Stream device=neuron:{self.device_index} id={self.id}>"


class Event:
    """A marker in a stream's queue (``torch.cuda.Event``'s counterpart)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._queue: WorkQueue | None = None
        self._seq = 0
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Mark the current end of ``stream``'s queue (the current stream if None)."""
        stream = as_stream(stream) if stream is not None else current_stream()
        queue = stream._queue
        self._time = None
        if self.enable_timing:
            self._seq = queue.submit(self._stamp, (), {})
        else:
            with queue._lock:
                self._seq = queue.submitted
        self._queue = queue

    @classmethod
    def at(cls, stream: Stream, position: int) -> Event:
        """An event at an earlier point of ``stream``'s queue: after its first ``position`` tasks."""
        event = cls()
        event._queue, event._seq = stream._queue, position
        return event

    def _stamp(self) -> None:
        self._time = time.perf_counter()

    def query(self) -> bool:
        """True when the work before the recorded point has run (or the event was never recorded)."""
        queue = self._queue
        return queue is None or queue.completed >= self._seq

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until the event completes."""
        if self._queue is not None and not self._queue.wait(self._seq, timeout):
            raise TimeoutError(f"event on neuron:{self._queue.device} stream {self._queue.id} did not "
                               f"complete within {timeout} s")

    def wait(self, stream: Stream | None = None) -> None:
        """Make work submitted to ``stream`` (the current stream if None) from now on wait for this event."""
        stream = as_stream(stream) if stream is not None else current_stream()
        queue, seq = self._queue, self._seq  # the point recorded now, even if re-recorded later
        if queue is None or queue.completed >= seq or stream._queue is queue:
            return  # already complete, or ordered by the queue itself
        stream.submit(queue.wait, seq)

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and ``end`` (both recorded with ``enable_timing=True``)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("both events must be created with enable_timing=True")
        self.synchronize()
        end.synchronize()
        if self._time is None or end._time is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return (end._time - self._time) * 1000.0


# -- the current device and stream --------------------------------------------


current_device = process.current_device
set_current_device = process.set_current_device


def default_stream(device: Any = None) -> Stream:
    """The default stream (id 0) of ``device`` (the current device if None)."""
    return _default_stream(device_index(device))


def current_stream(device: Any = None) -> Stream:
    """This thread's current stream on ``device`` (the current device if None; its default stream
    unless set)."""
    index = device_index(device)
    current = getattr(_local, "streams", None)
    if current is not None and index in current:
        return current[index]
    return _default_stream(index)


_stream_listener: Callable[[int, int], None] | None = None


def set_stream(stream: Stream) -> None:
    """Make ``stream`` this thread's current stream on its device (a ``torch.Stream`` of a neuron
    device too)."""
    stream = as_stream(stream)  # (checked before anything changes)
    current = getattr(_local, "streams", None)
    if current is None:
        current = _local.streams = {}
    current[stream.device_index] = stream
    if _stream_listener is not None:
        _stream_listener(stream.device_index, stream.id)


def on_set_stream(listener: Callable[[int, int], None]) -> None:
    """Call ``listener(device, stream id)`` in the thread that changes its current stream of a device,
    on every change (the native device guard's mirror, ``device/generic_streams.py``); one listener."""
    global _stream_listener
    _stream_listener = listener


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[Stream | None]:
    """Make ``s`` the current stream of its device, and its device the current device, inside
    the block (no-op for None), as ``torch.cuda.stream``."""
    if s is None:
        yield None
        return
    s = as_stream(s)
    previous, previous_device = current_stream(s.device_index), process.current_device()
    set_stream(s)
    process.set_current_device(s.device_index)
    try:
        yield s
    finally:
        set_stream(previous)
        process.set_current_device(previous_device)


def executing() -> tuple[int, int]:
    """The device index and stream id of the work running in this thread: the stream whose worker
    this is, else the current stream of the current device (for events: where a launch ran)."""
    queue = getattr(_local, "queue", None)
    if queue is not None:
        return queue.device, queue.id
    stream = current_stream()
    return stream._queue.device, stream._queue.id


def launch(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the current stream of the current device (see :meth:`Stream.run`)."""
    return current_stream().run(fn, *args)


def synchronize(device: Any = None) -> None:
    """Wait for the work of every stream of ``device`` (the current device if None)."""
    index = device_index(device)
    with _registry_lock:
        queues = list(_queues[index])
    for queue in queues:
        Stream._wrap(queue).synchronize()


def _finish_at_exit() -> None:
    """Let every stream run the work queued on it and end its worker before the interpreter exits.

    A script that ends with work still queued (``q = a @ a`` as its last line) had its worker
    thread torn down by the interpreter's finalization inside the runtime's native code, and
    the process aborted ("terminate called after throwing an instance of ''"). CUDA finishes
    queued work at exit too.
    """
    deadline = time.monotonic() + _EXIT_WAIT_S
    for queue in _finish_queued("at exit", _EXIT_WAIT_S):
        queue.stop(max(0.1, deadline - time.monotonic()))


def _finish_queued(when: str, seconds: float) -> list[WorkQueue]:
    """Wait up to ``seconds`` in all for the work queued on every stream (its errors stay for the
    next synchronization); every stream's queue. A stream still busy then is logged."""
    with _registry_lock:
        queues = [queue for device in _queues.values() for queue in device]
    deadline = time.monotonic() + seconds
    for queue in queues:
        if not queue.wait(queue.submitted, max(0.0, deadline - time.monotonic())):
            _log.warning("neuron:%d stream %d still had work queued %s after %.0f s", queue.device,
                         queue.id, when, seconds)
    return queues


def _finish_before_fork() -> None:
    """Let the queued work finish before ``os.fork()``: a child (a DataLoader worker with the
    default 'fork' start method) sees the parent's memory as it is at the fork, and read the
    tensors of kernels still queued as zeros or an earlier allocation's bytes, silently (CUDA's
    children cannot touch the parent's device memory at all). Not from a stream's worker, which
    must not wait for its own queue."""
    if not getattr(_local, "in_worker", False):
        _finish_queued("when the process forked (the child may read unwritten memory)", _FORK_WAIT_S)


def _drain(index: int, stream_id: int) -> bool:
    """Wait (up to :data:`_DRAIN_WAIT_S`) for the work queued on stream ``stream_id`` of device
    ``index``, so that the memory it holds goes back to that stream's pool before the pool grows;
    False when there is none, or in a stream's worker (which must not wait for its own queue).
    Other streams are not waited for: their blocks are not this stream's to reuse, and one may be
    waiting for an event this thread has yet to record."""
    if getattr(_local, "in_worker", False):
        return False
    with _registry_lock:
        queues = [q for q in _queues.get(index, ()) if q.id == stream_id and q.completed < q.submitted]
    for queue in queues:
        queue.wait(queue.submitted, _DRAIN_WAIT_S)
    return bool(queues)


atexit.register(_finish_at_exit)
memory.set_current_stream_resolver(lambda index: current_stream(index).id)
memory.set_queued_work_drain(_drain)


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for queues in _queues.values():
        for queue in list(queues):
            queue.reset_after_fork()


# A child forked while a stream's worker thread ran (a DataLoader worker) would otherwise wait
# forever for a thread it does not have.
os.register_at_fork(before=_finish_before_fork, after_in_child=_after_fork_in_child)
