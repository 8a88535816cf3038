"""The Neuron session behind torch.profiler: when it starts, what it records, where it writes."""

from __future__ import annotations

import os

import torch
from profiling_support import NEURON, eager_work, neuron_spans, profile_dir_fixture, read, session_dirs  # noqa: F401
from torch.profiler import ProfilerActivity, profile, schedule

from torch_neuronx import observe
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode, validate


class TinyMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _window(events: list[dict]) -> tuple[float, float]:
    """The profiled window of torch's own events: its CPU ops and its profiler span."""
    own = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Trace", "user_annotation")]
    return min(e["ts"] for e in own), max(e["ts"] + e["dur"] for e in own)


def test_profiled_loop_records_every_kind_on_torch_clock(profile_dir):
    model = torch.compile(TinyMLP(), backend="neuron")
    inputs = torch.randn(4, 8)
    handler = NeuronProfiler()
    with profile(activities=NEURON, on_trace_ready=handler.export_trace) as prof:
        for _ in range(2):
            eager_work()
        model(inputs)
    assert not observe.state.active  # the listener left with the session

    (directory,) = session_dirs(profile_dir)
    assert handler.exported == [os.path.join(directory, "trace.json")]
    assert sorted(os.listdir(directory)) == ["cpu_util.json", "host_memory.json", "runtime.json", "trace.json"]
    events = validate.validate(os.path.join(directory, "trace.json"), validate.neuron_event)
    spans = neuron_spans(events)
    kinds = {e["args"]["event"] for e in spans}
    assert {"runtime.launch", "eager.op", "runtime.load", "pipeline.neff", "cache.get"} <= kinds, kinds
    assert any(k.startswith("transfer.") for k in kinds)
    instants = {e["name"] for e in events if e.get("ph") == "i" and str(e.get("cat")).startswith("neuron.")}
    assert "memory.malloc" in instants
    start, end = _window(events)
    for e in spans:
        assert start - 1 <= e["ts"] and e["ts"] + e["dur"] <= end + 1, (e, start, end)
        assert 0 <= e["dur"] <= end - start
    assert all(e["dur"] > 0 for e in spans if e["args"]["event"] == "runtime.launch")
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert "neuron:0" in names and "host" in names
    counters = [e for e in events if e.get("ph") == "C" and e.get("cat") == "neuron.host"]
    assert {"cpu utilization (%)", "process rss (bytes)"} <= {e["name"] for e in counters}

    averages = {a.key: a for a in prof.key_averages()}
    launches = [a for k, a in averages.items() if k.startswith("runtime.launch")]
    assert launches and all(a.device_time_total > 0 for a in launches)
    assert "aten::mul" in averages  # torch's own rows are still there


