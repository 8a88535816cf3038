"""The ``*_copy`` forms of views, and other ops torch decomposes but its core table leaves whole.

``view_copy``, ``permute_copy``, ``unbind_copy``, ``as_strided_copy``, ``narrow_copy``
and ``new_empty_strided`` reached torch-mlir whole, which fails on them (``failed to
legalize operation 'torch.constant.int'``): torch's own decompositions (outside its core
ATen table) write each as a view plus a copy. ``fmax`` and ``fmin`` (torch-mlir mistyped
their broadcast compare for a 0-d operand; torch's decomposition is a prim) are a
``where`` of ``maximum``/``minimum`` and ``isnan`` here.

``as_strided_scatter`` (torch's decomposition is a prim) writes ``src`` through the
storage offsets its size and strides name, in the storage order of ``input``'s
clone; ``unfold`` of a 0-d tensor is its one-element view (torch's ``as_strided``
of it crashed torch-mlir).

A ``view(dtype)`` to a wider element (``int32`` as ``int64``: torch-mlir lowers only views that
keep or narrow the width) assembles each wide element from its narrow ones, little-endian,
in integer arithmetic; the inverse view functionalization writes after an in-place op through
a narrowing view is one of these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._decomp import decomposition_table, get_decompositions

aten = torch.ops.aten


def _ignoring_nan(extreme: object) -> object:
    """``fmax``/``fmin``: ``extreme`` of the two, or the one that is not NaN."""

    def decomposition(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype = torch.result_type(a, b)
        a, b = torch.broadcast_tensors(a.to(dtype), b.to(dtype))
        if not dtype.is_floating_point:
            return extreme(a, b)
        return torch.where(a.isnan(), b, torch.where(b.isnan(), a, extreme(a, b)))

    return decomposition


def _storage_offsets(size: Sequence[int], stride: Sequence[int], offset: int, device: torch.device) -> torch.Tensor:
    """The storage offset of every element of the strided view ``(size, stride, offset)``, flat."""
    offsets = torch.full((), offset, dtype=torch.int64, device=device)
    for axis, (extent, step) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[axis] = extent
        offsets = offsets + torch.arange(extent, device=device).view(shape) * step
    return offsets.expand(tuple(size)).reshape(-1)


def as_strided_scatter(x: torch.Tensor, src: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None = None) -> torch.Tensor:
    """``aten.as_strided_scatter``: ``x``'s clone with ``src`` written into its view
    ``as_strided(size, stride, storage_offset)``.

    The clone keeps ``x``'s strides, so storage offsets count in ``x``'s own memory order
    (a dense ``x`` only: one with gaps or overlaps has no such order here)."""
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    storage = x.permute(order)
    if not storage.is_contiguous():
        return NotImplemented
    targets = _storage_offsets(size, stride, storage_offset or 0, x.device)
    flat = storage.reshape(-1).index_put((targets,), src.reshape(-1).to(x.dtype))
    inverse = sorted(range(x.dim()), key=order.__getitem__)
    return flat.view(storage.shape).permute(inverse)


def unfold(x: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    """``aten.unfold``: torch's strided view; of a 0-d tensor (size 0 or 1), its one-element view."""
    if x.dim() == 0:
        return x.reshape(1).narrow(0, 0, size)
    return decomposition_table[aten.unfold.default](x, dimension, size, step)


_INTEGERS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def view_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.view(dtype)`` for a wider ``dtype`` (others are left to the lowering: NotImplemented)."""
    narrow_bytes, wide_bytes = x.element_size(), dtype.itemsize
    if (wide_bytes <= narrow_bytes or x.dim() == 0 or x.is_complex() or dtype.is_complex
            or torch.bool in (x.dtype, dtype) or wide_bytes not in _INTEGERS):
        return NotImplemented
    narrow, wide = _INTEGERS[narrow_bytes], _INTEGERS[wide_bytes]
    ratio, bits = wide_bytes // narrow_bytes, 8 * narrow_bytes
    parts = (x if x.dtype == narrow else x.view(narrow)).reshape(*x.shape[:-1], x.shape[-1] // ratio, ratio)
    unsigned = parts.to(wide) & ((1 << bits) - 1)  # (sign-extended by the conversion: masked off)
    assembled = unsigned[..., 0]
    for i in range(1, ratio):  # (the parts share no bit: a sum is their OR; wrapping is two's complement's)
        assembled = assembled + unsigned[..., i] * (1 << (bits * i))
    return assembled if dtype == wide else assembled.view(dtype)


def copy_strided(a: torch.Tensor, stride: list[int]) -> torch.Tensor:
    """``prims.copy_strided`` (torch's reference ``index_fill`` of a non-contiguous tensor keeps its
    layout this way; torch-mlir has no lowering): ``a``'s values laid out in ``stride``'s order of
    dimensions (a permuted contiguous copy, which the lowering knows, not ``empty_strided``)."""
    order = sorted(range(a.dim()), key=lambda d: -stride[d])  # outermost first
    inverse = sorted(range(a.dim()), key=order.__getitem__)
    return a.permute(order).clone(memory_format=torch.contiguous_format).permute(inverse)


DECOMPOSITIONS = {
    torch.ops.prims.copy_strided.default: copy_strided,
    aten.view.dtype: view_dtype,
    aten.as_strided_scatter.default: as_strided_scatter,
    aten.unfold.default: unfold,
    aten.fmax.default: _ignoring_nan(torch.maximum),
    aten.fmin.default: _ignoring_nan(torch.minimum),
}
DECOMPOSITIONS |= get_decompositions([
    aten.view_copy.default,
    aten.permute_copy.default,
    aten.unbind_copy.int,
    aten.as_strided_copy.default,
    aten.narrow_copy.default,
    aten.new_empty_strided.default,
])
