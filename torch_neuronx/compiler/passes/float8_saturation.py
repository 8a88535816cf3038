"""Conversions to ``float8_e4m3fn`` saturate, as torch's do.

``float8_e4m3fn`` has no infinity: torch converts a value beyond its largest finite one (448) to
±448, infinities included (NaN stays NaN), while StableHLO's ``convert`` (IREE's ``truncf``)
makes such a value NaN: a compiled cast of 500.0 gave NaN where eager gives 448. The value is
clamped to [-448, 448] before the conversion (a clamp keeps NaN). ``float8_e5m2`` has
infinities and the ``fnuz`` formats give NaN in torch too: they convert as they are.
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
