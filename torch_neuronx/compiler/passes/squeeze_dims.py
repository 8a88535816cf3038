"""``aten.squeeze.dims`` → ``aten.view`` (static shapes) or ``aten.squeeze.dim`` chains (dynamic
shapes): torch-mlir's importer rejects the multi-dim squeeze."""

from __future__ import annotations

import torch

from torch_neuronx.compiler.passes.rewrite import call_before, replace_with_call, static_val

aten = torch.ops.aten


def squeeze_dims_to_view(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``squeeze.dims``: by a ``view`` to its output shape when that is static, else
    (a dynamic-shape kernel) by one ``squeeze.dim`` per dimension of size 1, from the last."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.squeeze.dims:
            continue
        val = static_val(node)
        if val is not None:
            replace_with_call(gm, node, aten.view.default, (node.args[0], list(val.shape)))
            continue
        source = node.args[0]
        shape = source.meta["val"].shape
        dims = node.args[1] if isinstance(node.args[1], list | tuple) else [node.args[1]]
        ones = sorted({d % len(shape) for d in dims if isinstance(shape[d % len(shape)], int)
                       and shape[d % len(shape)] == 1}, reverse=True) if shape else []
        result = source
        for d in ones:  # dimensions of size 2 and up (symbols) are not squeezed: squeeze leaves them
            result = call_before(gm, node, aten.squeeze.dim, result, d)
        if result is source:
            result = call_before(gm, node, aten.alias.default, source)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
    return gm
