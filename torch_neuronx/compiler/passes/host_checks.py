"""Error checks of ``info`` tensors → extra graph outputs the host checks after each call.

Where eager raises on bad input to a linear-algebra op (a singular matrix to
``torch.linalg.inv``, a matrix that is not positive-definite to
``torch.linalg.cholesky``), the decompositions compute LAPACK's ``info`` in the
graph and call ``neuron::linalg_check_errors`` on it
(``compiler/decompositions/linalg.py``). A compiled graph cannot raise, so this
pass removes each such call, appends its ``info`` as a trailing output and
records the check (``gm.meta["host_checks"]``: ``{"api_name", "is_matrix"}``
dicts, JSON-serializable for plans). :func:`run_checks` applies them to those
outputs on the host, with torch's own ``_linalg_check_errors``: the same
exception and message as eager.

A tensor assertion (``assert (x > 0).all(), "msg"`` in a compiled function, which Dynamo makes
``torch._assert_async(cond, "msg")``) was dropped by the lowering, so the graph computed on bad
input where eager raises: each becomes a trailing failure count, raised on the host as eager's
``RuntimeError``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx.compiler.decompositions.linalg import CHECK
from torch_neuronx.compiler.passes.rewrite import append_checks, call_before

_ASSERTS = (torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default)
_SCALAR_ASSERT = torch.ops.aten._assert_scalar.default
#: Python operators on values read with ``.item()``, as the tensor ops of their 0-d tensors.
_AS_TENSOR_OPS = {operator.gt: torch.ops.aten.gt, operator.lt: torch.ops.aten.lt, operator.ge: torch.ops.aten.ge,
                  operator.le: torch.ops.aten.le, operator.eq: torch.ops.aten.eq, operator.ne: torch.ops.aten.ne,
                  operator.and_: torch.ops.aten.logical_and, operator.or_: torch.ops.aten.logical_or,
                  operator.add: torch.ops.aten.add, operator.sub: torch.ops.aten.sub, operator.mul: torch.ops.aten.mul,
                  operator.truediv: torch.ops.aten.div}
_REVERSED = {operator.gt: operator.lt, operator.lt: operator.gt, operator.ge: operator.le, operator.le: operator.ge,
             operator.eq: operator.eq, operator.ne: operator.ne, operator.add: operator.add, operator.mul: operator.mul,
             operator.and_: operator.and_, operator.or_: operator.or_}
#: torch's message for an assertion without one (``_assert_async(t)``).
_NO_MESSAGE = "Expected Tensor with single nonzero value, but got zero"


def checks_to_outputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``neuron::linalg_check_errors`` call and tensor assertion by a trailing output
    and a recorded check."""
    _scalar_asserts_as_tensor_asserts(gm)
    checks = [n for n in gm.graph.nodes if n.op == "call_function" and (n.target is CHECK or n.target in _ASSERTS)]
    if not checks:
        return gm
    recorded = []
    for node in checks:
        if node.target in _ASSERTS:
            recorded.append((_failures(gm, node), {"kind": "assert", "message": (node.args[1:] or [_NO_MESSAGE])[0]}))
        else:
            info, api_name, is_matrix = node.args
            recorded.append((info, {"api_name": api_name, "is_matrix": bool(is_matrix)}))
        gm.graph.erase_node(node)
    append_checks(gm, recorded)
    return gm


def _scalar_asserts_as_tensor_asserts(gm: torch.fx.GraphModule) -> None:
    """``torch._check(s > 0)`` on ``s = t.item()`` (``_assert_scalar`` of Python operators on the
    value, which torch-mlir cannot lower: "failed to legalize 'torch.runtime.assert'") becomes
    ``_assert_async`` of the same comparison of ``t``. One whose condition is no such expression
    (sizes' asserts, which Dynamo's guards check before the call) is dropped."""
    asserts = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _SCALAR_ASSERT]
    for node in asserts:
        condition = _as_tensor(gm, node, node.args[0])
        if isinstance(condition, torch.fx.Node):
            with gm.graph.inserting_before(node):
                gm.graph.call_function(torch.ops.aten._assert_async.msg, (condition, node.args[1]))
        gm.graph.erase_node(node)
    if asserts:
        gm.graph.eliminate_dead_code()  # the Python comparisons no assertion reads any more


