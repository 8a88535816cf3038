"""Bool and uint8 tensor constants → signed constants (int8 compared with zero, int16 converted).

torch-mlir imports a bool tensor constant as an unsigned 8-bit literal, and IREE
rejects unsigned constants (``arith.constant`` type mismatch): a mask built inside
the compiled function (``torch.tensor([[False, True]])``) failed to compile, and so did
``z + torch.tensor([1, 7], dtype=torch.uint8)``. A signed int8 constant and ``!= 0`` give the
same mask; an int16 constant converted to uint8, the same bytes.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

aten = torch.ops.aten


def _fake_mode(gm: torch.fx.GraphModule) -> object | None:
    for node in gm.graph.nodes:
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if mode is not None:
            return mode
    return None


#: Unsigned constant dtypes → the signed dtype they cross as.
_SIGNED = {torch.bool: torch.int8, torch.uint8: torch.int16}


def bool_constants_to_int8(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every bool tensor constant by an int8 copy and a comparison with zero, and every
    uint8 one by an int16 copy converted back."""
    targets = [n for n in gm.graph.nodes if n.op == "get_attr"
               and isinstance(getattr(gm, str(n.target), None), torch.Tensor)
               and getattr(gm, str(n.target)).dtype in _SIGNED]
    mode = _fake_mode(gm) if targets else None
    if mode is None:
        return gm
    for node in targets:
        value = getattr(gm, str(node.target))
        signed = _SIGNED[value.dtype]
        name = f"{node.target}_{str(signed).removeprefix('torch.')}"
        with unset_fake_temporarily():  # passes run under aot_autograd's fake mode
            gm.register_buffer(name, value.to(signed))
        with gm.graph.inserting_before(node):
            as_int = gm.graph.get_attr(name)
            mask = gm.graph.call_function(aten.ne.Scalar, (as_int, 0)) if value.dtype == torch.bool \
                else gm.graph.call_function(aten._to_copy.default, (as_int,), {"dtype": value.dtype})
        with mode:
            as_int.meta["val"] = torch.empty(value.shape, dtype=signed)
        mask.meta = dict(node.meta)
        node.replace_all_uses_with(mask)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm
