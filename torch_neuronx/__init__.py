"""torch_neuronx: TorchNeuron's ``neuron`` backend, running on CPUs and NVIDIA GPUs.

``torch.compile(model, backend="neuron")`` and ``device="neuron"`` work after
installation without importing this package: the backend is a
``torch_dynamo_backends`` entry point, and ``import torch`` loads this package
through torch's ``torch.backends`` entry point (:func:`_autoload`; set
TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip it). Configuration lives in :mod:`torch_neuronx.config`;
``@torch_neuronx.kernel`` compiles a user function as its own NEFF (:mod:`torch_neuronx.kernels`);
``torch_neuronx.aot_compile`` / ``aot_load`` compile a model ahead of time and package it
(:mod:`torch_neuronx.dynamo.aot`).
Importing the package names PyTorch's PrivateUse1 device ``neuron`` and registers
``torch.neuron`` (memory statistics, streams; see :mod:`torch_neuronx.device`).
"""

_initialized = False  # set at the end of this file


def _autoload() -> None:
    """torch's device-backend entry point (``import torch``): register the neuron device.

    Defined before anything else here: when this package's own import is what imports torch,
    torch calls this on the partially initialized package, and the import registers the
    device itself once torch is ready. An error here would make ``import torch`` fail for
    every program of this environment, so none leaves: it is logged, and ``neuron`` is then
    unavailable until ``import torch_neuronx`` says why.
    """
    if not _initialized:
        return
    try:
        if not _register_device():
            _log.logger().warning("the neuron device was not registered (PrivateUse1 is taken)")
    except Exception as exc:  # never break `import torch`
        _log.logger().warning("could not register the neuron device at `import torch`: %s", exc)


from torch_neuronx import log as _log  # noqa: E402

_log.configure()

import sys as _sys  # noqa: E402

from torch_neuronx.device import register as _register_device  # noqa: E402

# While ``python -m torch_neuronx.<tool>`` locates its module, argv[0] is "-m": the tools
# (cache, config) do not need the device, so they skip importing torch for it.
if _sys.argv[:1] != ["-m"] or "torch" in _sys.modules:
    _register_device()
    try:  # the `neuron` c10d backend: dist.init_process_group("neuron")
        from torch_neuronx.distributed import register as _register_distributed

        _register_distributed()
    except Exception as _exc:
        _log.logger().warning("the neuron c10d backend was not registered: %s", _exc)
    try:  # the Neuron session behind torch.profiler; a failure only costs the profiler
        from torch_neuronx.profiling import install as _install_profiling

        _install_profiling()
    except Exception as _exc:
        _log.logger().warning("the neuron profiler hooks were not installed: %s", _exc)

# TorchNeuron's metrics API; importing it reads TORCH_NEURONX_ENABLED_METRIC_TABLES, so an unknown
# table name is reported now rather than after a whole run.
from torch_neuronx import metrics  # noqa: E402, F401
from torch_neuronx.metrics import get_dynamo_metrics, reset_dynamo_metrics  # noqa: E402, F401
from torch_neuronx.version import __version__  # noqa: E402, F401


def __getattr__(name: str) -> object:
    # ``kernel`` imports the compile path: loaded on first use so `import torch_neuronx` stays light.
    if name in ("kernel", "Kernel"):
        from torch_neuronx import kernels

        return getattr(kernels, name)
    if name in ("aot_compile", "aot_load"):  # ahead-of-time compilation (torch_neuronx.dynamo.aot)
        from torch_neuronx.dynamo import aot

        return getattr(aot, name)
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")

_initialized = True
