"""Ops that reached torch-mlir whole, written as the ops they compose.

- ``addmv``, ``dist`` and ``_batch_norm_with_update`` (with its functional form): torch's own
  decompositions, which its core ATen table leaves out.
- ``angle`` of real tensors: pi where the value is negative, 0 elsewhere, NaN kept (complex
  tensors go through the complex decomposition pass).
- ``addbmm`` of real tensors: the batch of products summed, scaled and added (torch-mlir's own
  lowering failed on bfloat16 and integers: "failed to legalize operation 'torch.constant.int'").
- ``full_like`` of uint8: computed in int16 and narrowed (torch-mlir made a uint8 literal, which
  does not lower: ``zero_``/``fill_``/``zeros_like`` of a uint8 tensor fell back to the CPU on the
  eager device, with a warning).
- ``addmm`` with ``beta=0``: the product alone; ``input`` is ignored, its NaNs and infinities
  included, as eager's kernel and torch's documentation say (lowered whole, 0 * NaN was NaN).
  Of integer tensors: the scaled sum (torch-mlir's lowering of it did not legalize).
- ``native_batch_norm`` in evaluation: the per-channel affine map of the running statistics.
- ``grid_sampler_2d`` and ``grid_sampler_3d`` called directly (``F.grid_sample`` is rewritten
  before tracing, :mod:`.functional`): the same samplers, for the integer mode arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch._decomp import decompositions as torch_decompositions
from torch._decomp import get_decompositions

from torch_neuronx.compiler.decompositions import functional

aten = torch.ops.aten

_MODES, _PADDINGS = functional.MODE_NAMES, functional.PADDING_NAMES


def angle(x: torch.Tensor) -> torch.Tensor:
    """``aten.angle`` of a real tensor: pi where ``x < 0``, else 0; NaN stays NaN (a float result)."""
    if x.is_complex():
        return NotImplemented
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    x = x.to(dtype)
    phase = torch.where(x < 0, math.pi, 0.0).to(dtype)
    return torch.where(x.isnan(), x, phase)


def grid_sampler_2d(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> torch.Tensor:
    """``aten.grid_sampler_2d``: :mod:`.functional`'s sampler (bilinear, nearest), which matches eager's
    CPU kernel on NaN and infinite coordinates where torch's decomposition does not; torch's
    decomposition for bicubic."""
    mode = _MODES.get(interpolation_mode)
    if mode in ("bilinear", "nearest") and padding_mode in _PADDINGS:
        return functional.grid_sample_nd(input, grid, mode, _PADDINGS[padding_mode], align_corners)
    return torch_decompositions._grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners)


def grid_sampler_3d(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> torch.Tensor:
    """``aten.grid_sampler_3d`` (bilinear and nearest, as eager's CPU kernel): :mod:`.functional`'s sampler."""
    mode = _MODES.get(interpolation_mode)
    if mode not in ("bilinear", "nearest") or padding_mode not in _PADDINGS:
        return NotImplemented
    return functional.grid_sample_nd(input, grid, mode, _PADDINGS[padding_mode], align_corners)


def addbmm(x: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: float = 1,
           alpha: float = 1) -> torch.Tensor:
    """``aten.addbmm`` of real tensors: ``beta * x + alpha * sum(batch1 @ batch2)``, where a zero
    ``beta`` ignores ``x`` (its NaNs included), as eager's kernel; integers sum in their own type
    (torch-mlir's lowering of integer ``addbmm`` did not legalize)."""
    if x.is_complex() or batch1.is_complex() or torch.bool in (x.dtype, batch1.dtype) \
            or x.is_floating_point() != batch1.is_floating_point():
        return NotImplemented
    product = torch.bmm(batch1, batch2).sum(0, dtype=batch1.dtype)
    if alpha != 1:
        product = product * alpha
    if beta == 0:  # (the result has the product's shape; ``x`` only broadcasts to it)
        return product
    return (x if beta == 1 else x * beta) + product


def addmm(x: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: float = 1,
          alpha: float = 1) -> torch.Tensor:
    """``aten.addmm`` with ``beta=0``: ``alpha * (mat1 @ mat2)``, ``x`` ignored; of integer tensors:
    ``beta * x + alpha * (mat1 @ mat2)`` (lowered whole, torch-mlir's integer scaling did not
    legalize: "failed to legalize operation 'torch.constant.int'"). Other floats: lowered whole."""
    integer = not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
    if beta != 0 and not integer:
        return NotImplemented
    product = torch.mm(mat1, mat2)
    product = product if alpha == 1 else product * alpha
    if beta == 0:
        return product
    return product + (x if beta == 1 else x * beta)


def _uint8_fill(value: float | int | bool) -> int:
    return int(value) % 256  # (-1 wraps to 255, as torch's conversion does)


def full_like_uint8(x: torch.Tensor, fill_value: float | int | bool, *, dtype: torch.dtype | None = None,
                    **kwargs: object) -> torch.Tensor:
    """``aten.full_like`` with a uint8 result, as an int16 fill narrowed."""
    if (dtype or x.dtype) != torch.uint8 or isinstance(fill_value, torch.Tensor) or x.is_complex():
        return NotImplemented
    # Computed from x (times 0), not filled: torch-mlir folds a fill of a static shape into a
    # uint8 literal again, which is what does not lower.
    return (x.to(torch.int16) * 0 + _uint8_fill(fill_value)).to(torch.uint8)


def native_batch_norm_inference(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                                training: bool, momentum: float, eps: float) -> tuple[torch.Tensor, ...]:
    """``native_batch_norm`` in evaluation (running statistics): ``(x - mean) * invstd * w + b`` per
    channel, and the empty saved statistics eval returns. Lowered whole, its empty results failed in
    torch-mlir ("'tensor.cast' op ... tensor<0xf32> are cast incompatible"): a BatchNorm in
    ``eval()`` on the eager device ran on the CPU at every call.

    The result has the input's dtype, computed in float32 for float16/bfloat16 inputs, as torch's
    kernel: a bfloat16 input with float32 statistics (a bfloat16 model that keeps batch norm in
    float32) came out float32, and the next layer refused it. Training (and instance norm, which
    has no running statistics) is torch's decomposition: torch-mlir's lowering of the op failed
    for such mixed dtypes and it ran on the CPU."""
    if training or running_mean is None or running_var is None:
        return torch._decomp.decompositions.native_batch_norm(x, weight, bias, running_mean, running_var, training,
                                                              momentum, eps)
    shape = [1, -1] + [1] * (x.dim() - 2)
    computed = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    invstd = torch.rsqrt(running_var + eps)
    out = (computed - running_mean.view(shape)) * invstd.view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    empty = x.new_zeros((0,))
    return out.to(x.dtype), empty, empty.clone()


#: This module's decompositions, merged into the compile path's table.
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    """``aten.nan_to_num``; of a complex tensor, of its real and imaginary parts (torch's
    decomposition refuses complex: "Complex dtype is not supported for isneginf")."""
    if x.is_complex():
        return torch.view_as_complex(torch._refs.nan_to_num(torch.view_as_real(x.resolve_conj()), nan, posinf,
                                                            neginf).contiguous())
    return torch._refs.nan_to_num(x, nan, posinf, neginf)


def shrink_backward(grad: torch.Tensor, x: torch.Tensor, lambd: float = 0.5) -> torch.Tensor:
    """``aten.hardshrink_backward`` and ``aten.softshrink_backward`` (no lowering: the eager device
    ran them on the CPU): the gradient where ``x`` lies outside ``[-lambd, lambd]``, as torch's kernel."""
    return torch.where((x >= -lambd) & (x <= lambd), torch.zeros((), dtype=grad.dtype, device=grad.device), grad)


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.hardshrink_backward.default: shrink_backward,
    aten.softshrink_backward.default: shrink_backward,
    aten.native_batch_norm.default: native_batch_norm_inference,
    aten.nan_to_num.default: nan_to_num,
    aten.angle.default: angle,
    aten.addbmm.default: addbmm,
    aten.addmm.default: addmm,
    aten.full_like.default: full_like_uint8,
    aten.grid_sampler_2d.default: grid_sampler_2d,
    aten.grid_sampler_3d.default: grid_sampler_3d,
    **get_decompositions([aten.addmv.default, aten.dist.default, aten._batch_norm_with_update.default,
                          aten._batch_norm_with_update_functional.default]),
}
