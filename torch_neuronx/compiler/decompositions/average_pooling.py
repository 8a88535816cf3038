"""2-d average pooling and its backward (torch-mlir lowers them only without ``ceil_mode``
and with ``count_include_pad``), adaptive 2-d average pooling as two matmuls, and the
replication-padding backwards.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

aten = torch.ops.aten


# Pooling and padding gradients torch-mlir lowers only in part (avg_pool2d without ceil_mode
# and with count_include_pad) or not at all.
def avg_pool_divisors(out: int, size: int, kernel: int, stride: int, pad: int, include_pad: bool,
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
    rows, cols = (avg_pool_divisors(t.shape[d - 2], size[d], kernel[d], stride[d], padding[d], include_pad,
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


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.avg_pool2d.default: avg_pool2d,
    aten.avg_pool2d_backward.default: avg_pool2d_backward,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool2d_backward,
    aten.replication_pad1d_backward.default: replication_pad_backward,
    aten.replication_pad2d_backward.default: replication_pad_backward,
    aten.replication_pad3d_backward.default: replication_pad_backward,
}
