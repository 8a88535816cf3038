"""Rewrites of torch-mlir's StableHLO that IREE 3.13 needs, each one a workaround with its reason.

Like :mod:`.torch_to_stablehlo`, which runs them in the lowering worker, this module
imports nothing of torch or of this package, only torch-mlir's MLIR bindings.
:func:`apply` runs every fixup, in order, on a lowered module (scatters' in
:mod:`.stablehlo_scatter_fixups`, convolutions' in :mod:`.stablehlo_conv_fixups`).
"""

from __future__ import annotations

import math
import re

if __package__:
    from torch_neuronx.compiler import stablehlo_conv_fixups, stablehlo_scatter_fixups
    from torch_neuronx.compiler import stablehlo_ir as ir_
else:  # the lowering worker imports this module alone, its directory on sys.path
    import stablehlo_conv_fixups
    import stablehlo_ir as ir_
    import stablehlo_scatter_fixups


def apply(module: object) -> None:
    """Every fixup, in order, on the StableHLO ``module`` (in place)."""
    stablehlo_scatter_fixups.apply(module)
    _round_narrowed_constants(module)
    _materialize_sliced_operands(module)
    _signed_unsigned_converts(module)
    _materialize_broadcast_products_of_full_sums(module)
    stablehlo_conv_fixups.apply(module)
    _materialize_reductions_read_along_two_dims(module)


_NARROW_FLOATS = ("f32", "f16", "bf16")


def _round_narrowed_constants(module: object) -> None:
    """Fold ``convert`` of a float64 constant to a narrower float into a correctly rounded constant.

    Python floats reach StableHLO as float64 constants converted to the tensor's type.
    IREE 3.13's float64 demotion truncates those constants instead of rounding them to
    nearest (0.8 became 0.79999995 rather than 0.8000000119), so ``(i + 0.5) * 0.8``
    computed 1.9999999 where torch computes 2.0, and ``nearest-exact`` interpolation
    picked the wrong rows. The conversion is done here, as torch does it, for splat
    constants and float32/float16 arrays.
    """
    import numpy as np
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for convert in ir_.ops_named(module, "stablehlo.convert"):
            source = convert.operands[0]  # type: ignore[attr-defined]
            owner = ir_.defining_op(source)
            if getattr(owner, "name", None) not in ("arith.constant", "stablehlo.constant"):
                continue
            source_type = ir.RankedTensorType(source.type)
            target_type = ir.RankedTensorType(convert.results[0].type)  # type: ignore[attr-defined]
            target = str(target_type.element_type)
            if str(source_type.element_type) != "f64" or target not in _NARROW_FLOATS:
                continue
            value = ir.DenseFPElementsAttr(owner.attributes["value"])  # type: ignore[attr-defined]
            if value.is_splat:
                element = ir.FloatAttr.get(target_type.element_type, ir.FloatAttr(value.get_splat_value()).value)
                attr = ir.DenseElementsAttr.get_splat(target_type, element)
            elif target in ("f32", "f16"):
                array = np.array(value).astype(np.float32 if target == "f32" else np.float16)
                array = array.reshape(target_type.shape)
                attr = ir.DenseElementsAttr.get(array, type=target_type)
            else:
                continue
            constant = ir.Operation.create("stablehlo.constant", results=[target_type],
                                           attributes={"value": attr}, ip=ir.InsertionPoint(convert))
            convert.results[0].replace_all_uses_with(constant.result)  # type: ignore[attr-defined]
            convert.erase()  # type: ignore[attr-defined]


def _slice_read(value: object) -> object | None:
    """The ``stablehlo.slice`` that ``value`` is, seen through ops that only move elements (a strided view), or None."""
    source = ir_.view_source(value)
    return source if source is not None and source.name == "stablehlo.slice" else None  # type: ignore[attr-defined]


def _reads_a_slice(value: object) -> bool:
    """Whether ``value`` is a slice seen through ops that only move elements (a strided view)."""
    return _slice_read(value) is not None


