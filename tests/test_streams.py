"""Neuron streams and events on worker threads; launch blocking; streams disabled."""

from __future__ import annotations

import threading
import types

import pytest

from torch_neuronx import config
from torch_neuronx.runtime import streams
from torch_neuronx.runtime.streams import Event, Stream, StreamError

WAIT = 10.0  # generous bound for waits that must succeed


def blocked(stream: Stream) -> threading.Event:
    """Submit a task that holds ``stream`` until the returned gate is set."""
    gate = threading.Event()
    stream.submit(gate.wait, WAIT)
    return gate


def test_work_runs_in_order_on_a_worker_thread():
    stream = Stream()
    seen: list[tuple[int, int]] = []
    for i in range(50):
        stream.submit(lambda i=i: seen.append((i, threading.get_ident())))
    stream.synchronize(timeout=WAIT)
    assert [i for i, _ in seen] == list(range(50))
    assert {ident for _, ident in seen} != {threading.get_ident()}


def test_submit_returns_before_the_work_runs_and_query_reports_it():
    stream = Stream()
    gate = blocked(stream)
    done = []
    stream.submit(done.append, 1)
    assert not stream.query() and done == []
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert stream.query() and done == [1]


def test_synchronize_times_out_while_work_is_blocked():
    stream = Stream()
    gate = blocked(stream)
    with pytest.raises(TimeoutError):
        stream.synchronize(timeout=0.05)
    gate.set()
    stream.synchronize(timeout=WAIT)


def test_event_completes_after_the_work_before_it():
    stream = Stream()
    gate = blocked(stream)
    event = stream.record_event()
    after = Event()
    assert after.query()  # never recorded: complete, as in CUDA
    assert not event.query()
    gate.set()
    event.synchronize(timeout=WAIT)
    assert event.query()


def test_event_wait_orders_another_stream_after_it():
    producer, consumer = Stream(), Stream()
    gate = blocked(producer)
    order = []
    producer.submit(order.append, "produced")
    consumer.wait_event(producer.record_event())
    consumer.submit(order.append, "consumed")
    with pytest.raises(TimeoutError):
        consumer.synchronize(timeout=0.05)  # held back by the producer's event
    assert order == []
    gate.set()
    consumer.synchronize(timeout=WAIT)
    assert order == ["produced", "consumed"]


@pytest.fixture
def six_devices():
    """Devices 1-5 visible, so a test's streams live on a device no other test's work uses
    (a stream of a device the process does not see is an error)."""
    with config.override(TORCH_NEURONX_VISIBLE_DEVICES=tuple(range(6))):
        yield


def test_wait_stream_and_device_synchronize(six_devices):
    first, second = Stream("neuron:2"), Stream(2)
    gate = blocked(first)
    order = []
    first.submit(order.append, 1)
    second.wait_stream(first)
    second.submit(order.append, 2)
    gate.set()
    streams.synchronize(2)
    assert order == [1, 2] and first.query() and second.query()


def test_event_elapsed_time():
    stream = Stream()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    start.record(stream)
    stream.submit(threading.Event().wait, 0.02)
    end.record(stream)
    assert start.elapsed_time(end) >= 15.0
    with pytest.raises(RuntimeError):
        Event().elapsed_time(end)


def test_errors_surface_at_synchronize_and_the_stream_keeps_working():
    stream = Stream()
    stream.submit(lambda: 1 / 0)
    done = []
    stream.submit(done.append, 1)
    with pytest.raises(StreamError) as info:
        stream.synchronize(timeout=WAIT)
    assert isinstance(info.value.__cause__, ZeroDivisionError) and done == [1]
    stream.synchronize(timeout=WAIT)  # reported once


