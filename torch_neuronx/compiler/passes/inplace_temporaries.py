"""In-place ops on a graph's own temporaries → their out-of-place forms.

Traced graphs are functionalized, except for work a decomposition does below
functionalization: a backward computed with ``torch.autograd.grad`` inside a
decomposition (``grid_sampler_2d_backward``'s) runs autograd's formulas, some of
which mutate fresh temporaries (clamp's ``(x >= min).logical_and_(x <= max)``).
torch-mlir's importer rejects such in-place ops on value tensors. Where the mutated
tensor is a temporary no view shares (made by a non-view op of this graph), writing
``y = op(x, ...)`` and reading ``y`` wherever ``x`` was read after the op is the same
program.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

#: In-place ops that change their tensor's shape or storage: left alone.
_SHAPE_CHANGING = frozenset(("resize_", "resize_as_", "set_", "squeeze_", "unsqueeze_", "transpose_", "t_",
                             "as_strided_", "swapdims_", "swapaxes_"))


def _functional_form(target: object) -> torch._ops.OpOverload | None:
    """The out-of-place overload of an in-place ATen op that mutates its first argument."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    schema = target._schema
    if not schema.arguments or schema.arguments[0].alias_info is None or not schema.arguments[0].alias_info.is_write:
        return None
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments[1:]):
        return None  # out= forms and ops that write several tensors
    name = target.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_") or name in _SHAPE_CHANGING:
        return None
    packet = getattr(aten, name[:-1], None)
    if packet is None:
        return None
    signature = [str(a.type) for a in schema.arguments]
    for overload in packet.overloads():  # the overload of the same arguments (pow_.Scalar is pow.Tensor_Scalar)
        candidate = getattr(packet, overload)
        if not candidate._schema.is_mutable and [str(a.type) for a in candidate._schema.arguments] == signature:
            return candidate
    return None


def _fresh_temporary(node: object) -> bool:
    """``node`` is a tensor this graph made with a non-view op, and no view of it exists."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if not isinstance(node.target, torch._ops.OpOverload) or node.target.is_view:
        return False
    return not any(isinstance(user.target, torch._ops.OpOverload) and user.target.is_view for user in node.users)


def inplace_temporaries_to_functional(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace each in-place op on a fresh temporary by its out-of-place form (see the module)."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        functional = _functional_form(node.target) if node.op == "call_function" else None
        if functional is None or not _fresh_temporary(node.args[0]):
            continue
        mutated = node.args[0]
        with gm.graph.inserting_before(node):
            value = gm.graph.call_function(functional, node.args, node.kwargs)
        value.meta.update(node.meta)
        node.replace_all_uses_with(value)
        later = [user for user in mutated.users if user is not value and order.get(user, -1) > order[node]]
        for user in later:
            user.replace_input_with(mutated, value)
        gm.graph.erase_node(node)
    return gm
