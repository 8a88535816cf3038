"""``torch.nn.functional`` calls rewritten in the Dynamo graph, before aot_autograd traces it.

Some ops have a forward decomposition but no decomposable backward (``grid_sampler_2d``'s
and ``_pdist_forward``'s backwards are fused kernels with no lowering anywhere). Replacing the functional call
itself by a composition of differentiable ops lets autograd derive the backward from
that composition while aot_autograd traces, so forward and backward both lower. On the eager
device the fused ops themselves arrive (``grid_sampler_2d_backward``, ``_pdist_backward``): their
decompositions here compute the same pullbacks with ``torch.autograd.grad`` while the kernel is traced.
"""

from __future__ import annotations

import functools
import itertools
import operator
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch._decomp import decompositions as torch_decompositions

from torch_neuronx.compiler.decompositions import indexing, recurrent_layers


def grid_sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> torch.Tensor:
    """``F.grid_sample`` as differentiable ops: bilinear (trilinear) and nearest by :func:`grid_sample_nd`,
    4-d bicubic by torch's own decomposition.

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
    if mode == "bicubic":  # its clamps act on integer taps only: no gradient passes them
        out = torch_decompositions._grid_sampler_2d(
            input, grid=grid, interpolation_mode=F.GRID_SAMPLE_INTERPOLATION_MODES[mode],
            padding_mode=F.GRID_SAMPLE_PADDING_MODES[padding_mode], align_corners=align_corners)
    else:
        out = grid_sample_nd(input, grid, mode, padding_mode, align_corners)
    return _with_zero_gradient(out, grid) if mode == "nearest" else out


def _clip(coords: torch.Tensor, size: int, volumetric: bool) -> torch.Tensor:
    """``coords`` clamped to ``[0, size - 1]`` with the gradient of torch's kernels: 1 strictly inside,
    0 on the edges and beyond (autograd's clamp passes the gradient on the edges, where the
    interpolation's slope toward the zero-weighted neighbour outside then gave a wrong gradient).

    A NaN lands where torch's CPU kernels put it: on 0 in 2-d (the vectorized kernel clamps NaN to
    zero), on ``size - 1`` in 3-d (the scalar kernel's ``std::min(size - 1, std::max(NaN, 0))``).
    """
    inside = (coords > 0) & (coords < size - 1)
    clamped = coords.detach().clamp(0, size - 1)
    clamped = torch.where(clamped.isnan(), float(size - 1) if volumetric else 0.0, clamped)
    return torch.where(inside, coords, clamped)


def _unnormalize(coords: torch.Tensor, size: int, align_corners: bool, volumetric: bool) -> torch.Tensor:
    """Grid coordinates in [-1, 1] to input positions, rounded as torch's CPU kernels round them: a
    point landing on a pixel lands exactly there or just before it, and which of the two decides
    the one-sided gradient there (2-d: the vectorized kernel's ``(c + 1) * s - 0.5``; 3-d: the
    scalar kernel's ``((c + 1) * size - 1) / 2``)."""
    if volumetric:
        return (coords + 1) / 2 * (size - 1) if align_corners else ((coords + 1) * size - 1) / 2
    if align_corners:
        return (coords + 1) * ((size - 1) / 2)
    return (coords + 1) * (size / 2) - 0.5


def _source_index(coords: torch.Tensor, size: int, padding_mode: str, align_corners: bool,
                  volumetric: bool) -> torch.Tensor:
    """Grid coordinates in [-1, 1] to input positions, padded as torch's grid sampler pads them."""
    coords = _unnormalize(coords, size, align_corners, volumetric)
    if padding_mode == "border":
        return _clip(coords, size, volumetric)
    if padding_mode == "reflection":
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if high == low:
            return torch.zeros_like(coords)
        reflect = _reflect_scalar if volumetric else _reflect_vectorized
        return _clip(reflect(coords, low, high - low), size, volumetric)
    return coords


def _reflect_scalar(coords: torch.Tensor, low: float, span: float) -> torch.Tensor:
    """Reflection about ``low`` and ``low + span`` as torch's scalar (3-d) kernel computes it."""
    distance = (coords - low).abs()
    extra = torch.fmod(distance, span)
    flips = (distance / span).floor()
    return torch.where(torch.fmod(flips, 2) == 0, extra + low, span + low - extra)


def _reflect_vectorized(coords: torch.Tensor, low: float, span: float) -> torch.Tensor:
    """Reflection as torch's vectorized (2-d) kernel computes it: the remainder of the double span
    by truncated division, which that kernel takes in the input's precision (a huge coordinate
    lands on the edge there, not on an exact remainder), and a gradient of +1 at ``low``."""
    shifted = coords - low
    distance = torch.where(shifted < 0, -shifted, shifted)
    twice_span = 2 * span
    extra = distance - (distance / twice_span).trunc() * twice_span
    reflected = twice_span - extra
    return torch.where(extra > reflected, reflected, extra) + low


def grid_sample_nd(input: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str,
                   align_corners: bool) -> torch.Tensor:
    """Bilinear (trilinear) or nearest ``grid_sample`` of a 4-d or 5-d input (grid of x, y[, z]).

    Corners are weighted and summed in the order of torch's CPU kernel (top/bottom, then
    north/south, then west/east), each weight the product of its x, y (and z) factors. NaN and
    infinite coordinates give what those kernels give (NaN in 2-d with zeros padding, the clamped
    border otherwise).
    """
    n, c, *spatial = input.shape
    sizes = spatial[::-1]  # x indexes the last dimension
    volumetric = len(sizes) == 3
    nan_weights = not volumetric and padding_mode == "zeros"
    points = [_source_index(grid[..., i], sizes[i], padding_mode, align_corners, volumetric)
              for i in range(len(sizes))]
    batch = torch.arange(n, device=input.device).view(n, *([1] * (len(sizes) + 1)))
    channel = torch.arange(c, device=input.device).view(1, c, *([1] * len(sizes)))

    def gather(at: list[torch.Tensor], weight: torch.Tensor | float) -> torch.Tensor:
        inside = functools.reduce(operator.and_, ((p >= 0) & (p < size) for p, size in zip(at, sizes, strict=True)))
        index = [torch.where(inside, p, 0).to(torch.int64).unsqueeze(1) for p in at]
        # A corner outside adds nothing; 2-d's kernel still multiplies its zero by the weight, so
        # a NaN or infinite coordinate (a NaN weight) gives NaN there, as on the CPU.
        outside = weight * 0 if nan_weights and isinstance(weight, torch.Tensor) else 0
        weight = torch.where(inside, weight, outside).unsqueeze(1)
        return input[(batch, channel, *index[::-1])] * weight

    if mode == "nearest":
        return gather([p.round() for p in points], 1.0)
    corners = []
    for p in points:
        low = p.floor()
        corners.append(((low, low + 1 - p), (low + 1, p - low)))
    out = None
    for choice in itertools.product(*corners[::-1]):  # z (or y) outermost, x innermost
        at = [position for position, _ in choice[::-1]]
        weight = functools.reduce(operator.mul, [factor for _, factor in choice[::-1]])
        term = gather(at, weight)
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
    distances = pdist_forward(input, p)
    return _with_zero_gradient(distances, input) if p == 0 else distances


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,  # noqa: A002
                  size_average: bool | None = None, ignore_index: int = -100, reduce: bool | None = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy`` of one sample (a 1-D input) as a batch of one: torch's decomposition of
    the unbatched loss with class weights and label smoothing gave a 0-d index the shape ``[1]``
    where torch-mlir's ``where`` wanted it 0-d ("'chlo.broadcast_select' op inferred type(s)
    'tensor<i64>' are incompatible with ... 'tensor<1xi64>'")."""
    if input.dim() != 1:
        return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    loss = F.cross_entropy(input.unsqueeze(0), target.unsqueeze(0), weight, size_average, ignore_index, reduce,
                           reduction, label_smoothing)
    return loss.squeeze(0) if loss.dim() else loss


#: Functions of the Dynamo graph and their replacements.
SUBSTITUTES: dict[Callable, Callable] = {F.grid_sample: grid_sample, torch.pdist: pdist, F.one_hot: indexing.one_hot,
                                         F.cross_entropy: cross_entropy}


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


#: ``grid_sampler``'s integer modes and paddings by name.
MODE_NAMES = {index: name for name, index in F.GRID_SAMPLE_INTERPOLATION_MODES.items()}
PADDING_NAMES = {index: name for name, index in F.GRID_SAMPLE_PADDING_MODES.items()}


def _sampler_backward(forward: Callable, grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                      output_mask: list[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    grad_input, grad_grid = recurrent_layers.pullback(forward, (input, grid), grad_output)
    return (grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None)


def grid_sampler_2d_backward(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                             interpolation_mode: int, padding_mode: int, align_corners: bool,
                             output_mask: list[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``aten.grid_sampler_2d_backward`` (an eager op's backward on the device) as the pullback of
    :func:`grid_sample_nd` (bilinear, nearest) or torch's forward decomposition (bicubic)."""
    mode = MODE_NAMES.get(interpolation_mode)

    def forward(i: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if mode in ("bilinear", "nearest"):
            return grid_sample_nd(i, g, mode, PADDING_NAMES[padding_mode], align_corners)
        return torch_decompositions._grid_sampler_2d(i, g, interpolation_mode, padding_mode, align_corners)

    return _sampler_backward(forward, grad_output, input, grid, output_mask)


def grid_sampler_3d_backward(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                             interpolation_mode: int, padding_mode: int, align_corners: bool,
                             output_mask: list[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``aten.grid_sampler_3d_backward`` as the pullback of :func:`grid_sample_nd` (bilinear, nearest)."""
    mode = MODE_NAMES.get(interpolation_mode)
    if mode not in ("bilinear", "nearest"):
        return NotImplemented

    def forward(i: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return grid_sample_nd(i, g, mode, PADDING_NAMES[padding_mode], align_corners)

    return _sampler_backward(forward, grad_output, input, grid, output_mask)


def pdist_forward(input: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``aten._pdist_forward`` (``torch.pdist`` on the eager device): the p-norm distance of every
    row pair i < j, in torch's order."""
    n = input.shape[0]
    first, second = torch.triu_indices(n, n, 1, device=input.device)
    difference = input.index_select(0, first) - input.index_select(0, second)
    return torch.linalg.vector_norm(difference, ord=p, dim=1)


def pdist_backward(grad: torch.Tensor, input: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """``aten._pdist_backward`` as the pullback of :func:`pdist_forward` (zeros for ``p == 0``)."""
    return recurrent_layers.pullback(lambda x: pdist_forward(x, p), (input,), grad)[0]


#: Backwards of eager ops that have no lowering, as pullbacks of their differentiable compositions.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    torch.ops.aten.grid_sampler_2d_backward.default: grid_sampler_2d_backward,
    torch.ops.aten.grid_sampler_3d_backward.default: grid_sampler_3d_backward,
    torch.ops.aten._pdist_forward.default: pdist_forward,
    torch.ops.aten._pdist_backward.default: pdist_backward,
}
