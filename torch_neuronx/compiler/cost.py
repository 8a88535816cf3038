"""A rough FLOP count of an aot_autograd graph, to pick how its NEFF runs.

Only contractions count (mm, addmm, bmm, convolution): they dominate the
work of every graph large enough for threading to pay off.
"""

from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint

aten = torch.ops.aten


def _size(d: int | torch.SymInt) -> int:
    """A dimension's size; for a symbolic one, the size it was traced with (no guard is added:
    a dynamic-shape kernel's trace must not be specialized by its cost estimate)."""
    return d if isinstance(d, int) else optimization_hint(d, fallback=1)


def _numel(node: object) -> int:
    val = getattr(node, "meta", {}).get("val")
    return math.prod(_size(d) for d in val.shape) if isinstance(val, torch.Tensor) else 0


def _shape(node: object) -> tuple[int, ...]:
    val = getattr(node, "meta", {}).get("val")
    return tuple(_size(d) for d in val.shape) if isinstance(val, torch.Tensor) else ()


def graph_flops(gm: torch.fx.GraphModule) -> int:
    """Multiply-add FLOPs (x2) of the contractions in ``gm``."""
    total = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in (aten.mm.default, aten.bmm.default):
            total += 2 * _numel(node) * _shape(node.args[0])[-1]
        elif node.target is aten.addmm.default:
            total += 2 * _numel(node) * _shape(node.args[1])[-1]
        elif node.target is aten.convolution.default:
            weight = _shape(node.args[1])
            total += 2 * _numel(node) * math.prod(weight[1:]) if weight else 0
    return total
