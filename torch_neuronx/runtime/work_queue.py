"""In-order work queues: the worker thread behind each stream (:mod:`.streams`).

A :class:`WorkQueue` runs the callables submitted to it one after another on a worker thread of
its own, which starts with the first submit and exits after :data:`_IDLE_EXIT_S` idle. A
:class:`Pending` marks a point in a queue. Under ``NEURON_LAUNCH_BLOCKING=1`` a queue runs its work
in the submitting thread. A task's exception is kept, logged, and raised (as
:class:`StreamError`) by the next synchronization. A small task may run in the issuing thread
when the queue is idle (:meth:`WorkQueue.run_inline`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from torch_neuronx import config, observe
from torch_neuronx.observe.events import state as _observing
from torch_neuronx.runtime.errors import InputFailedError, NeuronRuntimeError

__all__ = ["NO_KWARGS", "Pending", "StreamError", "WorkQueue", "in_worker", "local", "submitted"]

_log = logging.getLogger("torch_neuronx.runtime.streams")
_IDLE_EXIT_S = 5.0  # an idle worker thread exits; the next submit starts a new one
_NAP_S = 0.0005  # a worker out of work checks again this often ...
_NAP_FOR_S = 0.02  # ... for this long, then sleeps until woken
_WAKE_BATCH = 32  # queued tasks that wake a napping worker at once


class StreamError(NeuronRuntimeError):
    """Work submitted to a stream raised; the original exception is the ``__cause__``."""


NO_KWARGS: dict[str, Any] = {}


class Pending:
    """A point in a stream's queue: complete once the work submitted up to it has run."""

    __slots__ = ("queue", "seq")

    def __init__(self, queue: WorkQueue, seq: int) -> None:
        self.queue, self.seq = queue, seq

    def done(self) -> bool:
        """Whether the work up to this point has run."""
        return self.queue.completed >= self.seq

    def wait(self) -> None:
        """Block until the work up to this point has run (its errors are the stream's to report)."""
        queue = self.queue
        if queue.completed < self.seq:
            queue.wait(self.seq)


class _Submitted:
    """Whether any work was ever queued on a stream (read on every NEFF launch: one flag)."""

    __slots__ = ("any",)

    def __init__(self) -> None:
        self.any = False


submitted = _Submitted()


