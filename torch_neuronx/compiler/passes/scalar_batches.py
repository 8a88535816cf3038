"""Many independent one-element pointwise ops become one op over their stacked operands.

IREE 3.13 gathers a graph's scalar computations (ops whose tensors hold one element) into one
dispatch, whatever their number, and a dispatch binds each buffer it reads or writes: the
runtime refuses more than 32 bindings per command-buffer dispatch ("binding count 42 > 32") and
the CPU executable loader more than 64 ("dispatch requiring 72 bindings exceeds limit of 64").
A compiled optimizer step computes per parameter (foreach Adam's bias corrections of each
``step``; ``clip_grad_norm_``'s ``sqrt`` of each gradient's sum of squares), so the step of any
model of a few dozen parameters failed to load.

:func:`scalar_ops_batched` finds groups of such ops that do the same thing (same op, same
constant arguments, same operand that all share, operands of one shape and dtype where they
differ) at the same depth of the graph (so none depends on another), and, in a graph of
:data:`MIN_SCALARS` or more such ops (fewer bind fewer buffers than the limits), writes each group
of two or more as the op on the stacked differing operands, each member's result a
``select`` of it. Chains stay vectorized: a stack of every ``select`` of one batched result, in
order, is that result. The arithmetic is the same op on the same values, element by element.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.fx import GraphModule, Node

__all__ = ["MIN_SCALARS", "scalar_ops_batched"]

#: A graph with fewer one-element pointwise ops keeps them as they are: each binds at most three
#: buffers, under the runtime's 32. (At 16, a compiled AdamW step over 9 to 15 parameters, a LoRA
#: fine-tune's, bound 36 to 60 buffers: "binding count 36 > 32".)
MIN_SCALARS = 8
_aten = torch.ops.aten


def _meta(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _one_element(node: Any) -> bool:
    value = _meta(node)
    return isinstance(value, torch.Tensor) and value.numel() == 1 and all(isinstance(s, int) for s in value.shape)


def _candidate(node: Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if (torch.Tag.pointwise not in target.tags or torch.Tag.nondeterministic_seeded in target.tags
            or target._schema.is_mutable or not _one_element(node)):
        return False
    tensors = [_meta(a) for a in (*node.args, *node.kwargs.values()) if isinstance(a, Node)]
    # One dtype and the result's shape for every tensor operand: stacking some of them then
    # changes neither type promotion (a 0-d tensor promotes less than a dimensioned one) nor
    # the broadcast of the others.
    shape = tuple(_meta(node).shape)
    return bool(tensors) and all(isinstance(t, torch.Tensor) and tuple(t.shape) == shape for t in tensors) \
        and len({t.dtype for t in tensors}) == 1


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _key(node: Node) -> tuple:
    """What members of a group share: the op, constants, and per tensor operand its shape and dtype."""
    parts: list[Any] = [node.target, _meta(node).dtype, tuple(_meta(node).shape)]
    for name, value in [*enumerate(node.args), *sorted(node.kwargs.items())]:
        if isinstance(value, Node):
            parts.append((name, "tensor", _meta(value).dtype, tuple(_meta(value).shape)))
        else:
            parts.append((name, _hashable(value)))
    return tuple(parts)


def _depths(gm: GraphModule) -> dict[Node, int]:
    depth: dict[Node, int] = {}
    for node in gm.graph.nodes:
        depth[node] = 1 + max((depth[a] for a in node.all_input_nodes), default=-1)
    return depth


def _stacked(graph: torch.fx.Graph, operands: list[Node], selected: dict[Node, tuple[Node, int]]) -> Node:
    """The stack of ``operands``: the batched node itself when they are all of its selects in order."""
    sources = [selected.get(o) for o in operands]
    if all(s is not None for s in sources):
        base = sources[0][0]
        if all(s[0] is base and s[1] == i for i, s in enumerate(sources)) and \
                _meta(base).shape[0] == len(operands):
            return base
    node = graph.call_function(_aten.stack.default, (operands, 0))
    node.meta["val"] = _stacked_meta(_meta(operands[0]), len(operands))
    return node


def _stacked_meta(value: torch.Tensor, count: int) -> torch.Tensor:
    """The metadata of ``count`` values like ``value`` stacked (made by the value's own mode)."""
    return value.new_empty((count, *value.shape))


def _batch(gm: GraphModule, members: list[Node], selected: dict[Node, tuple[Node, int]]) -> None:
    graph, first = gm.graph, members[0]
    positions = [name for name, value in [*enumerate(first.args), *first.kwargs.items()]
                 if isinstance(value, Node) and len({id(_arg(m, name)) for m in members}) > 1]
    if not positions:  # the same op of the same operands: one value (a stack of none was one 0-d op
        for member in members[1:]:  # typed as the stack, which its lowering refused)
            member.replace_all_uses_with(first)
            graph.erase_node(member)
        return
    insert_after = max((a for m in members for a in m.all_input_nodes), key=_order(gm))
    with graph.inserting_after(insert_after):
        stacks = {name: _stacked(graph, [_arg(m, name) for m in members], selected) for name in positions}
    anchor = max([insert_after, *stacks.values()], key=_order(gm))
    args = [stacks.get(i, a) for i, a in enumerate(first.args)]
    kwargs = {k: stacks.get(k, v) for k, v in first.kwargs.items()}
    with graph.inserting_after(anchor):
        batched = graph.call_function(first.target, tuple(args), kwargs)
    batched.meta["val"] = _stacked_meta(_meta(first), len(members))
    previous = batched
    for i, member in enumerate(members):
        with graph.inserting_after(previous):
            pick = graph.call_function(_aten.select.int, (batched, 0, i))
        pick.meta["val"] = _meta(member)
        selected[pick] = (batched, i)
        member.replace_all_uses_with(pick)
        graph.erase_node(member)
        previous = pick


def _arg(node: Node, name: Any) -> Any:
    return node.args[name] if isinstance(name, int) else node.kwargs[name]


def _order(gm: GraphModule) -> Any:
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return lambda n: index.get(n, -1)


def _sorted_topologically(graph: torch.fx.Graph) -> None:
    """Reorder ``graph`` so that every node follows its inputs (the original order where it can)."""
    placed: set[Node] = set()
    order: list[Node] = []
    for start in list(graph.nodes):
        stack = [(start, False)]
        while stack:
            node, ready = stack.pop()
            if node in placed:
                continue
            if ready:
                placed.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((a, False) for a in reversed(node.all_input_nodes) if a not in placed)
    previous = graph._root
    for node in order:
        if node.prev is not previous:
            previous.append(node)
        previous = node


def scalar_ops_batched(gm: GraphModule) -> GraphModule:
    """Batch the groups of alike one-element pointwise ops of a graph with :data:`MIN_SCALARS` or
    more of them (see the module)."""
    candidates = [n for n in gm.graph.nodes if _candidate(n)]
    if len(candidates) < MIN_SCALARS:
        return gm
    depth = _depths(gm)
    groups: dict[tuple, list[Node]] = collections.defaultdict(list)
    for node in candidates:
        groups[(depth[node], _key(node))].append(node)
    selected: dict[Node, tuple[Node, int]] = {}
    changed = False
    for (_, _), members in sorted(groups.items(), key=lambda item: item[0][0]):
        if len(members) >= 2:
            _batch(gm, members, selected)
            changed = True
    if changed:
        _sorted_topologically(gm.graph)
        gm.graph.lint()
        gm.recompile()
    return gm
