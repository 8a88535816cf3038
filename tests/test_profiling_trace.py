"""Trace files stay viewable: the validator, our tracks' nesting, and the summarize CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from profiling_support import NEURON, eager_work, profile_dir_fixture, session_dirs  # noqa: F401
from torch.profiler import profile

from torch_neuronx.profiling import NeuronProfiler, chrome, validate
from torch_neuronx.profiling.recorder import Record


def _x(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_validator_accepts_nested_spans_and_spans_on_other_tracks():
    events = [_x("outer", 0, 10), _x("inner", 2, 3), _x("after", 10, 1), _x("other", 5, 20, tid=2),
              {"ph": "C", "name": "mem", "pid": 1, "tid": 0, "ts": 1, "args": {"bytes": 5}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "t"}}]
    assert validate.validate({"traceEvents": events}) == events


@pytest.mark.parametrize("bad,problem", [
    ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}, "dur"),
    ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": -1}, "dur"),
    ({"ph": "C", "name": "c", "pid": 1, "tid": 0, "ts": 0, "args": {"v": "12"}}, "numbers"),
    ({"ph": "i", "name": "e", "pid": 1, "tid": 0}, "ts"),
    ({"ph": "Q", "name": "?"}, "phase"),
])
def test_validator_rejects_what_perfetto_cannot_read(bad, problem):
    with pytest.raises(validate.TraceError, match=problem):
        validate.validate([bad])


def test_validator_rejects_overlapping_spans_on_one_track():
    with pytest.raises(validate.TraceError, match="without nesting"):
        validate.validate([_x("a", 0, 10), _x("b", 5, 10)])
    assert validate.check([_x("a", 0, 10), _x("b", 5, 10, tid=2)]) == []


def test_overlapping_spans_of_two_threads_get_two_tracks():
    def span(thread, start, duration=1000):
        return Record("runtime.launch", "span", start, duration, 0, thread, 0, 0, {"neff": "ab" * 8})

    events = chrome.record_events([span(1, 10_000), span(2, 10_500), span(1, 10_200, 500)], base_ns=0)
    validate.validate(events)
    tracks = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert len(tracks) == 2


def test_summarize_cli_prints_tops_and_writes_pngs(profile_dir):
    with profile(activities=NEURON, on_trace_ready=NeuronProfiler().export_trace):
        eager_work()
    (directory,) = session_dirs(profile_dir)
    done = subprocess.run([sys.executable, "-m", "torch_neuronx.profiling", "summarize", str(profile_dir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Top graphs (NEFF executions) by time" in done.stdout and "eager_mul" in done.stdout
    assert "Top eager ops by time" in done.stdout and "Top transfers by time" in done.stdout
    for png in ("timeline.png", "top.png"):
        with open(os.path.join(directory, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_summarize_cli_says_what_to_do_without_a_profile(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch_neuronx.profiling", "summarize", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no trace.json" in done.stderr and "PrivateUse1" in done.stderr
