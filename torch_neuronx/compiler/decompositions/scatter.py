"""Index tensors: ``scatter_reduce`` (``scatter``'s legacy ``reduce=`` too), ``index_reduce``,
embedding bags, masked scatter, ``x[mask] = v``.

torch-mlir lowers a scatter that adds (``index_put`` with ``accumulate``) and one
that overwrites, but no scatter that takes a maximum, a minimum or a product,
nor ``embedding_bag``. Here every target position's sources are brought
together by sorting them on the flat target offset, a segmented doubling scan
(log2(n) static steps) reduces each run of equal targets, and the last element
of each run is written to its target. Sums and means use the adding scatter.
Shapes stay static throughout: where a count depends on the data (how many
targets are hit, how many mask elements are set), the writes that do not land
go to one spare slot past the end, which is then cut off.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions import indexing
from torch_neuronx.compiler.decompositions.general import calls_itself
from torch_neuronx.compiler.decompositions.indexing import BOUNDS, checked
from torch_neuronx.compiler.decompositions.scans import scan

aten = torch.ops.aten

_COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "amax": torch.maximum,  # NaN propagates, as in torch's scatter kernels
    "amin": torch.minimum,
    "prod": torch.mul,
}


def segment_last(starts: torch.Tensor, values: torch.Tensor, combine: Callable) -> torch.Tensor:
    """Inclusive segmented scan along dim 0: each position holds the reduction of its segment so far.

    ``starts[i]`` is true where a segment begins. The last position of each segment
    then holds the reduction of the whole segment.
    """
    flags = starts.view(-1, *([1] * (values.dim() - 1))).expand(values.shape)

    def merge(earlier: tuple, later: tuple) -> tuple:
        value = torch.where(later[0], later[1], combine(earlier[1], later[1]))
        return earlier[0] | later[0], value

    return scan((flags, values), 0, merge)[1]


def _write(size: int, targets: torch.Tensor, keep: torch.Tensor, values: torch.Tensor,
           fill: torch.Tensor) -> torch.Tensor:
    """A ``(size, *values.shape[1:])`` tensor of ``fill`` with ``values[i]`` at ``targets[i]`` where ``keep[i]``.

    Kept targets must be distinct; the others are written to a spare row, then dropped.
    """
    spare = torch.full_like(targets, size)
    slots = torch.where(keep, targets, spare)
    out = fill.expand(size + 1, *values.shape[1:]).clone()
    return aten.index_put.default(out, [slots], values, False)[:size]


def _reduce_by_target(targets: torch.Tensor, values: torch.Tensor, size: int, combine: Callable,
                      fill: float = 0) -> torch.Tensor:
    """Per target in ``range(size)``: ``values`` (rows) reduced with ``combine``; untouched rows are ``fill``."""
    order = torch.argsort(targets)
    targets, values = targets[order], values[order]
    n = targets.shape[0]
    starts = torch.ones_like(targets, dtype=torch.bool)
    if n > 1:
        starts = torch.cat([starts[:1], targets[1:] != targets[:-1]])
    reduced = segment_last(starts, values, combine)
    last = torch.cat([starts[1:], torch.ones_like(starts[:1])]) if n > 1 else starts
    return _write(size, targets, last, reduced, torch.full((), fill, dtype=values.dtype, device=values.device))


def _flat_targets(shape: tuple[int, ...], dim: int, index: torch.Tensor) -> torch.Tensor:
    """Flat offsets into a contiguous tensor of ``shape`` of every element of ``index`` along ``dim``."""
    offsets = torch.zeros(index.shape, dtype=torch.int64, device=index.device)
    stride = 1
    for axis in reversed(range(len(shape))):
        if axis == dim:
            coordinate = index.to(torch.int64)
        else:
            view = [1] * index.dim()
            view[axis] = index.shape[axis]
            coordinate = torch.arange(index.shape[axis], device=index.device).view(view)
        offsets = offsets + coordinate * stride
        stride *= shape[axis]
    return offsets.reshape(-1)


def scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str,
                   *, include_self: bool = True) -> torch.Tensor:
    """``aten.scatter_reduce.two`` for every ``reduce`` ("sum", "prod", "mean", "amax", "amin")."""
    if x.dim() == 0:
        x, index, src = x.view(1), index.view(1), src.view(1)
        return scatter_reduce(x, 0, index, src, reduce, include_self=include_self).view(())
    dim = dim % x.dim()
    if index.numel() == 0:
        return x.clone()
    # (checked here, in the user's dimension: past the flattening, index_add's check named its own)
    index = BOUNDS(index, x.shape[dim], False, "aten.scatter_reduce", f"bounds:{dim}")
    for axis, size in enumerate(index.shape):
        src = src.narrow(axis, 0, size)
    targets = _flat_targets(tuple(x.shape), dim, index)
    values = src.reshape(-1).to(x.dtype)
    flat = x.reshape(-1)
    counts = torch.zeros(flat.shape, dtype=torch.int64, device=x.device).index_add(
        0, targets, torch.ones_like(targets))
    hit = counts > 0
    if reduce in ("sum", "mean"):
        base = flat if include_self else torch.where(hit, torch.zeros_like(flat), flat)
        total = base.index_add(0, targets, values)
        if reduce == "sum":
            return total.view(x.shape)
        divisor = (counts + int(include_self)).clamp(min=1).to(x.dtype)
        mean = total / divisor if x.is_floating_point() else torch.div(total, divisor, rounding_mode="floor")
        return torch.where(hit, mean.to(x.dtype), flat).view(x.shape)
    combine = _COMBINE.get(reduce)
    if combine is None:
        raise ValueError(f"scatter_reduce: reduce must be one of sum, prod, mean, amax, amin, not {reduce!r}")
    reduced = _reduce_by_target(targets, values, flat.numel(), combine)
    if include_self:
        reduced = combine(flat, reduced)
    return torch.where(hit, reduced, flat).view(x.shape)


#: ``scatter``'s legacy ``reduce`` names, as ``scatter_reduce``'s.
_LEGACY_REDUCE = {"add": "sum", "multiply": "prod"}


def scatter_legacy_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor | float,
                          *, reduce: str) -> torch.Tensor:
    """``aten.scatter.reduce`` and ``.value_reduce`` (``reduce="add"`` or ``"multiply"``): a
    ``scatter_reduce`` that includes ``x``'s own values."""
    if reduce not in _LEGACY_REDUCE:
        raise ValueError(f"scatter: reduce must be 'add' or 'multiply', not {reduce!r}")
    if not isinstance(src, torch.Tensor):
        src = torch.full(index.shape, src, dtype=x.dtype, device=x.device)
    return scatter_reduce(x, dim, index, src, _LEGACY_REDUCE[reduce], include_self=True)


