"""Rewrites of torch-mlir's StableHLO convolutions that IREE 3.13 needs, each one a workaround with its reason.

Run by :func:`.stablehlo_fixups.apply` in the lowering worker; like it, this module imports
nothing of torch or of this package, only torch-mlir's MLIR bindings.
"""

from __future__ import annotations

import re

if __package__:
    from torch_neuronx.compiler import stablehlo_ir as ir_
else:  # the lowering worker imports this module alone, its directory on sys.path
    import stablehlo_ir as ir_


def apply(module: object) -> None:
    """Every convolution fixup, in order, on the StableHLO ``module`` (in place)."""
    _slice_input_the_window_never_reads(module)
    _materialize_converted_grouped_filters(module)


_DIMS = re.compile(r"#stablehlo\.conv<\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]>")


def _spatial_positions(layout: str) -> list[int]:
    """Where a compact layout such as ``b, f, 0, 1`` keeps spatial dimension 0, 1, ... (in that order)."""
    names = [name.strip() for name in layout.split(",")]
    spatial = sorted((int(name), position) for position, name in enumerate(names) if name.isdigit())
    return [position for _, position in spatial]


def _numbers(conv: object, name: str, count: int, default: int) -> list[int]:
    """The integers of attribute ``name`` of ``conv`` (``count`` of ``default`` when it is absent)."""
    attributes = conv.attributes  # type: ignore[attr-defined]
    if name not in attributes:
        return [default] * count
    text = str(attributes[name]).split(":")[0] if name == "padding" else str(attributes[name])
    found = [int(v) for v in re.findall(r"-?\d+", text.replace("i64", ""))]
    return found * count if len(found) == 1 else found


def _slice_input_the_window_never_reads(module: object) -> None:
    """Cut the trailing input rows no window reads from a convolution with an output of one row.

    A convolution whose last window stops short of its (padded) input's end, and whose output
    has one element along that dimension, failed to compile in IREE 3.13 ("'linalg.generic' op
    inferred input/output operand #1 has shape's dimension #0 to be 4, but found 3"): its
    one-row case becomes a contraction that assumes the window covers the input. A
    ``Conv2d(4, 3, 3, stride=2)`` of a 4x4 image, a stride-2 encoder's last layer and the
    backward of a transposed convolution of a 1x1 input with ``output_padding`` were such cases.
    The unread rows go: first from the high padding, then sliced off the input.
    """
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for conv in ir_.ops_named(module, "stablehlo.convolution"):
            _slice_unread_rows(conv, ir)


def _slice_unread_rows(conv: object, ir: object) -> None:
    """The rewrite of :func:`_slice_input_the_window_never_reads` for one convolution."""
    match = _DIMS.fullmatch(str(conv.attributes["dimension_numbers"]))  # type: ignore[attr-defined]
    source, result = conv.operands[0], conv.results[0]  # type: ignore[attr-defined]
    in_type, out_type = ir.RankedTensorType(source.type), ir.RankedTensorType(result.type)  # type: ignore[attr-defined]
    filter_type = ir.RankedTensorType(conv.operands[1].type)  # type: ignore[attr-defined]
    if match is None or not (in_type.has_static_shape and out_type.has_static_shape and filter_type.has_static_shape):
        return
    lhs, rhs, out = (_spatial_positions(layout) for layout in match.groups())
    rank = len(lhs)
    strides, dilations = _numbers(conv, "window_strides", rank, 1), _numbers(conv, "rhs_dilation", rank, 1)
    pads = _numbers(conv, "padding", 2 * rank, 0)
    if any(d != 1 for d in _numbers(conv, "lhs_dilation", rank, 1)) or len(pads) != 2 * rank:
        return
    limits, changed = list(in_type.shape), False
    for d in range(rank):
        rows, window = in_type.shape[lhs[d]], filter_type.shape[rhs[d]]
        outputs = out_type.shape[out[d]]
        needed = (outputs - 1) * strides[d] + (window - 1) * dilations[d] + 1
        excess = pads[2 * d] + rows + pads[2 * d + 1] - needed
        if outputs != 1 or excess <= 0:
            continue
        cut = min(pads[2 * d + 1], excess)
        if excess - cut >= rows:
            return
        pads[2 * d + 1] -= cut
        limits[lhs[d]] = rows - (excess - cut)
        changed = True
    if not changed:
        return
    point = ir.InsertionPoint(conv)
    if limits != list(in_type.shape):
        sliced = ir.Operation.create(
            "stablehlo.slice", results=[ir.RankedTensorType.get(limits, in_type.element_type)], operands=[source],
            attributes={"start_indices": ir.DenseI64ArrayAttr.get([0] * len(limits)),
                        "limit_indices": ir.DenseI64ArrayAttr.get(limits),
                        "strides": ir.DenseI64ArrayAttr.get([1] * len(limits))}, ip=point)
        conv.operands[0] = sliced.result  # type: ignore[attr-defined]
    rows_text = ", ".join(f"[{pads[2 * d]}, {pads[2 * d + 1]}]" for d in range(rank))
    conv.attributes["padding"] = ir.Attribute.parse(f"dense<[{rows_text}]> : tensor<{rank}x2xi64>")  # type: ignore[attr-defined]


def _materialize_converted_grouped_filters(module: object) -> None:
    """Put an ``optimization_barrier`` between a dtype conversion and the grouped convolution whose
    filter it computes.

    IREE 3.13 folds the conversion into the depthwise convolution's reshaped filter with the
    wrong element type ("'tensor.collapse_shape' op expected collapsed type to be
    'tensor<3x3x8xbf16>', but got 'tensor<3x3x8xf32>'"): a depthwise convolution under bfloat16
    autocast (its float32 weight rounded to bfloat16 and computed in float32) failed to compile.
    """
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for conv in ir_.ops_named(module, "stablehlo.convolution"):
            groups = conv.attributes["feature_group_count"]  # type: ignore[attr-defined]
            if ir.IntegerAttr(groups).value <= 1:
                continue
            source = ir_.view_source(conv.operands[1])  # type: ignore[attr-defined]
            if source is not None and source.name == "stablehlo.convert":  # type: ignore[attr-defined]
                ir_.materialize_operand(conv, 1)
