"""3-d, adaptive and 2-d pooling (max pooling's backwards: :mod:`.max_pool_backward`), through ops torch-mlir lowers.

torch-mlir lowers none of the 3-d pooling ops (nor ``adaptive_max_pool2d``'s backward), lowers
``avg_pool3d`` with ``ceil_mode`` to a mis-sized ``reduce_window``, and its 2-d max pooling
(``max_pool2d_with_indices``, ``adaptive_max_pool2d``) drops NaN. Every op here but strided
max pooling works one spatial dim at a time (pooling windows are products of per-dim windows),
in ops that fuse:

- Average pooling: along each dim, the sum of one strided slice of the zero-padded input per
  kernel offset; then one division by torch's divisor (``count_include_pad``, clipped
  ``ceil_mode`` windows and ``divisor_override`` as torch counts them). Its backward divides the
  gradient the same way and spreads it back along each dim (zeros inserted between outputs for
  the stride, one shifted copy per kernel offset). Adaptive average pooling treats evenly
  divided dims the same way; along the others, a gather of every window's elements and a
  product with a literal table of weights (1/count), summed; its backward likewise.
- Max pooling: torch scans a window in row-major order and keeps an element when ``val > max
  or isnan(val)``: the first maximum, or the last NaN. That rule picks the same element whether
  applied to a whole window or to its rows and then to the rows' winners, so the maximum is
  taken one dim at a time, innermost first, each partial maximum carrying its flat index into
  the pooled plane: exactly torch's values and indices, ties and NaN included. That is how
  adaptive windows are pooled: equal consecutive blocks once each input position is repeated
  (see :func:`_max_pool`), reduced by reshaping. Strided windows are scanned as torch scans
  them, all kernel offsets at once, one strided slice of the input each (:func:`_max_windows`;
  one dim at a time put IREE's fused intermediates on the stack).
  The backwards route the gradient to the indices without a scatter (:mod:`.max_pool_backward`).

Index arithmetic that depends only on shapes is done in Python and enters the graph as literals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from torch_neuronx.compiler.decompositions.average_pooling import avg_pool_divisors
from torch_neuronx.compiler.decompositions.literals import literal
from torch_neuronx.compiler.decompositions.precision import NARROW

aten = torch.ops.aten


def _expand(value: int | Sequence[int], n: int, default: Sequence[int] | None = None) -> tuple[int, ...]:
    """An ``int[n]`` argument as a tuple of ``n`` ints (a single value repeats; empty means ``default``)."""
    if isinstance(value, int):
        return (value,) * n
    if len(value) == 0 and default is not None:
        return tuple(default)
    if len(value) == 1:
        return (int(value[0]),) * n
    return tuple(int(v) for v in value)


def _pool_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """Output length along one dim, as torch's ``pooling_output_shape`` computes it."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def adaptive_sizes(output_size: Sequence[int | None], x_shape: Sequence[int], nd: int) -> tuple[int, ...]:
    """An adaptive op's output size (``None`` keeps the input's size)."""
    sizes = list(output_size) if len(output_size) == nd else [output_size[0]] * nd
    return tuple(int(o) if o is not None else int(n) for o, n in zip(sizes, x_shape[-nd:]))


def adaptive_bounds(out: int, size: int) -> list[tuple[int, int]]:
    """Adaptive pooling's windows along one dim: ``floor(i*size/out)`` .. ``ceil((i+1)*size/out)``."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


class Strided(NamedTuple):
    """Windows along one dim: window ``i`` covers ``i*stride - pad + j*dilation`` for ``j`` in
    ``range(kernel)``, those inside the input."""

    out: int
    kernel: int
    stride: int
    pad: int = 0
    dilation: int = 1


class Adaptive(NamedTuple):
    """Adaptive pooling's windows along one dim (see :func:`adaptive_bounds`)."""

    out: int