def _as_tensor(gm: torch.fx.GraphModule, before: torch.fx.Node, value: Any) -> Any:
    """``value`` (a number, a value read with ``.item()``, Python operators on those) as a 0-d tensor
    node (new ones inserted before ``before``) or a number; None when it is something else."""
    if isinstance(value, bool | int | float):
        return value
    if not isinstance(value, torch.fx.Node) or value.op != "call_function":
        return None
    if value.target is torch.ops.aten._local_scalar_dense.default:
        return value.args[0]
    if value.target is operator.not_ and len(value.args) == 1:
        inner = _as_tensor(gm, before, value.args[0])
        return call_before(gm, before, torch.ops.aten.logical_not.default, inner) \
            if isinstance(inner, torch.fx.Node) else None
    op = value.target
    if op not in _AS_TENSOR_OPS or len(value.args) != 2:
        return None
    a, b = (_as_tensor(gm, before, v) for v in value.args)
    if a is None or b is None or not (isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node)):
        return None
    if not isinstance(a, torch.fx.Node):  # (a number first: the reversed op, where there is one)
        if op not in _REVERSED:
            return None
        a, b, op = b, a, _REVERSED[op]
    packet = _AS_TENSOR_OPS[op]
    overload = packet.Tensor if isinstance(b, torch.fx.Node) else (
        packet.default if packet in (torch.ops.aten.logical_and, torch.ops.aten.logical_or) else packet.Scalar)
    if overload is packet.default and not isinstance(b, torch.fx.Node):
        return None
    return call_before(gm, before, overload, a, b)


def _failures(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.Node:
    """1 where an assertion's one-element condition is false (zero), else 0: an int32 count (gated by
    the assertion's torch.cond branch, as ``call_before`` gates what it inserts)."""
    false = call_before(gm, node, torch.ops.aten.eq.Scalar, node.args[0], 0)
    count = call_before(gm, node, torch.ops.aten._to_copy.default, false, dtype=torch.int32)
    return call_before(gm, node, torch.ops.aten.reshape.default, count, [])


def run_checks(checks: Sequence[dict[str, Any]], results: list[torch.Tensor]) -> list[torch.Tensor]:
    """Check the trailing outputs of ``results`` (raising eager's error); return the others.

    A check is a linear-algebra ``info`` (this pass's) or, with ``kind: "index"``, an index
    operand's (min, max) (``passes/index_bounds.py``), or with ``kind: "zero_division"`` whether
    an integer divisor held a zero (``passes/zero_divisors.py``), or with ``kind: "assert"`` a
    tensor assertion's failure count.
    """
    from torch_neuronx.compiler.passes.index_bounds import raise_out_of_range
    from torch_neuronx.compiler.passes.zero_divisors import raise_on_zero

    kept = len(results) - len(checks)
    for check, value in zip(checks, results[kept:]):
        if check.get("kind") == "index":
            raise_out_of_range(check, value)
        elif check.get("kind") == "zero_division":
            raise_on_zero(value)
        elif check.get("kind") == "assert":
            if int(value.item()):
                error = RuntimeError(check["message"])
                error.neuron_input_error = True  # type: ignore[attr-defined]  # bad input: never a fallback
                raise error
        else:
            try:
                torch._linalg_check_errors(value, check["api_name"], is_matrix=check["is_matrix"])
            except RuntimeError as error:
                error.neuron_input_error = True  # type: ignore[attr-defined]  # bad input: never a fallback
                raise
    return results[:kept]
