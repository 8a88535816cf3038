"""Outputs in eager's memory order: a channels-last or transposed result keeps its strides.

A NEFF returns every output contiguous, but eager (and inductor) give a
convolution of channels-last input a channels-last result, and a graph may
return a transposed product. For each output whose traced strides are a
permutation of a contiguous layout, this pass returns ``permute(out, order)``
instead, which is contiguous in that memory order, and records in
``gm.meta["output_layouts"]`` the ``[position, inverse]`` pairs with which the
host permutes the NEFF's result back: a view with exactly the traced strides,
no copy.
"""

from __future__ import annotations

import torch

from torch_neuronx.compiler.passes.rewrite import static_val

aten = torch.ops.aten


def stride_order(stride: tuple[int, ...]) -> list[int]:
    """Dimensions from the largest stride to the smallest (ties: in order): outermost first."""
    return sorted(range(len(stride)), key=lambda d: (-stride[d], d))


def memory_order(val: torch.Tensor) -> list[int] | None:
    """The permutation ``p`` with ``val.permute(p)`` contiguous, when ``val`` is dense but not
    contiguous and permuting a contiguous tensor back gives its strides (those of its dimensions
    of size 1 aside, which address nothing: a batch of one's); else None."""
    if val.is_contiguous() or val.numel() <= 1:
        return None
    stride = val.stride()
    order = stride_order(stride)
    shape = [val.shape[d] for d in order]
    inverse = [order.index(d) for d in range(val.dim())]
    permuted = torch.empty(shape, device="meta").permute(inverse).stride()
    if any(p != s for p, s, n in zip(permuted, stride, val.shape, strict=True) if n != 1):
        return None  # gaps or overlap: stays contiguous
    return order


def outputs_in_memory_order(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Return each permuted-dense output in its memory order (see the module docstring)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    skip = set(gm.meta.get("complex_outputs", ()))
    values, layouts = list(output.args[0]), []
    for i, value in enumerate(values):
        val = static_val(value) if isinstance(value, torch.fx.Node) and i not in skip else None
        order = memory_order(val) if val is not None else None
        if order is None:
            continue
        with gm.graph.inserting_before(output):
            permuted = gm.graph.call_function(aten.permute.default, (value, order))
        permuted.meta["val"] = val.permute(order)
        values[i] = permuted
        layouts.append([i, [order.index(d) for d in range(val.dim())]])
    if layouts:
        output.args = (tuple(values),)
        gm.meta["output_layouts"] = layouts
    return gm
