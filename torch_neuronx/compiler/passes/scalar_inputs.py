"""Drop non-tensor inputs (SymInt sizes, ``None``) from graphs compiled for one concrete shape.

Dynamo passes symbolic sizes as graph inputs once it marks a dimension dynamic.
The backend specializes each such graph to concrete input shapes, so these
inputs are constants here: uses are replaced by their value and the
placeholder is removed (the runtime passes only tensors to the NEFF).
"""

from __future__ import annotations

import torch


def inline_scalar_inputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace each non-tensor placeholder by its concrete example value and remove it."""
    for node in list(gm.graph.nodes):
        if node.op != "placeholder":
            continue
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor):
            continue
        if node.users:
            if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
                hint = val.node.hint
                if hint is None:
                    raise ValueError(f"graph input {node.name} is a symbolic size without a concrete value")
                val = hint
            if not isinstance(val, int | float | bool):
                raise ValueError(f"graph input {node.name} of type {type(val).__name__} is not supported")
            def substitute(n: torch.fx.Node, node: torch.fx.Node = node, val: object = val) -> object:
                return val if n is node else n

            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, substitute)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, substitute)
        gm.graph.erase_node(node)
    return gm
