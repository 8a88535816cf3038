"""Drop non-tensor inputs (SymInt sizes, ``None``) from graphs compiled for one concrete shape.

Dynamo passes symbolic sizes as graph inputs once it marks a dimension dynamic.
The backend specializes each such graph to concrete input shapes, so these
inputs are constants here: uses are replaced by their value and the
placeholder is removed (the runtime passes only tensors to the NEFF).
"""

from __future__ import annotations

import contextlib

import torch


def inline_scalar_inputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace each non-tensor placeholder by its concrete example value and remove it."""
    for node in list(gm.graph.nodes):
        if node.op != "placeholder":
            continue
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor):
            continue
        if node.users:
            if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
                hint = val.node.hint
                if hint is None:
                    raise ValueError(f"graph input {node.name} is a symbolic size without a concrete value")
                val = hint
            if not isinstance(val, int | float | bool):
                raise ValueError(f"graph input {node.name} of type {type(val).__name__} is not supported")
            def substitute(n: torch.fx.Node, node: torch.fx.Node = node, val: object = val) -> object:
                return val if n is node else n

            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, substitute)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, substitute)
        gm.graph.erase_node(node)
    return gm


def _constant(size: object) -> int | None:
    """``size`` as an int: an int, or a SymInt whose expression is a number (a symbol the shape
    environment specialized); None for a symbolic size."""
    if isinstance(size, int):
        return size
    if isinstance(size, torch.SymInt):
        return size.node.maybe_as_int()
    return None


def constant_sizes_as_ints(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Give tensors whose sizes are all constant SymInts (the sizes of views of one buffer passed
    in as a tensor subclass's inputs: a compiled optimizer step over DDP's bucket-view gradients)
    a meta value of int sizes: the importer made each such dimension ``?`` (torch-mlir then failed
    on ``aten.alias`` of ``[?,?]``, IREE on a dynamic broadcast). Truly symbolic sizes stay."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or all(isinstance(d, int) for d in val.shape):
            continue
        sizes = [_constant(d) for d in val.shape]
        strides = [_constant(d) for d in val.stride()] if val.layout == torch.strided else []
        if None in sizes or None in strides:
            continue
        mode = getattr(val, "fake_mode", None)
        with mode if mode is not None else contextlib.nullcontext():
            node.meta["val"] = torch.empty_strided(sizes, strides, dtype=val.dtype,
                                                   device=val.device if mode is not None else "meta")
        node.meta.pop("tensor_meta", None)
    return gm
