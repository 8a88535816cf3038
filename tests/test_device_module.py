"""``torch.neuron``: the device module registered on ``import torch_neuronx``."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
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
    torch.neuron.synchronize()  # queued work of earlier tests holds its memory until it has run
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


# The torch.neuron names TorchNeuron programs call; each is torch.cuda's name for the same thing,
# except TorchNeuron's module-level stream shortcuts and AMP query, which torch.cuda lacks.
_TORCHNEURON_ONLY = {"wait_stream", "wait_event", "record_event", "get_amp_supported_dtype"}
_TORCHNEURON_SURFACE = (
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "get_device_name", "get_device_properties", "synchronize", "Stream", "Event", "stream", "current_stream",
    "default_stream", "set_stream", "wait_stream", "wait_event", "record_event", "manual_seed", "manual_seed_all",
    "seed", "initial_seed", "get_rng_state", "set_rng_state", "get_amp_supported_dtype", "is_bf16_supported",
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "memory_summary", "empty_cache",
)


def test_torchneuron_surface_exists_under_torch_cuda_names():
    import torch.cuda

    missing = [name for name in _TORCHNEURON_SURFACE if not callable(getattr(torch.neuron, name, None))]
    assert missing == []
    assert {name for name in _TORCHNEURON_SURFACE if not hasattr(torch.cuda, name)} == _TORCHNEURON_ONLY


def test_device_selection_and_properties_answer_as_torch_cuda():
    torch.neuron.init()
    assert torch.neuron.is_available() and torch.neuron.is_initialized()
    for spelling in (0, "neuron:0", "neuron", torch.device("neuron", 0)):
        torch.neuron.set_device(spelling)
        assert torch.neuron.current_device() == 0
    with torch.neuron.device(None):  # None leaves the current device, as torch.cuda.device(None)
        assert torch.neuron.current_device() == 0
    properties = torch.neuron.get_device_properties("neuron:0")
    assert properties.name == torch.neuron.get_device_name(0) == torch.neuron.get_device_name()
    assert "NeuronCore 0" in properties.name
    assert properties.total_memory == torch.neuron.mem_get_info(0)[1] > 0
    assert torch.neuron.is_bf16_supported() and torch.bfloat16 in torch.neuron.get_amp_supported_dtype()


def test_tensor_and_module_neuron_methods_move_to_the_device():
    host = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    moved = host.neuron()
    assert moved.device == torch.device("neuron", 0) and moved.is_neuron and not host.is_neuron
    assert torch.equal(moved.cpu(), host)
    assert host.neuron(0).device == host.neuron(device="neuron:0").device == moved.device
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert model.neuron() is model  # in place, as Module.cuda()
    assert {t.device.type for t in (*model.parameters(), *model.buffers())} == {"neuron"}
    assert model[0](moved).device == moved.device


def test_memory_stats_answers_torchneuron_nested_and_torch_cuda_flat_keys():
    gc.collect()
    address = torch.neuron.caching_allocator_alloc(5 * 1024 * 1024)  # a large-pool block
    try:
        stats = torch.neuron.memory_stats()
        for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation",
                     "segment", "active", "inactive_split", "inactive_split_bytes"):
            assert set(stats[name]) == {"current", "peak", "allocated", "freed"}, name
            for field in ("current", "peak", "allocated", "freed"):
                assert stats[name][field] == stats[f"{name}.all.{field}"], (name, field)
        assert stats["allocated_bytes"]["current"] == torch.neuron.memory_allocated() >= 5 * 1024 * 1024
        assert stats["reserved_bytes"]["current"] == torch.neuron.memory_reserved()
        assert stats["allocated_bytes"]["peak"] == torch.neuron.max_memory_allocated()
        assert stats["oversize_allocations"]["current"] == stats["oversize_allocations.current"]
        assert isinstance(stats["num_alloc_retries"], int) and isinstance(stats["num_ooms"], int)
        # torch.cuda's nested form keeps its own shape: pools under each statistic.
        nested = torch.neuron.memory_stats_as_nested_dict()
        assert nested["allocated_bytes"]["large_pool"]["current"] == stats["allocated_bytes.large_pool.current"]
        assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes"]["current"]
        assert "Allocated memory" in torch.neuron.memory_summary()
    finally:
        torch.neuron.caching_allocator_delete(address)
    torch.neuron.reset_peak_memory_stats()
    after = torch.neuron.memory_stats()
    assert after["allocated_bytes"]["peak"] == after["allocated_bytes.all.peak"] == torch.neuron.memory_allocated()


def test_a_memory_fraction_caps_what_the_allocator_reserves():
    """``torch.neuron.set_per_process_memory_fraction`` (torch.cuda's, which it lacked): a request
    past the share is an OutOfMemoryError that says so; freed memory serves the next one."""
    neuron = torch.neuron
    total = neuron.mem_get_info()[1]
    assert neuron.get_per_process_memory_fraction() == 1.0
    neuron.set_per_process_memory_fraction(64 * 2**20 / total)
    try:
        assert abs(neuron.get_per_process_memory_fraction() * total - 64 * 2**20) < 2
        held = torch.empty(40 * 2**20 // 4, device="neuron")
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            torch.empty(40 * 2**20 // 4, device="neuron")
        del held
        torch.empty(40 * 2**20 // 4, device="neuron").fill_(1.0).cpu()
        for bad in (1.5, -0.1, "half", True):
            with pytest.raises(ValueError, match="Invalid fraction value"):
                neuron.set_per_process_memory_fraction(bad)
    finally:
        neuron.set_per_process_memory_fraction(1.0)
        neuron.empty_cache()


def test_stream_functions_order_work_on_the_current_stream():
    import threading

    producer, consumer = torch.neuron.Stream(), torch.neuron.Stream()
    gate = threading.Event()
    producer.submit(gate.wait, 10.0)
    order: list[str] = []
    producer.submit(order.append, "produced")
    with torch.neuron.stream(consumer):
        assert torch.neuron.current_stream() is consumer
        torch.neuron.wait_stream(producer)  # the current stream (consumer) waits for the producer's work
        consumer.submit(order.append, "after wait_stream")
        marker = torch.neuron.record_event()  # on the current stream
    assert torch.neuron.current_stream() is torch.neuron.default_stream()
    torch.neuron.set_stream(producer)
    try:
        assert torch.neuron.current_stream() is producer
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream())
    later = torch.neuron.Stream()
    with torch.neuron.stream(later):
        torch.neuron.wait_event(marker)
    later.submit(order.append, "after wait_event")
    assert not marker.query() and order == []
    gate.set()
    torch.neuron.synchronize()
    assert order == ["produced", "after wait_stream", "after wait_event"] and marker.query()


@pytest.mark.parametrize("call", [
    lambda d: torch.neuron.memory_allocated(d), lambda d: torch.neuron.memory_stats(f"neuron:{d}"),
    lambda d: torch.neuron.max_memory_reserved(torch.device("neuron", d)), lambda d: torch.neuron.empty_cache(d),
    lambda d: torch.neuron.reset_peak_memory_stats(d), lambda d: torch.neuron.Stream(device=d),
    lambda d: torch.neuron.synchronize(d), lambda d: torch.neuron.current_stream(d),
    lambda d: torch.neuron.default_stream(d), lambda d: torch.accelerator.memory_allocated(d),
], ids=["memory_allocated", "memory_stats", "max_memory_reserved", "empty_cache", "reset_peak", "Stream",
        "synchronize", "current_stream", "default_stream", "accelerator"])
def test_a_device_this_process_does_not_see_is_an_error(call):
    """``memory_allocated(9)`` answered 0 and ``Stream(device=3)`` made a stream of a device that does
    not exist; torch.cuda raises for both. Device 0 (the one visible device) answers."""
    with pytest.raises(ValueError, match="neuron device 3 does not exist; device_count\\(\\) is 1"):
        call(3)
    call(0)
