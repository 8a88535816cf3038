"""Dynamo graphs whose inputs include lists, compiled as graphs of one input per tensor.

Compiled autograd's backward graph takes its tensors as one list (which it empties), and
aot_autograd refuses such inputs ("all flat_args must be KNOWN_TYPES"): torch's own backends
flatten them first (``torch._dynamo.utils.flatten_graph_inputs``, which hands the backend a
module, not a graph). :func:`compiled_flat` rewrites the graph itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree


def compiled_flat(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  compile_fn: Callable[[torch.fx.GraphModule, list[Any]], Callable],
                  is_symbolic: Callable[[Sequence[Any]], bool]) -> Callable:
    """``gm`` compiled by ``compile_fn`` as a graph of one input per leaf of ``example_inputs``,
    called with the leaves; with its traced values as the examples when their sizes are symbolic
    (compiled autograd hands over real tensors for a graph of symbolic sizes: a second backward),
    so that the graph compiles per signature."""
    flat_inputs, spec = pytree.tree_flatten(list(example_inputs))
    graph = torch.fx.Graph()
    leaves = [graph.placeholder(f"leaf_{i}") for i in range(len(flat_inputs))]
    originals = [node for node in gm.graph.nodes if node.op == "placeholder"]
    values: dict[torch.fx.Node, Any] = dict(zip(originals, pytree.tree_unflatten(leaves, spec), strict=True))
    for node in gm.graph.nodes:
        if node.op == "output":
            graph.output(torch.fx.map_arg(node.args[0], values.__getitem__))
        elif node.op != "placeholder":
            values[node] = graph.node_copy(node, values.__getitem__)
    flat = torch.fx.GraphModule(gm, graph)
    traced = pytree.tree_leaves([node.meta.get("example_value") for node in originals])
    examples = traced if len(traced) == len(flat_inputs) and is_symbolic(traced) else flat_inputs
    compiled = compile_fn(flat, examples)
    boxed = getattr(compiled, "_boxed_call", False)
    stolen = [i for i, node in enumerate(originals) if node.meta.get("steal_arg", False)]

    def call(*args: Any) -> Any:
        leaves = pytree.arg_tree_leaves(*args)
        for i in stolen:  # the caller hands its list over: emptied, as torch's own backends do
            args[i].clear()
        return compiled(leaves) if boxed else compiled(*leaves)

    return call
