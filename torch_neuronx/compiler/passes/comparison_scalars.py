"""A Python float compared with a float tensor → that float rounded to the tensor's type.

torch compares ``x == 0.1`` of a bfloat16 ``x`` with 0.1 converted to bfloat16 (0.10009765625),
so ``torch.tensor(0.1, dtype=torch.bfloat16) == 0.1`` is True. torch-mlir imports the number as
a float64 literal converted to bfloat16 in the graph, and IREE 3.13, folding that conversion
into a comparison of a one-element tensor, compared with the unrounded value: False (wrong at
every ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` of a 0-d or one-element bfloat16 tensor and a
number bfloat16 cannot hold). The number is rounded here, to exactly the value torch compares
with; its conversion in the graph is then exact, however IREE folds it.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

_COMPARISONS = {aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar}
_NARROW = (torch.bfloat16, torch.float16, torch.float32)


def comparison_scalars_rounded(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Round the float operand of every ``<cmp>.Scalar`` of a bfloat16, float16 or float32 tensor."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _COMPARISONS or len(node.args) < 2:
            continue
        tensor, number = node.args[0], node.args[1]
        value = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
        if type(number) is not float or not isinstance(value, torch.Tensor) or value.dtype not in _NARROW:
            continue
        node.args = (tensor, torch.tensor(number, dtype=value.dtype).item(), *node.args[2:])
    return gm
