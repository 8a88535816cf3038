"""`import torch` registers the neuron device through torch's `torch.backends` entry point."""

from __future__ import annotations

import os
import subprocess
import sys

_SCRIPT = ("import sys, torch\n"
           "x = torch.randn(4, device='neuron')\n"
           "print(x.device, bool(((x * 2).cpu() == x.cpu() * 2).all()), 'torch_neuronx' in sys.modules)\n")


def _run(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_a_script_that_never_imports_torch_neuronx_gets_the_device():
    done = _run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["neuron:0", "True", "True"]


def test_autoload_can_be_turned_off_as_torch_documents():
    done = _run(TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert done.returncode != 0
    assert "neuron" in done.stderr and "torch_neuronx" not in done.stdout
