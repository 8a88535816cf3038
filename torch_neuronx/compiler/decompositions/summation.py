"""Sums of many floating values as sums of short chunks: ``sum``, ``mean`` and ``linalg_vector_norm``.

IREE reduces a dimension by accumulating along it, each of its vector lanes (8 or 16) one
running sum; a dynamic-shape kernel, one running sum. Each added value is rounded to the
accumulator's precision, so the error grows with the length of that chain: the float32 sum of
a million 0.1s was 100060 from a static kernel and 100958 (1%) from a dynamic one, where torch's
cascade summation gives 100000.008. Here a reduced dimension longer than :data:`PLAIN` is cut into
chunks of :data:`CHUNK` values (zero-padded to a multiple), each chunk summed, and the chunk sums
reduced the same way until few are left: no chain is longer than a few hundred values, and each
level is a parallel reduction of many short rows. Several reduced dimensions are summed one at a
time (IREE would run them as one chain). A dimension of symbolic size (a dynamic-shape trace) is
left as it is: cut without a guard on its size, its padded sizes became nested ``Mod`` and
``FloorDiv`` expressions that sympy took minutes to analyze. Integer sums are exact and left as
they are; float16 and bfloat16 arrive here in float32 (:mod:`.precision`).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

aten = torch.ops.aten

CHUNK = 64  # values per chunk at each level
PLAIN = 256  # a static dimension up to this long is summed as it is


_state = threading.local()  # set while this module emits its last, plain sums


@contextlib.contextmanager
def _as_they_are() -> Iterator[None]:
    """The sums emitted inside are left as they are (the last level is short already)."""
    before = getattr(_state, "plain", False)
    _state.plain = True
    try:
        yield
    finally:
        _state.plain = before


def _dims(x: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, Sequence) and len(dim) == 0):
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % max(x.dim(), 1) for d in dims})


def _whole(x: torch.Tensor, dims: list[int]) -> bool:
    """Whether a floating reduction of ``x`` over ``dims`` leaves one element (static sizes)."""
    if not x.is_floating_point() or x.dim() == 0 or not all(isinstance(s, int) for s in x.shape):
        return False
    return all(size == 1 for d, size in enumerate(x.shape) if d not in dims)


def _long(size: Any) -> bool:
    return isinstance(size, int) and size > PLAIN


def _needed(x: torch.Tensor, dims: list[int]) -> bool:
    """Whether a floating sum of ``x`` over ``dims`` has a dimension long enough to chunk, or
    several dimensions that IREE would sum as one long one."""
    if getattr(_state, "plain", False) or not x.is_floating_point() or x.dim() == 0 \
            or not all(isinstance(x.shape[d], int) for d in dims):
        return False
    count = 1
    for d in dims:
        if _long(x.shape[d]):
            return True
        count *= x.shape[d]
    return count > PLAIN


def _sum_one(x: torch.Tensor, d: int) -> torch.Tensor:
    """``x`` summed over dimension ``d`` (kept, of size 1), in chunks when it is long."""
    while _long(x.shape[d]):
        n = x.shape[d]
        pad = (-n) % CHUNK
        if pad:
            x = aten.constant_pad_nd.default(x, [0, 0] * (x.dim() - 1 - d) + [0, pad], 0.0)
        shape = list(x.shape)
        shape[d:d + 1] = [(n + pad) // CHUNK, CHUNK]
        x = aten.sum.dim_IntList(x.reshape(shape), [d + 1])
    with _as_they_are():
        return aten.sum.dim_IntList(x, [d], True)


def chunked_sum(x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    """``x`` summed over ``dims`` (sorted, non-negative), each long dimension in chunks."""
    for d in reversed(dims):
        x = _sum_one(x, d)
    return x if keepdim else aten.squeeze.dims(x, dims)


def sum_dim(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
    """``aten.sum.dim_IntList``."""
    source = x if dtype is None else x.to(dtype)
    dims = _dims(source, dim)
    if not _needed(source, dims):
        return NotImplemented
    return chunked_sum(source, dims, keepdim)


def sum_all(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> Any:
    """``aten.sum.default``: as ``aten.sum.dim_IntList`` over every dimension (torch's own decomposition)."""
    return aten.sum.dim_IntList(x, [], False, dtype=dtype)


def mean_dim(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Any:
    """``aten.mean.dim``: the chunked sum over the count."""
    source = x if dtype is None else x.to(dtype)
    dims = _dims(source, dim)
    if not _needed(source, dims):
        if dtype is not None and dtype != x.dtype:  # torch-mlir lowers no mean of ints with a dtype
            return aten.mean.dim(source, dim, keepdim)
        return NotImplemented
    count = 1
    for d in dims:
        count = count * source.shape[d]
    return chunked_sum(source, dims, keepdim) / count


def mean_all(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> Any:
    """``aten.mean.default``."""
    return mean_dim(x, None, False, dtype=dtype)


def vector_norm(x: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                dtype: torch.dtype | None = None) -> Any:
    """``aten.linalg_vector_norm`` of a finite positive order: ``(Σ|x|^p)^(1/p)``, the sum chunked.

    A norm of the whole tensor (one value: ``clip_grad_norm_``'s norm of each gradient) is written
    out too, so that the root of each is a one-element op of the graph, which
    ``passes/scalar_batches.py`` batches with the others (inside torch-mlir's lowering of the op,
    IREE put every such root of a graph in one dispatch, over its binding limits)."""
    source = x if dtype is None else x.to(dtype)
    dims = _dims(source, dim)
    if isinstance(ord, bool) or not isinstance(ord, int | float) or not math.isfinite(ord) or ord <= 0 \
            or not (_needed(source, dims) or _whole(source, dims)) or source.is_complex():
        return NotImplemented
    magnitude = source.abs()
    powered = magnitude * magnitude if ord == 2 else magnitude.pow(ord)
    total = chunked_sum(powered, dims, keepdim)
    return total.sqrt() if ord == 2 else total.pow(1.0 / ord)


DECOMPOSITIONS = {
    aten.sum.dim_IntList: sum_dim,
    aten.sum.default: sum_all,
    aten.mean.dim: mean_dim,
    aten.mean.default: mean_all,
    aten.linalg_vector_norm.default: vector_norm,
}
