"""Walking and editing torch-mlir's StableHLO from Python: the helpers every fixup module shares.

Imports nothing of torch or of this package (the lowering worker imports it alone), only
torch-mlir's MLIR bindings.
"""

from __future__ import annotations


def ops_named(module: object, name: str) -> list[object]:
    """Every op called ``name`` in ``module``, in walk order."""
    from torch_mlir import ir

    found: list[object] = []

    def visit(op: object) -> object:
        if op.name == name:  # type: ignore[attr-defined]
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)  # type: ignore[attr-defined]
    return found


#: Ops that only move their operand's elements: a consumer reads through them to the data's source.
VIEWS = ("stablehlo.reshape", "stablehlo.bitcast_convert", "stablehlo.transpose", "stablehlo.broadcast_in_dim")


def defining_op(value: object) -> object | None:
    """The operation that produced ``value`` (None for a block argument)."""
    from torch_mlir import ir

    owner = value.owner  # type: ignore[attr-defined]
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def view_source(value: object) -> object | None:
    """The op that computed ``value``'s elements, seen through ops that only move them (None for
    a function argument)."""
    source = defining_op(value)
    while source is not None and source.name in VIEWS:  # type: ignore[attr-defined]
        source = defining_op(source.operands[0])  # type: ignore[attr-defined]
    return source


def barrier(value: object, point: object) -> object:
    """An ``optimization_barrier`` of ``value`` created at ``point``: IREE fuses nothing across it."""
    from torch_mlir import ir

    return ir.Operation.create("stablehlo.optimization_barrier", results=[value.type],  # type: ignore[attr-defined]
                               operands=[value], ip=point)


def materialize_operand(op: object, position: int) -> None:
    """Make ``op`` read its operand ``position`` through a barrier (a tensor of its own)."""
    from torch_mlir import ir

    op.operands[position] = barrier(op.operands[position], ir.InsertionPoint(op)).result  # type: ignore[attr-defined]
