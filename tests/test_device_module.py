"""``torch.neuron``: the device module registered on ``import torch_neuronx``."""

from __future__ import annotations

import gc
import subprocess
import sys

import torch

import torch_neuronx  # noqa: F401  (registers torch.neuron)
from torch_neuronx import memory


def test_privateuse1_is_named_neuron():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.device("neuron:0").type == "neuron"
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    assert torch.neuron.current_device() == 0


def test_stream_queries_run_no_python_frame_of_ours():
    """Dynamo asks for the current stream at the start of every compiled call: the device
    guard answers from C, without a Python frame Dynamo would intercept each time."""
    device = torch.device("neuron", 0)
    torch.accelerator.current_stream(device)  # the first query initializes the device (init) once
    ours = []

    def watch(frame, event, arg):
        if event == "call" and "torch_neuronx" in frame.f_code.co_filename:
            ours.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        stream = torch.accelerator.current_stream(device)
    finally:
        sys.setprofile(None)
    assert ours == []
    assert stream.device == device


def test_memory_api_reachable_as_torch_neuron():
    gc.collect()  # neuron tensors an earlier test left in reference cycles
    before = torch.neuron.memory_allocated()
    address = torch.neuron.caching_allocator_alloc(3000)
    try:
        assert torch.neuron.memory_allocated() == memory.memory_allocated() == before + 3072
        assert torch.neuron.memory_stats()["allocated_bytes.all.current"] == before + 3072
        assert torch.neuron.memory_reserved() >= 2 * 1024 * 1024  # one small-pool segment
    finally:
        torch.neuron.caching_allocator_delete(address)
    assert torch.neuron.memory_allocated() == before
    torch.neuron.empty_cache()
    assert torch.neuron.max_memory_allocated() >= before + 3072


def test_streams_reachable_as_torch_neuron():
    s = torch.neuron.Stream()
    done = []
    s.submit(lambda: done.append(1))
    s.synchronize()
    assert done == [1]
    assert torch.neuron.current_stream() is torch.neuron.default_stream()


def test_profiler_lists_the_neuron_activity():
    assert "NEURON" in {a.name for a in torch.profiler.supported_activities()}


def test_registration_happens_on_import_alone():
    code = "import torch, torch_neuronx; print(torch.neuron.memory_allocated(), torch.device('neuron').type)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "neuron"]


def test_snapshot_renders_in_pytorchs_memory_visualizer():
    from torch.cuda import _memory_viz

    small = torch.neuron.caching_allocator_alloc(3000)
    large = torch.neuron.caching_allocator_alloc(5 * 1024 * 1024)
    try:
        snapshot = {"segments": torch.neuron.memory_snapshot(), "device_traces": [[]]}
        summary = _memory_viz.segsum(snapshot)
        assert "segment" in summary
        lines: list[str] = []
        _memory_viz.segments(snapshot, format_flamegraph=lambda text: lines.append(text) or "")
        assert "active_allocated;<non-python> 5242880" in lines[0]
        assert "active_allocated;<non-python> 3000" in lines[0]
    finally:
        torch.neuron.caching_allocator_delete(small)
        torch.neuron.caching_allocator_delete(large)
