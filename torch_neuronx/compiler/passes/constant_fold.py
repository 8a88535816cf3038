"""Fold computations on constants with torch itself, before torch-mlir sees them.

torch-mlir's folders get float splat comparisons wrong: ``torch.full((3,), 2.0) > 0``
folds to all-false, and ``torch.full((3,), 0.0) > 0`` crashes the process (both in
``torchdynamo-export-to-torch-backend-pipeline``); ``sign`` and ``trunc`` of a
positive constant fold to negative values; a float64 splat compared with 0 folded to true.
``*_like`` and ``new_*`` fills of a static shape count as constants. Such subgraphs come from user code and
from decompositions alike. This pass evaluates every op whose inputs are all
constants with torch's own kernels (exact semantics) and, where the result is a
splat, hands torch-mlir an ``aten.full`` (a literal its folders handle); where it is
not, the constant ops feeding it are tried the same way, down to the sources (a QR of
a zero matrix compares splats deep inside a constant chain). Other constant results
stay as they were: tensor constants upset the importer when
further ops consume them, and IREE rejects unsigned constants.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torch_neuronx.compiler.passes.rewrite import replace_with_call

aten = torch.ops.aten

# Ops that only create a constant: already what torch-mlir should see, nothing to fold.
_SOURCES = {aten.full.default, aten.scalar_tensor.default, aten.arange.default, aten.arange.start,
            aten.arange.start_step, aten.zeros.default, aten.ones.default}
_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def _foldable(node: torch.fx.Node, constant: set[torch.fx.Node]) -> bool:
    if node.op == "get_attr":
        return True
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags or node.target._schema.is_mutable:
        return False
    if node.target in (aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default):
        return False  # uninitialized values: nothing to fold to
    inputs = node.all_input_nodes
    return all(n in constant for n in inputs) and isinstance(node.meta.get("val"), torch.Tensor)


def _value(node: torch.fx.Node, gm: torch.fx.GraphModule, values: dict[torch.fx.Node, Any]) -> Any:
    if node not in values:
        if node.op == "get_attr":
            values[node] = getattr(gm, str(node.target))
        else:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _value(n, gm, values))
            values[node] = node.target(*args, **kwargs)
    return values[node]


def _splat(t: torch.Tensor) -> Any | None:
    """The single value every element of ``t`` holds, or None (NaN counts as one value)."""
    if t.numel() == 0 or t.is_complex():
        return None
    first = t.reshape(-1)[0]
    same = (t == first) | (t.isnan() & first.isnan()) if t.is_floating_point() else t == first
    return first.item() if bool(same.all()) else None


#: Ops whose values are a constant though they take a tensor (for its shape): with a static shape,
#: an ``aten.full`` (the eager device's ``x ** 2.5`` compares ``full_like(x, 2.5)`` with 0, which
#: torch-mlir folded to true for float64: every power came out 1.0).
_FILLS = {aten.full_like.default: lambda node: node.args[1], aten.zeros_like.default: lambda node: 0,
          aten.ones_like.default: lambda node: 1, aten.new_full.default: lambda node: node.args[2],
          aten.new_zeros.default: lambda node: 0, aten.new_ones.default: lambda node: 1}


def _fills_as_constants(gm: torch.fx.GraphModule) -> None:
    """Each ``*_like`` / ``new_*`` fill of a static shape and a number becomes an ``aten.full``."""
    for node in list(gm.graph.nodes):
        fill = _FILLS.get(node.target) if node.op == "call_function" else None
        value = node.meta.get("val")
        if fill is None or not isinstance(value, torch.Tensor) or value.dtype in _UNSIGNED:
            continue
        number = fill(node)
        if type(number) not in (int, float, bool) or not all(type(size) is int for size in value.shape):
            continue  # (a symbolic size or fill value: not a constant)
        replace_with_call(gm, node, aten.full.default, (list(value.shape), number), {"dtype": value.dtype})


def constant_fold(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace ops computed from constants only by their values (see the module docstring)."""
    _fills_as_constants(gm)
    constant: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if _foldable(node, constant):
            constant.add(node)
    # Fold where constants meet the rest of the graph: the last constant node before a use. A
    # result that stays (not a splat) leaves its own constant inputs meeting the graph: fold those.
    # (In graph order, never in the set's: the order of folding must not depend on where the
    # nodes happen to lie in memory, or one graph could lower differently from run to run.)
    worklist = [n for n in gm.graph.nodes if n in constant and n.op == "call_function"
                and n.target not in _SOURCES and any(user not in constant for user in n.users)]
    if not worklist:
        return gm
    values: dict[torch.fx.Node, Any] = {}
    seen = set(worklist)
    with unset_fake_temporarily():
        while worklist:
            node = worklist.pop()
            try:
                result = _value(node, gm, values)
            except Exception:  # an op torch cannot run eagerly here: leave it to the compiler
                continue
            if isinstance(result, torch.Tensor) and _replace(gm, node, result):
                continue
            for source in node.all_input_nodes:
                if source in constant and source not in seen and source.op == "call_function" \
                        and source.target not in _SOURCES:
                    seen.add(source)
                    worklist.append(source)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _replace(gm: torch.fx.GraphModule, node: torch.fx.Node, result: torch.Tensor) -> bool:
    """Replace ``node`` by an ``aten.full`` of ``result`` if it is a splat; whether it was."""
    splat = None if result.dtype in _UNSIGNED else _splat(result)
    if splat is None:
        return False
    replace_with_call(gm, node, aten.full.default, (list(result.shape), splat), {"dtype": result.dtype})
    return True
