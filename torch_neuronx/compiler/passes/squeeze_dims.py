"""``aten.squeeze.dims`` → ``aten.view``: torch-mlir's importer rejects the multi-dim squeeze."""

from __future__ import annotations

import torch

from torch_neuronx.compiler.passes.rewrite import replace_with_call, static_val

aten = torch.ops.aten


def squeeze_dims_to_view(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``squeeze.dims`` whose output shape is static by a ``view`` to that shape."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.squeeze.dims:
            continue
        val = static_val(node)
        if val is not None:
            replace_with_call(gm, node, aten.view.default, (node.args[0], list(val.shape)))
    return gm
