"""Test-session setup: isolated cache and artifact directories, Dynamo reset between tests.

The NEFF cache lives in one directory for the whole run (shared by pytest-xdist's
workers), so a graph that several tests compile is compiled once per run (CI time),
while each test gets its own artifact directory to inspect.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading

import pytest
import torch

_SESSION_ROOT = tempfile.mkdtemp(prefix="torch_neuronx_tests_")
# pytest-xdist's workers of one run share their caches (a kernel that tests in both compile is
# compiled once; the caches are built for processes sharing them), each its own debug directory.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
_CACHE_ROOT = os.path.join(tempfile.gettempdir(), f"torch_neuronx_tests_run_{_RUN}") if _RUN else _SESSION_ROOT
os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "neff_cache")
os.environ["TORCH_NEURONX_HLO_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "hlo_cache")
os.environ["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] = os.path.join(_CACHE_ROOT, "local_cache")
os.environ["TORCH_NEURONX_DEBUG_DIR"] = os.path.join(_SESSION_ROOT, "debug")
# One NEFF per signature in tests of other behaviours (a recompile for a new shape would otherwise add
# a dynamic trace and a slower dynamic compile to each); tests/test_compile_dynamic_shapes.py turns it on.
os.environ.setdefault("TORCH_NEURONX_DYNAMO_DYNAMIC_SHAPES", "0")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_CACHE_ROOT, "inductor"))

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with no compiled frames, so it really compiles what it tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def debug_dir(tmp_path, monkeypatch):
    """A private TORCH_NEURONX_DEBUG_DIR for tests that inspect the artifact tree."""
    path = tmp_path / "debug"
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(path))
    return path


@pytest.fixture
def retries(caplog):
    """The driver's "compiling again" messages (one per fallback compile) logged during the test."""
    logger = logging.getLogger("torch_neuronx")  # it does not propagate to the root logger
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="torch_neuronx.compiler.driver")
    try:
        yield lambda: [r.getMessage() for r in caplog.records if "compiling again" in r.getMessage()]
    finally:
        logger.removeHandler(caplog.handler)


GATE_WAIT_S = 60.0  # the longest a closed gate holds a stream (a test that forgets it cannot hang)


class _Gate(threading.Event):
    def close(self, stream=None) -> None:
        """Hold ``stream`` (the default stream) back until the gate is set."""
        from torch_neuronx.runtime import streams

        (stream or streams.default_stream()).submit(self.wait, GATE_WAIT_S)


@pytest.fixture
def gated():
    """A gate that holds a stream back once closed; always opened at the end."""
    gate = _Gate()
    yield gate
    gate.set()
    torch.neuron.synchronize()
