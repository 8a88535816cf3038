"""Bilinear and bicubic resizing (antialiased or not) and their backwards as two matmuls.

torch-mlir lowers neither ``aten._upsample_bilinear2d_aa`` nor
``aten._upsample_bicubic2d_aa`` (torchvision's ``Resize`` uses them by default on
tensors) nor their backwards, nor the plain ``upsample_bilinear2d`` / ``upsample_bicubic2d``
as the eager device traces them, nor their backwards or nearest's. Torch's kernels are separable: each output row is a
fixed weighted sum of input rows, then likewise for columns. The weights are taken
from torch's own kernel at trace time, by resizing the identity (each basis vector's
response is one column of the weight matrix), and enter the graph as constants
(:mod:`.literals`); the resize is then ``W_h @ x @ W_w^T`` and its backward
``W_h^T @ g @ W_w``. A uint8 image is resized in float32 as torch's uint8 kernel does it in
fixed point: along the width, rounded and clamped to 0..255, then along the height (within 1 of
it); other integer inputs keep the op as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch._decomp import get_decompositions

from torch_neuronx.compiler.decompositions.literals import literal

aten = torch.ops.aten


def _weights(kernel: Callable, size: int, out: int, align_corners: bool, scale: float | None,
             dtype: torch.dtype, device: torch.device, along_height: bool) -> torch.Tensor:
    """The ``(out, size)`` matrix ``kernel`` applies along one dim: its response to each basis vector."""
    def build() -> torch.Tensor:
        # Channels are the basis vectors, laid along the resized dim; the other dim holds two
        # equal copies, kept at size 2 (an identity: torch's kernel resizes size-1 dims oddly).
        eye = torch.eye(size, dtype=dtype)
        if along_height:
            basis = eye.reshape(1, size, size, 1).expand(1, size, size, 2).contiguous()
            response = kernel(basis, [out, 2], align_corners, scale, None)
            return response[0, :, :, 0].T.contiguous()
        basis = eye.reshape(1, size, 1, size).expand(1, size, 2, size).contiguous()
        response = kernel(basis, [2, out], align_corners, None, scale)
        return response[0, :, 0, :].T.contiguous()
    return literal(build, device)


def _matrices(kernel: Callable, input_size: Sequence[int], output_size: Sequence[int], align_corners: bool,
              scales_h: float | None, scales_w: float | None, like: torch.Tensor):
    height, width = input_size[-2], input_size[-1]
    rows = _weights(kernel, height, output_size[0], align_corners, scales_h, like.dtype, like.device, True)
    columns = _weights(kernel, width, output_size[1], align_corners, scales_w, like.dtype, like.device, False)
    return rows, columns


def _resize(kernel: Callable) -> Callable:
    def resize(x: torch.Tensor, output_size: Sequence[int], align_corners: bool, scales_h: float | None = None,
               scales_w: float | None = None) -> torch.Tensor:
        if x.dtype == torch.uint8:  # (images): torch's two passes, each rounded and clamped to 0..255
            rows, columns = _matrices(kernel, x.shape, output_size, align_corners, scales_h, scales_w,
                                      x.new_empty((), dtype=torch.float32))
            across = torch.matmul(x.to(torch.float32), columns.T).round().clamp(0, 255)
            return torch.matmul(rows, across).round().clamp(0, 255).to(torch.uint8)
        if not x.is_floating_point():
            return NotImplemented
        rows, columns = _matrices(kernel, x.shape, output_size, align_corners, scales_h, scales_w, x)
        return torch.matmul(torch.matmul(rows, x), columns.T)

    resize.__doc__ = f"``aten.{kernel.__name__}``: ``W_h @ x @ W_w^T`` with the kernel's own weights."
    return resize


def _resize_vec(resize: Callable) -> Callable:
    def resize_vec(x: torch.Tensor, output_size: Sequence[int] | None, align_corners: bool,
                   scale_factors: Sequence[float] | None) -> torch.Tensor:
        if output_size is None:
            output_size = [int(size * scale) for size, scale in zip(x.shape[-2:], scale_factors)]
            scales = list(scale_factors)
        else:
            scales = [None, None]
        return resize(x, output_size, align_corners, *scales)

    resize_vec.__doc__ = "The ``.vec`` overload: output size from scale factors when not given."
    return resize_vec


def _resize_backward(kernel: Callable) -> Callable:
    def backward(grad: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int], align_corners: bool,
                 scales_h: float | None = None, scales_w: float | None = None) -> torch.Tensor:
        if not grad.is_floating_point():
            return NotImplemented
        rows, columns = _matrices(kernel, input_size, output_size, align_corners, scales_h, scales_w, grad)
        return torch.matmul(torch.matmul(rows.T, grad), columns)

    backward.__doc__ = f"The backward of ``aten.{kernel.__name__}``: ``W_h^T @ g @ W_w``."
    return backward


_BILINEAR, _BICUBIC = aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default
_RESIZE_BILINEAR, _RESIZE_BICUBIC = _resize(_BILINEAR), _resize(_BICUBIC)

def _nearest(x: torch.Tensor, output_size: Sequence[int], align_corners: bool, scales_h: float | None,
             scales_w: float | None) -> torch.Tensor:
    """``upsample_nearest2d`` in the other kernels' signature (nearest has no ``align_corners``)."""
    return aten.upsample_nearest2d.default(x, output_size, scales_h, scales_w)


def _nearest_backward(grad: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                      scales_h: float | None = None, scales_w: float | None = None) -> torch.Tensor:
    """The backward of ``aten.upsample_nearest2d``: ``W_h^T @ g @ W_w`` with its 0/1 weights."""
    return _resize_backward(_nearest)(grad, output_size, input_size, False, scales_h, scales_w)


DECOMPOSITIONS: dict = {
    # The plain kernels too (``F.interpolate`` without antialiasing): torch-mlir lowers none of
    # them as the eager device traces them (the scales an op argument), nor their backwards.
    aten.upsample_bilinear2d.default: _resize(aten.upsample_bilinear2d.default),
    aten.upsample_bicubic2d.default: _resize(aten.upsample_bicubic2d.default),
    aten.upsample_bilinear2d_backward.default: _resize_backward(aten.upsample_bilinear2d.default),
    aten.upsample_bicubic2d_backward.default: _resize_backward(aten.upsample_bicubic2d.default),
    aten.upsample_nearest2d_backward.default: _nearest_backward,
    _BILINEAR: _RESIZE_BILINEAR,
    _BICUBIC: _RESIZE_BICUBIC,
    aten._upsample_bilinear2d_aa.vec: _resize_vec(_RESIZE_BILINEAR),
    aten._upsample_bicubic2d_aa.vec: _resize_vec(_RESIZE_BICUBIC),
    aten._upsample_bilinear2d_aa_backward.default: _resize_backward(_BILINEAR),
    aten._upsample_bicubic2d_aa_backward.default: _resize_backward(_BICUBIC),
    # 1-d and 3-d linear resizing as torch decomposes them (gathers and lerps): the eager device
    # traced the ops whole, which torch-mlir does not lower, and ran them on the CPU.
    **get_decompositions([aten.upsample_linear1d.default, aten.upsample_trilinear3d.default]),
}
