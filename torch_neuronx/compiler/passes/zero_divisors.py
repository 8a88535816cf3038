"""Integer divisors → zeros replaced by 1, and checked on the host after the call.

torch raises ``RuntimeError: ZeroDivisionError`` for an integer division or remainder by zero
(``a // b``, ``a % b``, ``torch.fmod``, ``torch.div(..., rounding_mode=...)``). The decompositions
write all of them as ``aten.div.Tensor_mode``, which IREE computes without a trap and returns
whatever the hardware gives: ``[7, -7] // [0, 0]`` came back as ``[-1, -2]``, with no error. This
pass rewrites the divisor ``d`` of every integer ``div.Tensor_mode`` as ``masked_fill(d == 0, 1)``
(no lane divides by zero) and appends ``any(d == 0)`` as a trailing graph output with a recorded
check (a literal divisor 0, as ``x // 0`` traces on the eager device, becomes 1 with a check that
always fires) (``gm.meta["host_checks"]``, ``kind: "zero_division"``): after the call the host raises
:class:`IntegerDivisionByZeroError`, and the results are never returned.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_neuronx.compiler.passes.rewrite import append_checks, call_before, example

aten = torch.ops.aten

_OPS = (aten.div.Tensor_mode, aten.floor_divide.default)


class IntegerDivisionByZeroError(ZeroDivisionError, RuntimeError):
    """An integer division or remainder by zero, found by a host check after a call: a RuntimeError
    with torch's message (what eager raises), and a ZeroDivisionError."""

    neuron_input_error = True  # bad input: eager raises it, never falls back to the CPU


def _integer(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.dtype.is_floating_point \
        and not value.dtype.is_complex and value.dtype != torch.bool


def _needs_check(divisor: Any) -> bool:
    """Whether ``divisor`` could hold a zero: a tensor made from a literal, when that is 0;
    any other tensor, when it depends on the graph's inputs (not only on literals)."""
    if not isinstance(divisor, torch.fx.Node) or not isinstance(example(divisor), torch.Tensor) \
            or example(divisor).numel() == 0:
        return False
    source = divisor
    while source.op == "call_function" and source.target in _SAME_VALUES:  # expand(scalar_tensor(0))
        source = source.args[0]
        if not isinstance(source, torch.fx.Node):
            return True
    if source.op == "call_function" and source.target in (aten.scalar_tensor.default, aten.full.default):
        value = source.args[0] if source.target is aten.scalar_tensor.default else source.args[1]
        return not isinstance(value, int | float) or value == 0
    return _from_inputs(divisor)


#: Ops whose result holds only values of their first argument (a literal's zero stays a zero).
_SAME_VALUES = frozenset((aten.expand.default, aten.view.default, aten.reshape.default, aten.unsqueeze.default,
                          aten.clone.default, aten.alias.default, aten._to_copy.default, aten.squeeze.dim,
                          aten.squeeze.default, aten.permute.default))


def _from_inputs(node: torch.fx.Node) -> bool:
    """Whether ``node`` depends on a graph input or a stored tensor (not only on literals: a
    decomposition's ``2 ** 23``, which needs no check and would cost ``frexp`` its launch plan)."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op in ("placeholder", "get_attr"):
            return True
        stack.extend(current.all_input_nodes)
    return False


def zero_divisors_checked(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Make every integer division's divisor safe and check it for zeros on the host."""
    checks: list[tuple[torch.fx.Node, dict[str, Any]]] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _OPS or not _integer(example(node)):
            continue
        divisor = node.args[1]
        if type(divisor) in (int, bool):  # a literal (``x // 0`` on the eager device): checked when 0
            if divisor == 0:
                checks.append((call_before(gm, node, aten.scalar_tensor.default, 1, dtype=torch.int32),
                               {"kind": "zero_division"}))
                node.args = (node.args[0], 1, *node.args[2:])
            continue
        if not _needs_check(divisor):
            continue
        zero = call_before(gm, node, aten.eq.Scalar, divisor, 0)
        safe = call_before(gm, node, aten.masked_fill.Scalar, divisor, zero, 1)
        found = call_before(gm, node, aten.any.default, zero)
        checks.append((call_before(gm, node, aten._to_copy.default, found, dtype=torch.int32),
                       {"kind": "zero_division"}))
        node.args = (node.args[0], safe, *node.args[2:])
    if checks:
        append_checks(gm, checks)
    return gm


def raise_on_zero(found: torch.Tensor) -> None:
    """Raise torch's error when a check output says a divisor held a zero."""
    if int(found.item()):
        raise IntegerDivisionByZeroError("ZeroDivisionError")
