"""``histogram`` and ``histogramdd`` as bin searches and an adding scatter.

torch-mlir lowers none of ``aten.histogram`` (``bin_ct``, ``bins_tensor``),
``aten._histogramdd_bin_edges``, ``aten._histogramdd_from_bin_cts`` and
``aten._histogramdd_from_bin_tensors``. Their shapes are static (the bin counts, or the bin
tensors' sizes); only the outer edges (the data's minimum and maximum when no ``range`` is
given) and each element's bin are data. As torch's CPU kernels (``ATen/native/Histogram.cpp``,
``cpu/HistogramKernel.cpp``):

- outer edges: ``range``, else the minimum and maximum of each dimension (0 and 1 for no
  data), widened by 0.5 each way where they are equal; bin edges ``linspace`` between them,
  computed as torch's CPU kernel does, each value one fused multiply-add from the nearer end
  (float32 through float64, rounded once: eager's bit for bit; float64 rounds twice), or by
  ``torch.linspace`` at trace time when ``range`` fixes them;
- an element's bin: with bin counts, ``(x - left) * bins / (right - left)`` truncated, then
  ``std::upper_bound`` over the three edges around it; with bin tensors, ``std::upper_bound``
  over all edges (both emulated step by step: log2 of the length gathers); elements outside
  the outer edges (and NaN) are skipped, the last bin holds its right edge;
- the histogram: ones (or the weights) added at each element's bin (skipped elements into a
  spare slot that is cut off); ``density`` divides by the total and by each bin's widths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from torch_neuronx.compiler.decompositions.literals import literal

aten = torch.ops.aten


def _linspace(start: torch.Tensor, end: torch.Tensor, steps: int) -> torch.Tensor:
    """``torch.linspace(start, end, steps)`` of 0-d tensors as torch's CPU kernel computes it:
    ``start + step * i`` below ``steps // 2``, ``end - step * (steps - 1 - i)`` from there on,
    each a fused multiply-add (float32 in float64: the product is exact, one rounding)."""
    dtype = start.dtype
    step = (end - start) / (steps - 1)
    wide = torch.float64 if dtype == torch.float32 else dtype
    start, end, step = start.to(wide), end.to(wide), step.to(wide)
    index = torch.arange(steps, device=start.device)
    low = start + step * index.to(wide)
    high = end - step * (steps - 1 - index).to(wide)
    return torch.where(index < steps // 2, low, high).to(dtype)


def _static_edges(bounds: tuple[float, float], bins: int, like: torch.Tensor) -> torch.Tensor:
    """Bin edges of a given ``range`` (widened where it is empty), by torch's own ``linspace``."""
    left, right = bounds
    if left == right:
        left, right = left - 0.5, right + 0.5
    return literal(lambda: torch.linspace(left, right, bins + 1, dtype=like.dtype), like.device)


def _bin_edges(x: torch.Tensor, bins: Sequence[int], bounds: Sequence[float] | None) -> list[torch.Tensor]:
    """Each dimension's bin edges for ``x`` of shape ``(M, N)``: ``bins[d] + 1`` of them
    between the outer edges (``bounds`` as pairs, else the data's extremes)."""
    if bounds is not None:
        return [_static_edges((bounds[2 * d], bounds[2 * d + 1]), b, x) for d, b in enumerate(bins)]
    if x.shape[0] == 0:
        lows = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
        highs = torch.ones_like(lows)
    else:
        lows, highs = torch.aminmax(x, dim=0)
    empty = lows == highs
    lows, highs = torch.where(empty, lows - 0.5, lows), torch.where(empty, highs + 0.5, highs)
    return [_linspace(lows[d], highs[d], b + 1) for d, b in enumerate(bins)]


def _upper_bound(edges: torch.Tensor, values: torch.Tensor, first: torch.Tensor, length: torch.Tensor,
                 longest: int) -> torch.Tensor:
    """``std::upper_bound(edges + first, edges + first + length, value) - edges`` per value, as
    libstdc++ bisects (``longest``: the largest ``length``, which bounds the steps)."""
    last = edges.shape[0] - 1
    for _ in range(longest.bit_length()):
        active = length > 0
        half = length // 2
        middle = first + half
        left = values < edges[middle.clamp(0, last)]
        first = torch.where(active & ~left, middle + 1, first)
        length = torch.where(active, torch.where(left, half, length - half - 1), length)
    return first