def _literal(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``data`` as a constant of the traced graph (see :mod:`.literals`)."""
    return literal(lambda: torch.tensor(data, dtype=dtype), device)


def _along(n: int, t: torch.Tensor, d: int) -> list[int]:
    """The shape that lays a length-``n`` vector along dim ``d`` of ``t`` (broadcast over later dims)."""
    return [n] + [1] * (t.dim() - 1 - d)


# --------------------------------------------------------------------------- average pooling


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types average in float32, as torch's CPU kernels accumulate."""
    return torch.promote_types(dtype, torch.float32)


def _sum_windows(t: torch.Tensor, d: int, w: Strided) -> torch.Tensor:
    """Along dim ``d``: each window's sum (padding counts as zeros; no dilation)."""
    size = t.shape[d]
    right = max(0, (w.out - 1) * w.stride + w.kernel - w.pad - size)
    if w.pad or right:
        t = torch.constant_pad_nd(t, [0, 0] * (t.dim() - 1 - d) + [w.pad, right], 0.0)
    span = (w.out - 1) * w.stride + 1
    total = None
    for j in range(w.kernel):
        part = aten.slice.Tensor(t, d, j, j + span, w.stride)
        total = part if total is None else total + part
    return total


def _spread_windows(t: torch.Tensor, d: int, w: Strided, size: int) -> torch.Tensor:
    """The transpose of :func:`_sum_windows`: along dim ``d``, each window's value added to
    every input position the window covers (``size`` of them in all)."""
    if w.stride > 1:  # output i to position i*stride, zeros between
        gaps = list(t.shape)
        gaps.insert(d + 1, w.stride - 1)
        t = torch.cat([t.unsqueeze(d + 1), t.new_zeros(gaps)], d + 1).flatten(d, d + 1)
    # t[m] now belongs at padded position m + j for each kernel offset j; input position x is
    # padded position x + pad. With k - 1 zeros in front, x's share from offset j is at x + pad - j + k - 1.
    right = max(0, w.pad + size - t.shape[d])
    t = torch.constant_pad_nd(t, [0, 0] * (t.dim() - 1 - d) + [w.kernel - 1, right], 0.0)
    total = None
    for j in range(w.kernel):
        part = t.narrow(d, w.pad - j + w.kernel - 1, size)
        total = part if total is None else total + part
    return total


def _avg_pool_divisor(x: torch.Tensor, sizes: Sequence[int], windows: Sequence[Strided], include_pad: bool,
                      dtype: torch.dtype) -> torch.Tensor:
    """torch's divisor for each output of an average pooling over ``x``'s last dims: the product
    of each dim's count, the padded extent with ``include_pad``, else only inside the input."""
    divisor = None
    for axis, (size, w) in enumerate(zip(sizes, windows)):
        count = avg_pool_divisors(w.out, size, w.kernel, w.stride, w.pad, include_pad, x.device)
        count = count.view([w.out] + [1] * (len(windows) - 1 - axis))
        divisor = count if divisor is None else divisor * count
    return divisor.to(dtype)


def _avg_pool_windows(x_shape: Sequence[int], kernel_size, stride, padding, ceil_mode: bool,
                      nd: int) -> list[Strided]:
    """avg_pool's windows along each of the last ``nd`` dims."""
    kernel = _expand(kernel_size, nd)
    strides = _expand(stride, nd, kernel)
    pads = _expand(padding, nd)
    return [Strided(_pool_out_size(n, k, s, p, 1, ceil_mode), k, s, p)
            for n, k, s, p in zip(x_shape[-nd:], kernel, strides, pads)]


def avg_pool3d(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> torch.Tensor:
    """``aten.avg_pool3d`` (every mode): window sums one dim at a time, divided as torch divides."""
    windows = _avg_pool_windows(x.shape, kernel_size, stride, padding, ceil_mode, 3)
    dtype = compute_dtype(x.dtype)
    t = x.to(dtype)
    for axis, w in enumerate(windows):
        t = _sum_windows(t, t.dim() - 3 + axis, w)
    if divisor_override:
        return (t / divisor_override).to(x.dtype)
    return (t / _avg_pool_divisor(x, x.shape[-3:], windows, count_include_pad, dtype)).to(x.dtype)


def avg_pool3d_backward(grad_output: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], ceil_mode: bool,
                        count_include_pad: bool, divisor_override: int | None = None) -> torch.Tensor:
    """``aten.avg_pool3d_backward``: each window's share of the gradient (divided as the forward
    divides) spread back over the window, one dim at a time."""
    windows = _avg_pool_windows(x.shape, kernel_size, stride, padding, ceil_mode, 3)
    dtype = compute_dtype(grad_output.dtype)
    g = grad_output.to(dtype)
    if divisor_override:
        g = g / divisor_override
    else:
        g = g / _avg_pool_divisor(x, x.shape[-3:], windows, count_include_pad, dtype)
    for axis, w in enumerate(windows):
        d = g.dim() - 3 + axis
        g = _spread_windows(g, d, w, x.shape[d])
    return g.to(x.dtype)


def _gathered_sum(t: torch.Tensor, d: int, rows: list[list[tuple[int, float]]]) -> torch.Tensor:
    """Along dim ``d``: output ``r`` is the sum of ``weight * t[position]`` over ``rows[r]``'s
    (position, weight) pairs: one gather into [..., rows, widest, ...], a product with a literal
    table of weights (0 where a row is shorter) and a sum over the row axis."""
    widest = max(len(row) for row in rows)
    positions = [q for row in rows for q, _ in row + [(row[0][0], 0.0)] * (widest - len(row))]
    weights = [[w for _, w in row] + [0.0] * (widest - len(row)) for row in rows]
    gathered = t.index_select(d, _literal(positions, torch.int64, t.device)).unflatten(d, (len(rows), widest))
    weight = _literal(weights, t.dtype, t.device).view([len(rows)] + _along(widest, t, d))
    return (gathered * weight).sum(d + 1)


def _adaptive_average(t: torch.Tensor, out_shape: Sequence[int], in_shape: Sequence[int],
                      backward: bool) -> torch.Tensor:
    """Adaptive average pooling of ``t``'s last dims (``in_shape`` to ``out_shape``), or its
    transpose with ``backward``: strided window sums where the output divides a dim evenly,
    gathered weighted sums along the others."""
    nd = len(out_shape)
    for axis, (o, n) in enumerate(zip(out_shape, in_shape)):
        d = t.dim() - nd + axis
        if n % o == 0:
            w = Strided(o, n // o, n // o)
            t = (_spread_windows(t, d, w, n) if backward else _sum_windows(t, d, w)) / (n // o)
            continue
        bounds = adaptive_bounds(o, n)
        if backward:  # input position x: the windows that cover it
            rows = [[(i, 1.0 / (end - start)) for i, (start, end) in enumerate(bounds) if start <= x < end]
                    for x in range(n)]
        else:
            rows = [[(x, 1.0 / (end - start)) for x in range(start, end)] for start, end in bounds]
        t = _gathered_sum(t, d, rows)
    return t


def adaptive_avg_pool3d(x: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor:
    """``aten._adaptive_avg_pool3d``: window averages one dim at a time."""
    out = adaptive_sizes(output_size, x.shape, 3)
    return _adaptive_average(x.to(compute_dtype(x.dtype)), out, x.shape[-3:], False).to(x.dtype)


def adaptive_avg_pool3d_backward(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``aten._adaptive_avg_pool3d_backward``: the gradient through the transposed averages."""
    g = grad_output.to(compute_dtype(grad_output.dtype))
    return _adaptive_average(g, grad_output.shape[-3:], x.shape[-3:], True).to(x.dtype)


# --------------------------------------------------------------------------- max pooling


def _lowest(dtype: torch.dtype) -> float | int:
    """The value no element of ``dtype`` is below."""
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_windows(x: torch.Tensor, windows: Sequence[Strided]) -> tuple[torch.Tensor, torch.Tensor]:
    """Max pooling over strided windows of ``x``'s last dims, as torch's kernels scan: every
    kernel offset in row-major order, one strided slice of the (padded) input each, kept where
    it is above the maximum so far or NaN, never from the padding. A window whose elements are
    all -inf (or the lowest integer) keeps its first element inside the input.

    All offsets at once, not one dim at a time: a dim's partial maxima and indices, read by the
    next dim through overlapping slices, were fused by IREE into the next dim's dispatch and
    materialized whole on its stack (max_pool2d(x, 3, 2) of a 16x32x32x32 input needed 1.9 MB,
    over llvm-cpu's 32 KiB limit). Here each dispatch reads only the input (or its padded copy)."""
    nd, device = len(windows), x.device
    sizes = [int(n) for n in x.shape[-nd:]]
    lead = x.dim() - nd
    pad = []
    for w, size in zip(reversed(windows), reversed(sizes)):
        pad += [w.pad, max(0, (w.out - 1) * w.stride + (w.kernel - 1) * w.dilation + 1 - w.pad - size)]
    if any(pad):
        x = torch.constant_pad_nd(x, pad, _lowest(x.dtype))

    def along(axis: int, data: list, dtype: torch.dtype) -> torch.Tensor:
        return _literal(data, dtype, device).view([len(data)] + [1] * (nd - 1 - axis))

    def position(axis: int, o: int, j: int) -> int:
        w = windows[axis]
        return o * w.stride - w.pad + j * w.dilation

    pitches = [math.prod(sizes[axis + 1:]) for axis in range(nd)]
    first = None  # each window's first element inside the input: the index of an all -inf window
    for axis, w in enumerate(windows):
        starts = [next(p for j in range(w.kernel) if 0 <= (p := position(axis, o, j)) < sizes[axis]) * pitches[axis]
                  for o in range(w.out)]
        share = along(axis, starts, torch.int64)
        first = share if first is None else first + share
    best, best_index = None, first
    for offsets in itertools.product(*(range(w.kernel) for w in windows)):  # row-major, as torch scans
        candidate, index, inside = x, None, None
        for axis, (w, j) in enumerate(zip(windows, offsets)):
            lo = j * w.dilation
            candidate = aten.slice.Tensor(candidate, lead + axis, lo, lo + (w.out - 1) * w.stride + 1, w.stride)
            where = [position(axis, o, j) for o in range(w.out)]
            share = along(axis, [max(0, p) * pitches[axis] for p in where], torch.int64)
            index = share if index is None else index + share
            valid = [0 <= p < sizes[axis] for p in where]
            if not all(valid):
                mask = along(axis, valid, torch.bool)
                inside = mask if inside is None else inside & mask
        take = candidate > (best if best is not None else _lowest(x.dtype))
        if x.is_floating_point():
            take = take | candidate.isnan()
        if inside is not None:
            take = take & inside
        best = torch.where(take, candidate, best if best is not None else _lowest(x.dtype))
        best_index = torch.where(take, index, best_index)
    return best, best_index.expand(best.shape)


def _max_blocks(values: torch.Tensor, index: torch.Tensor, d: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One dim of max pooling over ``out`` windows that split dim ``d`` into equal consecutive
    blocks: a reshape to [..., out, block, ...] and reductions over the block axis, for any block size."""
    block = values.shape[d] // out
    dtype = values.dtype
    if dtype in NARROW:  # compared in float32 (see sorting._extreme_index)
        values = values.float()
    values = values.unflatten(d, (out, block))
    index = index.unflatten(d, (out, block))
    j = _literal(list(range(block)), torch.int64, values.device).view(_along(block, values, d + 1))
    top = values
    if values.is_floating_point():
        nan = values.isnan()
        top = torch.where(nan, _lowest(values.dtype), values)
    top = top.amax(d + 1, keepdim=True)
    # Each element's claim, the highest winning (claims are distinct within a block): a NaN's,
    # the later the higher; else one equal to the maximum (-inf included), the earlier the higher.
    claim = torch.where(values == top, block - 1 - j, -1)
    if values.is_floating_point():
        claim = torch.where(nan, block + j, claim)
    winner = claim.amax(d + 1, keepdim=True)
    best = torch.where(winner >= block, math.nan, top) if values.is_floating_point() else top
    best_index = torch.where(claim == winner, index, -1).amax(d + 1, keepdim=True)
    return best.squeeze(d + 1).to(dtype), best_index.squeeze(d + 1)


def _repeat_each(t: torch.Tensor, d: int, times: int) -> torch.Tensor:
    """``t`` with each position along dim ``d`` repeated ``times`` times in place."""
    shape = list(t.shape)
    shape.insert(d + 1, times)
    return t.unsqueeze(d + 1).expand(shape).flatten(d, d + 1)


def _side_by_side(w: Strided | Adaptive) -> bool:
    """Whether strided windows tile their dim (kernel == stride, no dilation or padding)."""
    return isinstance(w, Strided) and w.kernel == w.stride and w.dilation == 1 and w.pad == 0


def _max_pool(x: torch.Tensor, windows: Sequence[Strided] | Sequence[Adaptive]) -> tuple[torch.Tensor, torch.Tensor]:
    """Max over windows of ``x``'s last ``len(windows)`` dims, and each maximum's flat index into
    those dims (per leading plane), chosen as torch chooses.

    Overlapping or padded strided windows: every kernel offset at once (:func:`_max_windows`).
    Adaptive windows, and strided windows side by side (``MaxPool2d(2)``, a global max pooling
    whose kernel is the whole input): one dim at a time, innermost first, each partial maximum
    carrying its flat index along (see the module's docstring for why that picks torch's
    element), by reshaping into blocks. Along a dim of ``n`` to ``o`` adaptive outputs
    (``g = gcd(n, o)``) the windows are, once each position is repeated ``o/g`` times, the
    ``o`` consecutive blocks of ``n/g`` repeated positions: the same elements in the same order,
    some repeated, which changes neither the maximum nor the element torch picks. Side by side
    windows are the blocks once the dim is cut (or, for ceil_mode, padded) to ``out * kernel``."""
    if all(isinstance(w, Strided) for w in windows) and not all(_side_by_side(w) for w in windows):
        return _max_windows(x, windows)
    nd = len(windows)
    sizes = x.shape[-nd:]
    values, index = x, None
    for axis in reversed(range(nd)):
        d, size, w = x.dim() - nd + axis, sizes[axis], windows[axis]
        here = _literal([p * math.prod(sizes[axis + 1:]) for p in range(size)], torch.int64, x.device)
        here = here.view([1] * d + _along(size, values, d))
        index = (here if index is None else index + here).expand(values.shape)
        if isinstance(w, Strided):
            span = w.out * w.kernel
            if span < size:
                values, index = values.narrow(d, 0, span), index.narrow(d, 0, span)
            elif span > size:  # ceil_mode's last window: padding, never the maximum unless all is -inf
                pad = [0, 0] * (values.dim() - 1 - d) + [0, span - size]
                values = torch.constant_pad_nd(values, pad, _lowest(values.dtype))
                index = torch.constant_pad_nd(index, pad, 0)
        else:
            times = w.out // math.gcd(size, w.out)
            if times > 1:
                values, index = _repeat_each(values, d, times), _repeat_each(index, d, times)
        values, index = _max_blocks(values, index, d, w.out)
    return values, index


def max_pool_windows(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding,
                      dilation, ceil_mode: bool, nd: int) -> list[Strided]:
    """max_pool's windows along each of the last ``nd`` dims."""
    kernel = _expand(kernel_size, nd)
    strides = _expand(stride, nd, kernel)
    pads, dilations = _expand(padding, nd), _expand(dilation, nd)
    return [Strided(_pool_out_size(n, k, s, p, d, ceil_mode), k, s, p, d)
            for n, k, s, p, d in zip(x.shape[-nd:], kernel, strides, pads, dilations)]


def max_pool2d_with_indices(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                            ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.max_pool2d_with_indices`` (and so max_pool1d): separable window maxima with torch's
    indices. torch-mlir's lowering drops NaN (a window holding one gets a number, and that
    number's index)."""
    return _max_pool(x, max_pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, 2))


def max_pool3d_with_indices(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                            ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.max_pool3d_with_indices``: separable window maxima with torch's indices."""
    return _max_pool(x, max_pool_windows(x, kernel_size, stride, padding, dilation, ceil_mode, 3))


def adaptive_max_pool2d(x: torch.Tensor, output_size: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.adaptive_max_pool2d`` (and so adaptive_max_pool1d): maxima over adaptive windows, torch's indices."""
    return _max_pool(x, [Adaptive(o) for o in adaptive_sizes(output_size, x.shape, 2)])


def adaptive_max_pool3d(x: torch.Tensor, output_size: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.adaptive_max_pool3d``: maxima over adaptive windows, with torch's indices."""
    return _max_pool(x, [Adaptive(o) for o in adaptive_sizes(output_size, x.shape, 3)])


#: This module's decompositions, merged into the compile path's table.
def _checked_unpool(op: torch._ops.OpOverload) -> Callable:
    """``op`` (``max_unpool2d``/``3d``) as torch decomposes it, its indices checked against the output
    volume first: a negative index wrapped (written to the last pixel) where torch raises "Found an
    invalid max index", and one past the end raised ``index_put``'s message."""
    from torch._decomp import decomposition_table

    from torch_neuronx.compiler.decompositions.indexing import BOUNDS

    def decomposition(x: torch.Tensor, indices: torch.Tensor, output_size: Sequence[int], *rest: object):
        volume = "x".join(str(n) for n in output_size)
        checked = BOUNDS(indices, math.prod(output_size), False, str(op), f"max_unpool:{volume}")
        return decomposition_table[op](x, checked, output_size, *rest)

    return decomposition


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.max_unpool2d.default: _checked_unpool(aten.max_unpool2d.default),
    aten.max_unpool3d.default: _checked_unpool(aten.max_unpool3d.default),
    aten.max_pool2d_with_indices.default: max_pool2d_with_indices,
    aten.max_pool3d_with_indices.default: max_pool3d_with_indices,
    aten.avg_pool3d.default: avg_pool3d,
    aten.avg_pool3d_backward.default: avg_pool3d_backward,
    aten._adaptive_avg_pool3d.default: adaptive_avg_pool3d,
    aten._adaptive_avg_pool3d_backward.default: adaptive_avg_pool3d_backward,
    aten.adaptive_max_pool2d.default: adaptive_max_pool2d,
    aten.adaptive_max_pool3d.default: adaptive_max_pool3d,
}
