"""Pointwise work between a view and its inverse runs in the unviewed shape.

``nn.Linear`` on a 3-d input is a 2-d matmul viewed as 3-d, and the next
``nn.Linear`` views its input back to 2-d. An activation in between leaves
``view → gelu → view``: two reshapes that IREE 3.13 does not move through the
matmul's unpacking, so the activation's dispatch and the next matmul's packing
stay apart and the activation is written and read once more (the FFN of
bench/compile.py's transformer block: 185 against 135 us per call). Such a
region is computed on the unviewed tensors instead, and the views around it go.

This is an optimization, not a legalization: a graph it leaves alone compiles
and runs the same.
"""

from __future__ import annotations

import torch
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from torch_neuronx.compiler.passes.rewrite import static_val

aten = torch.ops.aten
_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})


def _is_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in _VIEWS


def _is_pointwise(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags)


def _shape(node: object) -> tuple[int, ...] | None:
    val = static_val(node) if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if val is not None else None


def _region(end: torch.fx.Node, unviewed: tuple[int, ...]
            ) -> tuple[list[torch.fx.Node], set[torch.fx.Node]] | None:
    """The pointwise nodes that compute ``end`` from views of ``unviewed``-shaped tensors (and
    0-d tensors, which broadcast alike in either shape), in graph order, and those views; None
    when ``end`` is not such a region or a node inside it is used outside it."""
    viewed = _shape(end)
    if viewed == ():  # 0-d operands alone: their result stays 0-d whatever the meta says (it failed to lower)
        return None
    region: set[torch.fx.Node] = set()
    leaves: set[torch.fx.Node] = set()
    stack = [end]
    while stack:
        node = stack.pop()
        if node in region:
            continue
        if not _is_pointwise(node) or _shape(node) != viewed:
            return None
        region.add(node)
        for arg in node.all_input_nodes:
            shape = _shape(arg)
            if shape == ():
                continue
            if _is_view(arg) and shape == viewed and _shape(arg.args[0]) == unviewed:
                leaves.add(arg)  # its source replaces it
            else:
                stack.append(arg)
    if any(u not in region for node in region if node is not end for u in node.users):
        return None
    return [node for node in end.graph.nodes if node in region], leaves


def _rewrite(region: list[torch.fx.Node], leaves: set[torch.fx.Node], unviewed: tuple[int, ...]) -> None:
    """Feed ``region`` the sources of its ``leaves`` (views) and give it ``unviewed`` shapes."""
    for node in region:
        for arg in node.all_input_nodes:
            if arg in leaves:
                node.replace_input_with(arg, arg.args[0])
        node.meta["val"] = node.meta["val"].reshape(unviewed)
        if "tensor_meta" in node.meta:
            node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])


def pointwise_views_unviewed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Compute every pointwise region between views and their inverse in the unviewed shape."""
    erased: set[torch.fx.Node] = set()
    for node in list(gm.graph.nodes):
        if node in erased or not _is_view(node):
            continue
        end, unviewed = node.args[0], _shape(node)
        if (not isinstance(end, torch.fx.Node) or unviewed is None or unviewed == _shape(end)
                or any(not _is_view(u) or _shape(u) != unviewed for u in end.users)):
            continue
        found = _region(end, unviewed)
        if found is None:
            continue
        region, leaves = found
        _rewrite(region, leaves, unviewed)
        inverse = list(end.users)
        for view in inverse:
            view.replace_all_uses_with(end)
        for view in [*inverse, *leaves]:
            if not view.users:
                gm.graph.erase_node(view)
                erased.add(view)
    return gm
