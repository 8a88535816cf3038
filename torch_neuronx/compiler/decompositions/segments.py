"""``segment_reduce`` (``torch.segment_reduce``, lengths or offsets) as a segmented scan.

torch-mlir does not lower ``aten.segment_reduce``. Its output shape is static (the data's
with ``axis`` sized by the segment count, ``lengths.shape[-1]`` or ``offsets.shape[-1] - 1``),
only the segments' bounds are data. Along ``axis`` the segments are consecutive runs, so no
sort is needed: run starts are flagged by scattering every segment's start and end, a
segmented doubling scan (:func:`.scatter.segment_last`, log2 n static steps) reduces each
run, and each non-empty segment's result is gathered at its last position.

As torch's CPU kernel (``ATen/native/cpu/SegmentReduce.cpp``): ``initial`` (else the
reduction's identity: -inf for max, inf for min, 0 for sum and mean, 1 for prod) is folded
into every segment and is the value of an empty one, except for mean without ``initial``,
NaN there; mean divides by the segment's length; a NaN in a segment makes its max or min
NaN. With ``unsafe=False`` torch's checks of the segments (none negative; lengths summing to
the axis' size in each row) are made on the host after the call (:data:`.indexing.BOUNDS` on
a code).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.indexing import checked
from torch_neuronx.compiler.decompositions.scatter import segment_last

aten = torch.ops.aten

_INF = float("inf")

#: Per reduction: how two partial results combine, and the identity an empty segment starts from.
_REDUCTIONS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], float]] = {
    "max": (torch.maximum, -_INF),  # NaN propagates, as in torch's kernel
    "min": (torch.minimum, _INF),
    "sum": (torch.add, 0.0),
    "mean": (torch.add, 0.0),
    "prod": (torch.mul, 1.0),
}


def _bounds(lengths: torch.Tensor | None, offsets: torch.Tensor | None,
            outer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) of every segment, int64 of shape ``(outer, segments)``."""
    if lengths is not None:
        lengths = lengths.to(torch.int64).reshape(outer, -1)
        ends = torch.cumsum(lengths, -1)
        return ends - lengths, ends
    offsets = offsets.to(torch.int64).reshape(outer, -1)
    return offsets[:, :-1], offsets[:, 1:]


def _checked(starts: torch.Tensor, ends: torch.Tensor, size: int,
             from_lengths: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(starts, ends)`` with torch's checks made on a code (``indexing.checked``). From lengths: 1
    when one is negative, 2 when a row's do not sum to ``size``; from offsets (torch checks no
    sum there): 4 when they decrease. Bad lengths gave made-up segments where torch raises."""
    if not starts.numel():
        return starts, ends
    negative = (ends < starts).any().to(torch.int64)
    if from_lengths:
        code = negative + 2 * (ends[:, -1] != size).any().to(torch.int64)
    else:
        code = 4 * negative
    return checked(starts, code, "segment_reduce", "segment_reduce"), ends


def _run_starts(starts: torch.Tensor, ends: torch.Tensor, size: int) -> torch.Tensor:
    """``(outer * size,)`` flags: true where a row begins, a segment begins, or one ends."""
    outer = starts.shape[0]
    rows = torch.arange(outer, device=starts.device).unsqueeze(1).expand(starts.shape)
    # Scattered into zeros, the row starts or-ed in after: two scatters into one in-graph
    # non-splat constant (such as the row-start mask) compile wrongly (the first one's result
    # reads as all false), into a splat one they do not.
    flags = torch.zeros(outer, size + 1, dtype=torch.bool, device=starts.device)
    true = torch.ones((), dtype=torch.bool, device=starts.device)
    for bound in (starts, ends):
        flags = aten.index_put.default(flags, [rows.flatten(), bound.clamp(0, size).flatten()], true)
    row_starts = torch.arange(size, device=starts.device) == 0
    return (flags[:, :size] | row_starts).flatten()


def segment_reduce(data: torch.Tensor, reduce: str, *, lengths: torch.Tensor | None = None,
                   indices: torch.Tensor | None = None, offsets: torch.Tensor | None = None, axis: int = 0,
                   unsafe: bool = False, initial: float | None = None) -> torch.Tensor:
    """``aten.segment_reduce``: ``data`` reduced over the segments along ``axis`` (see the module)."""
    if (lengths is None and offsets is None) or reduce not in _REDUCTIONS:
        return NotImplemented  # indices: unsupported by torch too
    axis %= data.dim()
    shape = data.shape
    size, outer, inner = shape[axis], shape[:axis].numel(), shape[axis + 1:].numel()
    starts, ends = _bounds(lengths, offsets, outer)
    if not unsafe:
        starts, ends = _checked(starts, ends, size, lengths is not None)
    count = starts.shape[1]
    combine, identity = _REDUCTIONS[reduce]
    start = torch.full((), identity if initial is None else initial, dtype=data.dtype, device=data.device)
    length = (ends - starts).flatten().unsqueeze(1)
    if size == 0:
        out = start.expand(outer * count, inner)
    else:
        values = data.reshape(outer * size, inner)
        scanned = segment_last(_run_starts(starts, ends, size), values, combine)
        rows = torch.arange(outer, device=data.device).unsqueeze(1) * size
        last = (rows + (ends - 1).clamp(0, size - 1)).flatten()
        out = torch.where(length > 0, combine(start, scanned.index_select(0, last)), start)
    if reduce == "mean":
        empty = start if initial is not None else torch.full_like(start, float("nan"))
        out = torch.where(length > 0, out / length.clamp(min=1).to(data.dtype), empty)
    return out.reshape(*shape[:axis], count, *shape[axis + 1:])


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.segment_reduce.default: segment_reduce,
}
