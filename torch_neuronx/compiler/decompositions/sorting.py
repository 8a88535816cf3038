"""Sorts and selections with torch's NaN and tie rules: ``sort``, ``topk``, ``median``,
``nanmedian``, ``kthvalue``, ``mode``, ``argmax``/``argmin``, ``max``/``min`` along a dim,
``amax``/``amin``/``max``/``min`` of unsigned and bool tensors, ``searchsorted``.

torch-mlir lowers ``aten.sort`` to a ``stablehlo.sort`` of (values, iota) whose comparator
knows nothing of NaN (torch sorts NaN as the largest value) and whose ties IREE breaks in no
fixed order; IREE also rewrites a descending sort that feeds a slice (topk) into a ``chlo.top_k``
it then rejects for its int64 indices. Keys here sort as one int64 per element (see
:func:`sort`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from torch_neuronx.compiler.decompositions.precision import NARROW
from torch_neuronx.compiler.decompositions.scans import cummax
from torch_neuronx.compiler.errors import InvalidInputError

aten = torch.ops.aten


# Sorting: torch-mlir lowers aten.sort to a stablehlo.sort of (values, iota) whose comparator
# knows nothing of NaN (torch sorts NaN as the largest value) and whose ties IREE breaks in no
# fixed order; IREE also rewrites a descending sort that feeds a slice (topk) into a chlo.top_k
# it then rejects for its int64 indices. Floating and narrow integer keys instead sort as one
# int64 per element: the value's rank in torch's order in the high 32 bits, its position in
# the low 32 bits, so every key is distinct and the order is torch's, stable for ties.
_POSITION = 1 << 32


def _rank_bits(x: torch.Tensor) -> torch.Tensor | None:
    """An int64 tensor ordered as torch orders ``x``'s values (NaN largest, -0.0 == 0.0), or None."""
    if x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        f = x.to(torch.float32)
        f = torch.where(f.isnan(), float("nan"), torch.where(f == 0, 0.0, f))  # one NaN, one zero
        bits = f.view(torch.int32)
        # Negative floats order backwards as integers: flip their magnitude bits.
        return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    if x.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        return x.to(torch.int64)
    return None  # int64 and float64 leave no room for the position


def _float64_rank(x: torch.Tensor) -> torch.Tensor:
    """:func:`_rank_bits` for float64: int64 keys in torch's order, equal for equal values."""
    f = torch.where(x.isnan(), float("nan"), torch.where(x == 0, 0.0, x))
    bits = f.view(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFFFFFFFFFF, bits)


#: Sort lengths from which distinct keys sort by a bitonic network (see :func:`_sorted_keys`).
_NETWORK_FROM = 512
_INT64_MAX, _INT64_MIN = (1 << 63) - 1, -(1 << 63)


def _sorted_keys(key: torch.Tensor, dim: int, descending: bool) -> torch.Tensor:
    """``key`` (distinct int64 keys) sorted along ``dim``.

    IREE sorts by comparing every pair (``iree_linalg_ext.sort``: a 50k-element sort took seconds);
    from :data:`_NETWORK_FROM` elements the keys sort by a bitonic network instead
    (:func:`_network`). The keys are distinct, so any correct sort gives the one order.
    """
    n = key.shape[dim]
    if not isinstance(n, int) or n < _NETWORK_FROM:
        return aten.sort.default(key, dim, descending)[0]
    return _network(key, None, dim, descending)[0]


