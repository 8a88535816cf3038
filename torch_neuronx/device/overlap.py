"""Writes whose source and destination share memory, refused where the op is called.

torch's CPU kernels raise for a write into a tensor of which several elements share one memory
location (``x.expand(4, 3).add_(1)``), and for a copy or pointwise in-place op whose input
partly overlaps its output (``y[1:] = y[:-1]``, ``x.add_(x.t())``): the result would depend on
the order elements are written in. Queued on a stream, such an op failed only when it ran,
poisoning the tensor, or silently computed with clone semantics. These checks raise torch's
errors at the call, as torch's ``assert_no_internal_overlap`` and ``assert_no_partial_overlap`` do.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from torch_neuronx.runtime.allocation import _span_bytes

__all__ = ["NO_OVERLAP", "refuse_any_overlap", "refuse_internal_overlap", "refuse_partial_overlap",
           "shares_memory_within", "touches_any"]

_PARTIAL = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
            "single memory location. Please clone() the tensor before performing the operation.")


def refuse_internal_overlap(target: torch.Tensor) -> None:
    """Raise torch's error for a write into ``target`` (a neuron tensor) whose elements share memory."""
    if torch._debug_has_internal_overlap(target._data) == 1:
        raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                           "single memory location. Please clone() the tensor before performing the operation.")


def shares_memory_within(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share one memory location (an expanded view, ``unfold`` with a
    step below its size, an overlapping ``as_strided``). Exact: a layout whose every stride passes
    the reach of the smaller ones cannot overlap; any other is checked element by element (rare)."""
    dims = sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    reach = 0
    for stride, size in dims:
        if stride <= reach:
            break
        reach += (size - 1) * stride
    else:
        return False
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = (offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride)
    return int(torch.unique(offsets.reshape(-1)).numel()) < t.numel()


def _dense_span(t: torch.Tensor) -> tuple[int, int] | None:
    """The byte range of ``t``'s elements when they fill it exactly (torch only judges such tensors)."""
    nbytes = t.numel() * t.element_size()
    # (gaps, or elements sharing memory, make the span differ: torch calls those too hard to judge)
    if nbytes == 0 or _span_bytes(t.shape, t.stride(), t.dtype) != nbytes:
        return None
    start = t.data_ptr()
    return start, start + nbytes


def refuse_partial_overlap(target: torch.Tensor, sources: Iterable[object]) -> None:
    """Raise torch's error when a neuron tensor among ``sources`` partly overlaps ``target``'s memory
    (the same elements with the same layout is a full overlap, which torch allows)."""
    mine = _dense_span(target._data)
    if mine is None:
        return
    for source in sources:
        data = getattr(source, "_data", None)
        if not isinstance(data, torch.Tensor) or data is target._data:
            continue
        theirs = _dense_span(data)
        if theirs is None or theirs[0] >= mine[1] or mine[0] >= theirs[1]:
            continue
        if theirs == mine and data.shape == target.shape and data.stride() == target.stride():
            continue  # full overlap: the same elements
        raise RuntimeError(_PARTIAL)


#: In-place ops whose ATen kernels refuse any overlap of the written tensor with another argument,
#: the same elements included (``assert_no_overlap``: ``x.index_copy_(0, i, x[:3])``, ``x[i] = x[:3]``).
NO_OVERLAP = frozenset(getattr(torch.ops.aten, name) for name in (
    "index_copy_", "index_add_", "index_reduce_", "index_put_", "_index_put_impl_", "put_", "scatter_",
    "scatter_add_", "scatter_reduce_"))


def refuse_any_overlap(target: torch.Tensor, sources: Iterable[object]) -> None:
    """Raise torch's error when a neuron tensor among ``sources`` shares any of ``target``'s memory,
    as ``assert_no_overlap`` judges it: the target itself, or a dense tensor whose bytes meet the
    dense target's (layouts with gaps or shared elements are too hard to judge: allowed)."""
    mine = _dense_span(target._data)
    for source in sources:
        data = getattr(source, "_data", None)
        if not isinstance(data, torch.Tensor):
            continue
        if data is target._data:
            raise RuntimeError(_PARTIAL)
        theirs = _dense_span(data) if mine is not None else None
        if theirs is not None and theirs[0] < mine[1] and mine[0] < theirs[1]:
            raise RuntimeError(_PARTIAL)


def _reach(t: torch.Tensor) -> tuple[int, int] | None:
    """The byte range from ``t``'s first element to past its last (None when it has no elements)."""
    nbytes = _span_bytes(t.shape, t.stride(), t.dtype)
    if nbytes == 0:
        return None
    return t.data_ptr(), t.data_ptr() + nbytes


def touches_any(target: torch.Tensor, sources: Iterable[object]) -> bool:
    """Whether a neuron tensor among ``sources`` lies in the byte range of ``target``'s elements (a
    conservative test: interleaved views that share no element count too)."""
    mine = _reach(target._data)
    if mine is None:
        return False
    for source in sources:
        data = getattr(source, "_data", None)
        if not isinstance(data, torch.Tensor):
            continue
        theirs = _reach(data)
        if theirs is not None and theirs[0] < mine[1] and mine[0] < theirs[1]:
            return True
    return False
