"""The compiler: options, targets, lowering, the driver (our neuronx-cc) and the NEFF format.

Public API: :class:`CompileOptions` and :func:`compile_only`.
"""

from torch_neuronx.compiler.options import CompileOptions, compile_only

__all__ = ["CompileOptions", "compile_only"]
