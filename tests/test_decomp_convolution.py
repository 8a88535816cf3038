"""Convolutions torch-mlir could not train, through the compile path (``decompositions/convolution.py``).

Grouped (depthwise), dilated, 1-d and 3-d convolutions and every transposed one
failed at lowering in the backward; stride-2 convolutions of inputs whose dims
need different output paddings, and transposed convolutions with differing
output paddings, failed forward or backward. All are compared with eager,
outputs and the gradients of inputs, weights and biases.
"""

from __future__ import annotations

import inspect

import torch
from compare import weighted_backward
from torch import nn


def _layers():
    torch.manual_seed(0)
    return nn.ModuleDict({
        "grouped_1d_stride2": nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
        "depthwise": nn.Conv2d(4, 4, 3, padding=1, groups=4),
        "dilated": nn.Conv2d(3, 5, 3, padding=2, dilation=2),
        "stride2_odd_even": nn.Conv2d(2, 3, 3, stride=2),
        "conv3d": nn.Conv3d(2, 3, 3, stride=(2, 1, 1), padding=1),
        "transposed": nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
        "transposed_uneven": nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=(1, 0)),
        "transposed_grouped_dilated": nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=(1, 0),
                                                         groups=2, dilation=(1, 2)),
        "transposed_1d": nn.ConvTranspose1d(2, 3, 4, stride=3),
        "transposed_3d": nn.ConvTranspose3d(2, 2, 3, stride=(2, 2, 1), padding=(1, 0, 0), output_padding=(1, 0, 0)),
        # one padding for all dims (aten's ``padding=[0]``): the backward read a second one
        "valid": nn.Conv2d(2, 3, (4, 2), padding="valid"),
        # one output row whose window stops short of the input's end (IREE refused these)
        "one_row_stride2": nn.Conv2d(4, 3, 3, stride=2),
        "one_row_padded_1d": nn.Conv1d(2, 3, 3, stride=3, padding=1),
        "one_row_3d": nn.Conv3d(2, 2, (2, 3, 1), stride=(3, 2, 1)),
        "transposed_one_pixel": nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1),
    })


_INPUTS = {
    "grouped_1d_stride2": (2, 4, 9), "depthwise": (2, 4, 7, 8), "dilated": (2, 3, 9, 8),
    "stride2_odd_even": (1, 2, 6, 5), "conv3d": (2, 2, 5, 4, 4), "transposed": (2, 3, 4, 5),
    "transposed_uneven": (2, 3, 3, 4), "transposed_grouped_dilated": (2, 4, 3, 4), "transposed_1d": (2, 2, 5),
    "transposed_3d": (1, 2, 3, 2, 2), "valid": (1, 2, 7, 5),
    "one_row_stride2": (2, 4, 4, 8), "one_row_padded_1d": (2, 2, 3), "one_row_3d": (1, 2, 4, 4, 3),
    "transposed_one_pixel": (2, 3, 1, 1),
}


def _apply(layers, inputs):
    return {name: layer(inputs[name]) for name, layer in layers.items()}


def test_convolutions_train_as_in_eager():
    g = torch.Generator().manual_seed(1)
    inputs = {name: torch.randn(*shape, generator=g) for name, shape in _INPUTS.items()}
    eager_layers, compiled_layers = _layers(), _layers()
    eager_in = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    compiled_in = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    expected = _apply(eager_layers, eager_in)
    got = torch.compile(_apply, backend="neuron")(compiled_layers, compiled_in)
    weighted_backward(expected, got, list(expected), g)
    for name in _INPUTS:
        assert got[name].shape == expected[name].shape, name
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(compiled_in[name].grad, eager_in[name].grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"input grad of {n}: {m}")
        for (param, p_eager), p_compiled in zip(eager_layers[name].named_parameters(),
                                                compiled_layers[name].parameters(), strict=True):
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, n=name, p=param: f"{p} grad of {n}: {m}")


def test_the_compile_path_traces_with_these_decompositions():
    from torch_neuronx.compiler.decompositions import convolution, table

    # (precision.py wraps some of them, computing float16 and bfloat16 in float32)
    assert all(inspect.unwrap(table()[op]) is inspect.unwrap(fn) for op, fn in convolution.DECOMPOSITIONS.items())


def test_depthwise_convolutions_under_bfloat16_autocast_compile_and_match_eager():
    """IREE folded the filter's bfloat16 rounding into the depthwise convolution with the wrong
    element type and refused the module: MobileNet-style models could not use autocast."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=4))
    x = torch.randn(2, 8, 10, 10, requires_grad=True)
    compiled = torch.compile(model, backend="neuron")
    results = []
    for run in (model, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = run(x)
        out.float().square().sum().backward()
        results.append((out.float(), x.grad.clone(), [p.grad.clone() for p in model.parameters()]))
        x.grad = None
        model.zero_grad()
    (got, got_x, got_p), (expected, expected_x, expected_p) = results[1], results[0]
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_x, expected_x, rtol=5e-2, atol=5e-2)
    for g, e in zip(got_p, expected_p, strict=True):
        torch.testing.assert_close(g, e, rtol=5e-2, atol=1e-1)


def test_eager_convolutions_of_one_output_row_run_on_neuron():
    """The eager device lowers convolutions as the compile path does: a window that stops short of
    the input's end, with one output row, failed to compile and ran on the CPU with a warning."""
    import warnings

    g = torch.Generator().manual_seed(2)
    layers = _layers()
    for name in ("one_row_stride2", "one_row_3d"):
        x = torch.randn(*_INPUTS[name], generator=g)
        expected = layers[name](x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = layers[name].to("neuron")(x.to("neuron"))
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


def test_a_forward_convolution_with_an_output_padding_runs_on_the_device():
    """The double backward of ``conv_transpose2d(stride=2, output_padding=1)`` calls a forward
    convolution with that output padding, which torch ignores and torch-mlir refused: the eager
    device ran it on the CPU."""
    from torch_neuronx import observe

    def double_backward(device):
        torch.manual_seed(0)
        x = torch.randn(1, 2, 3, 3).to(device).requires_grad_()
        w = torch.randn(2, 3, 3, 3).to(device).requires_grad_()
        y = torch.nn.functional.conv_transpose2d(x, w, stride=2, output_padding=1)
        gx, gw = torch.autograd.grad((y * y).sum(), (x, w), create_graph=True)
        (gx.pow(2).sum() + gw.pow(2).sum()).backward()
        return x.grad.cpu(), w.grad.cpu()

    want = double_backward("cpu")
    before = observe.counter("eager_fallbacks")
    got = double_backward("neuron")
    assert observe.counter("eager_fallbacks") == before
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
