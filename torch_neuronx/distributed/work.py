"""The ``dist.Work`` of collectives on ``neuron`` tensors, and how streams are ordered after them.

A collective on neuron tensors first waits (on its group's queue, :mod:`.collective_queue`) for
the work queued before it on the issuing stream, which produces its inputs; the streams that
consume its outputs wait for it in turn (a task queued on each), so the host returns at once,
as with NCCL on CUDA. :func:`issue` decides where a collective runs (in the issuing thread, on
the one consuming stream's worker, or through the group's FIFO); :class:`NeuronWork` is the
``dist.Work`` handed back; its future holds the collective's output tensors (neuron tensors for
neuron collectives).

Every wait is bounded by the group's timeout and says what it waited for.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from torch_neuronx.distributed.collective_queue import CollectiveError, CollectiveQueue, Task
from torch_neuronx.runtime import streams

_POINT_TO_POINT = frozenset({"send", "recv"})  # their transport work is waited for by a thread of its own


_C10D_ENTRY_POINTS = frozenset({"_allgather_base", "_reduce_scatter_base"})


def never_compiled(cls: type) -> type:
    """Make ``cls``'s methods run eagerly under ``torch.compile``.

    c10d's C++ side (DDP's reducer, for one) calls the methods of a Python process group or work
    from inside a compiled function's frame; Dynamo would take each call for a new frame to compile
    and fail on the group, an opaque object to it. Disabled, they run as Python, and so does all
    they call: the private helpers they call are left as they are (a disabled function is one more
    wrapper on every call), except c10d's own underscored entry points.
    """
    for name, value in list(vars(cls).items()):
        entry = not name.startswith("_") or name in _C10D_ENTRY_POINTS
        if callable(value) and entry and not isinstance(value, type):
            setattr(cls, name, torch.compiler.disable(value))
    return cls


def _await(task: Task) -> None:
    """Queued on a stream that consumes a collective's outputs: hold the stream until it ended
    (its error becomes the stream's, unless ``Work.wait()`` raised it to the caller already)."""
    try:
        task.wait()
    except BaseException:
        if not task.reported:
            raise


def run_direct(queue: CollectiveQueue, task: Task) -> None:
    """Queued on the one stream that consumes a collective's outputs: run it there, in the
    stream's order (after the work producing its inputs); its error is the stream's."""
    queue.execute(task)
    _await(task)


@never_compiled
class NeuronWork(dist.Work):
    """The ``dist.Work`` of a collective issued on a ``neuron`` process group.

    For neuron tensors, ``wait()`` returns at once: the consuming streams already wait for the
    collective (host reads of its outputs wait for them). For CPU tensors it blocks until the
    collective ended. Either way it raises the collective's error when it already failed.
    """

    def __init__(self, task: Task, host_wait: bool, attach: Sequence[streams.Stream] = ()) -> None:
        super().__init__()
        self._task, self._host_wait = task, host_wait
        self._attach = attach  # deferred (see :func:`issue`): the streams to order after it at wait()
        self.sources: list[int] = []  # a receive from any source: the rank it came from

    def wait(self, timeout: Any = None) -> bool:
        task = self._task
        if self._host_wait:
            seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0.0
            if seconds > 0 and not task.done.wait(seconds):  # as gloo's ``wait(timeout)``
                raise CollectiveError(f"{task.describe()}: timed out after {seconds:g} s (work.wait(timeout))")
            task.wait()
            task.settle()
        elif self._attach:
            self._order_current_stream()
        elif task.done.is_set():
            task.settle()
        if not self._host_wait and task.error is not None:
            # Raised here, so not again at the consumers' next synchronization (a later, valid
            # collective's read raised this stale error): the streams forget it.
            task.reported = True
            for stream in task.consumers:
                stream._queue.forget_error(task.error)
            raise task.error
        return True

    def _order_current_stream(self) -> None:
        """A deferred work's ``wait()`` (see :func:`issue`): the current stream of its tensors'
        device, and the streams it was ordered with when issued, run the work queued after this
        point once it ended (CUDA's ``work.wait()``); the host goes on."""
        task = self._task
        for stream in task.consumers:  # waited for: later collectives on these streams wait for it
            _async_awaits.clear(stream)
        if task.done.is_set():
            task.settle()
            return
        current = streams.current_stream(self._attach[0].device_index)
        for stream in dict.fromkeys([current, *self._attach]):
            if stream not in task.consumers:
                task.consumers = (*task.consumers, stream)
                stream.submit(_await, task)

    def is_completed(self) -> bool:
        return self._task.done.is_set()

    def is_success(self) -> bool:
        return self._task.done.is_set() and self._task.error is None

    def exception(self) -> BaseException | None:
        return self._task.error

    def get_future(self) -> torch.futures.Future:
        return self._task.future

    def result(self) -> list[Any]:
        self._task.wait()
        return self._task.outputs

    def synchronize(self) -> None:
        self._task.wait()

    def source_rank(self) -> int:
        """The rank a receive from any source got its data from (waits for it); -1 otherwise."""
        if not self.sources and self._task is not None:
            self._task.wait()
        return self.sources[0] if self.sources else -1

    _source_rank = source_rank  # the name c10d's ``dist.recv(t)`` (no ``src``) calls


@never_compiled
class CoalescedWork(dist.Work):
    """The work of collectives issued together (``_coalescing_manager(device=...)``): waited for,
    and their future's value, together (the values of every one, in issue order, one flat list)."""

    def __init__(self, works: Sequence[dist.Work]) -> None:
        super().__init__()
        self._works = list(works)

    def wait(self, timeout: Any = None) -> bool:
        for work in self._works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def exception(self) -> BaseException | None:
        return next((work.exception() for work in self._works if work.exception() is not None), None)

    def get_future(self) -> torch.futures.Future:
        return torch.futures.collect_all([work.get_future() for work in self._works]).then(_joined)


def _joined(future: torch.futures.Future) -> list[Any]:
    return [value for each in future.value() for value in each.value()]


class _AsyncAwaits:
    """Per stream, the span of its queue that holds only the waits for async collectives not yet
    waited for (``async_op=True``), when nothing was queued after them: a later collective's inputs
    were ready before that span, so it waits for the stream up to its start only. (Two groups'
    async collectives issued in opposite orders on two ranks: the second waited for the first's
    end on the stream, the first's peer for the second's: both ranks hung until the timeout.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[tuple[int, int], tuple[int, int]] = {}

    def add(self, stream: streams.Stream, before: int, after: int) -> None:
        key = (stream.device_index, stream.id)
        with self._lock:
            start, end = self._spans.get(key, (before, -1))
            self._spans[key] = (start if end == before else before, after)

    def clear(self, stream: streams.Stream) -> None:
        with self._lock:
            self._spans.pop((stream.device_index, stream.id), None)

    def ready_point(self, stream: streams.Stream, position: int) -> int:
        """Where on ``stream`` a collective issued at ``position`` waits (see the class)."""
        span = self._spans.get((stream.device_index, stream.id))
        return span[0] if span is not None and span[1] == position else position


_async_awaits = _AsyncAwaits()
ready_point = _async_awaits.ready_point


#: A collective moving at most this many bytes, issued while the streams it is ordered with and its
#: group's queue are idle, runs in the issuing thread (unless TORCH_NEURONX_ENABLE_HOST_CC=1, whose
#: collectives overlap compute): the hop to a worker thread and back, whose share of the GIL and
#: of the cores the transport's own threads need, cost more than such a collective lets the host
#: run ahead (a 1 MB all-reduce on 2 ranks sharing 2 cores: +25-40% over gloo queued, +5% inline).
INLINE_BYTES = 4 << 20


def _inline(queue: CollectiveQueue, task: Task, consumers: Sequence[streams.Stream]) -> bool:
    if task.kind in _POINT_TO_POINT or task.nbytes > INLINE_BYTES or streams.in_worker():
        return False
    for stream in consumers:
        if not stream.query():
            return False  # work producing its inputs, or consuming earlier outputs, is still queued
    return queue.inline(task)


def issue(queue: CollectiveQueue, task: Task, neuron: Sequence[Any], consumers: Sequence[streams.Stream],
          blocking: bool, inline: bool = False, asynchronous: bool = False) -> NeuronWork:
    """Put ``task`` in its group's order and make ``consumers`` (streams) wait for it: on the one
    consuming stream's worker when :meth:`CollectiveQueue.direct` allows, else in the FIFO.

    ``neuron``: its neuron tensors (kept alive by the task until it ends). ``blocking``
    (NEURON_LAUNCH_BLOCKING=1): run it now in this thread, errors raised here. ``inline``: a
    small collective issued while its streams and its group's queue are idle runs now in this
    thread (:data:`INLINE_BYTES`); its error is still the consumers' (raised by ``wait()`` and at
    their next synchronization), as if it had been queued.

    Sends, receives and ``asynchronous`` collectives (``async_op=True``) are NCCL's: they go
    through the FIFO (never inline or on a stream's worker, which would hold the thread while
    the peers' matching call may wait for other work of this rank: two groups' async collectives
    issued in opposite orders on two ranks deadlocked), and the streams wait for them from the
    work's ``wait()`` on.
    """
    if blocking:
        pending = task.run()
        if pending is not None:
            task.complete(pending)
        task.wait()
        return NeuronWork(task, host_wait=True)
    task.consumers = consumers
    deferred = asynchronous or task.kind in _POINT_TO_POINT
    if inline and not deferred and _inline(queue, task, consumers):
        queue.execute(task)
        if task.error is not None:  # the consumers' next synchronization raises it, unless wait() did
            for stream in consumers:
                stream._queue.record_error(task.error)
        return NeuronWork(task, host_wait=not neuron)
    if len(consumers) == 1 and not deferred and queue.direct(task, consumers[0]):
        consumers[0].submit(run_direct, queue, task)
        return NeuronWork(task, host_wait=not neuron)
    queue.submit(task)
    if task.kind in _POINT_TO_POINT:  # the streams wait for it at ``wait()`` (a receive's
        # completion waits on the peer, who may first wait for work this rank queues after it)
        task.consumers = ()
        return NeuronWork(task, host_wait=not neuron, attach=consumers)
    if deferred:  # its streams wait for it now, but later collectives do not (see ``ready_point``)
        for stream in consumers:
            before = stream.position
            stream.submit(_await, task)
            _async_awaits.add(stream, before, stream.position)
        return NeuronWork(task, host_wait=not neuron, attach=consumers)
    for stream in consumers:
        stream.submit(_await, task)
    return NeuronWork(task, host_wait=not neuron)