def _i64_array(op: object, name: str) -> list[int]:
    text = str(op.attributes[name])  # type: ignore[attr-defined]  # array<i64: 1, 2>
    return [int(v) for v in re.findall(r"-?\d+", text.split(":", 1)[-1])]


def _strided_read(value: object) -> bool:
    """Whether ``value`` is a slice that is not one contiguous run of its source's elements (a step,
    or a part of a dimension before a dimension it cuts: ``t[:, ::2]``, ``t[..., 4:5]`` of a wider
    last dimension), seen through ops that only move elements."""
    from torch_mlir import ir

    source = _slice_read(value)
    if source is None:
        return False
    shape = ir.RankedTensorType(source.operands[0].type).shape  # type: ignore[attr-defined]
    result = ir.RankedTensorType(source.result.type).shape  # type: ignore[attr-defined]
    steps = _i64_array(source, "strides")
    cut = [d for d in range(len(shape)) if result[d] != shape[d]]
    if not cut:
        return False
    last = cut[-1]  # dimensions after it are whole: the run is contiguous if this one is read in
    # steps of 1 and every dimension before it holds one element
    return (steps[last] != 1 and result[last] > 1) or any(result[d] != 1 for d in range(last))


_DOT_DIMS = re.compile(r"(lhs|rhs)_(batching|contracting)_dimensions = \[([\d, ]*)\]")


def _vector_operands(dot: object) -> list[int]:
    """The operand positions of a ``dot_general`` that are vectors: one element outside batch and contracted dims."""
    from torch_mlir import ir

    used: dict[str, set[int]] = {"lhs": set(), "rhs": set()}
    for side, _, dims in _DOT_DIMS.findall(str(dot.attributes["dot_dimension_numbers"])):  # type: ignore[attr-defined]
        used[side].update(int(d) for d in dims.split(",") if d.strip())
    vectors = []
    for position, side in enumerate(("lhs", "rhs")):
        shape = ir.RankedTensorType(dot.operands[position].type).shape  # type: ignore[attr-defined]
        if math.prod(size for d, size in enumerate(shape) if d not in used[side]) == 1:
            vectors.append(position)
    return vectors


def _materialize_sliced_operands(module: object) -> None:
    """Put an ``optimization_barrier`` between a slice and the gathers and vector products that read it.

    IREE 3.13 fuses the slice into its consumer's dispatch as a strided load, and then
    - fails to vectorize a gather from that strided buffer ("LLVM Translation failed for
      operation: builtin.unrealized_conversion_cast", iree-org/iree#15364):
      ``torch.gather(x[..., 0], ...)`` of an input; the same for a ``reverse`` of a slice
      that is not one contiguous run (``t[:, ::2].flip(0)``, ``rot90``, and circular padding's
      copies of ``t[..., 4:5]`` into a scatter);
    - computes a matrix-vector product whose vector is that strided view wrongly (its
      data-tiled ``mmt4d`` path): ``x[:, 0] @ m`` returned garbage, as did the backward of
      ``householder_product``. Products of two matrices read strided slices correctly.
    The barrier makes the slice a contiguous tensor first.
    """
    from torch_mlir import ir

    reads: list[tuple[object, int]] = [(op, 0) for op in ir_.ops_named(module, "stablehlo.gather")]
    reads += [(op, 0) for op in ir_.ops_named(module, "stablehlo.reverse") if _strided_read(op.operands[0])]
    for dot in ir_.ops_named(module, "stablehlo.dot_general"):
        reads += [(dot, position) for position in _vector_operands(dot)]
    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for op, position in reads:
            if _reads_a_slice(op.operands[position]):  # type: ignore[attr-defined]
                ir_.materialize_operand(op, position)


def _broadcast_vector(value: object) -> bool:
    """Whether ``value`` broadcasts a tensor that is not a single element to more elements: of a
    lower rank (``w`` of ``[5]`` to ``[6, 5]``) or of the same rank with unit dimensions
    (``[1, 5]`` to ``[6, 5]``, as torch-mlir spells ``x * w[None]``: ``F.cross_entropy`` with class
    weights and probabilities as targets failed to compile)."""
    from torch_mlir import ir

    source = ir_.defining_op(value)
    if source is None or source.name != "stablehlo.broadcast_in_dim":  # type: ignore[attr-defined]
        return False
    shape = ir.RankedTensorType(source.operands[0].type).shape  # type: ignore[attr-defined]
    result = ir.RankedTensorType(value.type).shape  # type: ignore[attr-defined]
    return 1 < math.prod(shape) < math.prod(result)


