"""``expand`` sizes that repeat a symbolic size of the input → ``-1`` (keep the dimension).

In a dynamic-shape trace, ``x.expand(b, 4, s, 8)`` names its sizes with the graph's symbolic
ints. torch-mlir cannot tell from an SSA size whether the input's dimension is broadcast
(a 1) or kept, so it lowers the expand to a broadcast that decides per element at run time
(``select(dim == 1, 0, index)``) and asserts "dynamic negative broadcast sizes". IREE's
dispatch formation handles those generics badly: the dynamic graph of a small GPT-2, whose
attention masks and key/value heads are expanded this way, failed its first two compiles
(a stack allocation of 864691128455135936 bytes) and compiled only on the driver's third
set of flags; with this pass it compiles on the first. Where the trace shows that the input's dimension is
the very size requested (the same symbolic expression), the size is written ``-1``, which
torch-mlir lowers as a kept dimension; static sizes are left alone (torch-mlir sees them).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _same_symbol(have: object, want: object) -> bool:
    """Whether symbolic size ``have`` is known to be ``want`` (the same expression: no guard)."""
    if not isinstance(have, torch.SymInt) or not isinstance(want, torch.SymInt):
        return False
    return have.node.expr == want.node.expr


def expand_sizes_kept(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite each ``aten.expand`` size that repeats its input's symbolic size as ``-1``."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.expand.default:
            continue
        source, sizes = node.args[0], node.args[1]
        have = getattr(source, "meta", {}).get("val")
        if not isinstance(have, torch.Tensor) or not isinstance(sizes, list | tuple):
            continue
        offset = len(sizes) - have.dim()
        kept = list(sizes)
        for i, size in enumerate(sizes):
            if not isinstance(size, torch.fx.Node) or i < offset:
                continue
            if _same_symbol(have.shape[i - offset], size.meta.get("val")):
                kept[i] = -1
        if kept != list(sizes):
            node.args = (source, kept, *node.args[2:])
    gm.graph.eliminate_dead_code()
    return gm
