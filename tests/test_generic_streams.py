"""torch's device-generic streams and events on neuron (``torch.accelerator.current_stream``,
``torch.Stream``, ``torch.Event``): the native device guard answers them with the backend's own
streams. They were stream 0, reported queued work as done, and ``Event.synchronize``/
``elapsed_time`` raised "Backend doesn't support"; with two devices the current stream was always
device 0's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)
from torch_neuronx.device import native

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"no native hooks: {native.failure()}")


def _slow_chain(x: torch.Tensor, steps: int = 12) -> torch.Tensor:
    for _ in range(steps):
        x = (x @ x) / x.shape[0]
    return x


def test_generic_and_neuron_streams_are_the_same_streams_both_ways():
    default = torch.accelerator.current_stream()
    assert (default.device, default.stream_id) == (torch.device("neuron", 0), 0)
    generic = torch.Stream(device="neuron")
    assert generic.stream_id != 0 and generic.device.type == "neuron"
    with generic:
        assert torch.neuron.current_stream().id == generic.stream_id
        assert torch.accelerator.current_stream() == generic
    assert torch.neuron.current_stream().id == 0 and torch.accelerator.current_stream() == default
    mine = torch.neuron.Stream()
    with torch.neuron.stream(mine):
        assert torch.accelerator.current_stream().stream_id == mine.id
        with generic:  # nested: each restores what it found
            assert torch.neuron.current_stream().id == generic.stream_id
        assert torch.accelerator.current_stream().stream_id == mine.id
    torch.accelerator.set_stream(generic)
    try:
        assert torch.neuron.current_stream().id == generic.stream_id
    finally:
        torch.accelerator.set_stream(default)
    assert torch.neuron.current_stream().id == 0


def test_generic_events_order_streams_and_time_their_work():
    x = torch.randn(192, 192, device="neuron")
    want = _slow_chain(x.cpu())
    side = torch.Stream(device="neuron")
    start, end = torch.Event(device="neuron", enable_timing=True), torch.Event(device="neuron", enable_timing=True)
    start.record(side)
    with side:
        y = _slow_chain(x)
    end.record(side)
    torch.accelerator.current_stream().wait_event(end)  # the default stream's reads wait for side's work
    torch.testing.assert_close(y.cpu(), want, rtol=1e-4, atol=1e-5)
    end.synchronize()
    assert end.query() and side.query()
    assert start.elapsed_time(end) > 0.0
    untimed = torch.Event(device="neuron")
    untimed.record()
    untimed.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        untimed.elapsed_time(end)
    assert torch.Event(device="neuron").query()  # never recorded: complete, as CUDA's


def test_wait_stream_and_stream_synchronize_see_the_side_streams_work():
    x = torch.randn(192, 192, device="neuron")
    side = torch.Stream(device="neuron")
    with side:
        y = _slow_chain(x) + 1
    torch.accelerator.current_stream().wait_stream(side)
    z = y * 2
    torch.testing.assert_close(z.cpu(), (_slow_chain(x.cpu()) + 1) * 2, rtol=1e-4, atol=1e-5)
    with side:
        w = _slow_chain(x)
    side.synchronize()
    assert side.query()
    torch.accelerator.synchronize()
    torch.testing.assert_close(w.cpu(), _slow_chain(x.cpu()), rtol=1e-4, atol=1e-5)


def test_backward_runs_on_the_stream_its_forward_ran_on():
    """As with CUDA, the autograd engine runs each backward op on its forward op's stream."""
    side = torch.Stream(device="neuron")
    w = torch.randn(16, 16, device="neuron", requires_grad=True)
    seen: list[int] = []
    with side:
        hidden = w @ w
        hidden.register_hook(lambda g: seen.append(torch.neuron.current_stream().id))
        loss = hidden.tanh().sum()
    loss.backward()
    assert seen == [side.stream_id]
    assert torch.neuron.current_stream().id == 0
    wc = w.detach().cpu().requires_grad_()
    (wc @ wc).tanh().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)


def test_compiled_code_under_a_generic_stream():
    compiled = torch.compile(lambda a: a.sin() * 2 + 1, backend="neuron")
    x = torch.randn(8, 8, device="neuron")
    side = torch.Stream(device="neuron")
    with side:
        y = compiled(x)
    side.synchronize()
    torch.testing.assert_close(y.cpu(), x.cpu().sin() * 2 + 1)


def test_devices_and_errors_of_the_generic_api():
    """Two devices: the current stream is the current device's; a device that does not exist is a
    clear error (raised through the guard), never a crash."""
    script = textwrap.dedent("""
        import torch
        assert torch.accelerator.device_count() == 2
        torch.neuron.set_device(1)
        assert torch.accelerator.current_stream().device_index == 1
        assert torch.accelerator.current_device_index() == 1
        s = torch.Stream(device="neuron:1")
        with s:
            assert torch.neuron.current_stream(1).id == s.stream_id
            x = torch.ones(3, device="neuron") * 2
        s.synchronize()
        assert x.device == torch.device("neuron", 1) and x.sum().item() == 6
        torch.neuron.set_device(0)
        assert torch.accelerator.current_stream().device_index == 0
        for bad in (lambda: torch.Stream(device="neuron:5"), lambda: torch.accelerator.set_device_index(5)):
            try:
                bad()
            except (RuntimeError, ValueError) as exc:
                assert "5" in str(exc) and "exist" in str(exc), exc
            else:
                raise AssertionError("no error")
        print("ok")
    """)
    env = {**__import__("os").environ, "TORCH_NEURONX_VISIBLE_DEVICES": "2"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok" in done.stdout


def test_torch_neuron_calls_take_generic_streams_and_events():
    """``torch.neuron.stream(torch.Stream(...))`` raised AttributeError and left the thread's
    current stream broken for every later op; so did ``set_stream`` and ``record_stream``."""
    x = torch.randn(192, 192, device="neuron")
    want = _slow_chain(x.cpu())
    generic, mine = torch.Stream(device="neuron"), torch.neuron.Stream()
    with torch.neuron.stream(generic):
        assert torch.accelerator.current_stream() == generic
        y = _slow_chain(x)
    mine.wait_stream(generic)
    event = torch.Event(device="neuron")
    with mine:  # torch.neuron.Stream is a context manager, as torch.Stream is
        assert torch.accelerator.current_stream().stream_id == mine.id
        z = y + 1
        event.record()  # on the current stream: mine
    torch.neuron.current_stream().wait_event(event)
    torch.testing.assert_close(z.cpu(), want + 1, rtol=1e-4, atol=1e-5)
    z.record_stream(generic)
    torch.neuron.set_stream(generic)
    try:
        assert torch.neuron.current_stream().id == generic.stream_id
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream())
    with pytest.raises(TypeError, match="torch.Stream of a neuron device"):
        torch.neuron.set_stream(object())
    assert torch.neuron.current_stream().id == 0 and (torch.ones(2, device="neuron") * 2).sum().item() == 4


def test_backward_after_the_forwards_stream_object_is_gone():
    """The forward ran on a ``torch.neuron.Stream`` made inside a function: autograd runs the backward
    on that stream by its id, after the Python object was freed."""
    import gc

    def forward(w):
        with torch.neuron.stream(torch.neuron.Stream()):
            return (w @ w).tanh().sum()

    w = torch.randn(8, 8, device="neuron", requires_grad=True)
    loss = forward(w)
    gc.collect()
    loss.backward()
    wc = w.detach().cpu().requires_grad_()
    (wc @ wc).tanh().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)
