"""The TORCH_NEURONX_PROFILE_* variables: modes, ranks, the per-device cap, captured devices, output dir."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from profiling_support import (  # noqa: F401
    NEURON,
    eager_work,
    neuron_log_fixture,
    profile_dir_fixture,
    read,
    session_dirs,
)
from torch.profiler import profile

from torch_neuronx import config
from torch_neuronx.config.parsers import ConfigValueError, parse_index_ranges
from torch_neuronx.observe import Event
from torch_neuronx.profiling import ProfileMode, options
from torch_neuronx.profiling.recorder import Recorder


@pytest.mark.parametrize("raw,expected", [("0,1", (0, 1)), ("0,1,2-5", (0, 1, 2, 3, 4, 5)), (" 3 ", (3,)),
                                          ("2-3,0", (0, 2, 3)), ("1-2,2-4", (1, 2, 3, 4))])
def test_index_ranges_parse(raw, expected):
    assert parse_index_ranges(raw) == expected


def test_a_huge_range_stays_a_range():
    """``0-1000000000`` became a billion Python integers: the process grew to 23 GB and was killed."""
    ranges = parse_index_ranges("0-1000000000,5")
    assert 999_999_999 in ranges and 1_000_000_001 not in ranges and len(ranges) == 1_000_000_001
    assert ranges.describe() == "0-1000000000" and ranges.spans == ((0, 1_000_000_001),)
    assert parse_index_ranges("3,1").describe() == [1, 3]


@pytest.mark.parametrize("raw", ["a", "1-", "3-1", "0;1", "", " , "])
def test_malformed_index_ranges_are_rejected(raw):
    with pytest.raises(ConfigValueError):
        parse_index_ranges(raw)


def test_defaults(profile_dir, monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_PROFILE_OUTPUT_DIR")
    settings = options.resolve()
    assert settings.modes == {ProfileMode.RUNTIME, ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY}
    assert settings.capture_nc == (0, 1) and settings.max_events_per_nc == 10_000_000
    assert settings.output_dir == "neuron_profile"
    assert settings.neff_cache_dir == config.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    assert config.get("TORCH_NEURONX_PROFILE_RANKS") == (0,)


def test_unknown_mode_warns_naming_valid_modes_and_is_ignored(profile_dir, monkeypatch, neuron_log):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", "runtime,gpu_trace, DEVICE")
    assert options.resolve().modes == {ProfileMode.RUNTIME, ProfileMode.DEVICE}
    (message,) = [m for m in neuron_log() if "gpu_trace" in m]
    assert "TORCH_NEURONX_PROFILE_MODES" in message
    assert all(mode in message for mode in ("device", "runtime", "cpu_util", "host_memory"))


def test_malformed_capture_nc_warns_once_and_uses_the_default(profile_dir, monkeypatch, neuron_log):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_CAPTURE_NC", "zero-one")
    assert options.resolve().capture_nc == (0, 1)
    assert options.resolve().capture_nc == (0, 1)
    warnings = [m for m in neuron_log() if "zero-one" in m]
    assert len(warnings) == 1
    assert "TORCH_NEURONX_PROFILE_CAPTURE_NC" in warnings[0] and "0,1" in warnings[0]


def test_only_captured_devices_are_kept(profile_dir, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_CAPTURE_NC", "1-3")
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", "runtime")
    with profile(activities=NEURON):
        eager_work()
    (directory,) = session_dirs(profile_dir)
    trace = read(os.path.join(directory, "runtime.json"))
    assert trace["neuron"]["capture_nc"] == [1, 2, 3]
    assert trace["neuron"]["events_not_captured"] > 0  # device 0's allocations, launches, transfers
    assert not [e for e in trace["traceEvents"] if e.get("args", {}).get("device") == 0]
    assert [e for e in trace["traceEvents"] if e.get("ph") == "X"]  # host-side events (cache lookups) stay


def test_events_over_the_cap_are_dropped_counted_and_reported(profile_dir, monkeypatch, neuron_log):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC", "3")
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", "runtime")
    with profile(activities=NEURON):
        eager_work()
    (directory,) = session_dirs(profile_dir)
    meta = read(os.path.join(directory, "runtime.json"))["neuron"]
    assert meta["events_dropped"] > 0 and meta["events_dropped_per_nc"]["0"] > 0
    assert meta["events_kept"] <= 3 * (1 + len(meta["events_dropped_per_nc"]))
    (warning,) = [m for m in neuron_log() if "dropped" in m]
    assert "TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC=3" in warning


def test_empty_ranks_warn_and_take_the_default(profile_dir, monkeypatch, neuron_log):
    """An empty TORCH_NEURONX_PROFILE_RANKS (a launcher's unset template variable) silently
    profiled no rank; like every other variable, it now warns and takes the default (rank 0)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_RANKS", "")
    with profile(activities=NEURON) as prof:
        pass
    assert prof._neuron_session is not None
    assert [m for m in neuron_log() if "TORCH_NEURONX_PROFILE_RANKS" in m]


def test_a_huge_capture_range_profiles_without_expanding(profile_dir, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_CAPTURE_NC", "0-1000000000")
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", "runtime")
    with profile(activities=NEURON):
        eager_work()
    (directory,) = session_dirs(profile_dir)
    trace = read(os.path.join(directory, "runtime.json"))
    assert trace["neuron"]["capture_nc"] == "0-1000000000"
    assert [e for e in trace["traceEvents"] if e.get("args", {}).get("device") == 0]


@pytest.mark.parametrize("ranks,captured", [("0", False), ("0-1", True), ("1,3", True), ("2", False)])
def test_only_listed_ranks_capture(profile_dir, monkeypatch, ranks, captured):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_RANKS", ranks)
    with profile(activities=NEURON) as prof:
        pass
    assert (prof._neuron_session is not None) is captured
    dirs = session_dirs(profile_dir)
    assert len(dirs) == captured
    if captured:
        assert read(os.path.join(dirs[0], "runtime.json"))["neuron"]["rank"] == 1


def test_output_dir_layout(profile_dir):
    with profile(activities=NEURON):
        pass
    (directory,) = session_dirs(profile_dir)
    instance_dir = os.path.basename(os.path.dirname(directory))
    assert instance_dir == f"{socket.gethostname()}_pid_{os.getpid()}"
    assert os.path.dirname(os.path.dirname(directory)) == str(profile_dir)


def test_recorder_places_events_by_fields_or_stream_worker_thread():
    recorder = Recorder(capture_nc=(0, 1), max_events_per_nc=100, offset_ns=0)
    start = recorder.start_perf_ns + 1
    recorder(Event("collective.all_reduce", "span", start, 10, 0, 1, {"device": "neuron:1", "stream": 2}))

    def on_worker() -> None:
        recorder(Event("runtime.launch", "span", start, 5, 0, threading.get_ident(), {"neff": "ab" * 8}))

    worker = threading.Thread(target=on_worker, name="neuron:0 stream 3")
    worker.start()
    worker.join()
    recorder(Event("some_new_layer.thing", "event", start, 0, 7, 1, {}))  # names are never a closed list
    placed = {r.name: (r.device, r.stream, r.category) for r in recorder.snapshot()}
    assert placed == {"collective.all_reduce": (1, 2, "collective"), "runtime.launch": (0, 3, "runtime"),
                      "some_new_layer.thing": (None, None, "some_new_layer")}


@pytest.mark.parametrize("raw", ["bogus", "", " , "])
def test_profile_modes_naming_no_valid_mode_give_the_default(monkeypatch, caplog, raw):
    """A bad value warns and takes the default, as every variable's does (it recorded nothing)."""
    from torch_neuronx.profiling import options

    monkeypatch.setenv("TORCH_NEURONX_PROFILE_MODES", raw)
    with caplog.at_level("WARNING"):
        modes = options.resolve().modes
    assert {m.value for m in modes} == {"runtime", "cpu_util", "host_memory"}
    assert "TORCH_NEURONX_PROFILE_MODES" in caplog.text


def test_an_empty_metrics_dir_gives_the_default(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_METRICS_DIR", "")
    assert config.get("TORCH_NEURONX_METRICS_DIR") == "/tmp"


def test_neuron_config_options_are_checked_as_the_variables_are(profile_dir, tmp_path, neuron_log):
    """``NeuronConfig(modes=["bogus"])`` started a session that recorded nothing, ``max_events_per_nc=-1``
    dropped every event (the warning naming a variable never set), and a ``profile_output_dir`` that is
    a file lost the profile at the end: each now warns and takes the variable's value."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    settings = options.resolve(options.NeuronConfig(modes=["bogus"], max_events_per_nc=-1,
                                                    profile_output_dir=str(a_file)))
    assert settings.modes == {ProfileMode.RUNTIME, ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY}
    assert settings.max_events_per_nc == 10_000_000
    assert settings.output_dir == str(profile_dir)
    messages = " ".join(neuron_log())
    assert "names no valid mode" in messages and "max_events_per_nc=-1" in messages and "a_file" in messages
    kept = options.resolve(options.NeuronConfig(modes=["device"], max_events_per_nc=5,
                                                profile_output_dir=str(tmp_path)))
    assert kept.modes == {ProfileMode.DEVICE} and kept.max_events_per_nc == 5 and kept.output_dir == str(tmp_path)
