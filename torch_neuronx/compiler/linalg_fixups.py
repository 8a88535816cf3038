"""Rewrites of a backend-contract torch module before torch-mlir lowers it to linalg-on-tensors.

Imports nothing but the standard library: the lowering worker (``compiler/lowering_worker.py``)
runs it next to :mod:`.torch_to_stablehlo`.

torch-mlir's linalg lowering has no pattern for ``aten.view.dtype`` (a reinterpretation of the
bits), which its own decompositions of ``signbit`` and ``copysign`` emit, and so do this
package's decompositions of ``sin``, ``cos``, ``erf``, ``fmod``, ``remainder``, ``atan2`` and
others. Its StableHLO lowering has one (a bitcast), so static graphs never saw this; a graph
traced with dynamic sizes (a Llama decoding step with its rotary embedding's ``sin``) failed its
lowering and was compiled once per signature. :func:`bitcasts` replaces each such view whose
element width does not change by the builtin tensor bitcast it means, between the casts the
linalg lowering itself uses at its type boundary (IREE compiles ``tensor.bitcast``).
"""

from __future__ import annotations

import re

__all__ = ["bitcasts"]

_VIEW_DTYPE = re.compile(
    r"^(?P<indent>\s*)%(?P<result>[\w.$-]+) = torch\.aten\.view\.dtype (?P<source>%[\w.$-]+), %[\w.$-]+ : "
    r"!torch\.vtensor<\[(?P<dims>[^\]]*)\],(?P<from>\w+)>, !torch\.int -> "
    r"!torch\.vtensor<\[(?P<dims_after>[^\]]*)\],(?P<to>\w+)>$", re.MULTILINE)
# Torch element types and their builtin (signless) forms and widths in bits: only views between
# two types of one width keep the shape, the only views rewritten.
_ELEMENTS = {"f64": ("f64", 64), "si64": ("i64", 64), "f32": ("f32", 32), "si32": ("i32", 32),
             "f16": ("f16", 16), "bf16": ("bf16", 16), "si16": ("i16", 16)}


def _builtin(dims: str, element: str) -> str:
    """The builtin tensor type of a torch value tensor's ``[dims]`` and element type."""
    shape = "x".join(d.strip() for d in dims.split(",")) if dims.strip() else ""
    return f"tensor<{shape}x{element}>" if shape else f"tensor<{element}>"


def _rewrite(match: re.Match) -> str:
    dims, dims_after, source_type, result_type = match["dims"], match["dims_after"], match["from"], match["to"]
    source, result = _ELEMENTS.get(source_type), _ELEMENTS.get(result_type)
    if source is None or result is None or source[1] != result[1] or dims != dims_after:
        return match[0]  # a view that changes the width (and so the shape): left to fail as before
    indent, name = match["indent"], match["result"]
    before, after = _builtin(dims, source[0]), _builtin(dims, result[0])
    builtin_in, builtin_out = f"%tnx_bitcast_{name}_in", f"%tnx_bitcast_{name}_out"
    return (f"{indent}{builtin_in} = torch_c.to_builtin_tensor {match['source']} : "
            f"!torch.vtensor<[{dims}],{source_type}> -> {before}\n"
            f"{indent}{builtin_out} = tensor.bitcast {builtin_in} : {before} to {after}\n"
            f"{indent}%{name} = torch_c.from_builtin_tensor {builtin_out} : {after} -> "
            f"!torch.vtensor<[{dims}],{result_type}>")


def bitcasts(text: str) -> str | None:
    """``text`` (a backend-contract torch module) with its same-width ``aten.view.dtype`` ops as
    builtin bitcasts; None when it has none to rewrite."""
    if "torch.aten.view.dtype" not in text:
        return None
    rewritten = _VIEW_DTYPE.sub(_rewrite, text)
    return rewritten if rewritten != text else None
