"""torch_neuronx: TorchNeuron's ``neuron`` backend, running on CPUs and NVIDIA GPUs.

``torch.compile(model, backend="neuron")`` works after installation without
importing this package (the backend is registered as a ``torch_dynamo_backends``
entry point). Configuration lives in :mod:`torch_neuronx.config`;
``@torch_neuronx.kernel`` compiles a user function as its own NEFF (:mod:`torch_neuronx.kernels`).
Importing the package names PyTorch's PrivateUse1 device ``neuron`` and registers
``torch.neuron`` (memory statistics, streams; see :mod:`torch_neuronx.device`).
"""

from torch_neuronx import log as _log

_log.configure()

import sys as _sys  # noqa: E402

from torch_neuronx.device import register as _register_device  # noqa: E402

# While ``python -m torch_neuronx.<tool>`` locates its module, argv[0] is "-m": the tools
# (cache, config) do not need the device, so they skip importing torch for it.
if _sys.argv[:1] != ["-m"] or "torch" in _sys.modules:
    _register_device()

from torch_neuronx.version import __version__  # noqa: E402, F401


def __getattr__(name: str) -> object:
    # ``kernel`` imports the compile path: loaded on first use so `import torch_neuronx` stays light.
    if name in ("kernel", "Kernel"):
        from torch_neuronx import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")