def test_mode_files_hold_valid_traces(profile_dir, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", "runtime,cpu_util,host_memory,device")
    with profile(activities=NEURON):
        eager_work()
    (directory,) = session_dirs(profile_dir)
    for mode in ("runtime", "cpu_util", "host_memory", "device"):
        trace = read(os.path.join(directory, f"{mode}.json"))
        validate.validate(trace)
        assert trace["neuron"]["mode"] == mode and trace["neuron"]["rank"] == 0
        # every file names all four (the first written named only itself)
        assert trace["neuron"]["files"] == {m: f"{m}.json" for m in ("runtime", "cpu_util", "host_memory", "device")}
    cpu = read(os.path.join(directory, "cpu_util.json"))["traceEvents"]
    per_cpu = [e for e in cpu if e.get("name") == "cpu utilization per cpu (%)"]
    assert per_cpu and len(per_cpu[-1]["args"]) == os.cpu_count()
    memory = read(os.path.join(directory, "host_memory.json"))["traceEvents"]
    assert any(e.get("name") == "system memory used (bytes)" and e["args"]["bytes"] > 0 for e in memory)
    device = read(os.path.join(directory, "device.json"))
    neffs = device["neuron"]["neffs"]
    assert neffs and all(n["executions"] >= 1 and n["min_us"] > 0 for n in neffs.values())
    for prefix, entry in neffs.items():
        assert entry["files"], f"NEFF {prefix} was not copied from the NEFF cache"
        assert all(os.path.basename(f).startswith(prefix) and os.path.isfile(os.path.join(directory, f))
                   for f in entry["files"])
    executions = [e for e in device["traceEvents"] if e.get("ph") == "X"]
    assert len(executions) == sum(n["executions"] for n in neffs.values())


def test_run_without_profiler_subscribes_nothing(profile_dir):
    eager_work()
    assert not observe.state.active and observe.events.state.listeners == ()
    assert not profile_dir.exists()


def test_cpu_only_profiling_starts_no_session(profile_dir):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eager_work()
        assert not observe.state.active
    assert prof._neuron_session is None
    assert not profile_dir.exists()


def test_default_session_off_records_no_neuron_data(profile_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_DEFAULT_SESSION", "0")
    with profile(activities=NEURON) as prof:
        eager_work()
        assert not observe.state.active
    assert prof._neuron_session is None and not profile_dir.exists()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert not neuron_spans(validate.validate(str(tmp_path / "t.json"), validate.neuron_event))
    # A NeuronConfig asks for a session whatever the default session says.
    with profile(activities=NEURON, experimental_config=NeuronConfig(modes=[ProfileMode.RUNTIME])):
        assert observe.state.active
    assert len(session_dirs(profile_dir)) == 1


def test_neuron_config_overrides_environment(profile_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", "cpu_util")
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC", "1")
    chosen = tmp_path / "chosen"
    cfg = NeuronConfig(modes=[ProfileMode.RUNTIME, "host_memory"], max_events_per_nc=100_000,
                       capture_enabled_for_nc="0-3", profile_output_dir=str(chosen))
    with profile(activities=NEURON, experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace):
        eager_work()
    assert not profile_dir.exists()
    (directory,) = session_dirs(chosen)
    assert sorted(os.listdir(directory)) == ["host_memory.json", "runtime.json", "trace.json"]
    meta = read(os.path.join(directory, "runtime.json"))["neuron"]
    assert meta["modes"] == ["host_memory", "runtime"] and meta["capture_nc"] == [0, 1, 2, 3]
    assert meta["max_events_per_nc"] == 100_000 and meta["events_dropped"] == 0


def test_schedule_records_only_active_steps(profile_dir):
    active, handler = [], NeuronProfiler()
    with profile(activities=NEURON, schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=handler.export_trace) as prof:
        for _ in range(5):
            eager_work()
            active.append(observe.state.active)
            prof.step()
    assert active == [False, False, True, True, False]
    assert len(handler.exported) == 1 and len(session_dirs(profile_dir)) == 1
    launches = [e for e in neuron_spans(validate.validate(handler.exported[0], validate.neuron_event))
                if e["args"]["event"] == "runtime.launch"]
    assert len(launches) == 2 * 3  # mul, add, sum in each of the two active steps


def test_export_chrome_trace_and_tensorboard_handler_carry_neuron_tracks(profile_dir, tmp_path):
    board = tmp_path / "board"
    with profile(activities=NEURON, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(board))):
        eager_work()
    with profile(activities=NEURON) as prof:
        eager_work()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    (board_file,) = board.iterdir()
    for path in (str(tmp_path / "trace.json"), str(board_file)):
        events = validate.validate(path, validate.neuron_event)
        tracks = {(e["pid"], e["tid"]) for e in neuron_spans(events)}
        named = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
        assert tracks and tracks <= named
        assert read(path)["neuron"]["rank"] == 0


def test_legacy_autograd_profiler_with_neuron_device_runs_on_kineto():
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        eager_work()
    averages = prof.key_averages()
    assert any(a.key == "aten::mul" for a in averages)
    assert all(a.cpu_time_total >= 0 for a in averages)


def test_work_on_a_side_stream_gets_its_own_nested_track(profile_dir):
    x = torch.randn(8, 8, device="neuron")
    handler = NeuronProfiler()
    with profile(activities=NEURON, on_trace_ready=handler.export_trace):
        with torch.neuron.stream(torch.neuron.Stream()):
            for _ in range(3):
                y = x * 2 + 1
        torch.neuron.synchronize()
        y.cpu()
    events = validate.validate(handler.exported[0], validate.neuron_event)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    launch_tracks = {names[(e["pid"], e["tid"])] for e in neuron_spans(events)
                     if e["args"]["event"] == "runtime.launch"}
    assert any(t.startswith("stream ") and not t.startswith("stream 0") for t in launch_tracks), launch_tracks
