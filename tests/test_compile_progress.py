"""Feedback on long compiles: stage durations in the log at TORCH_NEURONX_LOG_LEVEL=2, and a
progress line on a terminal that disappears when the compile ends (a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

_SCRIPT = """
import torch, torch_neuronx
from torch_neuronx.pipeline import progress
progress.SHOW_AFTER_S, progress.TICK_S = 0.0, 0.05  # every compile is "long" here
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
torch.compile(m, backend="neuron", options={"model_name": "fed_back"})(torch.randn(2, 8)).sum().backward()
print("END", flush=True)
"""


def _run(tmp_path, terminal: bool, level: str) -> str:
    env = {**os.environ, "TORCH_NEURONX_LOG_LEVEL": level,
           "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"), "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo")}
    if not terminal:
        proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.DEVNULL, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_a_terminal_sees_a_progress_line_that_disappears(tmp_path):
    text = _run(tmp_path, terminal=True, level="1")
    lines = [part for part in text.split("\r") if "[torch_neuronx] compiling" in part]
    assert any("fed_back_" in line and "_forward_0" in line and "of 1 found" in line for line in lines), text[-2000:]
    assert any("_backward_0" in line and "found)" in line for line in lines), text[-2000:]
    assert text.rstrip(" \n").endswith("\r\x1b[K"), repr(text[-200:])  # erased when done


def test_stage_durations_are_logged_at_info_and_nothing_drawn_off_a_terminal(tmp_path):
    text = _run(tmp_path, terminal=False, level="2")
    assert "[torch_neuronx] compiling" not in text
    for stage in ("pipeline.fx_passes", "pipeline.lower", "pipeline.neff", "compiler.compile"):
        assert f"_forward_0: {stage}: " in text, (stage, text[-3000:])
    quiet = _run(tmp_path, terminal=False, level="1")
    assert "pipeline.lower" not in quiet