def test_an_error_reported_elsewhere_is_not_raised_again_by_work_still_queued():
    """A collective's error raised by its ``Work.wait()`` (``forget_error``) while work that waits
    for it is still queued: that work raises the same error later, and no synchronization raises
    it again (a later, valid read raised the stale error); another error still surfaces."""
    stream = Stream()
    error = RuntimeError("the collective failed")
    gate = blocked(stream)

    def waits_for_the_collective() -> None:
        raise error

    stream.submit(waits_for_the_collective)
    stream._queue.forget_error(error)  # raised to the caller before the queued work ran
    gate.set()
    stream.synchronize(timeout=WAIT)
    stream.submit(lambda: 1 / 0)
    with pytest.raises(StreamError) as info:
        stream.synchronize(timeout=WAIT)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_launch_blocking_runs_work_synchronously(monkeypatch):
    monkeypatch.setenv("NEURON_LAUNCH_BLOCKING", "1")
    stream = Stream()
    seen = []
    stream.submit(lambda: seen.append(threading.get_ident()))
    assert seen == [threading.get_ident()] and stream.query()
    with pytest.raises(ZeroDivisionError):
        stream.submit(lambda: 1 / 0)  # the error reaches the call that caused it


def test_disabled_streams_alias_the_default_stream(monkeypatch, six_devices):
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", "0")
    stream = Stream(5)
    assert stream == streams.default_stream(5) and stream.id == 0
    gate = blocked(streams.default_stream(5))
    assert not stream.query()  # same queue
    gate.set()
    stream.synchronize(timeout=WAIT)


def test_enabled_streams_are_distinct():
    a, b = Stream(), Stream()
    assert a != b and a.id != b.id and 0 not in (a.id, b.id)
    assert a != streams.default_stream() and len({a, b, streams.default_stream()}) == 3


def test_current_stream_is_per_thread_and_scoped(six_devices):
    side = Stream()
    assert streams.current_stream() == streams.default_stream()
    seen_in_thread = []
    with streams.stream(side):
        assert streams.current_stream() == side
        thread = threading.Thread(target=lambda: seen_in_thread.append(streams.current_stream()))
        thread.start()
        thread.join(WAIT)
    assert seen_in_thread == [streams.default_stream()]
    assert streams.current_stream() == streams.default_stream()
    other = Stream(1)
    streams.set_stream(other)
    try:
        assert streams.current_stream(1) == other and streams.current_stream(0) == streams.default_stream(0)
    finally:
        streams.set_stream(streams.default_stream(1))


@pytest.mark.parametrize(("device", "index"), [
    (None, 0), (3, 3), ("neuron", 0), ("neuron:7", 7), (types.SimpleNamespace(type="neuron", index=2), 2),
])
def test_device_index_accepts_torch_cuda_forms(device, index):
    assert streams.device_index(device) == index


@pytest.mark.parametrize("device", ["cuda:0", "neuron:x", -1, True, 1.0])
def test_device_index_rejects_other_devices(device):
    with pytest.raises(ValueError):
        streams.device_index(device)


def test_small_work_on_an_idle_stream_runs_in_the_issuing_thread_and_keeps_stream_order():
    """``enqueue_small`` runs at once when nothing is queued or running; behind queued work it
    queues; its error is the stream's, reported at synchronize; while it runs, work another
    thread submits waits for it."""
    stream = Stream()
    seen: list[tuple[str, int]] = []
    assert stream.enqueue_small(lambda: seen.append(("idle", threading.get_ident()))) is None
    assert seen == [("idle", threading.get_ident())] and stream.query()

    gate = blocked(stream)
    pending = stream.enqueue_small(lambda: seen.append(("behind", threading.get_ident())))
    assert pending is not None and not pending.done() and len(seen) == 1
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert seen[1][0] == "behind" and seen[1][1] != threading.get_ident()

    def fails() -> None:
        raise ValueError("small work failed")

    assert stream.enqueue_small(fails) is None  # not raised here ...
    with pytest.raises(StreamError, match="small work failed"):
        stream.synchronize(timeout=WAIT)  # ... but at the next synchronization
    stream.synchronize(timeout=WAIT)

    release, started, order = threading.Event(), threading.Event(), []

    def long_small_work() -> None:
        started.set()
        release.wait(WAIT)
        order.append("inline")

    issuing = threading.Thread(target=stream.enqueue_small, args=(long_small_work,))
    issuing.start()
    assert started.wait(WAIT)
    stream.submit(order.append, "submitted meanwhile")
    assert not stream.query()
    release.set()
    issuing.join(WAIT)
    stream.synchronize(timeout=WAIT)
    assert order == ["inline", "submitted meanwhile"]
