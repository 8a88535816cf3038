"""A Python number as an op's first Tensor operand → a 0-d tensor of the op's computation dtype.

aot_autograd graphs carry ``aten.sub.Tensor(0.16666666666666666, x)`` for
``1 / 6 - x``: a Python float where the schema has a Tensor. torch-mlir's
importer makes such a number a float32 literal, so in a float64 graph ``c - x``
computed with ``c`` rounded to float32 (errors of 5e-9 for 1/6). torch wraps
the number as a float64 "wrapped number" that never widens the result type;
here it becomes a 0-d ``scalar_tensor`` of exactly the type the op computes in,
which neither widens nor narrows it. (Numbers in later Tensor positions, as in
``x * 0.5``, are imported as exact scalars and stay as they are.)
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

_NUMBER = (bool, int, float)


def scalar_operands_to_tensors(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Wrap every Python number passed as the first operand where the op's schema takes a Tensor."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema.arguments
        if not (schema and isinstance(schema[0].type, torch.TensorType) and node.args
                and type(node.args[0]) in _NUMBER):
            continue
        tensors = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
        like = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
        if like is None:
            continue
        dtype = torch.result_type(like, node.args[0])
        with gm.graph.inserting_before(node):
            wrapped = gm.graph.call_function(aten.scalar_tensor.default, (node.args[0],),
                                             {"dtype": dtype, "device": like.device})
        wrapped.meta["val"] = like.new_empty((), dtype=dtype)
        node.args = (wrapped, *node.args[1:])
    return gm
