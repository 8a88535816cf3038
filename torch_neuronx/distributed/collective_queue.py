"""A process group's collectives in program order: the FIFO of :class:`CollectiveQueue` and its :class:`Task`.

gloo (and NCCL) match collectives by the order each rank issues them, so every collective of a
group, whatever stream it was issued on, goes through that group's :class:`CollectiveQueue`
in the order the program issued it. A :class:`Task` is one collective: what it waits for (the
neuron work producing its inputs, the ranks' agreement check), what it runs, and how it ended;
its future completes off the threads that run collectives (:class:`_Completions`).
The ``dist.Work`` handed to the caller, and how the streams are ordered after a task, are in
:mod:`torch_neuronx.distributed.work`.

Every wait is bounded by the group's timeout and says what it waited for.
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from torch_neuronx import observe
from torch_neuronx.distributed import agreements, algorithms
from torch_neuronx.runtime import streams

_log = logging.getLogger("torch_neuronx.distributed")
_IDLE_EXIT_S = 30.0
_finishing = threading.Lock()  # a task ends once, whichever thread ends it
_OUTSTANDING_PRUNE = 256  # tasks kept for finish_issued before the ended ones behind a running one go


class CollectiveError(RuntimeError):
    """A collective failed (a peer died or timed out, mismatched arguments): raised by ``wait()``,
    and by the next synchronization of the streams that consume its outputs."""


def _setter(event: threading.Event) -> Callable[[torch.futures.Future], None]:
    return lambda _future: event.set()


def _value(future: torch.futures.Future) -> Any:
    """The value of a completed future (raising its error: see :attr:`Task.future`)."""
    return future.value()


class Task:
    """One collective: what it waits for, what it runs, and how it ended."""

    __slots__ = ("kind", "fn", "ready", "outputs", "nbytes", "future", "done", "error", "group", "timeout_s",
                 "check", "after", "order", "_ending", "reported", "consumers", "_source", "_settled",
                 "_interrupt", "channel")

    def __init__(self, kind: str, fn: Callable[[], Any], ready: Sequence[streams.Event], outputs: list[Any],
                 nbytes: int, group: str, timeout_s: float, check: agreements.Check | None = None) -> None:
        self.kind, self.fn, self.ready, self.outputs, self.nbytes = kind, fn, list(ready), outputs, nbytes
        self.group, self.timeout_s = group, timeout_s
        self.check = check  # the ranks' agreement check, posted when the collective was issued
        self.after: Task | None = None  # a collective issued before it, running on a stream's worker
        self.order = 0  # its place in its group's program order (set when the queue admits it)
        # What Work.get_future() returns completes from the one set here through a callback that
        # reads its value: an error then fails it in C++, where DDP's reducer reads it (a Python
        # set_exception completes a future successfully with the exception as its value, which the
        # reducer took for its gradients: a segfault when a peer died during backward).
        self._source: torch.futures.Future = torch.futures.Future()
        self.future: torch.futures.Future = self._source.then(_value)
        # Set before any callback a user chains on the future runs (callbacks run in the order
        # they were added): what ``wait()`` waits for once the task ended, so that the future it
        # hands out is complete then (its ``value()`` readable, as NCCL's is after ``wait()``).
        self._settled = threading.Event()
        self.future.add_done_callback(_setter(self._settled))
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._ending = False
        self.reported = False  # its error was raised to the caller by Work.wait(): not the streams' too
        self.consumers: Sequence[streams.Stream] = ()  # the streams that wait for it
        self._interrupt: algorithms.Interrupt | None = None  # while it runs ahead of its check
        self.channel: int = 0  # a receive's tag: receives of one tag are posted in issue order

    def describe(self) -> str:
        return f"{self.kind} on process group {self.group!r}"

    def await_check(self) -> BaseException | None:
        """Wait for the agreement check's verdict; its error (or a timeout's), None when the ranks agree."""
        check = self.check
        if check is None:
            return None
        if not check.done.wait(self.timeout_s):
            return CollectiveError(f"{self.describe()}: the ranks' agreement check did not complete within "
                                   f"{self.timeout_s:g} s (a peer that never arrived)")
        return check.error

    def run(self) -> dist.Work | None:
        """Wait for the inputs' producers and run the collective (never raises).

        A collective whose agreement check runs ahead (:class:`~.agreements.Check`) moves its data
        first and takes the verdict after; the others wait for the verdict first. ``fn`` either
        completes the collective or, for point-to-point operations, which must not hold the group's
        queue while the peer's matching operation waits behind it, returns the transport's
        ``Work``, which is returned: the task ends with :meth:`complete` once it did.
        """
        ahead = self.check is not None and self.check.ahead
        problem = None if ahead else self.await_check()
        if problem is not None:
            self._finish(problem)
            return None
        try:
            for event in self.ready:
                try:
                    event.synchronize(self.timeout_s)
                except TimeoutError:
                    raise CollectiveError(f"{self.describe()} waited {self.timeout_s:g} s for the neuron work "
                                          "producing its inputs, which did not finish") from None
            if ahead:  # a failed verdict (on the agreements' thread) stops its transport waits
                self._interrupt = algorithms.Interrupt()
                with algorithms.interruptible(self._interrupt):
                    pending = self._call()
            else:
                pending = self._call()
        except BaseException as exc:  # kept for wait(), the future and the consuming streams
            self._finish(exc)
            return None
        if not isinstance(pending, dist.Work):
            self._finish(self.await_check() if ahead else None)
            return None
        self.fn = None
        return pending

    def _call(self) -> Any:
        if observe.state.active:
            with observe.span("collective." + self.kind, self.nbytes, group=self.group):
                return self.fn()
        return self.fn()

    def complete(self, pending: dist.Work) -> None:
        """Wait for the transport's work of a point-to-point operation, then end (never raises)."""
        try:
            pending.wait(datetime.timedelta(seconds=self.timeout_s))
        except BaseException as exc:
            self._finish(exc)
        else:
            self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        """End the task with ``exc`` (None: success); only the first end counts (a check that
        failed while the data ran ahead ends it on the transport's thread, see :class:`CollectiveQueue`)."""
        with _finishing:
            if self._ending:
                return
            self._ending = True
        self._end(exc)

    def fail(self, exc: BaseException) -> None:
        """End the task with ``exc`` unless it already ended."""
        self._finish(exc)

    def _end(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.error = exc if isinstance(exc, CollectiveError) else CollectiveError(
                f"{self.describe()} failed: {type(exc).__name__}: {exc}")
            if exc is not self.error:
                self.error.__cause__ = exc
            _completions.put(self._source.set_exception, self.error)
        else:
            _completions.put(self._source.set_result, self.outputs)
        self.fn = None  # the collective's closure (and its tensors' memory) goes now
        self.done.set()
        if exc is not None and self._interrupt is not None:
            self._interrupt.stop()

    def settle(self) -> None:
        """Once the task ended: wait for its future to complete (off this thread, see
        :class:`_Completions`; a moment), so that ``value()`` is readable."""
        if not self._settled.wait(self.timeout_s):
            raise CollectiveError(f"{self.describe()} ended, but its future did not complete within "
                                  f"{self.timeout_s:g} s")

    def wait(self) -> None:
        """Block until the collective ended; raise its error."""
        if not self.done.wait(self.timeout_s):
            raise CollectiveError(f"{self.describe()} did not complete within {self.timeout_s:g} s "
                                  "(a peer that never arrived, or work it waits for that never finished)")
        if self.error is not None:
            raise self.error


class _Completions:
    """Collectives' futures completed off the threads that run collectives.

    A future runs its callbacks where it completes, and a user's callback may wait for another
    collective (PowerSGD's comm hook waits inside the ``then`` of an all_reduce for the next one):
    completed on a stream's worker or the group's FIFO thread, that wait held the very thread the
    next collective needed, and DDP hung. Daemon workers complete them; one more starts whenever
    every worker is busy (a callback waiting), up to :data:`_MAX_COMPLETION_WORKERS`.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: collections.deque[tuple[Callable[[Any], None], Any]] = collections.deque()
        self._idle = self._workers = 0

    def put(self, complete: Callable[[Any], None], value: Any) -> None:
        with self._cond:
            self._items.append((complete, value))
            if self._idle == 0 and self._workers < _MAX_COMPLETION_WORKERS:
                self._workers += 1
                threading.Thread(target=self._work, daemon=True, name="neuron collective futures").start()
            else:
                self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                found = self._cond.wait_for(lambda: bool(self._items), _IDLE_EXIT_S)
                self._idle -= 1
                if not found:
                    self._workers -= 1
                    return
                complete, value = self._items.popleft()
            try:
                complete(value)
            except BaseException:  # a callback's error belongs to the future it chained; never stop here
                _log.exception("completing a collective's future failed")

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition()
        self._items.clear()
        self._idle = self._workers = 0


_MAX_COMPLETION_WORKERS = 16
_completions = _Completions()


class _Fifo:
    """Items handled one at a time, in order, by a worker thread that exits when idle."""

    def __init__(self, name: str, handle: Callable[[Any], None]) -> None:
        self.name, self._handle = name, handle
        self._cond = threading.Condition()
        self._items: collections.deque[Any] = collections.deque()
        self._worker: threading.Thread | None = None

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name=self.name)
                self._worker.start()
            else:
                self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._items and not self._cond.wait_for(lambda: bool(self._items), _IDLE_EXIT_S):
                    self._worker = None
                    return
                item = self._items.popleft()
            try:
                self._handle(item)
            except BaseException:  # the handlers never raise; a bug must not stop the queue
                _log.exception("%s failed", self.name)

    def drain(self, which: Callable[[Any], bool]) -> list[Any]:
        """Take the items not yet handled for which ``which`` holds out of the FIFO."""
        with self._cond:
            items = [item for item in self._items if which(item)]
            if items:
                self._items = collections.deque(item for item in self._items if not which(item))
        return items

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition()
        self._items.clear()
        self._worker = None


class CollectiveQueue:
    """The program order of one process group's collectives.

    A worker thread runs them in issue order (the FIFO); the sends it started are waited for by a
    second one, the receives (:class:`~.point_to_point.Deferred`: posted as they are waited for)
    by a third, each in issue order, so that a ``send`` never holds up a ``recv`` and a ``recv``
    waiting for its message never holds up a ``send``.
    A collective whose outputs only one stream consumes, issued while the FIFO holds nothing,
    runs on that stream's own worker instead, in the stream's order (:meth:`direct`): no hop
    through the FIFO's thread and back, and collectives issued back to back on one stream follow
    each other there; a later collective that goes through the FIFO waits for it first.

    An agreement check that fails while a rank ran ahead into the data (:class:`~.agreements.Check`)
    breaks the queue on every rank: that rank's transport holds a collective its peers never
    joined, so the collective and every later one fail (at once, queued or new). The collectives
    issued before it still run: their checks agreed, and the peers run them too.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._run = _Fifo(f"neuron collectives {name}", self._start)
        self._pending = _Fifo(f"neuron sends {name}", lambda item: item[0].complete(item[1]))
        self._receiving: dict[int, _Fifo] = {}  # per tag: see :meth:`_receives`
        self._broken: BaseException | None = None
        self._broken_from = 0  # the order of the first collective that fails with ``_broken``
        self._issued = 0  # collectives admitted so far
        self._lock = threading.Lock()
        self._in_fifo = 0  # tasks put in the FIFO and not yet handled
        self._direct: tuple[Task, streams.Stream] | None = None  # the last task run on a stream's worker
        self._outstanding: collections.deque[Task] = collections.deque()  # admitted, perhaps not ended

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value
        self._run.name, self._pending.name = f"neuron collectives {value}", f"neuron sends {value}"
        for tag, fifo in self._receiving.items():
            fifo.name = f"neuron receives {value} tag {tag}"

    def _admit(self, task: Task) -> bool:
        with self._lock:
            self._issued += 1
            task.order = self._issued
            if task.kind != "recv":  # (what finish_issued waits for; a receive may wait for ever)
                outstanding = self._outstanding
                while outstanding and outstanding[0].done.is_set():
                    outstanding.popleft()
                if len(outstanding) > _OUTSTANDING_PRUNE:  # an older one still running: drop the ended
                    self._outstanding = outstanding = collections.deque(
                        t for t in outstanding if not t.done.is_set())
                outstanding.append(task)
        if self._broken is not None:
            task.fail(self._unusable(task))
            return False
        check = task.check
        if check is not None and check.ahead:  # its data may be in flight when the verdict fails
            check.on_failure(lambda failed: self._break(failed, task))
        return True

    def finish_issued(self, timeout_s: float) -> list[Task]:
        """Wait until every collective issued so far ended (``destroy_process_group``: the peers
        join them, so a rank that tore its transport down first failed theirs), for at most
        ``timeout_s`` seconds in all; the collectives that had not ended then. Receives are not
        waited for: no peer needs them to end, and one nothing was sent for ends with the group."""
        with self._lock:
            tasks = list(self._outstanding)
        deadline = time.monotonic() + timeout_s
        for task in tasks:
            task.done.wait(max(0.0, deadline - time.monotonic()))
        return [task for task in tasks if not task.done.is_set()]

    def direct(self, task: Task, stream: streams.Stream) -> bool:
        """Whether ``task`` may run on ``stream``'s worker (then the caller queues :func:`run_direct`
        there): the FIFO holds nothing, and no collective runs directly on another stream."""
        with self._lock:
            last = self._direct
            if self._in_fifo or (last is not None and last[1] != stream and not last[0].done.is_set()):
                return False
            self._direct = (task, stream)
        self._admit(task)
        return True

    def inline(self, task: Task) -> bool:
        """Whether ``task`` may run now in the issuing thread (the caller then calls :meth:`execute`):
        the FIFO holds nothing and no collective runs on a stream's worker. Until it ended, a later
        collective waits for it as for one run on a stream's worker."""
        with self._lock:
            last = self._direct
            if self._in_fifo or (last is not None and not last[0].done.is_set()):
                return False
            self._direct = (task, None)
        self._admit(task)
        return True

    def submit(self, task: Task) -> None:
        """Put ``task`` in the FIFO; it runs after a collective still running on a stream's worker."""
        if not self._admit(task):
            return
        with self._lock:
            self._in_fifo += 1
            last = self._direct
            if last is not None and not last[0].done.is_set():
                task.after = last[0]
        self._run.put(task)

    def _start(self, task: Task) -> None:
        try:
            after = task.after
            if after is not None and not after.done.wait(task.timeout_s):
                task.fail(CollectiveError(f"{task.describe()} waited {task.timeout_s:g} s for the "
                                          f"{after.describe()} issued before it, which did not finish"))
            self.execute(task)
        finally:
            with self._lock:
                self._in_fifo -= 1

    def execute(self, task: Task) -> None:
        """Run ``task`` (never raises), unless it already ended or the queue is broken."""
        if task.done.is_set():
            return
        if self._broken is not None and task.order >= self._broken_from:
            task.fail(self._unusable(task))
            return
        pending = task.run()
        check = task.check
        if check is not None and check.breaks:
            self._break(check, task)
        if pending is not None:
            (self._receives(task.channel) if task.kind == "recv" else self._pending).put((task, pending))

    def _receives(self, tag: int) -> _Fifo:
        """The thread that posts the receives of ``tag``, in issue order (a receive's header, then
        its data: on each pair, messages of one tag arrive in the order they were sent). Receives
        of other tags do not wait behind it, as gloo matches them by tag: a receive posted first
        for tag 2 held up a later one for tag 1 whose sender sent tag 1 first, until the timeout."""
        with self._lock:
            fifo = self._receiving.get(tag)
            if fifo is None:
                fifo = self._receiving[tag] = _Fifo(f"neuron receives {self._name} tag {tag}",
                                                    lambda item: item[0].complete(item[1]))
            return fifo

    def _break(self, check: agreements.Check, task: Task) -> None:
        """``check`` failed while a rank ran ahead: fail ``task`` and everything queued after it."""
        if self._broken is None or task.order < self._broken_from:
            self._broken_from = task.order
        if self._broken is None:
            self._broken = check.error
            _log.error("%s: agreement check failed while a rank ran ahead into the data; the group's "
                       "later collectives fail: %s", task.describe(), check.error)
        task.fail(check.error)
        start = self._broken_from
        drained = self._run.drain(lambda queued: queued.order >= start)
        with self._lock:
            self._in_fifo -= len(drained)
        for queued in drained:
            queued.fail(self._unusable(queued))

    def _unusable(self, task: Task) -> CollectiveError:
        error = CollectiveError(f"{task.describe()}: the group is unusable since an earlier collective's "
                                f"agreement check failed while a rank had run ahead into its data "
                                f"({self._broken}); create a new group")
        error.__cause__ = self._broken
        return error

    def reset_after_fork(self) -> None:
        """In a forked child: no worker came along, and the parent's collectives are not the child's."""
        _completions.reset_after_fork()
        self._run.reset_after_fork()
        self._pending.reset_after_fork()
        self._receiving = {}
        self._in_fifo, self._direct = 0, None
        self._outstanding = collections.deque()
