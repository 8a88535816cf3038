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


def test_import_torch_does_not_import_dynamo_or_the_process_group():
    """The autoload registers the device and the c10d backend without importing Dynamo (about 1 s
    per process: every torchrun worker and DataLoader worker pays for ``import torch``); the
    torch.compile frontend and the process group's modules come when first used, and then work."""
    script = ("import sys, torch\n"
              "heavy = [m for m in ('torch._dynamo', 'torch_neuronx.dynamo',\n"
              "                     'torch_neuronx.distributed.process_group') if m in sys.modules]\n"
              "print('heavy', heavy)\n"
              "import torch_neuronx.distributed as d\n"
              "print(d.ProcessGroupNeuron.__name__, 'neuron' in torch.distributed.Backend.backend_list)\n"
              "f = torch.compile(lambda x: x * 2 + 1, backend='neuron')\n"
              "print(f(torch.ones(3)).tolist())\n"
              "from torch_neuronx.pipeline.graph import CompiledGraph\n"
              "print(getattr(CompiledGraph.__call__, '_torchdynamo_disable', False))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["heavy []", "ProcessGroupNeuron True", "[3.0, 3.0, 3.0]", "True"]
