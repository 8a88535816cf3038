"""``torch.cond`` → both branches inlined and their results selected by the predicate.

torch-mlir's FX importer has no ``higher_order.cond``, and a NEFF has no control flow
here: both branches are computed and ``where(pred, then, else)`` keeps the taken one's
results (a branch is a pure function of its operands: ``torch.cond`` forbids mutating
them, and both branches' results have the same shapes and dtypes). Branches holding
``torch.cond`` themselves are inlined in turn.

Every node copied out of a branch carries :data:`GATE` in its metadata: the conditions
(predicate node, polarity) under which that branch is taken. The host checks that later
passes attach to such nodes (index bounds, integer division by zero, linear-algebra
errors) are gated by it in :func:`~torch_neuronx.compiler.passes.rewrite.append_checks`:
an index out of range in the branch not taken raises nothing, as in eager.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_neuronx.compiler.passes.rewrite import GATE

aten = torch.ops.aten


def _cond_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.higher_order.cond]


def _fresh_name(gm: torch.fx.GraphModule, base: str) -> str:
    index = 0
    while hasattr(gm, f"{base}_{index}"):
        index += 1
    return f"{base}_{index}"


def _inline(gm: torch.fx.GraphModule, at: torch.fx.Node, branch: torch.fx.GraphModule, operands: list[Any],
            gate: tuple) -> list[Any]:
    """Copy ``branch``'s nodes before ``at`` with its inputs bound to ``operands``; its outputs."""
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(operands)
    results: list[Any] = []
    with gm.graph.inserting_before(at):
        for node in branch.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "output":
                results = list(torch.fx.map_arg(node.args[0], lambda n: env[n]))
            elif node.op == "get_attr":  # a nested branch (or a constant) of this branch
                name = _fresh_name(gm, node.target.replace(".", "_"))
                setattr(gm, name, getattr(branch, node.target))
                env[node] = gm.graph.get_attr(name)
                env[node].meta = dict(node.meta)
            else:
                copy = gm.graph.node_copy(node, lambda n: env[n])
                copy.meta[GATE] = gate + tuple(node.meta.get(GATE, ()))
                env[node] = copy
    return results


def cond_to_select(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Inline every ``torch.cond`` of ``gm`` (see the module docstring)."""
    while found := _cond_nodes(gm):
        node = found[0]
        pred, then_ref, else_ref, operands = node.args[:4]
        outer = tuple(node.meta.get(GATE, ()))
        if not isinstance(pred, torch.fx.Node):  # a Python bool: the branch is known now
            taken = getattr(gm, (then_ref if pred else else_ref).target)
            results = _inline(gm, node, taken, list(operands), outer)
        else:
            then = _inline(gm, node, getattr(gm, then_ref.target), list(operands), outer + ((pred, True),))
            other = _inline(gm, node, getattr(gm, else_ref.target), list(operands), outer + ((pred, False),))
            results = []
            with gm.graph.inserting_before(node):
                for a, b in zip(then, other):
                    chosen = gm.graph.call_function(aten.where.self, (pred, a, b))
                    chosen.meta["val"] = a.meta["val"]
                    if outer:
                        chosen.meta[GATE] = outer
                    results.append(chosen)
        for user in list(node.users):
            if user.op == "call_function" and user.target.__name__ == "getitem":
                user.replace_all_uses_with(results[user.args[1]])
                gm.graph.erase_node(user)
        if node.users:
            raise NotImplementedError(f"a torch.cond result used other than by index: {list(node.users)}")
        gm.graph.erase_node(node)
        for ref in (then_ref, else_ref):
            if isinstance(ref, torch.fx.Node) and not ref.users:
                gm.graph.erase_node(ref)
                delattr(gm, ref.target)
    gm.graph.lint()
    gm.recompile()
    return gm
