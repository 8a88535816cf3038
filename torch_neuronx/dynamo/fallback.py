"""The torch.compile fallback policy: TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION / CompileOptions(fallback_execution=...).

A graph that fails to compile either raises (the default) or runs eagerly; each
fallback is counted (``fallback_graphs``) and warned about once per distinct failure.
"""

from __future__ import annotations

import warnings

from torch_neuronx import config, observe
from torch_neuronx.compiler.errors import NeuronCompileError

_warned: set[str] = set()


def enabled() -> bool:
    """Whether a failing graph runs eagerly instead of raising (read under the compile options)."""
    return not config.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION")


def warn(err: NeuronCompileError) -> None:
    """Count a fallback and warn about it once per distinct failure."""
    observe.count("fallback_graphs")
    key = f"{err.stage}:{err.op}:{err.graph}"
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"{err}\n  falling back to eager execution of this graph "
                      "(TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0)", RuntimeWarning, stacklevel=2)
