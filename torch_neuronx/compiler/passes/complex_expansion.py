"""The real math that ``complex_to_real`` emits, decomposed as the traced graph's own ops are.

The complex rules write ``sin``, ``cos``, ``atan2``, ``exp``, ``log`` and ``sqrt`` nodes after the
trace, so this package's decompositions of them (``decompositions/float64_math.py``: Cephes'
range reduction; ``float64_exp_log.py``) never ran: ``torch.polar`` and complex ``exp`` used
IREE's own sine, whose float32 reduction lost 1e-4 at an angle of 4096 (a Llama ``freqs_cis``),
and complex128 ``log``/``sqrt``/``angle`` called an ``atan2`` symbol IREE's float64 code does not
have. :func:`expand_emitted` traces each such node through the decomposition table into the
graph, in place of the node.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

aten = torch.ops.aten

#: The ops a complex rule emits that have decompositions of their own (when the table has them).
EXPANDED = frozenset({aten.sin.default, aten.cos.default, aten.atan2.default, aten.exp.default,
                      aten.log.default, aten.sqrt.default})


def expand_emitted(graph: torch.fx.Graph, emitted: set[Node], fake_mode: Any) -> None:
    """Replace each node of ``emitted`` whose op is in :data:`EXPANDED` and in the decomposition
    table by the ops its decomposition traces to."""
    from torch_neuronx.compiler import decompositions

    table = decompositions.table()
    for node in list(graph.nodes):
        if node in emitted and node.op == "call_function" and node.target in EXPANDED and node.target in table:
            _expand(graph, node, table, fake_mode)


def _expand(graph: torch.fx.Graph, node: Node, table: dict, fake_mode: Any) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    if any(isinstance(v, Node) for v in node.kwargs.values()):
        return
    positions = [i for i, a in enumerate(node.args) if isinstance(a, Node)]

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        args = list(node.args)
        for i, t in zip(positions, tensors, strict=True):
            args[i] = t
        return node.target(*args, **node.kwargs)

    with fake_mode:
        sub = make_fx(call, decomposition_table=table)(*(node.args[i].meta["val"] for i in positions))
    if any(inner.op == "get_attr" for inner in sub.graph.nodes):  # holds a constant tensor: left as it is
        return
    env: dict[Node, Any] = {}
    inputs = iter(node.args[i] for i in positions)
    with graph.inserting_before(node):
        for inner in sub.graph.nodes:
            if inner.op == "placeholder":
                env[inner] = next(inputs)
            elif inner.op == "output":
                node.replace_all_uses_with(torch.fx.node.map_arg(inner.args[0], lambda n: env[n]))
            else:
                env[inner] = graph.node_copy(inner, lambda n: env[n])
    graph.erase_node(node)
