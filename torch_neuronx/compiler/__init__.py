"""The compiler: options, targets, decompositions, FX passes, lowering and the driver (our neuronx-cc).

Public API: :class:`CompileOptions` and :func:`compile_only`.
"""

from torch_neuronx.compiler.options import CompileOptions, compile_only

__all__ = ["CompileOptions", "compile_only"]
