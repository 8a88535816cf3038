"""``aten.squeeze.dims`` → ``aten.view``: torch-mlir's importer rejects the multi-dim squeeze."""

from __future__ import annotations

import torch

aten = torch.ops.aten


def squeeze_dims_to_view(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``squeeze.dims`` whose output shape is static by a ``view`` to that shape."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.squeeze.dims:
            continue
        val = node.meta.get("val")
        if val is None or any(not isinstance(d, int) for d in val.shape):
            continue
        with gm.graph.inserting_before(node):
            view = gm.graph.call_function(aten.view.default, (node.args[0], list(val.shape)))
        view.meta = dict(node.meta)
        node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
    return gm