def index_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str,
                 *, include_self: bool = True) -> torch.Tensor:
    """``aten.index_reduce``: ``scatter_reduce`` with ``index`` spread over ``source``'s other dims."""
    if reduce not in ("prod", "mean", "amax", "amin"):  # scatter_reduce takes "sum"; index_reduce does not
        raise RuntimeError("index_reduce(): Expected reduce to be one of prod, mean, amax or amin "
                           f"but got {reduce}.")
    if x.dim() == 0:
        return scatter_reduce(x, 0, index.view(1), source.view(1), reduce, include_self=include_self)
    dim = dim % x.dim()
    index = BOUNDS(index, x.shape[dim], False, "aten.index_reduce", "in_self")  # torch's IndexError
    view = [1] * source.dim()
    view[dim] = index.numel()
    spread = index.reshape(view).expand(source.shape)
    return scatter_reduce(x, dim, spread, source, reduce, include_self=include_self)


# Embedding bags. aten._embedding_bag returns (output, offset2bag, bag_size, max_indices); the
# backward receives them back, so their meaning here is ours, consistent between the two:
# offset2bag[i] is the bag of indices[i]; bag_size[b] counts bag b's non-padding indices;
# max_indices[b, d] is the weight row of bag b's maximum in column d (mode "max"), else empty.
_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices: torch.Tensor, offsets: torch.Tensor, include_last_offset: bool) -> tuple[torch.Tensor, int]:
    """The bag of every index, and the number of bags."""
    bags = offsets.numel() - (1 if include_last_offset else 0)
    n = indices.numel()
    starts = torch.zeros(n + 1, dtype=torch.int64, device=indices.device)
    # Bag b starts at offsets[b]; empty bags share a start, and trailing ones start at n (the spare).
    starts = starts.index_add(0, offsets[1:bags].to(torch.int64).clamp(max=n),
                              torch.ones(max(bags - 1, 0), dtype=torch.int64, device=indices.device))
    return torch.cumsum(starts[:n], 0), bags


