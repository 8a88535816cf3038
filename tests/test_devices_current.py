"""A second neuron device used as torch.cuda's are: the current device names "neuron" without an
index everywhere, autograd runs on every device, compiled graphs keep their inputs' device."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)
from torch_neuronx import config

_ONE = torch.device("neuron", 1)


@pytest.fixture
def on_device_1():
    with config.override(TORCH_NEURONX_VISIBLE_DEVICES=(0, 1)):
        torch.neuron.set_device(1)
        try:
            yield
        finally:
            torch.neuron.set_device(0)


def test_neuron_without_an_index_is_the_current_device_everywhere(on_device_1):
    """``Tensor.to``, ``torch.tensor`` and ``Module.to`` resolve the index in C++ from the device
    guard, which answered 0 while the factories used the current device: the next op mixed two
    devices. Generators, streams, memory statistics and seeding answer for the current device
    (``torch.accelerator.current_stream()`` too: ``tests/test_generic_streams.py``)."""
    host = torch.arange(4.0)
    made = [host.to("neuron"), host.to(torch.device("neuron")), host.to(device="neuron"),
            torch.tensor([1.0, 2.0], device="neuron"), torch.as_tensor(host, device="neuron"),
            torch.asarray(host, device="neuron"), host.new_tensor([1.0], device="neuron"),
            torch.zeros(2, device="neuron"), host.neuron()]
    assert all(t.device == _ONE for t in made), [t.device for t in made]
    linear = torch.nn.Linear(4, 2).to("neuron")
    assert linear.weight.device == _ONE
    torch.testing.assert_close(linear(host.to("neuron")).cpu(), linear.cpu()(host))
    assert torch.Generator(device="neuron").device == _ONE
    assert torch.neuron.Stream().device_index == 1
    before = torch.neuron.memory_allocated()
    kept = torch.empty(1 << 18, device="neuron:1")
    assert torch.neuron.memory_allocated() - before >= kept.nbytes
    assert torch.neuron.memory_allocated() == torch.neuron.memory_allocated(1)
    torch.neuron.manual_seed(3)
    first = torch.randn(5, device="neuron")
    torch.neuron.manual_seed(3)
    torch.testing.assert_close(torch.randn(5, device="neuron").cpu(), first.cpu())
    assert torch.neuron.initial_seed() == 3


def test_a_stream_of_another_device_makes_its_device_current(on_device_1):
    stream = torch.neuron.Stream(device=0)
    with torch.neuron.stream(stream):
        assert torch.neuron.current_device() == 0 and torch.neuron.current_stream() == stream
        assert torch.zeros(1, device="neuron").device == torch.device("neuron", 0)
    assert torch.neuron.current_device() == 1


def test_backward_of_tensors_on_device_1(on_device_1):
    """The autograd engine keeps a ready queue per device of the count the device guard reports
    (1 for a Python backend): a backward on neuron:1 hit its internal assert."""
    w = torch.randn(4, 5, device="neuron:1", requires_grad=True)
    (w.sin() * 2).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w.detach().cpu().cos() * 2)
    host = torch.randn(3, requires_grad=True)
    (host.to("neuron:1") * 3).to("neuron:0").sum().backward()
    torch.testing.assert_close(host.grad, torch.full((3,), 3.0))
    grads = torch.autograd.grad((w * w).sum(), w)
    assert grads[0].device == _ONE


def test_compiled_graphs_keep_their_inputs_device_and_refuse_a_mix(on_device_1):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    reference.load_state_dict(model.state_dict())
    model.to("neuron:1")
    compiled = torch.compile(model, backend="neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):  # training graphs: forward and backward on device 1
        x = torch.randn(4, 8)
        out = compiled(x.to("neuron:1"))
        assert out.device == _ONE
        out.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        reference(x).square().mean().backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.cpu(), theirs, rtol=1e-5, atol=1e-5)
    f = torch.compile(lambda a, b: (a @ b).relu() + torch.arange(3, device=a.device), backend="neuron")
    a, b = torch.randn(6, 7, device="neuron:1"), torch.randn(7, 3, device="neuron:1")
    assert f(a, b).device == _ONE
    with pytest.raises(RuntimeError, match="neuron:1 and neuron:0"):
        f(a, b.to("neuron:0"))


def test_compiled_launches_of_device_1_inputs_run_and_report_on_device_1():
    """With neuron:0 current, a compiled forward (training) or inference graph of neuron:1 inputs
    launched on neuron:0's stream, and the profiler put it on neuron:0's track."""
    from torch_neuronx import observe

    launches: list[tuple[str, int]] = []

    def record(event: observe.Event) -> None:
        if event.name == "runtime.launch":
            launches.append((event.fields.get("graph", ""), event.fields.get("device")))

    with config.override(TORCH_NEURONX_VISIBLE_DEVICES=(0, 1)):
        assert torch.neuron.current_device() == 0
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(_ONE)
        compiled = torch.compile(model, backend="neuron")
        x = torch.randn(4, 8, device=_ONE)
        compiled(x).sum().backward()  # compiled before listening
        with torch.no_grad():
            compiled(x)
        torch.neuron.synchronize(1)
        observe.subscribe(record)
        try:
            compiled(x).sum().backward()
            with torch.no_grad():
                compiled(x).cpu()
            torch.neuron.synchronize(1)
        finally:
            observe.unsubscribe(record)
    graphs = {graph for graph, _ in launches}
    assert any("forward" in g for g in graphs) and any("inference" in g for g in graphs), launches
    assert {device for _, device in launches} == {1}, launches


def test_out_tensors_on_another_device_are_refused(on_device_1):
    x = torch.randn(4, device="neuron:0")
    for out in (torch.empty(4, device="neuron:1"), torch.empty(4)):
        with pytest.raises(RuntimeError, match="Expected out tensor to have device neuron:0"):
            torch.add(x, x, out=out)
    out = torch.empty(4, device="neuron:0")
    torch.add(x, x, out=out)
    torch.testing.assert_close(out.cpu(), x.cpu() * 2)


def test_compiling_while_another_thread_traces_eager_kernels():
    """Dynamo compiling in one thread inlined the wrapper FX's trace in another thread had put
    on ``nn.Module`` ("Unsupported ... _thread.get_ident" under fullgraph), and two traces at once
    reverted each other's patches ("CURRENT_PATCHER is None in finally block")."""
    stop, failures = threading.Event(), []

    def eager_work():
        i = 0
        while not stop.is_set():  # new shapes: each traces a kernel
            n = 3 + i % 29
            try:
                torch.randn(n, n + 1).to("neuron").softmax(-1).cumsum(0).cpu()
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(f"eager: {type(exc).__name__}: {exc}"[:300])
            i += 1

    thread = threading.Thread(target=eager_work)
    thread.start()
    try:
        for width in range(9, 15):
            model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, 4))
            x = torch.randn(4, 16)
            try:
                with torch.no_grad():
                    torch.testing.assert_close(torch.compile(model, backend="neuron", fullgraph=True)(x), model(x))
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(f"compile: {type(exc).__name__}: {exc}"[:300])
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures[:3]


