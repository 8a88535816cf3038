"""Helpers of the profiling tests: fixtures, a short workload, reading a session's output.

Test modules import the fixtures (``profile_dir_fixture``, ``neuron_log_fixture``) to register
them; tests ask for them as ``profile_dir`` and ``neuron_log``.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest
import torch
from torch.profiler import ProfilerActivity

NEURON = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


@pytest.fixture(name="profile_dir")
def profile_dir_fixture(tmp_path, monkeypatch):
    """TORCH_NEURONX_PROFILE_OUTPUT_DIR in the test's own directory; profiling variables unset."""
    for name in ("TORCH_NEURONX_PROFILE_DEFAULT_SESSION", "TORCH_NEURONX_PROFILE_MODES", "TORCH_NEURONX_PROFILE_RANKS",
                 "TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC", "TORCH_NEURONX_PROFILE_CAPTURE_NC", "RANK"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "profiles"
    monkeypatch.setenv("TORCH_NEURONX_PROFILE_OUTPUT_DIR", str(path))
    return path


@pytest.fixture(name="neuron_log")
def neuron_log_fixture(caplog):
    """The messages the torch_neuronx loggers (which do not propagate) log during the test."""
    logger = logging.getLogger("torch_neuronx")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="torch_neuronx")
    try:
        yield lambda: [r.getMessage() for r in caplog.records]
    finally:
        logger.removeHandler(caplog.handler)


def eager_work() -> torch.Tensor:
    """A few eager ops on the neuron device, read back to the host."""
    x = torch.randn(8, 8, device="neuron")
    y = (x * 2 + 1).sum(dim=0)
    return y.cpu()


def session_dirs(root) -> list[str]:
    """Every session directory (``{root}/{instance}_pid_{pid}/{timestamp}``) under ``root``."""
    return sorted(glob.glob(os.path.join(str(root), "*_pid_*", "*")))


def read(path) -> dict:
    with open(path) as f:
        return json.load(f)


def neuron_spans(events: list[dict]) -> list[dict]:
    """The complete events our session added."""
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).startswith("neuron.")]
