"""The statistics kernels of ``nn.SyncBatchNorm`` (CUDA-only in ATen) as decompositions.

SyncBatchNorm computes each rank's per-channel mean and inverse standard deviation
(``batch_norm_stats``), all-gathers them with the element counts, merges them
(``batch_norm_gather_stats_with_counts``), normalizes (``batch_norm_elemt``), and in the
backward reduces the gradient's sums per channel (``batch_norm_backward_reduce``), all-reduces
them and forms the input's gradient (``batch_norm_backward_elemt``). The statistics are kept in
the input's accumulation type (float32 for float16/bfloat16 inputs), as ATen's CUDA kernels keep
them. The channel dimension is 1.

The running statistics that ``batch_norm_gather_stats_with_counts`` updates in place (its schema
does not say so) are written by the eager device (``device/eager.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

aten = torch.ops.aten


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _channel(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over ``like`` (channels in dimension 1)."""
    return t.reshape([1, -1] + [1] * (like.dim() - 2))


def _reduced_dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def batch_norm_stats(input: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's per-channel mean and ``1 / sqrt(biased variance + eps)``."""
    x = input.to(_accumulation(input.dtype))
    dims = _reduced_dims(x)
    mean = x.mean(dims)
    variance = (x - _channel(mean, x)).square().mean(dims)
    return mean, (variance + eps).rsqrt()


def merged_statistics(mean: torch.Tensor, invstd: torch.Tensor, eps: float,
                      counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's statistics (rows of ``mean``/``invstd``, ``counts`` elements each) merged: the
    global mean, its biased variance, and the element count (a rank with no elements adds nothing)."""
    n = counts.to(mean.dtype).reshape(-1, 1)
    total = n.sum(0)
    present = n > 0
    global_mean = (mean * n).sum(0) / total
    variance = torch.where(present, invstd.reciprocal().square() - eps, torch.zeros_like(mean))
    spread = torch.where(present, (mean - global_mean).square(), torch.zeros_like(mean))
    return global_mean, ((variance + spread) * n).sum(0) / total, total


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """The global mean and inverse standard deviation from every rank's (see :func:`merged_statistics`)."""
    global_mean, variance, _ = merged_statistics(mean, invstd, eps, counts)
    return global_mean, (variance + eps).rsqrt()


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    """``(input - mean) * invstd * weight + bias`` per channel, in the input's dtype."""
    x = input.to(_accumulation(input.dtype))
    scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
    out = (x - _channel(mean, x)) * _channel(scale, x)
    if bias is not None:
        out = out + _channel(bias.to(out.dtype), x)
    return out.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    """Per channel: the sum of the gradient, of the gradient times ``input - mean``, and the
    weight's and bias's gradients (in the weight's dtype)."""
    acc = _accumulation(input.dtype)
    dy, x = grad_out.to(acc), input.to(acc)
    dims = _reduced_dims(x)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (x - _channel(mean, x))).sum(dims)
    dtype = weight.dtype if weight is not None else mean.dtype
    return sum_dy, sum_dy_xmu, (sum_dy_xmu * invstd).to(dtype), sum_dy.to(dtype)


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """The input's gradient from the all-reduced sums and every rank's element count."""
    acc = _accumulation(input.dtype)
    dy, x = grad_out.to(acc), input.to(acc)
    total = count.to(acc).sum()
    mean_dy, mean_dy_xmu = sum_dy / total, sum_dy_xmu / total
    scale = invstd if weight is None else invstd * weight.to(acc)
    projected = (x - _channel(mean, x)) * _channel(invstd.square() * mean_dy_xmu, x)
    return ((dy - _channel(mean_dy, x) - projected) * _channel(scale, x)).to(grad_out.dtype)


def running_statistics(running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                       mean: torch.Tensor, invstd: torch.Tensor, momentum: float, eps: float,
                       counts: torch.Tensor) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
    """(running statistic, its new value) pairs: the momentum update with the unbiased variance."""
    global_mean, variance, total = merged_statistics(mean, invstd, eps, counts)
    pairs = []
    if running_mean is not None:
        pairs.append((running_mean, running_mean * (1 - momentum) + global_mean.to(running_mean.dtype) * momentum))
    if running_var is not None:
        unbiased = variance * total / (total - 1).clamp_min(1)
        pairs.append((running_var, running_var * (1 - momentum) + unbiased.to(running_var.dtype) * momentum))
    return pairs


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.batch_norm_stats.default: batch_norm_stats,
    aten.batch_norm_gather_stats_with_counts.default: batch_norm_gather_stats_with_counts,
    aten.batch_norm_elemt.default: batch_norm_elemt,
    aten.batch_norm_backward_reduce.default: batch_norm_backward_reduce,
    aten.batch_norm_backward_elemt.default: batch_norm_backward_elemt,
}
