"""``aten.slice`` with nothing in it → an empty ``full``: torch-mlir mis-sizes ``x[:, :0]``.

torch-mlir lowers a slice ending at 0 to a ``stablehlo.slice`` whose inferred type is the
whole dim ("inferred type(s) 'tensor<4x6xf32>' are incompatible with ... 'tensor<4x0xf32>'").
A tensor with no elements holds no data, so a ``full`` of its shape is the same value.
"""

from __future__ import annotations

import torch

from torch_neuronx.compiler.passes.rewrite import replace_with_call, static_val

aten = torch.ops.aten


def empty_slices_to_full(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every slice whose (static) result has no elements by a ``full`` of that shape."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.slice.Tensor:
            continue
        val = static_val(node)
        if val is not None and val.numel() == 0:
            replace_with_call(gm, node, aten.full.default, (list(val.shape), 0),
                              {"dtype": val.dtype, "device": val.device})
    return gm
