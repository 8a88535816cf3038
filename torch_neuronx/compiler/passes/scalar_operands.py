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


def _tensor_positions(op: torch._ops.OpOverload) -> list[int]:
    return [i for i, arg in enumerate(op._schema.arguments) if isinstance(arg.type, torch.TensorType)]


def scalar_operands_to_tensors(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Wrap every Python number passed as the first operand where the op's schema takes a Tensor."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        positions = [i for i in _tensor_positions(node.target)[:1]
                     if i == 0 and node.args and type(node.args[0]) in _NUMBER]
        tensors = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        if not positions or not tensors:
            continue
        args = list(node.args)
        for i in positions:
            dtype = torch.result_type(tensors[0], args[i])
            with gm.graph.inserting_before(node):
                wrapped = gm.graph.call_function(aten.scalar_tensor.default, (args[i],), {
                    "dtype": dtype, "device": tensors[0].device})
            wrapped.meta["val"] = tensors[0].new_empty((), dtype=dtype)
            args[i] = wrapped
        node.args = tuple(args)
    return gm
