"""Fake quantization (quantization-aware training) as the float ops torch's CPU kernels compute.

``torch.fake_quantize_per_tensor_affine`` (with Python or tensor scale and zero point) and
``torch.fake_quantize_per_channel_affine`` reach the dispatcher as their ``*_cachemask`` forms,
which return the fake-quantized values and the mask their straight-through backward multiplies the
gradient by. torch-mlir lowers none of them ("failed to legalize operation 'torch.constant.int'"),
so a compiled QAT step failed and the eager device ran them on the CPU. Here they are the
kernels' arithmetic: ``q = round(x * (1 / scale)) + zero_point`` (rounded half to even; a
float zero point is added before rounding), clamped to ``[quant_min, quant_max]`` (a NaN to
``quant_min``, as ``fmax`` does), then ``(q - zero_point) * scale``; the mask holds where ``q`` was
in range. float16 and bfloat16 inputs compute in float32, as the kernels do.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import torch

__all__ = ["DECOMPOSITIONS"]

aten = torch.ops.aten


def _float32(value: float) -> float:
    """``value`` rounded to float32 (the kernels take the scale as a float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _fake_quantize(x: torch.Tensor, scale: torch.Tensor | float, zero_point: torch.Tensor | int,
                   quant_min: int, quant_max: int, *, per_channel: bool = False,
                   float_zero_point: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and the in-range mask of fake quantization (``scale``/``zero_point``: numbers, or
    tensors broadcasting against ``x``).

    The per-tensor kernel clamps the rounded float (NaN to ``quant_min``, infinities to the
    bounds) and multiplies in float32; the per-channel kernel converts it to int64 first (NaN,
    infinities and values beyond int64 become its minimum, so ``quant_min``) and computes
    ``(q - zero_point) * scale`` in float64.
    """
    wide = x.to(_compute_dtype(x))
    inverse = 1.0 / scale if isinstance(scale, torch.Tensor) else _float32(1.0 / _float32(scale))
    scaled = wide * inverse
    quantized = torch.round(scaled + zero_point) if float_zero_point else torch.round(scaled) + zero_point
    mask = (quantized >= quant_min) & (quantized <= quant_max)
    unrepresentable = ~(quantized.abs() < 2.0 ** 63) if per_channel else quantized.isnan()
    clamped = torch.where(unrepresentable, float(quant_min), quantized.clamp(quant_min, quant_max))
    scale_value = scale if isinstance(scale, torch.Tensor) else _float32(scale)
    if per_channel:
        offset = zero_point.to(torch.float64) if isinstance(zero_point, torch.Tensor) else zero_point
        values = (clamped.to(torch.float64) - offset) * scale_value.to(torch.float64)
    else:
        values = (clamped - zero_point).to(torch.float32) * scale_value
    return values.to(x.dtype), mask


def per_tensor_cachemask(x: torch.Tensor, scale: float, zero_point: int, quant_min: int,
                         quant_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.fake_quantize_per_tensor_affine_cachemask`` (a Python scale and zero point)."""
    if not x.is_floating_point():
        return NotImplemented
    return _fake_quantize(x, scale, zero_point, quant_min, quant_max)


def per_tensor_cachemask_tensor_qparams(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                                        fake_quant_enabled: torch.Tensor, quant_min: int,
                                        quant_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams``: the first element of each
    one-element tensor, as the kernel reads them; ``x`` itself and a full mask when disabled."""
    if not x.is_floating_point():
        return NotImplemented
    scale = scale.reshape(-1)[0].to(torch.float32)
    zero_point = zero_point.reshape(-1)[0].to(torch.int64)
    values, mask = _fake_quantize(x, scale, zero_point, quant_min, quant_max)
    enabled = fake_quant_enabled.reshape(-1)[0] != 0
    return torch.where(enabled, values, x), mask | ~enabled


def per_channel_cachemask(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
                          quant_min: int, quant_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.fake_quantize_per_channel_affine_cachemask``: one scale and zero point per index of
    ``axis`` (an integer zero point added after rounding, a float one before, as the kernel does)."""
    if not x.is_floating_point():
        return NotImplemented
    axis = axis % x.dim()
    shape = [1] * x.dim()
    shape[axis] = -1
    float_zero_point = zero_point.is_floating_point()
    zero_point = zero_point.reshape(shape)
    return _fake_quantize(x, scale.to(torch.float32).reshape(shape), zero_point, quant_min, quant_max,
                          per_channel=True, float_zero_point=float_zero_point)


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.fake_quantize_per_tensor_affine_cachemask.default: per_tensor_cachemask,
    aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default: per_tensor_cachemask_tensor_qparams,
    aten.fake_quantize_per_channel_affine_cachemask.default: per_channel_cachemask,
}
