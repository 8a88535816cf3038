"""``torch.nn.functional`` calls rewritten in the Dynamo graph, before aot_autograd traces it.

Some ops have a forward decomposition but no decomposable backward (``grid_sampler_2d``'s
and ``_pdist_forward``'s backwards are fused kernels with no lowering anywhere). Replacing the functional call
itself by a composition of differentiable ops lets autograd derive the backward from
that composition while aot_autograd traces, so forward and backward both lower. On the eager
device the fused ops themselves arrive (``grid_sampler_2d_backward``, ``_pdist_backward``): their
decompositions here compute the same pullbacks with ``torch.autograd.grad`` while the kernel is traced.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch._decomp import decompositions as torch_decompositions

from torch_neuronx.compiler.decompositions import indexing, recurrent_layers


def grid_sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> torch.Tensor:
    """``F.grid_sample`` as differentiable ops: 4-d inputs by torch's own decomposition, 5-d by ours.

    5-d inputs support what eager does there: bilinear (trilinear) and nearest, every padding.
    """
    volumetric = input.dim() == 5 and mode in ("bilinear", "nearest")
    if not (input.dim() == 4 or volumetric) or mode not in F.GRID_SAMPLE_INTERPOLATION_MODES \
            or padding_mode not in F.GRID_SAMPLE_PADDING_MODES or grid.shape[-1] != input.dim() - 2:
        return F.grid_sample(input, grid, mode, padding_mode, align_corners)
    if align_corners is None:
        warnings.warn("Default grid_sample and affine_grid behavior has changed to align_corners=False "
                      "since 1.3.0. Please specify align_corners=True if the old behavior is desired. "
                      "See the documentation of grid_sample for details.", stacklevel=2)
        align_corners = False
    if volumetric:
        out = grid_sample_3d(input, grid, mode, padding_mode, align_corners)
    else:
        out = torch_decompositions._grid_sampler_2d(
            input, grid=grid, interpolation_mode=F.GRID_SAMPLE_INTERPOLATION_MODES[mode],
            padding_mode=F.GRID_SAMPLE_PADDING_MODES[padding_mode], align_corners=align_corners)
    return _with_zero_gradient(out, grid) if mode == "nearest" else out


def _source_index(coords: torch.Tensor, size: int, padding_mode: str, align_corners: bool) -> torch.Tensor:
    """Grid coordinates in [-1, 1] to input positions, padded as torch's grid sampler pads them."""
    scale = (size * 0.5 - 0.5) if align_corners else size * 0.5
    coords = coords * scale + (size * 0.5 - 0.5)
    if padding_mode == "border":
        return coords.clamp(0, size - 1)
    if padding_mode == "reflection":
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if high == low:
            return torch.zeros_like(coords)
        span = high - low
        distance = (coords - low).abs()
        extra = torch.fmod(distance, span)
        flips = (distance / span).floor()
        reflected = torch.where(torch.fmod(flips, 2) == 0, extra + low, span + low - extra)
        return reflected.clamp(0, size - 1)
    return coords


def grid_sample_3d(input: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str,
                    align_corners: bool) -> torch.Tensor:
    """Volumetric ``grid_sample`` (``N, C, D, H, W`` input, ``N, D', H', W', 3`` grid of x, y, z).

    Corners are weighted and summed in the order of torch's CPU kernel (top/bottom, then
    north/south, then west/east), each weight the product of its x, y and z factors.
    """
    n, c, depth, height, width = input.shape
    sizes = (width, height, depth)
    ix, iy, iz = (_source_index(grid[..., i], sizes[i], padding_mode, align_corners) for i in range(3))
    batch = torch.arange(n, device=input.device).view(n, 1, 1, 1, 1)
    channel = torch.arange(c, device=input.device).view(1, c, 1, 1, 1)

    def gather(xs: torch.Tensor, ys: torch.Tensor, zs: torch.Tensor, weight: torch.Tensor | float) -> torch.Tensor:
        inside = (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height) & (zs >= 0) & (zs < depth)
        xs, ys, zs = (torch.where(inside, t, 0).to(torch.int64).unsqueeze(1) for t in (xs, ys, zs))
        weight = torch.where(inside, weight, 0).unsqueeze(1)
        return input[batch, channel, zs, ys, xs] * weight

    if mode == "nearest":
        return gather(ix.round(), iy.round(), iz.round(), 1.0)
    x0, y0, z0 = ix.floor(), iy.floor(), iz.floor()
    x1, y1, z1 = x0 + 1, y0 + 1, z0 + 1
    factors = {"x": ((x0, x1 - ix), (x1, ix - x0)), "y": ((y0, y1 - iy), (y1, iy - y0)),
               "z": ((z0, z1 - iz), (z1, iz - z0))}
    out = None
    for zs, wz in factors["z"]:
        for ys, wy in factors["y"]:
            for xs, wx in factors["x"]:
                term = gather(xs, ys, zs, wx * wy * wz)
                out = term if out is None else out + term
    return out


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
    distances = _pdist_rows(input, p)
    return _with_zero_gradient(distances, input) if p == 0 else distances


