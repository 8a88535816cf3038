"""Views that merge symbolic dimensions → ``aten.flatten.using_ints`` (dynamic traces).

torch-mlir's linalg lowering of ``aten.view`` cannot relate a symbolic output size to the
input dimensions it merges: ``x.view(-1, 32)`` of a ``[B, S, 32]`` tensor (``B`` and ``S``
symbolic) was lowered as if ``S`` were 1 (a ``tensor.collapse_shape [[0], [1, 2]]`` of a
``?x1x32`` tensor). IREE's input check then refused every call whose ``S`` is not 1, so each
such graph (GPT-2's and every transformer's ``view(-1, hidden)``, ``flatten(0, 1)``) compiled
once per shape; an unchecked buffer would have been read wrong. Its ``flatten`` lowering is a
``collapse_shape`` of exactly the named dimensions, so a view that only merges runs of
adjacent dimensions (each output size the product of a run of input sizes, symbolically) is
written as flattens, right to left, and the lowering keeps ``aten.flatten.using_ints`` as
it is (``torch_to_stablehlo._LINALG_LEGAL``). Views that split a dimension are left alone: torch-mlir lowers
those correctly. Static shapes are left alone too (the StableHLO path sees the sizes).
"""

from __future__ import annotations

import sympy
import torch

from torch_neuronx.compiler.passes.rewrite import call_before

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _expr(size: int | torch.SymInt) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def merge_runs(have: list[int | torch.SymInt], want: list[int | torch.SymInt]) -> list[tuple[int, int]] | None:
    """The runs ``[start, end)`` of ``have``'s dims whose products are ``want``'s sizes in order,
    or None when ``want`` is not such a merge of ``have`` (it splits or reorders a dimension)."""
    runs, i = [], 0
    for size in want:
        target, start, product = _expr(size), i, sympy.Integer(1)
        while True:
            if i >= len(have):
                return None
            product *= _expr(have[i])
            i += 1
            if sympy.expand(product - target) == 0:
                break
        runs.append((start, i))
    rest = have[i:]
    if any(_expr(s) != 1 for s in rest) or (rest and not runs):
        return None
    if rest:
        runs[-1] = (runs[-1][0], len(have))  # trailing 1s join the last run
    return runs


def views_merging_symbols_to_flatten(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite each view that merges runs of dims, one of them symbolic, as flattens of the runs."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _VIEWS:
            continue
        source, out = node.args[0], node.meta.get("val")
        have = getattr(source, "meta", {}).get("val")
        if not isinstance(have, torch.Tensor) or not isinstance(out, torch.Tensor):
            continue
        shape = list(have.shape)
        if all(isinstance(s, int) for s in shape):
            continue
        runs = merge_runs(shape, list(out.shape))
        merged = [(a, b) for a, b in runs or () if b - a > 1]
        if not merged or not any(not isinstance(shape[d], int) for a, b in merged for d in range(a, b)):
            continue
        result = source
        for start, end in reversed(merged):  # right to left: the left runs keep their positions
            result = call_before(gm, node, aten.flatten.using_ints, result, start, end - 1)
        result.meta = {**node.meta, "val": result.meta["val"]}
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
    return gm
