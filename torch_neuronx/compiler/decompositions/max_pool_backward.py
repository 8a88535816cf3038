"""Max pooling's backwards (1-d to 3-d, strided and adaptive) without a scatter.

A max pooling's input gradient adds each output's gradient at the flat index of its maximum.
Written as a scatter-add, that is one ``stablehlo.scatter`` whose updates are scalars: IREE
cannot split it across threads (two updates may hit one element), so its dispatch is a
single serial loop, and at O3 IREE fuses the scatter's elementwise producers (the gradient
arriving from a residual add, the indices' conversion, recomputed index selects) into that
dispatch, where codegen materializes each of them whole in a stack buffer. A ResNet stem's
4x16x8x8 pooling gradient already needs 48 KiB there, over llvm-cpu's 32 KiB stack limit
(``'func.func' op exceeded stack allocation limit``); 8x64x32x32 needed megabytes.

Here each input position gathers instead: it receives the gradient of every window whose
index is its own flat index. An index always lies in its window, so comparing it is enough:
any superset of the windows that cover a position may be offered, and a window that does
not cover it never matches. Along a dim of strided windows, position ``x`` with
``x + pad = q * stride + r`` is covered only by windows ``q - m`` for ``m`` up to
``(kernel - 1) * dilation // stride``; so the (padded) input dim is laid out as ``[q, r]``
blocks and each ``m`` offers the outputs shifted by ``m`` along that dim, broadcast over
``r``. Along a dim of adaptive windows that do not divide it, each position gathers the
(few, consecutive) windows that cover it, padded with an entry that never matches. The
comparisons and selects are elementwise over the input, a sum of one term per combination
of shifts: one fused, tiled dispatch fed by output-sized pads and gathers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
from torch._prims_common import suggest_memory_format

from torch_neuronx.compiler.decompositions.literals import literal
from torch_neuronx.compiler.decompositions.pooling import (
    Adaptive,
    Strided,
    adaptive_bounds,
    adaptive_sizes,
    compute_dtype,
    max_pool_windows,
)

aten = torch.ops.aten

# A target no index equals, whatever the other dims' shares add to it: it marks the padded
# positions of the block layout, which are cut off at the end.
_NOWHERE = -(1 << 40)


class _Blocks:
    """A dim of strided windows laid out in ``[q, r]`` blocks of ``stride`` positions."""

    def __init__(self, w: Strided, size: int) -> None:
        self.w, self.size = w, size
        self.blocks = -(-(size + w.pad) // w.stride)
        self.shifts = (w.kernel - 1) * w.dilation // w.stride + 1

    def targets(self, pitch: int) -> list[list[int]]:
        """Each block position's share of the flat index (``_NOWHERE`` outside the input)."""
        s, pad = self.w.stride, self.w.pad
        return [[(x * pitch if 0 <= (x := q * s + r - pad) < self.size else _NOWHERE) for r in range(s)]
                for q in range(self.blocks)]


class _Covers:
    """A dim of adaptive windows: each position's covering windows, padded with ``out`` (a never-matching entry)."""

    def __init__(self, w: Adaptive, size: int) -> None:
        self.w, self.size = w, size
        covers = [[o for o, (start, end) in enumerate(adaptive_bounds(w.out, size)) if start <= x < end]
                  for x in range(size)]
        self.widest = max(len(c) for c in covers)
        self.order = [o for c in covers for o in c + [w.out] * (self.widest - len(c))]


