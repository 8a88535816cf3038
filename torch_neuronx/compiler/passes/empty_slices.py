"""``aten.slice`` with nothing in it → an empty ``full``: torch-mlir mis-sizes ``x[:, :0]``.

torch-mlir lowers a slice ending at 0 to a ``stablehlo.slice`` whose inferred type is the
whole dim ("inferred type(s) 'tensor<4x6xf32>' are incompatible with ... 'tensor<4x0xf32>'").
A tensor with no elements holds no data, so a ``full`` of its shape is the same value.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def empty_slices_to_full(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every slice whose (static) result has no elements by a ``full`` of that shape."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.slice.Tensor:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or any(not isinstance(d, int) for d in val.shape) \
                or val.numel() != 0:
            continue
        with gm.graph.inserting_before(node):
            empty = gm.graph.call_function(aten.full.default, (list(val.shape), 0), {
                "dtype": val.dtype, "device": val.device})
        empty.meta = dict(node.meta)
        node.replace_all_uses_with(empty)
        gm.graph.erase_node(node)
    return gm