#: Functions of the Dynamo graph and their replacements.
SUBSTITUTES: dict[Callable, Callable] = {F.grid_sample: grid_sample, torch.pdist: pdist, F.one_hot: indexing.one_hot}


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


def _sampler_vjp(forward: Callable, grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                 output_mask: list[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of ``forward(input, grid)`` for ``grad_output``, those ``output_mask`` asks for."""
    with recurrent_layers.autograd_dispatch(), torch.enable_grad():
        leaves = input.detach().requires_grad_(), grid.detach().requires_grad_()
        grad_input, grad_grid = torch.autograd.grad(forward(*leaves), leaves, grad_output, allow_unused=True)
    grad_input = torch.zeros_like(input) if grad_input is None else grad_input
    grad_grid = torch.zeros_like(grid) if grad_grid is None else grad_grid
    return (grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None)


def grid_sampler_2d_backward(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                             interpolation_mode: int, padding_mode: int, align_corners: bool,
                             output_mask: list[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``aten.grid_sampler_2d_backward`` (an eager op's backward on the device) as the pullback of
    torch's forward decomposition, whose ops all lower."""
    def forward(i: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return torch_decompositions._grid_sampler_2d(i, g, interpolation_mode, padding_mode, align_corners)

    return _sampler_vjp(forward, grad_output, input, grid, output_mask)


def grid_sampler_3d_backward(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                             interpolation_mode: int, padding_mode: int, align_corners: bool,
                             output_mask: list[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``aten.grid_sampler_3d_backward`` as the pullback of :func:`grid_sample_3d` (bilinear, nearest)."""
    modes = {v: k for k, v in F.GRID_SAMPLE_INTERPOLATION_MODES.items()}
    paddings = {v: k for k, v in F.GRID_SAMPLE_PADDING_MODES.items()}
    if modes.get(interpolation_mode) not in ("bilinear", "nearest"):
        return NotImplemented

    def forward(i: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return grid_sample_3d(i, g, modes[interpolation_mode], paddings[padding_mode], align_corners)

    return _sampler_vjp(forward, grad_output, input, grid, output_mask)


def _pdist_rows(input: torch.Tensor, p: float) -> torch.Tensor:
    n = input.shape[0]
    first, second = torch.triu_indices(n, n, 1, device=input.device)
    difference = input.index_select(0, first) - input.index_select(0, second)
    return torch.linalg.vector_norm(difference, ord=p, dim=1)


def pdist_forward(input: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``aten._pdist_forward`` (``torch.pdist`` on the eager device) as :func:`pdist`'s composition."""
    return _pdist_rows(input, p)


def pdist_backward(grad: torch.Tensor, input: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """``aten._pdist_backward`` as the pullback of :func:`pdist_forward` (zeros for ``p == 0``)."""
    with recurrent_layers.autograd_dispatch(), torch.enable_grad():
        leaf = input.detach().requires_grad_()
        (found,) = torch.autograd.grad(_pdist_rows(leaf, p), leaf, grad, allow_unused=True)
    return torch.zeros_like(input) if found is None else found


#: Backwards of eager ops that have no lowering, as pullbacks of their differentiable compositions.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    torch.ops.aten.grid_sampler_2d_backward.default: grid_sampler_2d_backward,
    torch.ops.aten.grid_sampler_3d_backward.default: grid_sampler_3d_backward,
    torch.ops.aten._pdist_forward.default: pdist_forward,
    torch.ops.aten._pdist_backward.default: pdist_backward,
}
