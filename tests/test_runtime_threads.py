"""The runtime's threads: one pinned worker per allowed CPU, and a multi-threaded NEFF call
first ends torch's idle OpenMP threads (runtime/openmp.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from compare import last_compiled_graph

from torch_neuronx.runtime import openmp


def _threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _gone(tids: set[int], seconds: float = 2.0) -> bool:
    """Whether every thread of ``tids`` has exited (an ended thread leaves /proc shortly after)."""
    deadline = time.monotonic() + seconds
    while tids & _threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _openmp_workers(a: torch.Tensor) -> set[int]:
    """The threads a parallel torch op starts (its OpenMP workers), after ending any idle ones."""
    openmp.end_idle_threads()
    before = _threads()
    torch.mm(a, a)  # large enough for torch to run it on both threads
    return _threads() - before - {threading.get_native_id()}


def _compiled_linear() -> tuple[torch.nn.Module, torch.Tensor, torch.nn.Module]:
    model = torch.nn.Linear(512, 512).eval()  # 67 MFLOP at batch 128: the multi-threaded driver
    x = torch.randn(128, 512)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        compiled(x)
    assert last_compiled_graph()._executable._multithreaded
    return model, x, compiled


_no_openmp_pause = pytest.mark.skipif(openmp._pause_function() is None,
                                      reason="no OpenMP runtime with omp_pause_resource_all")

_WORKER_AFFINITIES = """
import json, os, torch
model = torch.nn.Linear(512, 512).eval()
with torch.no_grad():
    torch.compile(model, backend="neuron")(torch.randn(128, 512))
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        if f.read().startswith("iree-worker"):
            print(json.dumps(sorted(os.sched_getaffinity(int(tid)))))
"""


def _worker_affinities(env: dict[str, str]) -> list[list[int]]:
    """The CPU sets of the runtime's workers in a fresh process that ran a multi-threaded NEFF."""
    out = subprocess.run([sys.executable, "-c", _WORKER_AFFINITIES], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("[")]


def test_one_worker_pinned_to_each_cpu_the_process_may_use():
    allowed = sorted(os.sched_getaffinity(0))[:64]
    affinities = _worker_affinities({})
    assert sorted(affinities) == [[cpu] for cpu in allowed]


def test_workers_run_unpinned_with_the_variable_off():
    allowed = sorted(os.sched_getaffinity(0))[:64]
    assert _worker_affinities({"TORCH_NEURONX_PIN_WORKERS": "0"}) == [allowed] * len(allowed)


@_no_openmp_pause
def test_a_multithreaded_call_ends_idle_openmp_threads_and_torch_starts_them_again(two_torch_threads):
    model, x, compiled = _compiled_linear()
    a = torch.randn(512, 512)
    with torch.no_grad():
        expected = model(x)
        workers = _openmp_workers(a)
        assert workers, "torch's parallel op started no OpenMP thread"
        got = compiled(x)
    assert _gone(workers)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.mm(a, a), a.double().mm(a.double()).float(), rtol=1e-4, atol=1e-3)
    assert _openmp_workers(a), "torch did not start its OpenMP threads again"


@_no_openmp_pause
def test_the_variable_turns_it_off(two_torch_threads, monkeypatch):
    model, x, compiled = _compiled_linear()
    workers = _openmp_workers(torch.randn(512, 512))
    monkeypatch.setenv("TORCH_NEURONX_PAUSE_OPENMP", "0")
    with torch.no_grad():
        compiled(x)
    assert workers and workers <= _threads()