class WorkQueue:
    """The work queue and worker thread behind one stream id.

    Submitting is cheap: one lock, and a wake-up of the worker only when it sleeps deeply or
    enough work has gathered (:data:`_WAKE_BATCH`). A worker that just ran out of work naps
    (:data:`_NAP_S`) before it sleeps deeply, so work queued meanwhile starts within a nap
    without a wake-up per op: the worker and the thread issuing ops share the GIL, and a
    wake-up per op costs the issuing thread more than the op's own dispatch. A thread that
    waits for the queue (a synchronization) always wakes the worker.
    """

    def __init__(self, device: int, stream_id: int) -> None:
        self.device = device
        self.id = stream_id
        self.blocking = bool(config.get("NEURON_LAUNCH_BLOCKING"))
        self._tasks: collections.deque[tuple[Callable[..., Any], tuple, dict]] = collections.deque()
        self._init_sync()
        self.submitted = 0  # tasks ever submitted
        self.completed = 0  # tasks ever finished (in order, so the first `completed` are done)
        self._error: BaseException | None = None

    def _init_sync(self) -> None:
        self._lock = threading.Lock()
        self._work_cond = threading.Condition(self._lock)  # the worker waits here for work
        self._done_cond = threading.Condition(self._lock)  # synchronizing threads wait here
        self._run_lock = threading.Lock()  # serializes launch-blocking work
        self._worker: threading.Thread | None = None
        self._napping = False  # the worker ran out of work moments ago and naps
        self._sleeping = False  # the worker sleeps until woken (or until it exits)
        self._waiting = 0  # threads waiting for completions
        self._inline = False  # an issuing thread runs a small task itself (run_inline)
        self._stopping = False  # the interpreter exits: an idle worker ends at once

    def submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
        if self.blocking:
            return self._run_now(fn, args, kwargs)
        submitted.any = True
        with self._lock:
            tasks = self._tasks
            tasks.append((fn, args, kwargs))
            self.submitted += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True,
                                                name=f"neuron:{self.device} stream {self.id}")
                self._worker.start()
            elif self._sleeping or (self._napping and len(tasks) >= _WAKE_BATCH):
                self._work_cond.notify()
            return self.submitted

    def _run_now(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
        with self._run_lock:
            self.wait(self.submitted)
            with self._lock:
                self.submitted += 1
                seq = self.submitted
            try:
                fn(*args, **kwargs)  # under launch blocking an error reaches the caller directly
            finally:
                with self._lock:
                    self.completed += 1
                    self._done_cond.notify_all()
            return seq

    def run_inline(self, fn: Callable[..., Any], args: tuple) -> bool:
        """Run ``fn(*args)`` in the calling thread when the queue is idle (nothing queued or
        running): a small op then costs no hand-over to the worker, whose wake-up and share of
        the GIL cost the issuing thread more than such an op's own run. False (nothing ran) when
        the queue is busy. An error is the stream's, reported at its next synchronization, as
        the worker's are; the worker starts nothing meanwhile (work queued by another thread
        waits for this to finish)."""
        with self._lock:
            if self._tasks or self.completed < self.submitted or self._inline:
                return False
            self._inline = True
            self.submitted += 1
        was_worker, was_queue = local.in_worker, local.queue
        local.in_worker, local.queue = True, self  # (ops it issues run at once, in its order)
        try:
            fn(*args)
        except BaseException as exc:  # kept for synchronize(), as the worker keeps it
            self._keep(exc)
        finally:
            local.in_worker, local.queue = was_worker, was_queue
            with self._lock:
                self._inline = False
                self.completed += 1
                if self._waiting:
                    self._done_cond.notify_all()
                if self._tasks and (self._napping or self._sleeping):
                    self._work_cond.notify()
        return True

    def _next_task(self) -> tuple[Callable[..., Any], tuple, dict] | None:
        """The next task; None once the queue stayed empty for :data:`_IDLE_EXIT_S` (the worker exits)."""
        tasks = self._tasks
        with self._lock:
            if tasks and not self._inline:
                return tasks.popleft()
            idle_since = time.monotonic()
            while not tasks or self._inline:
                idle = time.monotonic() - idle_since
                if (idle >= _IDLE_EXIT_S or self._stopping) and not tasks:
                    self._worker = None
                    return None
                if idle < _NAP_FOR_S:
                    self._napping = True
                    self._work_cond.wait(_NAP_S)
                else:  # (woken by a submit, a synchronization, or the end of a run_inline)
                    self._sleeping = True
                    self._work_cond.wait(max(_IDLE_EXIT_S - idle, _NAP_FOR_S))
                self._napping = self._sleeping = False
            return tasks.popleft()

    def _work(self) -> None:
        local.in_worker = True
        local.queue = self
        while True:
            task = self._next_task()
            if task is None:
                return
            fn, args, kwargs = task
            try:
                fn(*args, **kwargs)
            except BaseException as exc:  # kept for synchronize(); the worker must survive
                self._keep(exc)
            del task, fn, args, kwargs  # the work's tensors (device memory) go now, not at the next task
            with self._lock:
                self.completed += 1
                if self._waiting:
                    self._done_cond.notify_all()

    def stop(self, timeout: float) -> None:
        """End the worker once it is idle and wait up to ``timeout`` s for its thread (interpreter exit)."""
        with self._lock:
            self._stopping = True
            self._work_cond.notify()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    def reset_after_fork(self) -> None:
        """In a forked child: no worker thread came along, so start without one (work the parent
        had queued is the parent's; the child never runs it)."""
        self._tasks.clear()
        self._init_sync()
        self.completed = self.submitted

    def wait(self, seq: int, timeout: float | None = None) -> bool:
        """Block until the first ``seq`` tasks have run; False on timeout."""
        if self.completed >= seq:
            return True
        if not _observing.active:
            return self._wait(seq, timeout)
        with observe.span("stream.wait", device=self.device, stream=self.id):
            return self._wait(seq, timeout)

    def _wait(self, seq: int, timeout: float | None) -> bool:
        with self._lock:
            if self._napping or self._sleeping:
                self._work_cond.notify()  # a synchronization: the worker starts now
            self._waiting += 1
            try:
                return self._done_cond.wait_for(lambda: self.completed >= seq, timeout)
            finally:
                self._waiting -= 1

    def _keep(self, exc: BaseException) -> None:
        """A task raised ``exc``: the next synchronization raises it (the first one since the last),
        unless it was reported elsewhere already (:meth:`forget_error`)."""
        with self._lock:
            if getattr(exc, _REPORTED, False):
                return
            if self._error is None:
                self._error = exc
        if isinstance(exc, InputFailedError):  # its root failure was logged where it happened
            _log.debug("work submitted to neuron:%d stream %d raised %r", self.device, self.id, exc)
        else:
            _log.error("work submitted to neuron:%d stream %d raised %r", self.device, self.id, exc)

    def record_error(self, error: BaseException) -> None:
        """Make ``error`` the one the next synchronization raises (unless an earlier one is
        pending), as if a task had raised it: work that failed before it was queued."""
        self._keep(error)

    def forget_error(self, error: BaseException) -> None:
        """``error`` was reported elsewhere (raised by a collective's ``wait()``): drop it if this
        stream would report it, and never take it again (a task still queued here, waiting for that
        collective, raises it later: it was a stale error at the next synchronization)."""
        with self._lock:
            try:  # (marked on the error, not kept here: its traceback holds the caller's frames)
                setattr(error, _REPORTED, True)
            except AttributeError:
                pass
            if self._error is error:
                self._error = None

    def raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise StreamError(f"work on neuron:{self.device} stream {self.id} failed: "
                              f"{type(error).__name__}: {error}") from error


#: Set on an error :meth:`WorkQueue.forget_error` was told was reported elsewhere.
_REPORTED = "_neuron_reported_elsewhere"


class _Local(threading.local):
    streams: dict[int, Any] | None = None  # the current stream per device (streams.py)
    in_worker = False  # this thread is a stream's worker
    queue: WorkQueue | None = None  # the queue whose worker this thread is


local = _Local()


def in_worker() -> bool:
    """Whether the calling thread is a stream's worker (running queued work, in stream order)."""
    return local.in_worker