def _checked_offsets(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """``offsets`` with eager's checks made by :data:`BOUNDS` on a code: 1 when the first is not
    0, 2 when the last is past the ``n`` indices, 4 when they decrease (eager's kernel then fails
    on an index). Bad offsets gave made-up bags where eager raises."""
    if not offsets.numel():
        return offsets
    o = offsets.to(torch.int64)
    code = (o[:1] != 0).to(torch.int64) + 2 * (o[-1:] > n).to(torch.int64)
    if offsets.numel() > 1:
        code = code + 4 * (o[1:] < o[:-1]).any().to(torch.int64).reshape(1)
    return checked(offsets, code, "embedding_bag", "embedding_bag")


def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                  scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                  per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten._embedding_bag`` (and its forward-only twin) for modes sum, mean and max; the index
    outputs in the indices' integer type, as torch's (int32 ones were int64 here, and the
    backward then refused them: "expected scalar type Int but found Long")."""
    out, bag, bag_size, max_indices = _embedding_bag(weight, indices, offsets, mode, per_sample_weights,
                                                     include_last_offset, padding_idx)
    kind = indices.dtype
    return out, bag.to(kind), bag_size.to(kind), max_indices.to(kind)


def _embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: int,
                   per_sample_weights: torch.Tensor | None, include_last_offset: bool,
                   padding_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    indices = indices.reshape(-1)
    offsets = _checked_offsets(offsets, indices.numel())
    bag, bags = _bags(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    rows = weight.index_select(0, indices)
    bag_size = torch.zeros(bags + 1, dtype=torch.int64, device=weight.device).index_add(
        0, bag, valid.to(torch.int64))[:bags]
    if mode == _MAX:
        out, max_indices = _bag_max(weight, indices, bag, bags, valid, rows)
        return out, bag, bag_size, max_indices
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1).to(rows.dtype)
    rows = torch.where(valid.unsqueeze(1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
    out = torch.zeros(bags + 1, weight.shape[1], dtype=weight.dtype, device=weight.device).index_add(
        0, bag, rows)[:bags]
    if mode == _MEAN:
        out = out / bag_size.clamp(min=1).unsqueeze(1).to(out.dtype)
    return out, bag, bag_size, torch.zeros(0, dtype=torch.int64, device=weight.device)


def _bag_max(weight: torch.Tensor, indices: torch.Tensor, bag: torch.Tensor, bags: int,
             valid: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bag and column: the maximum over the bag's valid rows and the weight row it came from.

    Empty bags give 0 and row -1. Of equal maxima the first in the bag wins, as in torch.
    """
    low = torch.full((), float("-inf"), dtype=rows.dtype, device=rows.device)
    candidates = torch.where(valid.unsqueeze(1), rows, low)
    best = _reduce_by_target(bag, candidates, bags + 1, torch.maximum)
    at = best.index_select(0, bag)
    n = indices.numel()
    position = torch.arange(n, device=rows.device).unsqueeze(1).expand(rows.shape)
    first = torch.where(valid.unsqueeze(1) & (rows == at), position, torch.full_like(position, n))
    first = _reduce_by_target(bag, first, bags + 1, torch.minimum, fill=n)[:bags]
    found = first < n
    padded = torch.cat([indices.to(torch.int64), indices.new_full((1,), -1, dtype=torch.int64)])
    max_indices = torch.where(found, padded.index_select(0, first.clamp(max=n).reshape(-1)).view(first.shape),
                              torch.full_like(first, -1))
    out = torch.where(found, best[:bags], torch.zeros((), dtype=rows.dtype, device=rows.device))
    return out, max_indices


def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           offset2bag: torch.Tensor, bag_size: torch.Tensor, max_indices: torch.Tensor,
                           num_weights: int, scale_grad_by_freq: bool, mode: int, sparse: bool,
                           per_sample_weights: torch.Tensor | None, padding_idx: int = -1) -> torch.Tensor:
    """``aten._embedding_bag_backward``: the weight's (dense) gradient."""
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