def _bins_of(values: torch.Tensor, edges: torch.Tensor, interpolate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(bin, inside) of each value: its bin's index (the last bin closed), and whether it lies
    within the outer edges (NaN does not)."""
    count = edges.shape[0]
    left, right = edges[0], edges[-1]
    inside = (values >= left) & (values <= right)
    zeros = torch.zeros_like(values, dtype=torch.int64)
    if interpolate:
        safe = torch.where(inside, values, left)
        guess = torch.trunc((safe - left) * (count - 1) / (right - left))
        guess = torch.where(guess.isfinite(), guess, 0).clamp(0, count - 1).to(torch.int64)
        first = (guess - 1).clamp(min=0)
        position = _upper_bound(edges, values, first, (guess + 2).clamp(max=count) - first, 3) - 1
    else:
        position = _upper_bound(edges, values, zeros, zeros + count, count) - 1
    position = torch.where(position == count - 1, position - 1, position)
    return position.clamp(0, max(count - 2, 0)), inside


def _histogram(x: torch.Tensor, weight: torch.Tensor | None, edges: Sequence[torch.Tensor], density: bool,
               interpolate: bool) -> torch.Tensor:
    """The histogram of ``x`` (shape ``(M, N)``) over the bins of ``edges`` (one tensor per
    dimension): an adding scatter of ones or ``weight`` (shape ``(M,)``)."""
    sizes = [e.shape[0] - 1 for e in edges]
    total = math.prod(sizes)
    flat = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    keep = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    for d, e in enumerate(edges):
        position, inside = _bins_of(x[:, d], e.to(x.dtype), interpolate)
        flat = flat * sizes[d] + position
        keep = keep & inside
    values = torch.ones_like(x[:, 0]) if weight is None else weight.reshape(-1).to(x.dtype)
    slots = torch.where(keep, flat, total)
    hist = torch.zeros(total + 1, dtype=x.dtype, device=x.device)
    hist = aten.index_put.default(hist, [slots], values, True)[:total].reshape(sizes)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * len(sizes)
            shape[d] = sizes[d]
            hist = hist / (e[1:] - e[:-1]).to(x.dtype).reshape(shape)
    return hist


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``(M, N)``: its last dimension the coordinates."""
    return x.reshape(-1, x.shape[-1])


def histogram_bin_ct(x: torch.Tensor, bins: int = 100, *, range: Sequence[float] | None = None,  # noqa: A002
                     weight: torch.Tensor | None = None, density: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.histogram.bin_ct``: ``bins`` equal bins over ``range`` (else the data's extent)."""
    x = x.reshape(-1, 1)
    edges = _bin_edges(x, [bins], range)
    return _histogram(x, weight, edges, density, True), edges[0]


def histogram_bins_tensor(x: torch.Tensor, bins: torch.Tensor, *, weight: torch.Tensor | None = None,
                          density: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.histogram.bins_tensor``: the bins between consecutive elements of ``bins``."""
    return _histogram(x.reshape(-1, 1), weight, [bins], density, False), bins.clone()


def histogramdd_bin_edges(x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,  # noqa: A002
                          weight: torch.Tensor | None = None, density: bool = False) -> list[torch.Tensor]:
    """``aten._histogramdd_bin_edges``: each dimension's edges, ``bins[d]`` equal bins."""
    return _bin_edges(_rows(x), bins, range)


def histogramdd_from_bin_cts(x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,  # noqa: A002
                             weight: torch.Tensor | None = None, density: bool = False) -> torch.Tensor:
    """``aten._histogramdd_from_bin_cts``: the histogram over ``bins[d]`` equal bins per dimension."""
    x = _rows(x)
    return _histogram(x, weight, _bin_edges(x, bins, range), density, True)


def histogramdd_from_bin_tensors(x: torch.Tensor, bins: Sequence[torch.Tensor], *,
                                 weight: torch.Tensor | None = None, density: bool = False) -> torch.Tensor:
    """``aten._histogramdd_from_bin_tensors``: the histogram over given edges per dimension."""
    return _histogram(_rows(x), weight, list(bins), density, False)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.histogram.bin_ct: histogram_bin_ct,
    aten.histogram.bins_tensor: histogram_bins_tensor,
    aten._histogramdd_bin_edges.default: histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: histogramdd_from_bin_cts,
    aten._histogramdd_from_bin_tensors.default: histogramdd_from_bin_tensors,
}
