"""Convolution backwards torch-mlir cannot lower, and transposed convolutions with uneven output padding.

Neither torch-mlir's lowering of the backward (``aten.convolution_backward``)
nor our earlier decomposition of it (per-group forward convolutions) compiled for
grouped (depthwise), dilated, 1-d or 3-d convolutions, and torch-mlir lowers no
backward of a transposed one. Its transposed convolution also applied one dim's
output padding to another:
``F.conv_transpose2d(x, w, stride=2, output_padding=(1, 0))`` failed to lower,
and so did the backward of ``F.conv2d(x, w, stride=2)`` on a 6x5 input, whose
input gradient is such a transposed convolution.

Here, in convolutions torch-mlir lowers (plain ones, and transposed ones without
padding):

- a transposed convolution with differing output paddings is computed in full
  and cropped (or padded with zeros) to its size;
- a plain convolution's input gradient is the transposed convolution of the
  output gradient, its weight gradient a convolution with batch and channels
  exchanged (:func:`_weight_gradient`), its bias gradient a sum;
- a transposed convolution, the adjoint of a plain one, has the plain
  convolution of the output gradient as input gradient and the weight gradient of
  a plain convolution with input and output gradient exchanged.

Every convolution backward takes this path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_neuronx.compiler.decompositions.general import calls_itself

aten = torch.ops.aten


def _transposed(x: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], sizes: Sequence[int], groups: int) -> torch.Tensor:
    """A transposed convolution (no bias) with spatial ``sizes``: the full output, each dim cut to size."""
    dims = len(stride)
    full = aten.convolution.default(x, weight, None, list(stride), [0] * dims, list(dilation), True,
                                    [0] * dims, groups)
    for i, size in enumerate(sizes):
        axis = 2 + i
        available = full.shape[axis] - padding[i]
        full = full.narrow(axis, padding[i], min(size, available))
        if size > available:  # output padding past the full output: rows nothing contributes to
            full = torch.nn.functional.pad(full, [0, 0] * (full.dim() - axis - 1) + [0, size - available])
    return full


def _per_dim(dims: int, *params: Sequence[int]) -> list[list[int]]:
    """Each of ``params`` with one value per spatial dimension: aten takes one value for all
    (``padding="valid"`` reaches ``convolution_backward`` as ``padding=[0]``)."""
    return [list(p) * dims if len(p) == 1 else list(p) for p in params]


def _shape_env(x: torch.Tensor) -> object | None:
    """The shape environment of a symbolically traced ``x``; None for concrete sizes."""
    for size in x.shape:
        if isinstance(size, torch.SymInt):
            return size.node.shape_env
    return None


@calls_itself
def convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                output_padding: Sequence[int], groups: int):
    """``aten.convolution``: ours for transposed ones with differing output paddings; a forward one's
    output padding (which torch ignores) dropped; with symbolic
    sizes, torch's without the guards its fake kernel adds while choosing a CPU backend (``batch <
    16``: a dynamic-shape trace of any convolutional model was refused, one NEFF per batch size)."""
    stride, padding, dilation, output_padding = _per_dim(weight.dim() - 2, stride, padding, dilation, output_padding)
    if not transposed and any(output_padding):
        # torch ignores a forward convolution's output padding (a transposed one's double backward
        # passes it along); torch-mlir refused the op
        return aten.convolution.default(x, weight, bias, list(stride), list(padding), list(dilation), False,
                                        [0] * len(output_padding), groups)
    if not transposed or len(set(output_padding)) <= 1:
        env = _shape_env(x)
        if env is None:
            return NotImplemented
        with env.suppress_guards():  # the backend choice decides nothing the lowering uses
            return aten.convolution.default(x, weight, bias, list(stride), list(padding), list(dilation),
                                            transposed, list(output_padding), groups)
    sizes = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1)
             + output_padding[i] + 1 for i in range(len(stride))]
    out = _transposed(x, weight, stride, padding, dilation, sizes, groups)
    if bias is not None:
        out = out + bias.view(1, -1, *([1] * len(stride)))
    return out


def _weight_gradient(grad: torch.Tensor, x: torch.Tensor, weight_shape: Sequence[int], stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int], groups: int) -> torch.Tensor:
    """The weight gradient of a plain convolution, itself a convolution: batch and channels exchanged.

    ``x`` becomes ``Cin/g`` images of ``g * N`` channels and ``grad`` the ``g * Cout/g``
    filters of ``N`` channels; a grouped convolution of the two, with stride and dilation
    exchanged, gives every ``(out, in, kernel offset)`` sum over the batch and output
    positions (cut to the kernel's size: the last positions may be past it).
    """
    n, c_in = x.shape[0], x.shape[1]
    if n == 0:  # an empty batch: no term in the sums (the exchanged convolution would have 0 channels)
        return x.new_zeros(list(weight_shape))
    c_out, spatial = grad.shape[1], list(x.shape[2:])
    images = x.reshape(n, groups, c_in // groups, *spatial).movedim(2, 0).movedim(2, 1)
    images = images.reshape(c_in // groups, groups * n, *spatial)
    out_spatial = list(grad.shape[2:])
    filters = grad.reshape(n, groups, c_out // groups, *out_spatial).movedim(0, 2)
    filters = filters.reshape(c_out, n, *out_spatial)
    sums = aten.convolution.default(images, filters, None, list(dilation), list(padding), list(stride), False,
                                    [0] * len(stride), groups)  # (Cin/g, Cout, k')
    for i, size in enumerate(weight_shape[2:]):
        sums = sums.narrow(2 + i, 0, size)
    return sums.transpose(0, 1)


def convolution_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                         bias_sizes: Sequence[int] | None, stride: Sequence[int], padding: Sequence[int],
                         dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int,
                         output_mask: Sequence[bool]):
    """``aten.convolution_backward`` in convolutions torch-mlir lowers.

    A plain convolution's input gradient is the transposed convolution of ``grad`` cut to the
    input's size, its weight gradient
    :func:`_weight_gradient`. A transposed convolution is the adjoint of a plain one: its
    input gradient is the plain convolution of ``grad``, its weight gradient that of a plain
    convolution of ``grad`` whose output gradient is ``x``.
    """
    stride, padding, dilation, output_padding = _per_dim(weight.dim() - 2, stride, padding, dilation, output_padding)
    zeros = [0] * len(stride)
    grad_input = grad_weight = grad_bias = None
    if transposed:
        if output_mask[0]:
            grad_input = aten.convolution.default(grad, weight, None, list(stride), list(padding), list(dilation),
                                                  False, zeros, groups)
        if output_mask[1]:
            grad_weight = _weight_gradient(x, grad, weight.shape, stride, padding, dilation, groups)
    else:
        if output_mask[0]:
            grad_input = _transposed(grad, weight, stride, padding, dilation, x.shape[2:], groups)
        if output_mask[1]:
            grad_weight = _weight_gradient(grad, x, weight.shape, stride, padding, dilation, groups)
    if output_mask[2]:
        grad_bias = grad.sum([0, *range(2, grad.dim())])
    return grad_input, grad_weight, grad_bias


DECOMPOSITIONS: dict = {
    aten.convolution.default: convolution,
    aten.convolution_backward.default: convolution_backward,
}
