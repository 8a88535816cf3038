"""Rewrites of torch-mlir's StableHLO scatters that IREE 3.13 needs, each one a workaround with its reason.

IREE computes a scatter in place in its target's buffer: these fixups keep what the scatter
reads (its indices, its updates, operands another op also reads) apart from what it writes.
Like :mod:`.stablehlo_fixups`, which runs them first, this module imports nothing of torch or
of this package, only torch-mlir's MLIR bindings.
"""

from __future__ import annotations

import math
from collections.abc import Callable

if __package__:
    from torch_neuronx.compiler import stablehlo_ir as ir_
else:  # the lowering worker imports this module alone, its directory on sys.path
    import stablehlo_ir as ir_


def apply(module: object) -> None:
    """Every scatter fixup, in order, on the StableHLO ``module`` (in place)."""
    _narrow_scatter_indices(module)
    _materialize_scatter_operands(module)
    _copy_shared_in_place_operands(module)
    _materialize_updates_read_from_the_target(module)


_INT32_LIMIT = 2**31


def _narrow_scatter_indices(module: object) -> None:
    """Give every ``stablehlo.scatter`` with int64 indices an explicit int32 copy of them.

    IREE 3.13 narrows scatter indices to int32 itself, and fails ("failed to legalize
    unresolved source materialization") when one index tensor feeds two scatters, as when
    a graph sums values and counts into the same targets. Converting first avoids it. Only
    where every dimension of the scattered-into operand is below 2**31, so every valid
    index fits; out-of-range indices are already invalid in torch.
    """
    from torch_mlir import ir

    scatters = ir_.ops_named(module, "stablehlo.scatter")
    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        i32 = ir.IntegerType.get_signless(32)
        for op in scatters:
            operands = op.operands  # type: ignore[attr-defined]
            count = len(operands) // 2  # (inputs..., indices, updates...)
            inputs, indices = operands[:count], operands[count]
            index_type = ir.RankedTensorType(indices.type)
            if str(index_type.element_type) != "i64":
                continue
            if not index_type.has_static_shape or any(
                    d >= _INT32_LIMIT or d < 0 for v in inputs for d in ir.RankedTensorType(v.type).shape):
                continue
            narrowed = ir.Operation.create(
                "stablehlo.convert", results=[ir.RankedTensorType.get(index_type.shape, i32)],
                operands=[indices], ip=ir.InsertionPoint(op))  # type: ignore[attr-defined]
            op.operands[count] = narrowed.result  # type: ignore[attr-defined]


#: Scatters whose indices and updates together hold fewer bytes than this keep their producers
#: fused: whole, they still fit llvm-cpu's 32 KiB stack with room for the dispatch's other buffers.
_SCATTER_STACK_BUDGET = 8192


