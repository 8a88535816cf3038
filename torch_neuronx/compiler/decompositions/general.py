"""General decompositions: ops torch-mlir rejects or lowers wrongly, rewritten in ops it lowers.

Sorts and extremes with torch's NaN and tie rules, 2-d average pooling,
cumulative ops, bitwise and remainder ops, and more (see the README's
"Known limits of the compile path"). Attention ops live in :mod:`.attention`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

aten = torch.ops.aten


_inside = threading.local()


def _calls_itself(decomposition: Callable) -> Callable:
    """For a decomposition that calls the op it decomposes: that inner call lowers as the op."""

    @functools.wraps(decomposition)
    def wrapper(*args, **kwargs):
        if getattr(_inside, decomposition.__name__, False):
            return NotImplemented
        setattr(_inside, decomposition.__name__, True)
        try:
            return decomposition(*args, **kwargs)
        finally:
            setattr(_inside, decomposition.__name__, False)

    return wrapper


def remainder(a, b):
    """Python's modulo (the result takes the divisor's sign).

    torch-mlir lowers ``aten.remainder`` to ``stablehlo.remainder``, which is C's
    fmod (the dividend's sign): silently wrong for operands of mixed sign.
    """
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (
            a.is_floating_point() or b.is_floating_point()):
        a, b = _promoted(a, b)
        mod = _fmod_float(a, b)  # torch: fmod, then moved into the divisor's sign
        return torch.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)
    return a - aten.div.Tensor_mode(a, b, rounding_mode="floor") * b


def _promoted(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.result_type(a, b)
    a, b = torch.broadcast_tensors(a, b)
    return a.to(dtype), b.to(dtype)


def _fmod_float(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C's fmod of floats: torch-mlir's own lowering (``stablehlo.remainder``), exact for large
    quotients, with the dividend's sign on zeros and a finite dividend over an infinite divisor
    kept (IREE gives +0.0 and NaN there)."""
    mod = torch.copysign(aten.fmod.Tensor(a, b), a)  # :func:`fmod` lets this call through to torch-mlir
    return torch.where(b.isinf() & a.isfinite(), a, mod)


def _floor_divide_integers(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact integer floor division: the truncating quotient, one less where the remainder's sign
    differs from the divisor's (torch-mlir went through float32: 2**31 - 1 // 3 was 715827904)."""
    quotient = aten.div.Tensor_mode(a, b, rounding_mode="trunc")
    remainder = a - quotient * b
    return torch.where((remainder != 0) & ((remainder < 0) != (b < 0)), quotient - 1, quotient)


def div_mode(a, b, *, rounding_mode: str | None = None):
    """``aten.div`` with ``rounding_mode="floor"``, computed as torch computes it.

    torch-mlir lowers it to floor(a / b) in floating point: for floats that differs from
    torch at infinities (torch: ``floor_divide(inf, 2)`` is NaN, ``floor_divide(-1, inf)`` is
    -1) and where a / b rounds up to an integer; for int32 and int64 it went through float32,
    wrong beyond 2**24. Other rounding modes lower as they are.
    """
    if rounding_mode != "floor":
        return NotImplemented
    b = promoted_scalar(b, a)
    if not (a.is_floating_point() or b.is_floating_point()):
        return _floor_divide_integers(*_promoted(a, b))
    a, b = _promoted(a, b)
    mod = _fmod_float(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    floor = torch.where(div == 0, torch.copysign(torch.zeros_like(div), a / b), floor)
    return torch.where(b == 0, a / b, floor)


def remainder_scalar(a, b):
    return remainder(a, torch.scalar_tensor(b, dtype=a.dtype, device=a.device))


@_calls_itself
def fmod(a, b):
    """C's remainder (the dividend's sign); torch-mlir lowers no ``fmod`` with a scalar divisor."""
    if a.is_floating_point() or b.is_floating_point():
        return _fmod_float(*_promoted(a, b))
    return a - aten.div.Tensor_mode(a, b, rounding_mode="trunc") * b


def fmod_scalar(a, b):
    return fmod(a, torch.scalar_tensor(b, dtype=a.dtype, device=a.device))


def diagonal(x, offset=0, dim1=0, dim2=1):
    """``aten.diagonal`` (a strided view torch-mlir does not lower) as a gather of the diagonal."""
    x = torch.movedim(x, (dim1, dim2), (-2, -1))
    rows, cols = x.shape[-2], x.shape[-1]
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    index = torch.arange(length, device=x.device)
    return x[..., index + max(-offset, 0), index + max(offset, 0)]


def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    """``aten.diagonal_scatter`` (``diagonal``'s backward, QR's): ``x`` with a diagonal replaced by ``src``."""
    if src.shape[-1] == 0:
        return x.clone()
    moved = torch.movedim(x, (dim1, dim2), (-2, -1))
    rows = torch.arange(moved.shape[-2], device=x.device).unsqueeze(-1)
    cols = torch.arange(moved.shape[-1], device=x.device)
    on_diagonal = cols - rows == offset
    # Position along the diagonal of each (row, col); clamped where it is off the diagonal.
    along = (rows if offset >= 0 else cols).expand(on_diagonal.shape).clamp(max=src.shape[-1] - 1)
    replaced = torch.where(on_diagonal, src[..., along].to(x.dtype), moved)
    return torch.movedim(replaced, (-2, -1), (dim1, dim2))


def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """``aten._weight_norm_interface_backward`` (training ``weight_norm``), as torch's kernel computes it.

    ``w = g v / ||v||`` with norms over every dim but ``dim``: ``grad_g = sum(grad_w v) / ||v||``
    and ``grad_v = g / ||v|| (grad_w - v sum(grad_w v) / ||v||**2)``.
    """
    dim = dim % saved_v.dim()
    dims = [d for d in range(saved_v.dim()) if d != dim]
    compute = saved_norms.dtype
    v, grad = saved_v.to(compute), grad_w.to(compute)
    shape = [saved_v.shape[d] if d == dim else 1 for d in range(saved_v.dim())]
    norms, g = saved_norms.reshape(shape), saved_g.to(compute).reshape(shape)
    products = (grad * v).sum(dims, keepdim=True)
    grad_g = (products / norms).reshape(saved_g.shape).to(saved_g.dtype)
    grad_v = (g / norms) * (grad - v * (products / (norms * norms)))
    return grad_v.to(saved_v.dtype), grad_g


def promoted_scalar(value, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of the type ``like`` op ``value`` computes in (tensors pass through)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.scalar_tensor(value, dtype=torch.result_type(like, value), device=like.device)


def _as_tensor(value, like):
    return value if isinstance(value, torch.Tensor) else torch.scalar_tensor(value, dtype=like.dtype,
                                                                            device=like.device)


def shift_left(a, b):
    """Integer ``a << b`` as ``a * 2**b`` (torch-mlir lowers no shift to StableHLO)."""
    return a * torch.pow(_as_tensor(2, a), _as_tensor(b, a))


def shift_right(a, b):
    """Arithmetic ``a >> b`` as the floor division by ``2**b``, which rounds the same way for negatives."""
    return aten.div.Tensor_mode(a, torch.pow(_as_tensor(2, a), _as_tensor(b, a)), rounding_mode="floor")


def bitwise_xor_scalar(a, b):
    return aten.bitwise_xor.Tensor(a, _as_tensor(b, a))


def bitwise_or_scalar(a, b):
    return aten.bitwise_or.Tensor(a, _as_tensor(b, a))


def any_dims(x, dim=None, keepdim=False):
    """``aten.any.dims`` (which torch-mlir does not lower) as a sum of the true values."""
    counts = aten.sum.dim_IntList(x.to(torch.int32), list(dim) if dim is not None else None, keepdim)
    return counts > 0


def _scan(xs: tuple[torch.Tensor, ...], dim: int, combine: Callable) -> tuple[torch.Tensor, ...]:
    """Inclusive prefix scan of ``xs`` along ``dim`` by doubling (Hillis-Steele): log2(n) static steps.

    ``combine(earlier, later)`` merges the results (tuples like ``xs``) over an earlier range
    with those over the range right after it; each step merges every position with the one
    ``shift`` before it.
    """
    n, shift = xs[0].shape[dim], 1
    while shift < n:
        merged = combine(tuple(x.narrow(dim, 0, n - shift) for x in xs),
                         tuple(x.narrow(dim, shift, n - shift) for x in xs))
        xs = tuple(torch.cat([x.narrow(dim, 0, shift), m], dim) for x, m in zip(xs, merged))
        shift *= 2
    return xs


def cumprod(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten.cumprod`` (torch-mlir lowers it to nothing) as a doubling scan of products."""
    if dtype is None and not (x.is_floating_point() or x.is_complex()):
        dtype = torch.int64  # as torch: integer and bool inputs accumulate in int64
    x = x if dtype is None else x.to(dtype)
    if x.dim() == 0:
        return x.clone()
    return _scan((x,), dim % x.dim(), lambda a, b: (a[0] * b[0],))[0]


def _cumulative_extreme(x: torch.Tensor, dim: int, later_wins: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    dim = dim % x.dim()
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    index = torch.arange(x.shape[dim], device=x.device).view(shape).expand(x.shape)

    def combine(earlier: tuple, later: tuple) -> tuple:
        take = later_wins(earlier[0], later[0])
        return torch.where(take, later[0], earlier[0]), torch.where(take, later[1], earlier[1])

    return _scan((x, index), dim, combine)


def _nan_aware(better: Callable) -> Callable:
    # The later element wins when it is NaN, or when neither is NaN and it is at least as good:
    # ties and NaNs move the index forward, as torch's kernels do.
    def later_wins(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
        if not later.is_floating_point():
            return better(later, earlier)
        return later.isnan() | (earlier.isnan().logical_not() & better(later, earlier))

    return later_wins


def cummax(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.cummax``: running maximum and the index of its latest occurrence."""
    return _cumulative_extreme(x, dim, _nan_aware(torch.ge))


def cummin(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.cummin``: running minimum and the index of its latest occurrence."""
    return _cumulative_extreme(x, dim, _nan_aware(torch.le))



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


def sort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.sort`` in torch's order (NaN largest) and stable, as one int64 key sort.

    float64 sorts its int64 rank with torch-mlir's lowering (NaN placed right, ties in no
    fixed order); int64 uses that lowering directly.
    """
    if x.dim() > 0 and x.dtype == torch.float64:
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
    key = aten.sort.default(key, dim, descending)[0]
    index = key & (_POSITION - 1)
    index = _POSITION - 1 - index if descending else index
    return x.gather(dim, index), index


def sort_stable(x: torch.Tensor, *, stable: bool | None = None, dim: int = -1,
                descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.sort.stable``: :func:`sort`, which is stable except for int64 and float64 keys."""
    if stable and x.dim() > 0 and x.dtype in (torch.int64, torch.float64):
        raise NotImplementedError(f"sort(stable=True) of {x.dtype} values: the compiled sort orders equal "
                                  "keys in no fixed order for 64-bit types; sort a 32-bit copy or run eagerly")
    result = sort(x, dim, descending)
    return aten.sort.default(x, dim, descending) if result is NotImplemented else result


def topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.topk`` as the first ``k`` of a :func:`sort` (NaN counts as the largest value)."""
    if x.dim() == 0:
        return NotImplemented
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
        starts = torch.cat([starts.narrow(dim, 0, 1), values.narrow(dim, 1, n - 1) != values.narrow(dim, 0, n - 1)],
                           dim)
    run_start = cummax(torch.where(starts, position, torch.zeros_like(position)), dim)[0]
    run_length = position - run_start + 1  # within each run of equal values, counting up
    # The first position reaching the longest run ends the smallest most frequent value's run.
    value = values.gather(dim, argmax(run_length, dim, keepdim=True))
    # Its last occurrence, found directly: int64 and float64 sorts do not keep ties in order.
    same = (x == value) | (x.isnan() & value.isnan()) if x.is_floating_point() else x == value
    index = torch.where(same, position, torch.full_like(position, -1)).amax(dim, keepdim=True)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


@_calls_itself
def slice_scatter(x: torch.Tensor, src: torch.Tensor, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> torch.Tensor:
    """``aten.slice_scatter`` with its bounds clamped to the dim (torch-mlir rejects an end of 2**63-1);
    scattering nothing is a copy (IREE crashed on the empty scatter)."""
    if src.numel() == 0:
        return x.clone()
    size = x.shape[dim]
    start = 0 if start is None else start + size if start < 0 else start
    end = size if end is None else end + size if end < 0 else end
    start = min(max(start, 0), size)
    return aten.slice_scatter.default(x, src, dim, start, min(max(end, start), size), step)


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``prims.fma`` (inductor's decompositions emit it once inductor is loaded): a * b + c; IREE
    may contract it back into one fused multiply-add."""
    return a * b + c


def lerp(start: torch.Tensor, end: torch.Tensor, weight: torch.Tensor | float) -> torch.Tensor:
    """``aten.lerp`` (every Adam step) with torch's two-sided formula, exact at both ends; ours so
    the table does not depend on which decomposition the loaded torch modules registered."""
    difference = end - start
    if not isinstance(weight, torch.Tensor):
        weight = torch.scalar_tensor(weight, dtype=difference.dtype, device=difference.device)
    return torch.where(weight.abs() < 0.5, start + weight * difference, end - difference * (-weight + 1))


def gcd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.gcd`` by Euclid's algorithm, unrolled for the worst case of the dtype (consecutive
    Fibonacci numbers: 47 steps for 32 bits, 93 for 64); finished pairs keep their value."""
    a, b = torch.broadcast_tensors(a, b)
    a, b = a.abs(), b.abs()
    steps = {1: 13, 2: 25, 4: 47}.get(a.element_size(), 93)
    for _ in range(steps):
        nonzero = b != 0
        remainder = a - aten.div.Tensor_mode(a, torch.where(nonzero, b, torch.ones_like(b)), rounding_mode="trunc") * b
        a, b = torch.where(nonzero, b, a), torch.where(nonzero, remainder, b)
    return a


def lcm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.lcm``: |a / gcd(a, b) * b|, 0 when either is 0."""
    a, b = torch.broadcast_tensors(a, b)
    divisor = gcd(a, b)
    safe = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    # As torch's C++ kernel: narrow integers are promoted to int before the product and abs.
    wide = torch.int32 if a.element_size() < 4 else a.dtype
    multiple = (aten.div.Tensor_mode(a, safe, rounding_mode="trunc").to(wide) * b.to(wide)).abs().to(a.dtype)
    return torch.where(divisor == 0, torch.zeros_like(a), multiple)


def add_bool(a: torch.Tensor, b: torch.Tensor | float, *, alpha: float = 1) -> torch.Tensor:
    """``aten.add`` of two bool tensors: logical or, as torch (IREE added the 1-bit integers and
    wrapped True + True to False)."""
    if not (isinstance(b, torch.Tensor) and a.dtype == torch.bool and b.dtype == torch.bool and alpha):
        return NotImplemented
    return torch.logical_or(a, b)


@_calls_itself
def clamp(x: torch.Tensor, min: float | None = None, max: float | None = None) -> torch.Tensor:  # noqa: A002
    """``aten.clamp`` of integers by float bounds: in the promoted float type, as torch (torch-mlir
    rejected the mixed types)."""
    bounds = [v for v in (min, max) if v is not None]
    dtype = x.dtype
    for bound in bounds:
        dtype = torch.promote_types(dtype, torch.result_type(x, bound))
    if dtype == x.dtype:
        return NotImplemented
    return aten.clamp.default(x.to(dtype), min, max)


def _variance(x: torch.Tensor, dim, correction, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Variance and mean over ``dim`` with torch's divisor ``max(n - correction, 0)``, or None
    for what torch-mlir's own lowering handles (non-float or complex tensors)."""
    if not x.is_floating_point():
        return None
    dims = list(range(x.dim())) if dim is None or (isinstance(dim, list | tuple) and not dim) else \
        [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]
    count = 1
    for d in dims:
        count *= x.shape[d] if x.dim() else 1
    mean = x.mean(dims, keepdim=True) if x.dim() else x
    squares = (x - mean).square().sum(dims, keepdim=keepdim) if x.dim() else (x - mean).square()
    divisor = max(count - (1 if correction is None else correction), 0)
    variance = squares / float(divisor)  # 0 gives inf (or NaN), as torch
    return variance, (mean if keepdim or not x.dim() else mean.squeeze(dims))


def var_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False) -> torch.Tensor:
    """``aten.var.correction``: torch-mlir divided by n - correction even below zero (a negative
    variance where torch gives inf)."""
    result = _variance(x, dim, correction, keepdim)
    return NotImplemented if result is None else result[0]


def var_mean_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False):
    """``aten.var_mean.correction`` (see :func:`var_correction`)."""
    return NotImplemented if (result := _variance(x, dim, correction, keepdim)) is None else result


def std_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False) -> torch.Tensor:
    """``aten.std.correction`` (see :func:`var_correction`)."""
    result = _variance(x, dim, correction, keepdim)
    return NotImplemented if result is None else result[0].sqrt()


def std_mean_correction(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False):
    """``aten.std_mean.correction`` (see :func:`var_correction`)."""
    result = _variance(x, dim, correction, keepdim)
    return NotImplemented if result is None else (result[0].sqrt(), result[1])


def native_dropout(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.native_dropout`` from ``rand_like`` (which the compile path draws on the host per call;
    torch-mlir's lowering drew the same mask every call)."""
    if not train or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    keep = torch.rand_like(x) < 1 - p
    return x * keep * (1.0 / (1 - p)), keep


def eq_tensor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.eq.Tensor`` of a float tensor with itself: NaN is not equal to itself.

    torch-mlir folds ``x == x`` to a constant true (so ``isfinite``, which torch writes as
    ``(x == x) & (x.abs() != inf)``, called NaN finite).
    """
    if a is b and (a.is_floating_point() or a.is_complex()):
        return a.isnan().logical_not()
    return NotImplemented


def isfinite(x: torch.Tensor) -> torch.Tensor:
    """``aten.isfinite``: torch-mlir's lowering (|x| != inf) calls NaN finite."""
    if not (x.is_floating_point() or x.is_complex()):
        return torch.ones_like(x, dtype=torch.bool)
    return x.isnan().logical_not() & (x.abs() != float("inf"))


@_calls_itself
def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``aten.atan2`` with IEEE's zeros and infinities (IREE's approximation gives NaN for them)."""
    if not (y.is_floating_point() or x.is_floating_point()):
        return NotImplemented
    y, x = torch.broadcast_tensors(y, x)
    dtype = torch.promote_types(y.dtype, x.dtype)
    y, x = y.to(dtype), x.to(dtype)
    result = aten.atan2.default(y, x)
    pi = torch.pi
    zeros = torch.copysign(torch.where(x.signbit(), pi, 0.0), y)  # y and x both +-0
    infinities = torch.copysign(torch.where(x.signbit(), 0.75 * pi, 0.25 * pi), y)  # both +-inf
    result = torch.where((y == 0) & (x == 0), zeros.to(dtype), result)
    return torch.where(y.isinf() & x.isinf(), infinities.to(dtype), result)


def hypot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.hypot`` without overflow: the larger magnitude times sqrt(1 + ratio**2); inf wins over NaN."""
    a, b = torch.broadcast_tensors(a.abs(), b.abs())
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, 0.0, small / big)
    result = big * torch.sqrt(1 + ratio * ratio)
    return torch.where(a.isinf() | b.isinf(), float("inf"), result)

def _extreme_index(x: torch.Tensor, dim: int | None, keepdim: bool, extreme: Callable) -> torch.Tensor | None:
    """The first index of ``x``'s extreme along ``dim``, or of its first NaN (torch's rule).

    torch-mlir's own lowering skips NaN and, for some integer types, does not return the
    first of equal extremes: the index is the smallest position that holds the extreme.
    """
    if x.dtype == torch.bool or x.is_complex():
        return None
    if x.dim() == 0:  # a scalar's one element (dims 0 and -1 name it)
        return torch.zeros((), dtype=torch.int64, device=x.device)
    if dim is None:
        x, dim = x.reshape(-1), 0
    if x.dtype == torch.uint8:
        x = x.to(torch.int32)  # see amax_uint8
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


def flip_unsigned(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``aten.flip`` of unsigned integers as gathers: IREE cannot compile ``stablehlo.reverse`` of them."""
    if x.dtype not in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return NotImplemented
    for dim in dims:
        n = x.shape[dim]
        x = x.index_select(dim, torch.arange(n - 1, -1, -1, device=x.device))
    return x


def amax_uint8(x: torch.Tensor, dim: list[int] | tuple[int, ...] = (), keepdim: bool = False) -> torch.Tensor:
    """``aten.amax`` of uint8 in int32: torch-mlir reduces uint8 from a signed initial value."""
    if x.dtype != torch.uint8:
        return NotImplemented
    return aten.amax.default(x.to(torch.int32), dim, keepdim).to(torch.uint8)


def amin_uint8(x: torch.Tensor, dim: list[int] | tuple[int, ...] = (), keepdim: bool = False) -> torch.Tensor:
    """``aten.amin`` of uint8 in int32 (see :func:`amax_uint8`)."""
    if x.dtype != torch.uint8:
        return NotImplemented
    return aten.amin.default(x.to(torch.int32), dim, keepdim).to(torch.uint8)


def max_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.max.dim`` propagating NaN (value and index), as torch does."""
    return _extreme_dim(x, dim, keepdim, torch.amax)


def min_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.min.dim`` propagating NaN (value and index), as torch does."""
    return _extreme_dim(x, dim, keepdim, torch.amin)


# Pooling and padding gradients torch-mlir lowers only in part (avg_pool2d without ceil_mode
# and with count_include_pad) or not at all.
def _avg_pool_divisors(out: int, size: int, kernel: int, stride: int, pad: int, include_pad: bool,
                       device: torch.device) -> torch.Tensor:
    """Per output position along one dim: the count torch's avg_pool2d divides by (unclipped to
    the padded extent with ``count_include_pad``, else clipped to the input)."""
    start = torch.arange(out, dtype=torch.int64, device=device) * stride - pad
    end = torch.clamp(start + kernel, max=size + pad)
    if include_pad:
        return end - start
    return torch.clamp(end, max=size) - torch.clamp(start, min=0)


def _divide_by_windows(t: torch.Tensor, size: tuple, kernel: tuple, stride: tuple, padding: tuple,
                       include_pad: bool, divisor_override: int | None) -> torch.Tensor:
    """``t`` (one value per 2-d pooling window) divided as torch's avg_pool2d divides each window."""
    if divisor_override:
        return t / divisor_override
    rows, cols = (_avg_pool_divisors(t.shape[d - 2], size[d], kernel[d], stride[d], padding[d], include_pad,
                                     t.device) for d in (0, 1))
    return t / (rows[:, None] * cols[None, :]).to(t.dtype)


def _pair(value, default=None) -> tuple[int, int]:
    if not value:
        return default
    return (value[0], value[-1]) if len(value) in (1, 2) else tuple(value)


def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """``aten.avg_pool2d`` with ``ceil_mode`` (torch-mlir's reduce_window mis-sizes it) or a
    ``divisor_override`` (torch-mlir rejects it): window sums by a depthwise convolution with a
    kernel of ones, divided as torch divides."""
    if not ceil_mode and not divisor_override:
        return NotImplemented
    (kh, kw) = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding if isinstance(padding, list | tuple) else [padding])
    unbatched = x.dim() == 3
    xb = x.unsqueeze(0) if unbatched else x
    (h, w), channels = xb.shape[-2:], xb.shape[1]

    def out_size(size: int, k: int, st: int, p: int) -> int:
        if not ceil_mode:
            return (size + 2 * p - k) // st + 1
        out = -(-(size + 2 * p - k) // st) + 1
        return out - 1 if (out - 1) * st >= size + p else out

    oh, ow = out_size(h, kh, sh, ph), out_size(w, kw, sw, pw)
    # Zeros around the input out to the last window's end (ceil_mode windows may pass the padding).
    padded = F.pad(xb, (pw, max(0, (ow - 1) * sw + kw - w - pw), ph, max(0, (oh - 1) * sh + kh - h - ph)))
    ones = torch.ones(channels, 1, kh, kw, dtype=x.dtype, device=x.device)
    sums = F.conv2d(padded, ones, stride=(sh, sw), groups=channels)
    out = _divide_by_windows(sums, (h, w), (kh, kw), (sh, sw), (ph, pw), count_include_pad, divisor_override)
    return out.squeeze(0) if unbatched else out


def avg_pool2d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override=None):
    """``aten.avg_pool2d_backward`` for every mode: each window's share of the gradient, spread
    back over it by a depthwise transposed convolution with a kernel of ones."""
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    unbatched = grad_output.dim() == 3
    g = grad_output.unsqueeze(0) if unbatched else grad_output
    (h, w), channels = x.shape[-2:], g.shape[1]
    g = _divide_by_windows(g, (h, w), (kh, kw), (sh, sw), (ph, pw), count_include_pad, divisor_override)
    ones = torch.ones(channels, 1, kh, kw, dtype=g.dtype, device=g.device)
    spread = F.conv_transpose2d(g, ones, stride=(sh, sw), groups=channels)  # over the padded input
    spread = F.pad(spread, (0, max(0, pw + w - spread.shape[-1]), 0, max(0, ph + h - spread.shape[-2])))
    grad = spread[..., ph:ph + h, pw:pw + w]
    return grad.squeeze(0) if unbatched else grad


def _adaptive_average_matrix(out: int, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[out, size]: row i averages input positions floor(i*size/out) .. ceil((i+1)*size/out)."""
    i = torch.arange(out, dtype=torch.int64, device=device)[:, None]
    j = torch.arange(size, dtype=torch.int64, device=device)[None, :]
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    inside = (j >= start) & (j < end)
    return inside.to(dtype) / (end - start).to(dtype)


def adaptive_avg_pool2d(x: torch.Tensor, output_size) -> torch.Tensor:
    """``aten._adaptive_avg_pool2d`` as two averaging matrices (torch-mlir lowers only sizes that
    divide evenly)."""
    oh, ow = _pair(output_size)
    (h, w) = x.shape[-2:]
    oh, ow = oh or h, ow or w
    dtype = torch.promote_types(x.dtype, torch.float32)  # half types average in float32, as torch does
    rows = _adaptive_average_matrix(oh, h, dtype, x.device)
    cols = _adaptive_average_matrix(ow, w, dtype, x.device)
    return (rows @ x.to(dtype) @ cols.t()).to(x.dtype)


def adaptive_avg_pool2d_backward(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``aten._adaptive_avg_pool2d_backward``: the gradient through each dim's averaging matrix."""
    (oh, ow), (h, w) = grad_output.shape[-2:], x.shape[-2:]
    dtype = torch.promote_types(grad_output.dtype, torch.float32)
    rows = _adaptive_average_matrix(oh, h, dtype, grad_output.device)
    cols = _adaptive_average_matrix(ow, w, dtype, grad_output.device)
    return (rows.t() @ grad_output.to(dtype) @ cols).to(x.dtype)


def replication_pad_backward(grad_output: torch.Tensor, x: torch.Tensor, padding) -> torch.Tensor:
    """``aten.replication_pad{1,2,3}d_backward``: each border's gradient summed onto its edge."""
    g = grad_output
    for k in range(len(padding) // 2):
        dim, left, right = g.dim() - 1 - k, int(padding[2 * k]), int(padding[2 * k + 1])
        if left < 0 or right < 0:
            return NotImplemented
        size = x.shape[dim]
        center = g.narrow(dim, left, size)
        first = center.narrow(dim, 0, 1)
        last = center.narrow(dim, size - 1, 1)
        if left:
            first = first + g.narrow(dim, 0, left).sum(dim, keepdim=True)
        if right:
            last = last + g.narrow(dim, left + size, right).sum(dim, keepdim=True)
        if size == 1:
            g = first + last - center
        else:
            g = torch.cat([first, center.narrow(dim, 1, size - 2), last], dim)
    return g


def cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> torch.Tensor:
    """``aten._cdist_forward`` from the pairwise differences (torch-mlir has no lowering)."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # [..., P, R, M]
    if p == 0:
        return (diff != 0).sum(-1).to(x1.dtype)
    if p == float("inf"):
        return diff.abs().amax(-1)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return diff.square().sum(-1).sqrt()
    return diff.abs().pow(p).sum(-1).pow(1.0 / p)


def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   dist: torch.Tensor) -> torch.Tensor:
    """``aten._cdist_backward``: the gradient for ``x1``, term by term as torch's kernel computes it."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    d = dist.unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        term = diff.sign()
    elif p == float("inf"):
        term = diff.sign() * (diff.abs() == d).to(diff.dtype)
    else:
        term = diff.sign() * diff.abs().pow(p - 1) / d.pow(p - 1)
        dead = (d == 0) | (diff == 0) if p < 1 else d == 0
        term = torch.where(dead, 0.0, term)
    return (grad.unsqueeze(-1) * term).sum(-2)


def searchsorted(sorted_sequence: torch.Tensor, values, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: torch.Tensor | None = None) -> torch.Tensor:
    """``aten.searchsorted`` as a count of the sequence's elements before each value."""
    if not isinstance(values, torch.Tensor):
        values = torch.tensor(values, dtype=sorted_sequence.dtype, device=sorted_sequence.device)
    right = side == "right" if side is not None else right
    seq = sorted_sequence if sorter is None else sorted_sequence.gather(-1, sorter)
    seq = seq if seq.dim() == 1 else seq.unsqueeze(-2)  # [N] or [..., 1, N] against [..., M, 1]
    v = values.unsqueeze(-1)
    # torch's binary search: left finds the first element >= the value, right the first one
    # > it; written as negations, so a NaN value (no element compares) lands at the end, as in torch.
    before = (seq > v).logical_not() if right else (seq >= v).logical_not()
    return before.sum(-1).to(torch.int32 if out_int32 else torch.int64)

#: Decompositions PyTorch has but does not count as "core"; torch-mlir lowers none of these ops.
FROM_TORCH = (
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default,
    aten.native_batch_norm_backward.default,
    aten.max_pool2d_with_indices_backward.default,
    # torch-mlir's lowering ignores `training`: eval-mode rrelu got the gradient of its noise.
    aten.rrelu_with_noise_backward.default,
    aten.unfold.default,  # a strided view torch-mlir does not lower
)

DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.remainder.Tensor: remainder,
    aten.remainder.Scalar: remainder_scalar,
    aten.div.Tensor_mode: div_mode,
    aten.div.Scalar_mode: div_mode,
    aten.any.dims: any_dims,
    aten.fmod.Tensor: fmod,
    aten.fmod.Scalar: fmod_scalar,
    aten.diagonal.default: diagonal,
    aten.diagonal_scatter.default: diagonal_scatter,
    aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    aten.cumprod.default: cumprod,
    aten.cummax.default: cummax,
    aten.cummin.default: cummin,
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
    aten.gcd.default: gcd,
    aten.var.correction: var_correction,
    aten.var_mean.correction: var_mean_correction,
    aten.std.correction: std_correction,
    aten.std_mean.correction: std_mean_correction,
    aten.add.Tensor: add_bool,
    aten.clamp.default: clamp,
    aten.lcm.default: lcm,
    aten.lerp.Scalar: lerp,
    aten.lerp.Tensor: lerp,
    aten.slice_scatter.default: slice_scatter,
    aten.isfinite.default: isfinite,
    aten.eq.Tensor: eq_tensor,
    aten.native_dropout.default: native_dropout,
    aten.atan2.default: atan2,
    aten.hypot.default: hypot,
    aten.amax.default: amax_uint8,
    aten.flip.default: flip_unsigned,
    aten.avg_pool2d.default: avg_pool2d,
    aten._cdist_forward.default: cdist_forward,
    aten._cdist_backward.default: cdist_backward,
    aten.searchsorted.Tensor: searchsorted,
    aten.searchsorted.Scalar: searchsorted,
    aten.avg_pool2d_backward.default: avg_pool2d_backward,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool2d_backward,
    aten.replication_pad1d_backward.default: replication_pad_backward,
    aten.replication_pad2d_backward.default: replication_pad_backward,
    aten.replication_pad3d_backward.default: replication_pad_backward,
    aten.amin.default: amin_uint8,
    aten.min.dim: min_dim,
    aten.bitwise_xor.Scalar: bitwise_xor_scalar,
    aten.bitwise_or.Scalar: bitwise_or_scalar,
    aten.__lshift__.Scalar: shift_left,
    aten.__lshift__.Tensor: shift_left,
    aten.bitwise_left_shift.Tensor: shift_left,
    aten.bitwise_left_shift.Tensor_Scalar: shift_left,
    aten.__rshift__.Scalar: shift_right,
    aten.__rshift__.Tensor: shift_right,
    aten.bitwise_right_shift.Tensor: shift_right,
    aten.bitwise_right_shift.Tensor_Scalar: shift_right,
}
