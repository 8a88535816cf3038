"""Conversions to ``float8_e4m3fn`` saturate, as torch's do.

``float8_e4m3fn`` has no infinity: torch converts a value beyond its largest finite one (448) to
±448, infinities included (NaN stays NaN), while StableHLO's ``convert`` (IREE's ``truncf``)
makes such a value NaN: a compiled cast of 500.0 gave NaN where eager gives 448. The value is
clamped to [-448, 448] before the conversion (a clamp keeps NaN). ``float8_e5m2`` has
infinities and the ``fnuz`` formats give NaN in torch too: they convert as they are.

Conversions from ``float8_e4m3fn`` keep its negative NaN: IREE's ``extf`` decoded the byte 0xFF as
-480 (a value the format cannot hold; 0x7F decodes to NaN), so a checkpoint's raw fp8 bytes viewed
as ``float8_e4m3fn`` and widened gave -480 where eager gives NaN. A result of magnitude 480 is NaN.
"""

from __future__ import annotations

import torch

aten, prims = torch.ops.aten, torch.ops.prims

#: Formats whose conversion saturates in torch: the largest finite value.
_SATURATING = {torch.float8_e4m3fn: float(torch.finfo(torch.float8_e4m3fn).max)}


def _target_dtype(node: torch.fx.Node) -> torch.dtype | None:
    if node.target is aten._to_copy.default:
        return node.kwargs.get("dtype")
    if node.target is prims.convert_element_type.default and len(node.args) > 1:
        return node.args[1]
    return None


def float8_conversions_saturated(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Clamp the value of every conversion to a saturating float8 format (see the module)."""
    changed = False
    for node in list(gm.graph.nodes):
        changed |= _negative_nan_kept(gm, node)
        limit = _SATURATING.get(_target_dtype(node)) if node.op == "call_function" else None
        source = node.args[0] if limit is not None and node.args else None
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point \
                or torch.finfo(value.dtype).max <= limit:
            continue
        with gm.graph.inserting_before(node):
            clamped = gm.graph.call_function(aten.clamp.default, (source, -limit, limit))
        clamped.meta = dict(source.meta)
        node.replace_input_with(source, clamped)
        changed = True
    if changed:
        gm.recompile()
    return gm


#: What IREE decodes float8_e4m3fn's NaN bytes as when the sign is set.
_E4M3FN_NAN_DECODED = 480.0


def _negative_nan_kept(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """After a conversion from ``float8_e4m3fn`` to a wider float: a magnitude of 480 is NaN."""
    if node.op != "call_function" or _target_dtype(node) is None or not node.args:
        return False
    source, result = node.args[0], node.meta.get("val")
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float8_e4m3fn \
            or not isinstance(result, torch.Tensor) or not result.dtype.is_floating_point \
            or result.dtype.itemsize <= 1:
        return False
    users = list(node.users)
    with gm.graph.inserting_before(node.next):  # (in this order, after the conversion)
        size = gm.graph.call_function(aten.abs.default, (node,))
        bad = gm.graph.call_function(aten.eq.Scalar, (size, _E4M3FN_NAN_DECODED))
        kept = gm.graph.call_function(aten.where.ScalarSelf, (bad, float("nan"), node))
    size.meta["val"], bad.meta["val"], kept.meta["val"] = result, result.abs() == 0, result
    for user in users:
        user.replace_input_with(node, kept)
    return True