_RACE = """
import threading
from concurrent.futures import ThreadPoolExecutor
import torch
barrier = threading.Barrier(4)
def first_compile(i):
    barrier.wait(60)
    try:
        torch.compile(torch.nn.Linear(4, 4), backend="neuron")
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
with ThreadPoolExecutor(4) as pool:
    print(list(pool.map(first_compile, range(4))))
"""


def test_first_compiles_in_several_threads_at_once(tmp_path):
    """Each racing thread loaded the backend's entry point and registered it: all but one failed
    with torch's "duplicate name: neuron"."""
    env = {**os.environ, "TORCH_NEURONX_VISIBLE_DEVICES": "1"}
    result = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True, timeout=240, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == str(["ok"] * 4), result.stdout[-2000:]


def test_compiled_code_calling_the_wrapped_constructors_keeps_one_graph(on_device_1):
    """The index-less wrappers of ``torch.tensor``/``torch.as_tensor`` are Python functions that
    Dynamo inlines: a compiled function calling them still compiles as one graph."""
    f = torch.compile(lambda x: x * torch.tensor([2.0, 3.0], device=x.device)
                      + torch.as_tensor([1.0, 1.0], device=x.device), backend="neuron", fullgraph=True)
    out = f(torch.ones(2, device="neuron:1"))
    assert out.device == _ONE
    torch.testing.assert_close(out.cpu(), torch.tensor([3.0, 4.0]))