def embedding_bag_dense_backward(grad: torch.Tensor, indices: torch.Tensor, offset2bag: torch.Tensor,
                                 bag_size: torch.Tensor, max_indices: torch.Tensor, num_weights: int,
                                 scale_grad_by_freq: bool, mode: int,
                                 per_sample_weights: torch.Tensor | None, padding_idx: int = -1) -> torch.Tensor:
    """``aten._embedding_bag_dense_backward``: scatter each bag's gradient back to its rows."""
    indices = indices.reshape(-1).to(torch.int64)
    columns = grad.shape[1]
    grad_weight = torch.zeros(num_weights, columns, dtype=grad.dtype, device=grad.device)
    if mode == _MAX:
        rows = max_indices.reshape(-1)
        found = rows >= 0
        column = torch.arange(columns, device=grad.device).repeat(max_indices.shape[0])
        values = torch.where(found, grad.reshape(-1), torch.zeros((), dtype=grad.dtype, device=grad.device))
        return aten.index_put.default(grad_weight, [rows.clamp(min=0), column], values, True)
    valid = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    bags = grad.shape[0]
    padded = torch.cat([grad, grad.new_zeros(1, columns)])  # offset2bag may name the spare bag
    rows = padded.index_select(0, offset2bag.clamp(max=bags))
    if mode == _MEAN:
        sizes = torch.cat([bag_size, bag_size.new_ones(1)]).index_select(0, offset2bag.clamp(max=bags))
        rows = rows / sizes.clamp(min=1).unsqueeze(1).to(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1).to(rows.dtype)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=torch.int64, device=grad.device).index_add(
            0, indices, torch.ones_like(indices))
        rows = rows / counts.index_select(0, indices).unsqueeze(1).to(rows.dtype)
    rows = torch.where(valid.unsqueeze(1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
    return grad_weight.index_add(0, indices, rows)


def embedding_bag_per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                              offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                              padding_idx: int = -1) -> torch.Tensor:
    """``aten._embedding_bag_per_sample_weights_backward``: each sample's row dotted with its bag's gradient."""
    indices = indices.reshape(-1)
    bags = grad.shape[0]
    padded = torch.cat([grad, grad.new_zeros(1, grad.shape[1])])
    per_row = (padded.index_select(0, offset2bag.clamp(max=bags)) * weight.index_select(0, indices)).sum(1)
    if padding_idx >= 0:
        per_row = torch.where(indices != padding_idx, per_row, torch.zeros_like(per_row))
    return per_row


def embedding(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """``aten.embedding`` as a gather of rows (torch-mlir rejects ``scale_grad_by_freq=True`` and
    ``sparse=True``, flags of the gradient: ``nn.Embedding(sparse=True)``'s forward ran on the CPU)."""
    if not (scale_grad_by_freq or sparse):
        return NotImplemented
    return weight.index_select(0, indices.reshape(-1)).view(*indices.shape, weight.shape[1])


def masked_scatter_backward(grad: torch.Tensor, mask: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``aten.masked_scatter_backward``: the gradient of the source, the masked gradient in order.

    Source elements past the number of set mask elements got no use: their gradient is 0.
    """
    mask = mask.expand(grad.shape).reshape(-1)
    numel = 1
    for size in sizes:
        numel *= size
    slots = torch.cumsum(mask.to(torch.int64), 0) - 1
    keep = mask & (slots < numel)
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    return _write(numel, slots.clamp(min=0), keep, grad.reshape(-1), zero).view(sizes)


@calls_itself
def masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``aten.masked_scatter`` with torch's check that ``source`` has an element for every set mask
    element (a host check: a short source repeated its last element where eager raises), and with
    ``self`` and mask expanded to their common shape (torch-mlir's lowering assumes the mask
    broadcasts to ``self``'s shape; a ``self`` that broadcasts up to the mask's failed to lower)."""
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    x, mask = x.expand(shape).contiguous(), mask.expand(shape).contiguous()
    if mask.numel():
        short = (mask.sum() > source.numel()).to(torch.int64).reshape(1)
        mask = checked(mask, short, "masked_scatter", "masked_scatter")
    return aten.masked_scatter.default(x, mask, source)


def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float,
                     norm_type: float) -> torch.Tensor:
    """``aten.embedding_renorm`` (``nn.Embedding(max_norm=...)``): the looked-up rows whose norm
    exceeds ``max_norm`` scaled down to it, as torch's kernel scales them."""
    indices = indices.reshape(-1)
    rows = weight.index_select(0, indices)
    norms = torch.linalg.vector_norm(rows, ord=norm_type, dim=1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    # Repeated indices write the same row: the plain (overwriting) scatter is exact.
    return aten.index_put.default(weight, [indices], rows * scale, False)


def histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:  # noqa: A002
    """``aten.histc``: counts in ``bins`` equal bins over [min, max] (the data's range when equal).

    Values outside the range and NaN are not counted; the range's upper end goes to the last bin.
    """
    if not (math.isfinite(min) and math.isfinite(max)):
        raise RuntimeError(f"torch.histc: range of [{min}, {max}] is not finite")
    if min > max:
        raise RuntimeError("torch.histc: max must be larger than min")
    low = torch.full((), min, dtype=x.dtype, device=x.device)
    high = torch.full((), max, dtype=x.dtype, device=x.device)
    if min == max and x.numel():
        # The data's range, which torch requires to be finite (checked on the host after the call)
        code = x.isfinite().logical_not().any().to(torch.int64).reshape(1)
        x = checked(x, code, "histc", "histc")
        low, high = x.amin(), x.amax()
        same = low == high
        low, high = torch.where(same, low - 1, low), torch.where(same, high + 1, high)
    values = x.reshape(-1)
    inside = (values >= low) & (values <= high)
    position = ((values - low) * bins / (high - low)).to(torch.int64).clamp(0, bins - 1)
    slot = torch.where(inside, position, torch.full_like(position, bins))
    counts = torch.zeros(bins + 1, dtype=x.dtype, device=x.device).index_add(0, slot, torch.ones_like(values))
    return counts[:bins]


def index_put_mask(x: torch.Tensor, indices: list, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``aten.index_put`` with one boolean mask over the leading dims (``x[mask] = v``; after full
    dims, ``x[:, mask] = v``, through :func:`_index_put_mask_after`) as a ``where``.

    torch-mlir cannot lower a boolean index. When ``v`` is the same for every selected
    element (a scalar, or a row broadcast over the selection), the write is
    ``where(mask, v, x)`` (``x + where(mask, v, 0)`` when accumulating: a mask selects
    each element once). Values that differ per selected element (``x[x > 0] *= -1``: as many
    as the mask selects, a count Dynamo took from this call) are picked by each selected
    element's rank among the selected ones, with torch's check that the counts agree.
    """
    if len(indices) > 1 and all(i is None for i in indices[:-1]):  # ``x[:, mask] = v``
        return _index_put_mask_after(x, len(indices) - 1, indices[-1], values, accumulate)
    if len(indices) != 1 or indices[0] is None or indices[0].dtype not in (torch.bool, torch.uint8):
        return NotImplemented
    mask = indices[0].bool()
    rest = x.shape[mask.dim():]
    if mask.dim() > x.dim() or mask.shape != x.shape[:mask.dim()]:
        return NotImplemented
    selected = mask.reshape(*mask.shape, *([1] * len(rest)))
    if values.dim() > len(rest) and any(s != 1 for s in values.shape[:values.dim() - len(rest)]):
        row = _per_selected_element(mask, values.to(x.dtype), rest)  # one value per selected element
        if row is NotImplemented:
            return row
    else:
        row = values.reshape(values.shape[max(values.dim() - len(rest), 0):]).to(x.dtype)  # leading 1s dropped
    if accumulate:
        return x + torch.where(selected, row, torch.zeros((), dtype=x.dtype, device=x.device))
    return torch.where(selected, row, x)


def _index_put_mask_after(x: torch.Tensor, lead: int, mask: torch.Tensor | None, values: torch.Tensor,
                          accumulate: bool) -> torch.Tensor:
    """``x[:, ..., mask] = values`` (``lead`` full dims before the mask) as a mask over the leading
    dims of ``x`` with those ``lead`` dims moved last (the values' too, broadcast as torch does)."""
    if mask is None or mask.dtype not in (torch.bool, torch.uint8) or lead + mask.dim() > x.dim():
        return NotImplemented
    rest = x.dim() - lead - mask.dim()
    full = lead + 1 + rest  # the indexing result's dims: the lead ones, the selected, the rest
    if values.dim() > full:
        return NotImplemented
    v = values.reshape(*([1] * (full - values.dim())), *values.shape)
    moved = index_put_mask(x.movedim(tuple(range(lead)), tuple(range(x.dim() - lead, x.dim()))), [mask],
                           v.movedim(tuple(range(lead)), tuple(range(full - lead, full))), accumulate)
    if moved is NotImplemented:
        return moved
    return moved.movedim(tuple(range(x.dim() - lead, x.dim())), tuple(range(lead)))


def _per_selected_element(mask: torch.Tensor, values: torch.Tensor, rest: torch.Size) -> torch.Tensor:
    """``values`` (one row per selected element, in order) placed at the selected positions of
    ``mask``'s shape; a host check raises torch's shape mismatch when the mask selects another count."""
    if values.dim() != len(rest) + 1:
        return NotImplemented
    count = values.shape[0]
    flat = mask.reshape(-1)
    chosen = flat.sum().reshape(1)
    code = (chosen != count).to(torch.int64) * (chosen + 1)  # 0, or the count selected + 1
    rows = torch.cat([values.expand(count, *rest), values.new_zeros(1, *rest)])  # a spare row past the last
    rank = checked((torch.cumsum(flat.to(torch.int64), 0) - 1).clamp(0, count), code, "index_put",
                   f"masked_index_put:{list(values.shape)}:{list(rest)}")
    return rows.index_select(0, rank).reshape(*mask.shape, *rest)


def _index_put_separated(x: torch.Tensor, indices: list, values: torch.Tensor,
                         accumulate: bool) -> torch.Tensor:
    """``x[i, :, j] = v``: index tensors with a full dimension between them, as indices of adjacent dims.

    torch-mlir cannot lower an ``index_put`` whose index list has a ``None`` between two
    tensors. Such indices put their broadcast dims first in the indexed view (``x[i, :, j]``
    is ``B + rest``), which is exactly the view of ``x`` with the indexed dims moved to the
    front, indexed by the same tensors: the write goes there, and the dims move back.
    """
    present = [i for i, index in enumerate(indices) if index is not None]
    if len(present) < 2 or present[-1] - present[0] + 1 == len(present):
        return NotImplemented  # adjacent: lowered as it is
    if any(indices[i].dtype in (torch.bool, torch.uint8) for i in present):
        return NotImplemented
    order = present + [d for d in range(x.dim()) if d not in present]
    moved = x.permute(order)
    written = aten.index_put.default(moved, [indices[i] for i in present], values.to(x.dtype), accumulate)
    inverse = [order.index(d) for d in range(x.dim())]
    return written.permute(inverse).clone(memory_format=torch.contiguous_format)


def index_put(x: torch.Tensor, indices: list, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``aten.index_put`` in the forms torch-mlir cannot lower: a boolean mask, separated index tensors;
    values of another dtype are eager's error (torch's meta function lets them through, and the
    lowering failed deep in IREE)."""
    indexing.check_index_put_dtypes(x, values)
    result = index_put_mask(x, indices, values, accumulate)
    if result is NotImplemented:
        result = _index_put_separated(x, indices, values, accumulate)
    return result


def _one_element(op: torch._ops.OpOverload, name: str) -> Callable:
    """``op`` (``scatter``, ``scatter_add``) of a 0-d tensor as the op of its one
    element in 1-d (torch-mlir requires its operands' ranks to match and be at least 1: "`index`,
    `input` and `src` param should have the same rank"); other calls are not decomposed."""
    def decomposition(x: torch.Tensor, dim: int, index: torch.Tensor, *rest: object) -> object:
        if x.dim() != 0:
            return NotImplemented
        flat = [r.reshape(-1) if isinstance(r, torch.Tensor) else r for r in rest]
        out = op(x.reshape(1), 0 if dim in (0, -1) else dim, index.reshape(-1), *flat)
        return out.reshape(())

    decomposition.__name__ = name
    return calls_itself(decomposition)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.scatter.src: _one_element(aten.scatter.src, "scatter_src_0d"),
    aten.scatter.value: _one_element(aten.scatter.value, "scatter_value_0d"),
    aten.scatter_add.default: _one_element(aten.scatter_add.default, "scatter_add_0d"),
    aten.scatter_reduce.two: scatter_reduce,
    aten.scatter.reduce: scatter_legacy_reduce,
    aten.scatter.value_reduce: scatter_legacy_reduce,
    aten.index_reduce.default: index_reduce,
    aten._embedding_bag.default: embedding_bag,
    aten._embedding_bag_forward_only.default: embedding_bag,
    aten._embedding_bag_backward.default: embedding_bag_backward,
    aten._embedding_bag_dense_backward.default: embedding_bag_dense_backward,
    aten._embedding_bag_per_sample_weights_backward.default: embedding_bag_per_sample_weights_backward,
    aten.embedding.default: embedding,
    aten.masked_scatter.default: masked_scatter,
    aten.masked_scatter_backward.default: masked_scatter_backward,
    aten.embedding_renorm.default: embedding_renorm,
    aten.histc.default: histc,
    aten.index_put.default: index_put,
}
