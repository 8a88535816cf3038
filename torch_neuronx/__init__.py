"""torch_neuronx: TorchNeuron's ``neuron`` backend, running on CPUs and NVIDIA GPUs.

``torch.compile(model, backend="neuron")`` works after installation without
importing this package (the backend is registered as a ``torch_dynamo_backends``
entry point). Configuration lives in :mod:`torch_neuronx.config`.
"""

from torch_neuronx import log as _log

_log.configure()

__version__ = "0.1.0"