def _materialize_broadcast_products_of_full_sums(module: object) -> None:
    """Put an ``optimization_barrier`` between a sum to a scalar and a product with a broadcast it reads.

    IREE 3.13 takes ``reduce(add, x * broadcast(w))`` over every dim for a contraction and
    fails to compile it ("'vector.contract' op invalid accumulator/result vector shape"):
    ``(x * w).sum()`` with ``w`` broadcast over rows, ``F.binary_cross_entropy`` with a
    ``weight`` and mean reduction. With the product materialized, the sum is a plain reduction.
    """
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for reduce in ir_.ops_named(module, "stablehlo.reduce"):
            operands = reduce.operands  # type: ignore[attr-defined]
            if len(operands) != 2 or ir.RankedTensorType(reduce.results[0].type).rank != 0:  # type: ignore[attr-defined]
                continue
            product = ir_.defining_op(operands[0])
            if product is None or product.name != "stablehlo.multiply":  # type: ignore[attr-defined]
                continue
            if any(_broadcast_vector(v) for v in product.operands):  # type: ignore[attr-defined]
                ir_.materialize_operand(reduce, 0)


#: Ops whose result of the operand's shape holds its elements elsewhere (or other elements).
_MOVING = frozenset(("stablehlo.transpose", "stablehlo.reverse", "stablehlo.dot_general", "stablehlo.reduce",
                     "stablehlo.gather", "stablehlo.scatter", "stablehlo.sort", "stablehlo.slice", "stablehlo.pad",
                     "stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice", "stablehlo.concatenate",
                     "stablehlo.reduce_window", "stablehlo.convolution", "stablehlo.custom_call",
                     "stablehlo.optimization_barrier", "stablehlo.reshape", "stablehlo.broadcast_in_dim"))


def _same_shape(a: object, b: object) -> bool:
    """Whether values ``a`` and ``b`` are ranked tensors of one shape."""
    from torch_mlir import ir

    try:
        return ir.RankedTensorType(a.type).shape == ir.RankedTensorType(b.type).shape  # type: ignore[attr-defined]
    except ValueError:  # (not a ranked tensor: a token, a tuple)
        return False


def _placements(value: object, dims: tuple[int, ...], found: set[tuple]) -> None:
    """Add to ``found`` where the elements of a reduction's result land in the tensors that broadcast
    it: per ``broadcast_in_dim`` (seen through reshapes that add or drop unit dims), its rank and the
    dimension each of the result's dims (``dims``: their positions in ``value``) goes to. (Other
    readers iterate over the result's own shape, which any tiling of it serves.)"""
    from torch_mlir import ir

    for use in value.uses:  # type: ignore[attr-defined]
        user = use.owner
        name = user.name  # type: ignore[attr-defined]
        if name == "stablehlo.broadcast_in_dim":
            mapping = list(ir.DenseI64ArrayAttr(user.attributes["broadcast_dimensions"]))  # type: ignore[attr-defined]
            target = ir.RankedTensorType(user.results[0].type)  # type: ignore[attr-defined]
            found.add((target.rank, tuple(mapping[d] for d in dims)))
        elif name not in _MOVING and len(user.results) == 1 and _same_shape(user.results[0], value):  # type: ignore[attr-defined]
            _placements(user.results[0], dims, found)  # elementwise (a mean's division): the same places  # type: ignore[attr-defined]
        elif name == "stablehlo.reshape":
            source = ir.RankedTensorType(value.type).shape  # type: ignore[attr-defined]
            shape = ir.RankedTensorType(user.results[0].type).shape  # type: ignore[attr-defined]
            kept = [i for i in dims if source[i] != 1]
            places = [i for i, n in enumerate(shape) if n != 1]
            if [source[i] for i in kept] == [shape[i] for i in places]:
                _placements(user.results[0], tuple(places), found)  # type: ignore[attr-defined]