def _tensor_bytes(value: object) -> int:
    """The bytes a statically shaped tensor ``value`` holds (a dynamic one counts as unbounded)."""
    from torch_mlir import ir

    kind = ir.RankedTensorType(value.type)  # type: ignore[attr-defined]
    if not kind.has_static_shape:
        return 1 << 62
    return math.prod(kind.shape) * max(1, (kind.element_type.width if hasattr(kind.element_type, "width")
                                            else ir.FloatType(kind.element_type).width) // 8)


def _materialize_scatter_operands(module: object) -> None:
    """Put an ``optimization_barrier`` between a large colliding ``stablehlo.scatter`` and its
    indices and updates.

    IREE 3.13 runs a scatter whose updates may collide (``unique_indices = false``: every
    scatter-add, ``index_put`` with ``accumulate``) as one serial loop, untiled, and fuses the
    elementwise producers of its indices and updates into that dispatch (all of them at O3's
    aggressive fusion; bit-extending converts, such as bfloat16 updates summed in float32, and
    index arithmetic even without it), where codegen materializes each whole in a stack buffer:
    over llvm-cpu's 32 KiB stack limit ("'func.func' op exceeded stack allocation limit")
    for a 2x8x32x32 upsampling gradient, a 4x16x8x8 pooling gradient or a 1024x64 embedding
    gradient. Behind the barriers the scatter reads its operands from memory. (The scattered-into
    operand stays fusable: its producer computes into the scatter's own result.)

    Only scatters whose operands could reach the stack limit get barriers (see
    :data:`_SCATTER_STACK_BUDGET`): each barrier's producer becomes a result of a dispatch of
    its own, and IREE fuses the producers of many small scatters (a 3-d grid sample's backward
    has eight per sampling) into one dispatch with more buffers than its runtime's 32 bindings
    per dispatch ("binding count 49 > 32" when the module loads).
    """
    from torch_mlir import ir

    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for op in ir_.ops_named(module, "stablehlo.scatter"):
            unique = op.attributes["unique_indices"] if "unique_indices" in op.attributes else None  # type: ignore[attr-defined]
            if unique is not None and ir.BoolAttr(unique).value:
                continue  # a parallel scatter: tiled, nothing on the stack
            count = len(op.operands) // 2  # type: ignore[attr-defined]  # (inputs..., indices, updates...)
            operands = range(count, len(op.operands))  # type: ignore[attr-defined]
            if sum(_tensor_bytes(op.operands[p]) for p in operands) < _SCATTER_STACK_BUDGET:  # type: ignore[attr-defined]
                continue
            for position in operands:
                if ir_.defining_op(op.operands[position]) is not None:  # type: ignore[attr-defined]
                    ir_.materialize_operand(op, position)


#: StableHLO ops that IREE runs in place, and the operand positions whose buffer each one writes
#: its result into: every input of a scatter (``(inputs..., indices, updates...)``), the operand of
#: a ``dynamic_update_slice`` (a ``flow.tensor.update``), every operand of a sort.
_IN_PLACE: dict[str, Callable[[int], range]] = {
    "stablehlo.scatter": lambda count: range(count // 2),
    "stablehlo.dynamic_update_slice": lambda count: range(1),
    "stablehlo.sort": lambda count: range(count),
}


def _is_constant(value: object) -> bool:
    """Whether ``value`` is a ``stablehlo.constant``, or a splat one seen through ops that only move elements."""
    from torch_mlir import ir

    source = ir_.defining_op(value)
    if source is not None and source.name == "stablehlo.constant":  # type: ignore[attr-defined]
        return True
    source = ir_.view_source(value)
    if source is None or source.name != "stablehlo.constant":  # type: ignore[attr-defined]
        return False
    elements = source.attributes["value"]  # type: ignore[attr-defined]
    return isinstance(elements, ir.DenseElementsAttr) and elements.is_splat


def _views_an_argument(value: object) -> bool:
    """Whether ``value`` is a function argument seen through ops that only move elements."""
    return ir_.view_source(value) is None


def _read_elsewhere(value: object) -> bool:
    """Whether the op-computed, non-constant ``value`` has more than one use (an in-place op's being one)."""
    uses = len(list(value.uses))  # type: ignore[attr-defined]
    return uses > 1 and not _views_an_argument(value) and not _is_constant(value)


def _copy_shared_in_place_operands(module: object) -> None:
    """Route a tensor that an in-place op writes into, and something else also reads, through a barrier.

    IREE 3.13 runs scatters, sorts and ``dynamic_update_slice`` in place: the result is written
    into the operand's buffer, and its stream copy-on-write pass gives each such use of a tensor
    that has other users a clone. Where the tensor comes from a dispatch that reads no buffer
    (built from constants that IREE did not hoist into a global: it hoists no ``i1`` tensor, nor
    one whose hoisting would grow the module by more than 1 MiB, such as ``arange(300000) * 2``),
    the canonicalizer replaces each clone by a recomputation (``PropagateCloneableOps``:
    ``AsyncDispatchOp::preferCloneToConsumers`` holds for a dispatch that reads no resource), and
    the next CSE merges the recomputations back into one, as ``stream.async.dispatch`` is a pure op
    (iree-org/iree#23665, open). The clones are gone, and all the in-place ops write into one
    buffer: two ``index_put`` into ``arange(6) == 0`` gave zeros for one and both updates in the
    other; the base, when returned too, came back with the updates in it. (Constants are
    unaffected: a splat one, also seen through a broadcast, becomes a ``stream.async.splat``, which
    is not pure, and IREE always clones any other; so are function arguments, which are imports.)
    A function argument seen through a reshape or another view gets no barrier either (a transpose
    or broadcast of one is a dispatch that reads a buffer, which the hazard above spares); after a
    reshape the barrier is of the imported buffer itself, and IREE then elided the in-place op's clone of it:
    ``x.scatter(0, index, -1.0, reduce="add")`` of a flattened input wrote into ``x``'s buffer
    before a multiplying scatter of ``x`` in the same graph read it, and its result came back
    with the additions in it.

    Behind one ``optimization_barrier`` that every user reads the tensor through, the clones are
    of the barrier's result, which no dispatch recomputes: they stay, and each in-place op gets a
    copy of its own. A tensor with a single user keeps its producer fused into the op.
    """
    from torch_mlir import ir

    shared: list[object] = []
    for name, positions in _IN_PLACE.items():
        for op in ir_.ops_named(module, name):
            for position in positions(len(op.operands)):  # type: ignore[attr-defined]
                value = op.operands[position]  # type: ignore[attr-defined]
                if value not in shared and _read_elsewhere(value):
                    shared.append(value)
    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for value in shared:
            barrier = ir_.barrier(value, ir.InsertionPoint.after(ir_.defining_op(value)))
            value.replace_all_uses_except(barrier.result, barrier)  # type: ignore[attr-defined]


#: The operands an in-place op reads while it writes its target's buffer: a scatter's updates,
#: a ``dynamic_update_slice``'s update.
_READ_WHILE_WRITING: dict[str, Callable[[int], range]] = {
    "stablehlo.scatter": lambda count: range(count // 2 + 1, count),
    "stablehlo.dynamic_update_slice": lambda count: range(1, 2),
}
_DEPENDENCE_LIMIT = 4096  # values looked at per operand (a larger search leaves the operand as it is)


def _same_data(value: object) -> list[object]:
    """``value`` and what it shows, seen through ops that only move elements and through barriers."""
    found = [value]
    source = ir_.defining_op(value)
    while source is not None and (source.name in ir_.VIEWS  # type: ignore[attr-defined]
                                  or source.name == "stablehlo.optimization_barrier"):  # type: ignore[attr-defined]
        found.append(source.operands[0])  # type: ignore[attr-defined]
        source = ir_.defining_op(source.operands[0])  # type: ignore[attr-defined]
    return found


def _computed_from(value: object, sources: list[object]) -> bool:
    """Whether ``value`` is computed (through any ops) from one of ``sources``."""
    stack, seen = [value], 0
    visited: list[object] = []
    while stack:
        current = stack.pop()
        if current in sources:
            return True
        if current in visited:
            continue
        visited.append(current)
        seen += 1
        if seen > _DEPENDENCE_LIMIT:
            return False
        op = ir_.defining_op(current)
        if op is not None:
            stack.extend(op.operands)  # type: ignore[attr-defined]
    return False


def _materialize_updates_read_from_the_target(module: object) -> None:
    """Compute a scatter's updates before the scatter when they are read from the tensor it writes.

    ``y[1:] = y[:-1]`` is ``scatter(y, indices, slice(y))``. IREE 3.13 runs the scatter in place
    in ``y``'s buffer and fuses the slice into the scatter's dispatch, which then reads elements it
    has already overwritten: the shift gave ``[1, 1, 1, 1, 1]`` for ``[1, 1, 2, 3, 4]``, and so did
    ``slice_scatter``, ``index_copy``, ``index_put``, ``scatter_add`` and ``index_add`` of a slice of
    their own input. Behind a barrier, the updates are a tensor of their own, computed first.
    Updates that IREE folds into the target's own elements (``y.scatter(1, index, y)``, HF's top-p
    filter ``remove.scatter(1, sorted_indices, remove)``: every token masked; an identity slice, a
    bitcast pair, a double negation) named its buffer, and a barrier copies nothing: the updates
    are copied first.
    """
    from torch_mlir import ir

    reads: list[tuple[object, int, bool]] = []
    for name, positions in _READ_WHILE_WRITING.items():
        for op in ir_.ops_named(module, name):
            count = len(op.operands)  # type: ignore[attr-defined]
            written = _IN_PLACE[name](count)
            sources = [v for p in written for v in _same_data(op.operands[p])]  # type: ignore[attr-defined]
            for position in positions(count):
                update = op.operands[position]  # type: ignore[attr-defined]
                if ir_.defining_op(update) is not None and _computed_from(update, sources):
                    reads.append((op, position))
    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        for op, position in reads:
            _copy_operand(op, position)
            ir_.materialize_operand(op, position)


def _copy_operand(op: object, position: int) -> None:
    """Make ``op`` read its operand ``position`` as a copy of its own: reversed twice along a
    dimension of more than one element, which IREE 3.13 computes as a dispatch of its own (it folds
    a double negation, a bitcast pair and an identity slice into nothing)."""
    from torch_mlir import ir

    value = op.operands[position]  # type: ignore[attr-defined]
    shape = ir.RankedTensorType(value.type).shape
    dims = [d for d, size in enumerate(shape) if size != 1][:1]
    if not dims:  # one element: read before it is written
        return
    point = ir.InsertionPoint(op)
    original = value.type
    element = ir.RankedTensorType(original).element_type
    signless = _signless(element)
    if signless is not None:  # IREE 3.13 cannot reverse an unsigned tensor ("failed to legalize")
        value = _bitcast(value, ir.RankedTensorType.get(shape, signless), point)
    for _ in range(2):
        value = ir.Operation.create("stablehlo.reverse", results=[value.type], operands=[value],
                                    attributes={"dimensions": ir.DenseI64ArrayAttr.get(dims)}, ip=point).result
    if signless is not None:
        value = _bitcast(value, original, point)
    op.operands[position] = value  # type: ignore[attr-defined]


def _signless(element: object) -> object | None:
    """The signless integer type of ``element``'s width when it is an unsigned integer, else None."""
    from torch_mlir import ir

    if isinstance(element, ir.IntegerType) and element.is_unsigned:
        return ir.IntegerType.get_signless(element.width)
    return None


def _bitcast(value: object, to: object, point: object) -> object:
    """``stablehlo.bitcast_convert`` of ``value`` to the type ``to``, inserted at ``point``."""
    from torch_mlir import ir

    return ir.Operation.create("stablehlo.bitcast_convert", results=[to], operands=[value], ip=point).result