def _network(key: torch.Tensor, position: torch.Tensor | None, dim: int,
             descending: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``key`` sorted along ``dim`` by a bitonic network, with ``position`` (an int64 tensor of
    ``key``'s shape) carried along and breaking ties (a stable sort), or None for distinct keys.

    n log²n compare-exchanges in log n (log n + 1) / 2 elementwise stages over the whole
    tensor, padded to a power of two with keys that sort last.
    """
    n = key.shape[dim]
    rows = key.movedim(dim, -1)
    shape = rows.shape
    rows = rows.reshape(-1, n)
    places = None if position is None else position.expand(key.shape).movedim(dim, -1).reshape(-1, n)
    m = 1 << (n - 1).bit_length()
    if m != n:
        pad = torch.full((rows.shape[0], m - n), _INT64_MIN if descending else _INT64_MAX,
                         dtype=key.dtype, device=key.device)
        rows = torch.cat([rows, pad], 1)
        if places is not None:  # after every real position: the pads stay last among equal keys
            places = torch.cat([places, torch.full_like(pad, n)], 1)
    k = 2
    while k <= m:
        j = k // 2
        while j >= 1:
            pairs = rows.view(-1, m // (2 * j), 2, j)
            partner = pairs.flip(2)  # element i's partner: i ^ j
            # Pair p's block of k elements ascends when (p*2j) // k is even (descending: odd);
            # there the first of the pair holds the one that comes first, elsewhere the other.
            block = torch.arange(m // (2 * j), device=key.device) // (k // (2 * j))
            up = (block % 2) == 0
            first = up.view(-1, 1, 1) == (torch.arange(2, device=key.device) == 0).view(1, 2, 1)
            if places is None:
                early, late = ((torch.maximum, torch.minimum) if descending else (torch.minimum, torch.maximum))
                rows = torch.where(first, early(pairs, partner), late(pairs, partner)).view(-1, m)
            else:
                at = places.view(-1, m // (2 * j), 2, j)
                other = at.flip(2)
                ahead = (pairs > partner if descending else pairs < partner) | ((pairs == partner) & (at < other))
                keep = ahead == first
                rows = torch.where(keep, pairs, partner).view(-1, m)
                places = torch.where(keep, at, other).view(-1, m)
            j //= 2
        k *= 2
    rows = rows.narrow(1, 0, n).reshape(shape).movedim(-1, dim)
    if places is not None:
        places = places.narrow(1, 0, n).reshape(shape).movedim(-1, dim)
    return rows, places


def _sorted_64_bit(x: torch.Tensor, dim: int, descending: bool) -> torch.Tensor | None:
    """The stable sort's index of int64 or float64 ``x`` by the network, from
    :data:`_NETWORK_FROM` elements; None for shorter (or symbolic) lengths."""
    n = x.shape[dim]
    if not isinstance(n, int) or n < _NETWORK_FROM:
        return None
    key = _float64_rank(x) if x.dtype == torch.float64 else x
    shape = [1] * x.dim()
    shape[dim] = n
    position = torch.arange(n, dtype=torch.int64, device=x.device).view(shape)
    return _network(key, position, dim, descending)[1]


def sort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.sort`` in torch's order (NaN largest) and stable, as one int64 key sort.

    int64 and float64 (whose rank fills an int64) sort with their positions by the network from
    :data:`_NETWORK_FROM` elements (stable); shorter ones sort with torch-mlir's lowering (NaN
    placed right, ties in no fixed order).
    """
    if x.dim() > 0 and x.dtype in (torch.float64, torch.int64):
        dim = dim % x.dim()
        index = _sorted_64_bit(x, dim, descending)
        if index is None and x.dtype == torch.int64:
            return NotImplemented
        if index is None:
            index = aten.sort.default(_float64_rank(x), dim, descending)[1]
        return x.gather(dim, index), index
    rank = _rank_bits(x) if x.dim() > 0 else None
    if rank is None or x.shape[dim] > _POSITION:
        return NotImplemented
    dim = dim % x.dim()
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    position = torch.arange(x.shape[dim], dtype=torch.int64, device=x.device).view(shape)
    # Descending keeps equal values in their original order too: earlier positions rank higher.
    key = rank * _POSITION + (_POSITION - 1 - position if descending else position)
    key = _sorted_keys(key, dim, descending)
    index = key & (_POSITION - 1)
    index = _POSITION - 1 - index if descending else index
    return x.gather(dim, index), index


def sort_stable(x: torch.Tensor, *, stable: bool | None = None, dim: int = -1,
                descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.sort.stable``: :func:`sort`, which is stable except for int64 and float64 keys."""
    short = x.dim() > 0 and not (isinstance(x.shape[dim], int) and x.shape[dim] >= _NETWORK_FROM)
    if stable and short and x.dtype in (torch.int64, torch.float64):
        raise NotImplementedError(f"sort(stable=True) of {x.dtype} values: the compiled sort orders equal "
                                  f"keys in no fixed order for 64-bit types shorter than {_NETWORK_FROM} "
                                  "elements; sort a 32-bit copy or run eagerly")
    result = sort(x, dim, descending)
    return aten.sort.default(x, dim, descending) if result is NotImplemented else result


def topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.topk`` as the first ``k`` of a :func:`sort` (NaN counts as the largest value)."""
    if x.dim() == 0:
        return NotImplemented
    size = x.shape[dim]
    if isinstance(size, int) and isinstance(k, int) and not 0 <= k <= size:
        raise InvalidInputError("selected index k out of range")
    values, index = sort_stable(x, dim=dim, descending=largest)
    # index_select, not a slice: IREE turns a sort with indices feeding a slice into a top_k
    # it cannot type for int64 indices.
    first = torch.arange(k, device=x.device)
    return values.index_select(dim, first), index.index_select(dim, first)


def _sorted_at(ordered: tuple[torch.Tensor, torch.Tensor], dim: int, at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ``at`` along ``dim`` of a :func:`sort` result: its value and index (dim kept)."""
    values, index = ordered
    return values.narrow(dim, at, 1), index.narrow(dim, at, 1)


def _of_scalar(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A selection along the one "dimension" of a 0-d tensor: the value itself, at index 0."""
    return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)


def median_dim(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.median.dim``: the lower median and its index; a slice with NaN gives its first NaN."""
    if x.dim() == 0:
        return _of_scalar(x)
    dim = dim % x.dim()
    ordered = sort_stable(x, dim=dim)
    value, index = _sorted_at(ordered, dim, (x.shape[dim] - 1) // 2)
    if x.is_floating_point():
        # NaN sorts last: a slice with k NaNs has the first of them (in position order) at n - k.
        nans = x.isnan().sum(dim, keepdim=True)
        first_nan = ordered[1].gather(dim, x.shape[dim] - nans.clamp(min=1))
        value = torch.where(nans > 0, float("nan"), value)
        index = torch.where(nans > 0, first_nan, index)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def median(x: torch.Tensor) -> torch.Tensor:
    """``aten.median``: the lower median of all elements (NaN if any)."""
    return median_dim(x.reshape(-1), 0)[0]


def kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.kthvalue``: the k-th smallest in :func:`sort`'s order (NaN largest), with its index."""
    if x.dim() == 0:
        return _of_scalar(x) if k == 1 else NotImplemented  # eager's error for other k
    dim = dim % x.dim()
    value, index = _sorted_at(sort_stable(x, dim=dim), dim, k - 1)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def nanmedian_dim(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.nanmedian.dim``: the lower median of the slice's non-NaN values, and its index.

    A slice of NaN only gives NaN (its index is then one of its NaNs, where torch's is unspecified).
    """
    if x.dim() == 0 or not x.is_floating_point():
        return median_dim(x, dim, keepdim)
    dim = dim % x.dim()
    values, index = sort_stable(x, dim=dim)  # NaN last
    numbers = x.isnan().logical_not().sum(dim, keepdim=True)
    at = ((numbers - 1).clamp(min=0) // 2).to(torch.int64)
    value, index = values.gather(dim, at), index.gather(dim, at)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def nanmedian(x: torch.Tensor) -> torch.Tensor:
    """``aten.nanmedian``: the lower median of all non-NaN elements."""
    return nanmedian_dim(x.reshape(-1), 0)[0]


def mode(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.mode``: the most frequent value of each slice (the smallest of equally frequent
    ones) and the index of its last occurrence, as torch's kernel returns them."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    dim = dim % x.dim()
    values = sort_stable(x, dim=dim)[0]
    n = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = n
    position = torch.arange(n, device=x.device).view(shape).expand(x.shape)
    starts = torch.ones_like(values, dtype=torch.bool)
    if n > 1:
        later, earlier = values.narrow(dim, 1, n - 1), values.narrow(dim, 0, n - 1)
        differs = later != earlier
        if x.is_floating_point():  # NaNs are one value to torch's mode (they sort last, together)
            differs = differs & ~(later.isnan() & earlier.isnan())
        starts = torch.cat([starts.narrow(dim, 0, 1), differs], dim)
    run_start = cummax(torch.where(starts, position, torch.zeros_like(position)), dim)[0]
    run_length = position - run_start + 1  # within each run of equal values, counting up
    # The first position reaching the longest run ends the smallest most frequent value's run.
    value = values.gather(dim, argmax(run_length, dim, keepdim=True))
    # Its last occurrence, found directly: int64 and float64 sorts do not keep ties in order.
    same = (x == value) | (x.isnan() & value.isnan()) if x.is_floating_point() else x == value
    index = torch.where(same, position, torch.full_like(position, -1)).amax(dim, keepdim=True)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def _extreme_index(x: torch.Tensor, dim: int | None, keepdim: bool, extreme: Callable) -> torch.Tensor | None:
    """The first index of ``x``'s extreme along ``dim``, or of its first NaN (torch's rule).

    torch-mlir's own lowering skips NaN and, for some integer types, does not return the
    first of equal extremes: the index is the smallest position that holds the extreme.
    """
    if x.is_complex():
        return None
    if x.dim() == 0:  # a scalar's one element (dims 0 and -1 name it)
        return torch.zeros((), dtype=torch.int64, device=x.device)
    if dim is None:
        x, dim = x.reshape(-1), 0
    if x.dtype in _WIDER:
        x = x.to(_WIDER[x.dtype])  # see amax_unsigned
    elif x.dtype in NARROW:
        # Computed in float32 inside a fused dispatch, x is rounded only where it is stored: the
        # extreme, stored as bfloat16, equalled no element of x (the index came out as n).
        x = x.float()
    best = extreme(x, dim, keepdim=True)  # NaN where the slice has one: amax/amin propagate it
    hit = torch.where(best.isnan(), x.isnan(), x == best) if x.is_floating_point() else x == best
    n = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = n
    position = torch.arange(n, dtype=torch.int64, device=x.device).view(shape)
    return torch.where(hit, position, n).amin(dim, keepdim=keepdim)


def argmax(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """``aten.argmax`` with NaN as the maximum (torch-mlir's lowering skips NaN)."""
    index = _extreme_index(x, dim, keepdim, torch.amax)
    return NotImplemented if index is None else index


def argmin(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """``aten.argmin`` with NaN as the minimum, as torch does."""
    index = _extreme_index(x, dim, keepdim, torch.amin)
    return NotImplemented if index is None else index


def _extreme_dim(x: torch.Tensor, dim: int, keepdim: bool, extreme: Callable) -> tuple:
    index = _extreme_index(x, dim, True, extreme) if x.dim() > 0 else None
    if index is None:
        return NotImplemented
    values = x.gather(dim, index)
    return (values, index) if keepdim else (values.squeeze(dim), index.squeeze(dim))


# torch-mlir reduces unsigned and bool tensors from a signed initial value (uint8's max starts
# from -128, read as 128; bool's from True), so a max of small values, or a min of large ones,
# came out wrong. These dtypes reduce in a wider signed type instead.
_WIDER = {torch.bool: torch.int32, torch.uint8: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}


def amax_unsigned(x: torch.Tensor, dim: list[int] | tuple[int, ...] = (), keepdim: bool = False) -> torch.Tensor:
    """``aten.amax`` of an unsigned or bool tensor, in a wider signed type (see ``_WIDER``)."""
    wide = _WIDER.get(x.dtype)
    if wide is None:
        return NotImplemented
    return aten.amax.default(x.to(wide), dim, keepdim).to(x.dtype)


def amin_unsigned(x: torch.Tensor, dim: list[int] | tuple[int, ...] = (), keepdim: bool = False) -> torch.Tensor:
    """``aten.amin`` of an unsigned or bool tensor (see :func:`amax_unsigned`)."""
    wide = _WIDER.get(x.dtype)
    if wide is None:
        return NotImplemented
    return aten.amin.default(x.to(wide), dim, keepdim).to(x.dtype)


def _nonempty(x: torch.Tensor, name: str) -> None:
    """torch's error for a reduction over all of an empty tensor, which it has no identity for."""
    if statically_known_true(x.numel() == 0):
        raise InvalidInputError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                                "Specify the reduction dim with the 'dim' argument.")


def max_all(x: torch.Tensor) -> torch.Tensor:
    """``aten.max`` of a whole tensor: an error when it is empty; unsigned and bool tensors in a
    wider type (see :func:`amax_unsigned`)."""
    _nonempty(x, "max")
    return amax_unsigned(x, list(range(x.dim())))


def min_all(x: torch.Tensor) -> torch.Tensor:
    """``aten.min`` of a whole tensor (see :func:`max_all`)."""
    _nonempty(x, "min")
    return amin_unsigned(x, list(range(x.dim())))


def max_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.max.dim`` propagating NaN (value and index), as torch does."""
    return _extreme_dim(x, dim, keepdim, torch.amax)


def min_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.min.dim`` propagating NaN (value and index), as torch does."""
    return _extreme_dim(x, dim, keepdim, torch.amin)


#: Halvings of a binary search over a sequence of symbolic length (below 2**32 elements).
_SYMBOLIC_SEARCH_STEPS = 32


def searchsorted(sorted_sequence: torch.Tensor, values, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: torch.Tensor | None = None) -> torch.Tensor:
    """``aten.searchsorted`` as torch's binary search, all values at once: one gather per halving
    of the range (``log2`` of the sequence's length), not a comparison with every element. Its
    steps are torch's (``cus_lower_bound`` / ``cus_upper_bound``), so a sequence holding NaN
    (``torch.sort`` puts them last) or out of order gives torch's answer: counting the elements
    before each value counted the NaN too (``[0, 1, 2, nan, nan]`` found 0.5 at 3, torch at 1)."""
    if not isinstance(values, torch.Tensor):
        values = torch.full((), values, dtype=sorted_sequence.dtype, device=sorted_sequence.device)
    right = side == "right" if side is not None else right
    seq = sorted_sequence if sorter is None else sorted_sequence.gather(-1, sorter)
    length = seq.shape[-1]
    steps = length.bit_length() if isinstance(length, int) else _SYMBOLIC_SEARCH_STEPS
    shape = values.shape
    if seq.dim() == 1:
        v = values.reshape(-1)
        probe = lambda at: seq[at]  # noqa: E731
    else:
        v = values
        probe = lambda at: seq.gather(-1, at)  # noqa: E731
    start = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    end = torch.full(v.shape, length, dtype=torch.int64, device=v.device)
    for _ in range(steps):
        active = start < end
        mid = start + torch.div(end - start, 2, rounding_mode="floor")
        found = probe(mid.clamp(0, length - 1))
        # torch goes right while the probe is not past the value: written as a negation, so a NaN
        # probe or value moves right, as in torch.
        right_of = (found > v).logical_not() if right else (found >= v).logical_not()
        start = torch.where(active & right_of, mid + 1, start)
        end = torch.where(active & right_of.logical_not(), mid, end)
    return start.reshape(shape).to(torch.int32 if out_int32 else torch.int64)


def bucketize(values, boundaries: torch.Tensor, *, out_int32: bool = False, right: bool = False) -> torch.Tensor:
    """``aten.bucketize``: :func:`searchsorted` of the values in the boundaries."""
    return searchsorted(boundaries, values, out_int32=out_int32, right=right)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.sort.default: sort,
    aten.sort.stable: sort_stable,
    aten.topk.default: topk,
    aten.argmax.default: argmax,
    aten.argmin.default: argmin,
    aten.max.dim: max_dim,
    aten.median.dim: median_dim,
    aten.median.default: median,
    aten.kthvalue.default: kthvalue,
    aten.nanmedian.dim: nanmedian_dim,
    aten.nanmedian.default: nanmedian,
    aten.mode.default: mode,
    aten.amax.default: amax_unsigned,
    aten.max.default: max_all,
    aten.min.default: min_all,
    aten.searchsorted.Tensor: searchsorted,
    aten.searchsorted.Scalar: searchsorted,
    aten.bucketize.Tensor: bucketize,
    aten.bucketize.Scalar: bucketize,
    aten.amin.default: amin_unsigned,
    aten.min.dim: min_dim,
}