def _materialize_reductions_read_along_two_dims(module: object) -> None:
    """Put an ``optimization_barrier`` after a reduction whose result is read along two different
    dimensions of its readers.

    IREE 3.13 fuses a reduction into the elementwise op that reads it and computes the reduced
    values tile by tile; read along a second dimension too, the values of other tiles are not
    there: ``d = A.sum(1); d[:, None] * A * d[None, :]`` (GCN's symmetric normalization) kept the
    diagonal and gave zeros elsewhere, at every optimization level. Materialized, the reduction is
    a dispatch of its own.
    """
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for reduce in ir_.ops_named(module, "stablehlo.reduce"):
            for result in reduce.results:  # type: ignore[attr-defined]
                rank = ir.RankedTensorType(result.type).rank
                if rank == 0:
                    continue
                found: set[tuple] = set()
                _placements(result, tuple(range(rank)), found)
                if len({placed_rank for placed_rank, _ in found}) < len(found):  # two placements, one rank
                    barrier = ir_.barrier(result, ir.InsertionPoint.after(reduce))
                    result.replace_all_uses_except(barrier.result, barrier)  # type: ignore[attr-defined]


_UNSIGNED = ("ui8", "ui16", "ui32", "ui64")


def _signed_unsigned_converts(module: object) -> None:
    """Keep conversions from booleans and unsigned integers out of the ops that consume them.

    IREE 3.13 sign-extends the narrow integer when it fuses the conversion into a
    matmul's operand: ``torch.eye(5) @ v`` (eye is a comparison converted to float)
    returned ``-v``, ``mask.float() @ x`` likewise, and a uint8 image's 200 became -56
    in ``x.float() @ w``, ``x.double() @ w`` and ``x.long() @ m``. Booleans become a
    ``select`` of 1 and 0 (static shapes); an unsigned conversion is followed by an
    optimization barrier, so it runs as its own (correct) elementwise dispatch: chains
    of conversions were folded back into the matmul otherwise.
    """
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for convert in ir_.ops_named(module, "stablehlo.convert"):
            source = convert.operands[0]  # type: ignore[attr-defined]
            kind = str(ir.RankedTensorType(source.type).element_type)
            target_type = ir.RankedTensorType(convert.results[0].type)  # type: ignore[attr-defined]
            target = str(target_type.element_type)
            point = ir.InsertionPoint(convert)
            if kind == "i1" and target != "i1" and target_type.has_static_shape:
                replacement = _select_one_zero(source, target_type, point)
            elif kind in _UNSIGNED and target not in _UNSIGNED:
                converted = ir.Operation.create("stablehlo.convert", results=[target_type], operands=[source],
                                                ip=point)
                replacement = ir_.barrier(converted.result, point)
            else:
                continue
            convert.results[0].replace_all_uses_with(replacement.result)  # type: ignore[attr-defined]
            convert.erase()  # type: ignore[attr-defined]


def _select_one_zero(condition: object, target_type: object, point: object) -> object:
    """``select(condition, 1, 0)`` in ``target_type`` (a statically shaped tensor type)."""
    from torch_mlir import ir

    element = target_type.element_type  # type: ignore[attr-defined]
    if str(element).startswith(("i", "si", "ui")):
        one, zero = (ir.IntegerAttr.get(element, v) for v in (1, 0))
    else:
        one, zero = (ir.FloatAttr.get(element, v) for v in (1.0, 0.0))
    ones, zeros = (ir.Operation.create("stablehlo.constant", results=[target_type],
                                       attributes={"value": ir.DenseElementsAttr.get_splat(target_type, v)},
                                       ip=point) for v in (one, zero))
    return ir.Operation.create("stablehlo.select", results=[target_type],
                               operands=[condition, ones.result, zeros.result], ip=point)



# -- the worker protocol -------------------------------------------------------------
