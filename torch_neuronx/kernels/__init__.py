"""User kernels: ``@torch_neuronx.kernel`` and the NKI trace cache.

* :mod:`~torch_neuronx.kernels.kernel`: the decorator and the eager call path.
* :mod:`~torch_neuronx.pipeline.trace` (below this package): tracing to StableHLO, loading a trace.
* :mod:`~torch_neuronx.kernels.trace_cache`: traces persisted across processes (NKI_ENABLE_TRACE_CACHE).
* :mod:`~torch_neuronx.kernels.wheels`: which installed wheel owns a kernel's source file.
"""

from torch_neuronx.kernels.kernel import DECLARED_TYPES, Kernel, kernel

__all__ = ["DECLARED_TYPES", "Kernel", "kernel"]
