"""StableHLO rewrites that work around IREE 3.13 bugs (torch_neuronx/compiler/lower.py)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch_mlir import ir

from torch_neuronx.compiler import lower

_NARROWED = """
module {
  func.func @main() -> (tensor<2xf32>, tensor<2xf16>, tensor<f32>, tensor<f64>) {
    %c = arith.constant dense<[8.000000e-01, 0.1]> : tensor<2xf64>
    %s = "stablehlo.constant"() {value = dense<0.8> : tensor<f64>} : () -> tensor<f64>
    %0 = "stablehlo.convert"(%c) : (tensor<2xf64>) -> tensor<2xf32>
    %1 = "stablehlo.convert"(%c) : (tensor<2xf64>) -> tensor<2xf16>
    %2 = "stablehlo.convert"(%s) : (tensor<f64>) -> tensor<f32>
    return %0, %1, %2, %s : tensor<2xf32>, tensor<2xf16>, tensor<f32>, tensor<f64>
  }
}"""


def test_narrowing_converts_of_float64_constants_become_rounded_constants():
    context = ir.Context()
    context.allow_unregistered_dialects = True
    module = ir.Module.parse(_NARROWED, context)
    lower._round_narrowed_constants(module)
    text = module.operation.get_asm()
    assert "stablehlo.convert" not in text
    values = {}
    for op in lower._ops_named(module, "stablehlo.constant"):
        attr = ir.DenseFPElementsAttr(op.attributes["value"])
        kind = str(ir.RankedTensorType(op.results[0].type))
        values[kind] = [ir.FloatAttr(attr.get_splat_value()).value] if attr.is_splat else np.array(attr).tolist()
    assert values["tensor<2xf32>"] == [float(np.float32(0.8)), float(np.float32(0.1))]
    assert values["tensor<2xf16>"] == [float(np.float16(0.8)), float(np.float16(0.1))]
    assert values["tensor<f32>"] == [float(np.float32(0.8))]
    assert values["tensor<f64>"] == [0.8]  # float64 uses keep their constant


def test_python_float_constants_round_as_in_torch():
    """IREE truncated 0.8 to 0.79999995: (2 + 0.5) * 0.8 came out below 2.0, and nearest-exact
    interpolation picked the wrong rows."""
    def fn(x):
        scaled = (torch.arange(7, dtype=torch.float32) + 0.5) * 0.8
        return scaled.to(torch.int64), F.interpolate(x, size=(5, 9), mode="nearest-exact"), \
            F.interpolate(x, size=(3, 4), mode="nearest-exact")

    x = torch.arange(24.0).view(1, 1, 4, 6)
    for got, expected in zip(torch.compile(fn, backend="neuron")(x), fn(x), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_one_index_tensor_feeding_two_scatters():
    """IREE failed to compile a module where two scatters share their int64 indices."""
    index = torch.tensor([0, 0, 5, 2, 2, 2])

    def fn(x, values):
        return x.index_add(0, index, values), torch.zeros(8).index_add(0, index, values * 2)

    x, values = torch.randn(8), torch.randn(6)
    for got, expected in zip(torch.compile(fn, backend="neuron")(x, values), fn(x, values), strict=True):
        torch.testing.assert_close(got, expected)


def test_a_python_number_as_first_operand_keeps_the_ops_precision_and_type():
    """``1 / 6 - x`` of float64 used a float32 literal for 1/6 (5e-9 off)."""
    def fn(x, n):
        return (1 / 6) - x, 2.5 - n, 3 - n, (1 / 3) - x.float()

    x, n = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64), torch.tensor([1, 2, 3])
    for got, expected in zip(torch.compile(fn, backend="neuron")(x, n), fn(x, n), strict=True):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_slices_with_nothing_in_them_forward_and_backward():
    """torch-mlir sized ``x[:, :0]`` as the whole dim."""
    def fn(x):
        return torch.cat([x[:, :0], x * 2, x[:, 3:3]], 1).sum(1) + x[:, :0].sum() + x[1:1].sum()

    x = torch.randn(4, 6, requires_grad=True)
    fn(x).square().sum().backward()
    expected, x.grad = x.grad, None
    got = torch.compile(fn, backend="neuron")(x)
    torch.testing.assert_close(got, fn(x))
    got.square().sum().backward()
    torch.testing.assert_close(x.grad, expected)
