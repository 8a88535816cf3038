"""Views and scatters torch-mlir does not lower (``diagonal``, ``diagonal_scatter``,
``slice_scatter``), ``flip`` of unsigned tensors, ``native_dropout``, ``cdist`` and its
backward, weight norm's backward; :data:`FROM_TORCH`, the decompositions PyTorch has outside
its core table that the compile path adds; and :func:`calls_itself`, for decompositions that
call the op they decompose. Subjects of their own: :mod:`.arithmetic`, :mod:`.sorting`,
:mod:`.scans`, :mod:`.average_pooling`, :mod:`.moments`, :mod:`.attention`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator

import torch

from torch_neuronx.compiler.decompositions import sampling

aten = torch.ops.aten


_inside = threading.local()
_linalg = contextvars.ContextVar("neuron_linalg_trace", default=False)


@contextlib.contextmanager
def linalg_trace() -> Iterator[None]:
    """Decompositions traced inside this block lower through linalg-on-tensors (a dynamic-shape
    kernel), whose forms of some ops lose range that StableHLO's keep (:func:`for_linalg`)."""
    token = _linalg.set(True)
    try:
        yield
    finally:
        _linalg.reset(token)


def for_linalg() -> bool:
    """Whether the trace under way lowers through linalg (see :func:`linalg_trace`)."""
    return _linalg.get()


def calls_itself(decomposition: Callable) -> Callable:
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


@calls_itself
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


def native_dropout(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.native_dropout`` from ``rand_like`` (which the compile path draws on the host per call;
    torch-mlir's lowering drew the same mask every call)."""
    if train and not 0 <= p <= 1:  # (traced, it drew a mask anyway: SDPA's dropout_p=1.5 gave zeros)
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not train or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    # (uniforms of a float16/bfloat16 ``x`` in float32: 8 bits of bfloat16 made p=0.001 drop nothing)
    keep = torch.rand_like(x, dtype=sampling.draw_dtype(x)) < 1 - p
    return x * keep * (1.0 / (1 - p)), keep


def flip_unsigned(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``aten.flip`` of unsigned integers as gathers: IREE cannot compile ``stablehlo.reverse`` of them."""
    if x.dtype not in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return NotImplemented
    for dim in dims:
        n = x.shape[dim]
        x = x.index_select(dim, torch.arange(n - 1, -1, -1, device=x.device))
    return x


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

def neg_view(x: torch.Tensor) -> torch.Tensor:
    """``torch._neg_view`` (``x.conj().imag``): a view that sets the negative bit; traced after
    functionalization, which already resolved what it aliases, it is the negation it stands for."""
    return torch.neg(x)


def is_all_true(x: torch.Tensor) -> torch.Tensor:
    """``aten._is_all_true`` (``torch.distributions``' argument validation): ``all`` of a bool tensor
    (torch-mlir has no lowering: every ``Categorical(...)`` on neuron warned and ran it on the CPU)."""
    return x.all()


def is_any_true(x: torch.Tensor) -> torch.Tensor:
    """``aten._is_any_true``: ``any`` of a bool tensor."""
    return x.any()


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten._is_all_true.default: is_all_true,
    aten._is_any_true.default: is_any_true,
    aten._neg_view.default: neg_view,
    aten.diagonal.default: diagonal,
    aten.diagonal_scatter.default: diagonal_scatter,
    aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    aten.slice_scatter.default: slice_scatter,
    aten.native_dropout.default: native_dropout,
    aten.flip.default: flip_unsigned,
    aten._cdist_forward.default: cdist_forward,
    aten._cdist_backward.default: cdist_backward,
}
