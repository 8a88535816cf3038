"""``torch.nn.functional`` calls rewritten in the Dynamo graph, before aot_autograd traces it.

Some ops have a forward decomposition but no decomposable backward (``grid_sampler_2d``'s
and ``_pdist_forward``'s backwards are fused kernels with no lowering anywhere). Replacing the functional call
itself by a composition of differentiable ops lets autograd derive the backward from
that composition while aot_autograd traces, so forward and backward both lower.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch._decomp import decompositions as torch_decompositions


def grid_sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> torch.Tensor:
    """``F.grid_sample`` of 4-d inputs as torch's own decomposition (differentiable ops)."""
    if input.dim() != 4 or mode not in F.GRID_SAMPLE_INTERPOLATION_MODES \
            or padding_mode not in F.GRID_SAMPLE_PADDING_MODES:
        return F.grid_sample(input, grid, mode, padding_mode, align_corners)
    if align_corners is None:
        warnings.warn("Default grid_sample and affine_grid behavior has changed to align_corners=False "
                      "since 1.3.0. Please specify align_corners=True if the old behavior is desired. "
                      "See the documentation of grid_sample for details.", stacklevel=2)
        align_corners = False
    out = torch_decompositions._grid_sampler_2d(
        input, grid=grid, interpolation_mode=F.GRID_SAMPLE_INTERPOLATION_MODES[mode],
        padding_mode=F.GRID_SAMPLE_PADDING_MODES[padding_mode], align_corners=align_corners)
    return _with_zero_gradient(out, grid) if mode == "nearest" else out


def _with_zero_gradient(out: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``out`` plus an exact 0 that depends on ``source``: rounding (nearest sampling, the
    0-norm) cuts ``source`` off the graph, where torch's kernels give it a gradient of zeros."""
    if not source.requires_grad:
        return out
    return out + torch.where(torch.zeros_like(source, dtype=torch.bool), source, 0).sum()


def pdist(input: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``torch.pdist``: the p-norm distance of every row pair i < j, in torch's order, as
    differentiable ops (its fused backward has no lowering)."""
    if input.dim() != 2:
        return torch.pdist(input, p)
    n = input.shape[0]
    first, second = torch.triu_indices(n, n, 1, device=input.device)
    difference = input.index_select(0, first) - input.index_select(0, second)
    distances = torch.linalg.vector_norm(difference, ord=p, dim=1)
    return _with_zero_gradient(distances, input) if p == 0 else distances


#: Functions of the Dynamo graph and their replacements.
SUBSTITUTES: dict[Callable, Callable] = {F.grid_sample: grid_sample, torch.pdist: pdist}


def substitute(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, or a copy of it with every call in :data:`SUBSTITUTES` replaced (``gm`` is left alone)."""
    if not any(node.op == "call_function" and node.target in SUBSTITUTES for node in gm.graph.nodes):
        return gm
    graph, copies = torch.fx.Graph(), {}
    for node in gm.graph.nodes:
        copy = copies[node] = graph.node_copy(node, lambda n: copies[n])
        if node.op == "call_function" and node.target in SUBSTITUTES:
            copy.target = SUBSTITUTES[node.target]
    replaced = torch.fx.GraphModule(gm, graph)
    replaced.meta.update(gm.meta)
    return replaced