def _layout(w: Strided | Adaptive, size: int) -> _Blocks | _Covers:
    """How one dim offers its windows: in blocks for strided (and evenly dividing adaptive)
    windows, else by gathering."""
    if isinstance(w, Adaptive) and size % w.out == 0:
        w = Strided(w.out, size // w.out, size // w.out)
    return _Blocks(w, size) if isinstance(w, Strided) else _Covers(w, size)


def _gather_covers(t: torch.Tensor, d: int, dim: _Covers, fill: int) -> torch.Tensor:
    """Along dim ``d`` (outputs): each input position's covering windows, as dims ``[size, widest]``."""
    extra = list(t.shape)
    extra[d] = 1
    t = torch.cat([t, torch.full(extra, fill, dtype=t.dtype, device=t.device)], d)
    order = literal(lambda: torch.tensor(dim.order, dtype=torch.int64), t.device)
    return t.index_select(d, order).unflatten(d, (dim.size, dim.widest))


def _pad_for_shifts(t: torch.Tensor, blocks: Sequence[tuple[int, _Blocks]], fill: int) -> torch.Tensor:
    """``t`` padded with ``fill`` along each block dim ``d`` of ``(d, dim)``: ``shifts - 1`` in
    front and up to ``blocks`` behind, so that every shift is one slice (which fuses)."""
    pad = [0, 0] * t.dim()
    for d, dim in blocks:
        back = 2 * (t.dim() - 1 - d)
        pad[back:back + 2] = [dim.shifts - 1, max(0, dim.blocks - t.shape[d])]
    return torch.constant_pad_nd(t, pad, fill) if any(pad) else t


def _shifted(t: torch.Tensor, blocks: Sequence[tuple[int, _Blocks]], combo: Sequence[int]) -> torch.Tensor:
    """The slice of padded ``t`` (:func:`_pad_for_shifts`) whose position ``q`` holds output ``q - m``
    along each block dim, for the ``m`` of ``combo``."""
    for (d, dim), m in zip(blocks, combo):
        t = t.narrow(d, dim.shifts - 1 - m, dim.blocks)
    return t


def route_to_indices(grad_output: torch.Tensor, x: torch.Tensor, indices: torch.Tensor,
                     windows: Sequence[Strided | Adaptive]) -> torch.Tensor:
    """Max pooling's input gradient: each output's gradient added at its flat index into the
    last ``len(windows)`` dims of ``x`` (overlapping windows accumulate), with no scatter."""
    nd = len(windows)
    sizes = [int(s) for s in x.shape[-nd:]]
    dims = [_layout(w, n) for w, n in zip(windows, sizes)]
    lead = grad_output.dim() - nd
    g = grad_output.to(compute_dtype(grad_output.dtype))
    idx = indices
    # Gathered dims first: output dim k becomes [size, widest]; block dims stay one dim each.
    for axis in reversed(range(nd)):
        if isinstance(dims[axis], _Covers):
            d = lead + axis
            g, idx = _gather_covers(g, d, dims[axis], 0), _gather_covers(idx, d, dims[axis], -1)
    # Where each dim sits now, and the broadcast target: [blocks, stride] or [size, 1] per dim.
    positions, spot, target = [], lead, None
    for axis, dim in enumerate(dims):
        positions.append(spot)
        spot += 2 if isinstance(dim, _Covers) else 1
        pitch = math.prod(sizes[axis + 1:])
        table = dim.targets(pitch) if isinstance(dim, _Blocks) else [[p * pitch] for p in range(dim.size)]
        share = literal(lambda t=table: torch.tensor(t, dtype=torch.int64), x.device)
        share = share.view([1] * (2 * axis) + list(share.shape) + [1] * (2 * (nd - 1 - axis)))
        target = share if target is None else target + share
    spread = list(g.shape[:lead])
    for axis, dim in enumerate(dims):  # a unit r dim after each block dim
        d = positions[axis]
        spread += [g.shape[d], g.shape[d + 1]] if isinstance(dim, _Covers) else [dim.blocks, 1]
    blocks = [(positions[axis], dim) for axis, dim in enumerate(dims) if isinstance(dim, _Blocks)]
    g, idx = _pad_for_shifts(g, blocks, 0), _pad_for_shifts(idx, blocks, -1)
    total = None
    for combo in itertools.product(*(range(min(dim.shifts, dim.blocks)) for _, dim in blocks)):
        term = torch.where(_shifted(idx, blocks, combo).reshape(spread) == target,
                           _shifted(g, blocks, combo).reshape(spread), 0)
        total = term if total is None else total + term
    covers = [lead + 2 * axis + 1 for axis in range(nd) if isinstance(dims[axis], _Covers)]
    if covers:
        total = total.sum(covers, keepdim=True)
    total = total.reshape(list(total.shape[:lead]) + [total.shape[lead + 2 * a] * total.shape[lead + 2 * a + 1]
                                                      for a in range(nd)])
    for axis, dim in enumerate(dims):
        if isinstance(dim, _Blocks) and (dim.w.pad or total.shape[lead + axis] > dim.size):
            total = total.narrow(lead + axis, dim.w.pad, dim.size)
    total = total.to(grad_output.dtype)
    return total.contiguous(memory_format=suggest_memory_format(x)) if x.dim() in (4, 5) else total


def max_pool2d_with_indices_backward(grad_output: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                                     ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    """``aten.max_pool2d_with_indices_backward`` (and max_pool1d's): the gradient routed to the maxima."""
    return route_to_indices(grad_output, x, indices,
                            max_pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, 2))


def max_pool3d_with_indices_backward(grad_output: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                                     ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    """``aten.max_pool3d_with_indices_backward``: the gradient routed to the maxima."""
    return route_to_indices(grad_output, x, indices,
                            max_pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, 3))


def adaptive_max_pool2d_backward(grad_output: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``aten.adaptive_max_pool2d_backward`` (and adaptive_max_pool1d's): the gradient routed to the maxima."""
    sizes = adaptive_sizes(grad_output.shape[-2:], x.shape, 2)
    return route_to_indices(grad_output, x, indices, [Adaptive(o) for o in sizes])


def adaptive_max_pool3d_backward(grad_output: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``aten.adaptive_max_pool3d_backward``: the gradient routed to the maxima."""
    sizes = adaptive_sizes(grad_output.shape[-3:], x.shape, 3)
    return route_to_indices(grad_output, x, indices, [Adaptive(o) for o in sizes])


#: This module's decompositions, merged into the compile path's table after :mod:`.pooling`'s
#: (and so over torch's scatter-add decomposition of max_pool2d_with_indices_backward).
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.max_pool2d_with_indices_backward.default: max_pool2d_with_indices_backward,
    aten.max_pool3d_with_indices_backward.default: max_pool3d_with_indices_backward,
    aten.adaptive_max_pool2d_backward.default: adaptive_max_pool2d_backward,
    aten.adaptive_max_pool3d_backward.default: adaptive_max_pool3d_backward,
}
