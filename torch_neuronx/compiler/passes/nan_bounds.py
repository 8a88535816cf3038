"""NaN kept by clamps and element-wise maxima/minima of kernels lowered through linalg.

torch's ``clamp`` (and what is written with it: ``clip``, ``hardtanh``, ``relu6``, ``hardsigmoid``),
``maximum`` and ``minimum`` return NaN where an operand is NaN. StableHLO's ``clamp``/``max``/``min``
do the same, but torch-mlir's linalg lowering (the one dynamic-shape kernels compile from)
compares with ``ult``/``ogt`` and selects: a NaN became the bound or the other operand
(``clamp(NaN, -1, 1)`` was -1, ``maximum(NaN, 0)`` 0), silently, once an op or a graph ran on
its dynamic-shape kernel. :func:`nan_propagating_bounds` follows each such float node with
``where(isnan(a) | isnan(b) ..., a + b ..., result)``: the sum of its tensor operands, NaN
exactly where one of them is.
"""

from __future__ import annotations

import functools

import torch

from torch_neuronx.compiler.passes.rewrite import call_before, example

__all__ = ["nan_propagating_bounds"]

aten = torch.ops.aten

#: Ops whose float result drops NaN in torch-mlir's linalg lowering, and the positions of their
#: operands that may carry a NaN into the result (scalar bounds are Python numbers: skipped).
_OPS = {
    aten.clamp.default: (0,), aten.clamp.Tensor: (0, 1, 2), aten.clamp_min.default: (0,),
    aten.clamp_min.Tensor: (0, 1), aten.clamp_max.default: (0,), aten.clamp_max.Tensor: (0, 1),
    aten.maximum.default: (0, 1), aten.minimum.default: (0, 1), aten.hardtanh.default: (0,),
    aten.hardsigmoid.default: (0,), aten.relu6.default: (0,),
}


def _nan_operands(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The float tensor operands of ``node`` that may carry a NaN into its result."""
    operands = []
    for position in _OPS[node.target]:
        arg = node.args[position] if position < len(node.args) else None
        value = example(arg)
        if isinstance(arg, torch.fx.Node) and isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
            operands.append(arg)
    return operands


def nan_propagating_bounds(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Make every clamp, maximum and minimum of a float result return NaN where an operand is NaN."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _OPS:
            continue
        result = example(node)
        if not isinstance(result, torch.Tensor) or not result.dtype.is_floating_point:
            continue
        operands = _nan_operands(node)
        if not operands:
            continue
        after, users = node.next, list(node.users)
        nans = [call_before(gm, after, aten.isnan.default, t) for t in operands]
        anywhere = functools.reduce(lambda a, b: call_before(gm, after, aten.logical_or.default, a, b), nans)
        source = functools.reduce(lambda a, b: call_before(gm, after, aten.add.Tensor, a, b), operands)
        if example(source).dtype != result.dtype:
            source = call_before(gm, after, aten._to_copy.default, source, dtype=result.dtype)
        kept = call_before(gm, after, aten.where.self, anywhere, source, node)
        for user in users:
            user.replace_input_with(node, kept)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm

