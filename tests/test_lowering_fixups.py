"""StableHLO rewrites that work around IREE 3.13 bugs (torch_neuronx/compiler/lower.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_mlir import ir

from torch_neuronx.compiler import stablehlo_fixups, stablehlo_ir

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
    stablehlo_fixups._round_narrowed_constants(module)
    text = module.operation.get_asm()
    assert "stablehlo.convert" not in text
    values = {}
    for op in stablehlo_ir.ops_named(module, "stablehlo.constant"):
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


def test_gathers_from_a_slice_of_an_input():
    """IREE fused the slice into the gather as a strided load and failed to compile it (iree-org/iree#15364)."""
    def fn(x, idx):
        rows = x[..., 0].unsqueeze(-1)  # (2, 2, 8, 1), a strided view of x
        columns = x[..., ::2, 1]  # (2, 2, 4), strided twice
        return (torch.gather(rows, -2, idx.unsqueeze(-1).expand(*rows.shape)),
                torch.gather(columns * 2, -1, idx[..., :4] % 4))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 8, 2, generator=g)
    idx = torch.randint(0, 8, (2, 2, 8), generator=g)
    got = torch.compile(fn, backend="neuron")(x, idx)
    assert all(torch.equal(a, b) for a, b in zip(got, fn(x, idx)))


def test_reversals_of_a_slice_with_a_step_in_its_last_dimension():
    """``t[:, ::2].flip(0)``, ``flip(1)`` and ``rot90``: IREE fused the strided slice into the
    reverse and failed to compile it ("LLVM Translation failed", iree-org/iree#15364); a step in
    the first dimension compiled. Forward and backward."""
    def fn(t):
        s = t[:, ::2]
        return s.flip(0), s.flip(1), s.rot90(1, (0, 1)), t[1:, 1::3].flip(0, 1), t[::2].flip(0)

    t = torch.arange(24.0).reshape(4, 6).requires_grad_()
    got = torch.compile(fn, backend="neuron")(t)
    expected = fn(t)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    weights = [torch.randn(e.shape, generator=torch.Generator().manual_seed(i)) for i, e in enumerate(expected)]
    grad, = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), t)
    want, = torch.autograd.grad(sum((e * w).sum() for e, w in zip(expected, weights)), t)
    assert torch.equal(grad, want)


@pytest.mark.parametrize("shape, pad", [((2, 3, 5, 4), (1, 2, 3, 0)), ((1, 2, 3, 4, 5), (1, 1, 1, 1, 1, 1)),
                                        ((2, 3, 7), (2, 1))])
def test_reversals_of_slices_that_are_not_one_contiguous_run(shape, pad):
    """Circular padding copies ``t[..., 4:5]`` (part of a wider last dimension, so not one
    contiguous run although its step is 1) into the padded tensor through a reverse: IREE failed
    to compile 4-d and 5-d circular padding ("LLVM Translation failed", iree-org/iree#15364), and
    so every ``Conv2d(padding_mode="circular")``. Also a reverse of ``t[..., 1:2, :]`` and of
    ``t[:, 0]``. Forward and backward."""
    def fn(t):
        padded = F.pad(t, pad, mode="circular")
        return padded, t[..., 1:2, :].flip(-2, -1), t[:, 0].flip(-1)

    t = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_()
    got = torch.compile(fn, backend="neuron")(t)
    expected = fn(t)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    grad, = torch.autograd.grad(sum((g * (i + 1)).sum() for i, g in enumerate(got)), t)
    want, = torch.autograd.grad(sum((e * (i + 1)).sum() for i, e in enumerate(expected)), t)
    torch.testing.assert_close(grad, want)


def test_booleans_and_unsigned_integers_converted_into_a_matmul_keep_their_values():
    """IREE sign-extended the narrow integer when it fused the conversion into a matmul.

    ``torch.eye(5) @ v`` was ``-v``, and a uint8 pixel of 200 became -56 in ``x.float() @ w``,
    ``x.double() @ w`` and ``x.long() @ m`` (uint32 likewise).
    """
    def fn(v, a, pixels, counts, big):
        mask = a > 0
        return (torch.eye(5, dtype=v.dtype) @ v, mask.float() @ v, mask.to(torch.bfloat16) @ v.bfloat16(),
                mask.to(torch.int32).sum(0) * 3, mask.to(torch.float64) @ v.double(), pixels.float() @ v,
                pixels.to(torch.int32) * 2, pixels.double() / 255, pixels.double() @ v.double(),
                pixels.to(torch.int32) @ counts.int(), pixels.long() @ counts, counts.T @ pixels.T.long(),
                big.long() @ counts)

    g = torch.Generator().manual_seed(0)
    v, a = torch.randn(5, 3, generator=g), torch.randn(4, 5, generator=g)
    pixels = torch.randint(0, 256, (4, 5), generator=g, dtype=torch.uint8)
    pixels[0] = torch.tensor([200, 255, 128, 0, 1], dtype=torch.uint8)
    counts = torch.randint(-5, 5, (5, 3), generator=g)
    big = torch.tensor([[4_000_000_000, 2**31, 1, 0, 2**32 - 1]], dtype=torch.uint32)
    got = torch.compile(fn, backend="neuron")(v, a, pixels, counts, big)
    for got_t, expected in zip(got, fn(v, a, pixels, counts, big), strict=True):
        torch.testing.assert_close(got_t, expected)


def test_vector_products_of_strided_slices():
    """IREE's data-tiled matrix-vector product read a strided vector as if contiguous: x[:, 0] @ m was garbage."""
    def fn(x, m, xb):
        return (x[:, 0] @ m, m @ x[:, 1:2], x.T[2:3] @ m, xb[:, :, 0:1].mT @ m, x[:, 3].unsqueeze(0) @ m.T,
                x[:, 0:2].T @ m, torch.relu(x[:, 0]) @ m)

    g = torch.Generator().manual_seed(0)
    x, m, xb = torch.randn(64, 48, generator=g), torch.randn(64, 64, generator=g), torch.randn(3, 64, 48, generator=g)
    got = torch.compile(fn, backend="neuron")(x, m, xb)
    for got_t, expected in zip(got, fn(x, m, xb), strict=True):
        torch.testing.assert_close(got_t, expected, rtol=1e-4, atol=1e-4)


def test_full_sums_of_products_with_a_broadcast_vector():
    """IREE took sum(x * w) over every dim, w broadcast over rows, for a contraction and failed to compile it."""
    def fn(x, w, target):
        return ((x * w).sum(), (x * w).mean(), (x * 2.0).sum(),
                torch.nn.functional.binary_cross_entropy(x.sigmoid(), target, weight=w))

    g = torch.Generator().manual_seed(0)
    x, w, target = torch.randn(64, 32, generator=g), torch.rand(32, generator=g), torch.rand(64, 32, generator=g)
    got = torch.compile(fn, backend="neuron")(x, w, target)
    for got_t, expected in zip(got, fn(x, w, target), strict=True):
        torch.testing.assert_close(got_t, expected, rtol=1e-5, atol=1e-4)


def test_a_reduction_read_along_two_dimensions():
    """IREE fused ``d = A.sum(1)`` into ``d[:, None] * A * d[None, :]`` (GCN's symmetric normalization)
    tile by tile: the compiled result kept the diagonal and was 0 elsewhere, at every size."""
    def fn(a, x):
        d = a.sum(1)
        m = x.mean(1)
        return d[:, None] * a * d[None, :], m[:, None] - m[None, :], (a.amax(0)[None] + a.amax(0)[:, None]) * a

    g = torch.Generator().manual_seed(0)
    for n in (2, 3, 16, 40):
        a, x = torch.rand(n, n, generator=g), torch.randn(n, 7, generator=g)
        got = torch.compile(fn, backend="neuron", dynamic=False)(a, x)
        for got_t, expected in zip(got, fn(a, x), strict=True):
            torch.testing.assert_close(got_t, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16])
def test_conversions_to_float8_saturate_as_torchs(source):
    """float8_e4m3fn has no infinity: torch converts values beyond 448 (infinities too) to ±448;
    IREE's conversion made them NaN. The other float8 formats keep their own overflow (inf, NaN)."""
    x = torch.tensor([0.1, 448.0, 464.0, 500.0, -1000.0, 1e6, float("inf"), -float("inf"), float("nan"),
                      -0.0, 57344.0, 70000.0])
    for target in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz):
        def fn(t, target=target):
            return t.to(source).to(target).float()

        got = torch.compile(fn, backend="neuron")(x)
        assert torch.equal(got.nan_to_num(7.0), fn(x).nan_to_num(7.0)), (target, got)


@pytest.mark.parametrize("wide", [torch.float32, torch.bfloat16])
def test_every_float8_byte_decodes_as_torchs(wide):
    """IREE decoded float8_e4m3fn's byte 0xFF (a NaN) as -480: raw fp8 checkpoint bytes viewed as
    float8 and widened in a compiled graph, or on the eager device."""
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        def fn(t, fp8=fp8):
            return t.view(fp8).to(wide) * 2

        expected = fn(raw)
        assert torch.equal(torch.compile(fn, backend="neuron")(raw).nan_to_num(7.0), expected.nan_to_num(7.0))
        assert torch.equal(fn(raw.to("neuron")).cpu().nan_to_num(7.0), expected.nan_to_num(7.0))


_VIEWS = """
module {
  func.func @main(%a: !torch.vtensor<[?,3],f32>, %b: !torch.vtensor<[],bf16>, %c: !torch.vtensor<[2],f64>,
                  %d: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[?,3],si32>, !torch.vtensor<[],si16>,
                  !torch.vtensor<[2],si64>, !torch.vtensor<[4,4],ui8>) {
    %int3 = torch.constant.int 3
    %int2 = torch.constant.int 2
    %int4 = torch.constant.int 4
    %int0 = torch.constant.int 0
    %0 = torch.aten.view.dtype %a, %int3 : !torch.vtensor<[?,3],f32>, !torch.int -> !torch.vtensor<[?,3],si32>
    %1 = torch.aten.view.dtype %b, %int2 : !torch.vtensor<[],bf16>, !torch.int -> !torch.vtensor<[],si16>
    %2 = torch.aten.view.dtype %c, %int4 : !torch.vtensor<[2],f64>, !torch.int -> !torch.vtensor<[2],si64>
    %3 = torch.aten.view.dtype %d, %int0 : !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4,4],ui8>
    return %0, %1, %2, %3 : !torch.vtensor<[?,3],si32>, !torch.vtensor<[],si16>, !torch.vtensor<[2],si64>,
      !torch.vtensor<[4,4],ui8>
  }
}"""


def test_same_width_dtype_views_become_builtin_bitcasts_for_the_linalg_lowering():
    """torch-mlir's linalg lowering has no ``aten.view.dtype`` (the bitcast of its signbit and
    copysign); views of one element width, symbolic, 0-d or 64-bit, are rewritten; a view that
    changes the width (and the shape) is left alone."""
    from torch_neuronx.compiler import linalg_fixups

    text = linalg_fixups.bitcasts(_VIEWS)
    assert text.count("tensor.bitcast") == 3 and text.count("torch.aten.view.dtype") == 1
    assert "tensor.bitcast %tnx_bitcast_0_in : tensor<?x3xf32> to tensor<?x3xi32>" in text
    assert "tensor.bitcast %tnx_bitcast_1_in : tensor<bf16> to tensor<i16>" in text
    assert "tensor<2xf64> to tensor<2xi64>" in text
    assert linalg_fixups.bitcasts(_NARROWED) is None  # nothing to rewrite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_sign_ops_of_every_float_width_lower_to_linalg(dtype):
    """The dynamic-shape route (linalg-on-tensors) lowers signbit and copysign in every float dtype."""
    from torch_mlir import fx

    from torch_neuronx.compiler import torch_to_stablehlo

    class Signs(torch.nn.Module):
        def forward(self, x, y):
            return torch.signbit(x), torch.copysign(x, y)

    x = torch.randn(3, 4, dtype=dtype)
    rows = torch.export.Dim("rows")
    program = torch.export.export(Signs(), (x, x), dynamic_shapes=({0: rows}, {0: rows}))
    raw = fx.export_and_import(program, output_type="raw")
    linalg = torch_to_stablehlo.to_stablehlo(torch_to_stablehlo.parse_raw(torch_to_stablehlo.asm(raw)), "linalg")
    assert "tensor.bitcast" in linalg or "arith.bitcast" in linalg
    assert "torch." not in linalg.replace("torch.onnx", "")


def test_alike_one_element_ops_become_one_op_over_their_stack():
    """``passes/scalar_batches.py``: dozens of alike scalar ops (IREE put them all in one dispatch,
    one binding each) become one op over a stack; chains stay stacked; fewer stay as they were."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_neuronx.compiler.passes.scalar_batches import MIN_SCALARS, scalar_ops_batched

    def per_tensor(*xs):  # three one-element ops per tensor: sqrt, mul, pow
        return [((x * x).sum().sqrt() * 0.5).pow(2.0) + x for x in xs]

    for count in (2, 3, 40):
        batched = 3 * count >= MIN_SCALARS
        xs = [torch.randn(3) for _ in range(count)]
        gm = make_fx(per_tensor)(*xs)
        scalars_before = sum(1 for n in gm.graph.nodes if n.target == torch.ops.aten.sqrt.default)
        gm = scalar_ops_batched(gm)
        sqrt = [n for n in gm.graph.nodes if n.target == torch.ops.aten.sqrt.default]
        assert len(sqrt) == (1 if batched else scalars_before)
        stacks = [n for n in gm.graph.nodes if n.target == torch.ops.aten.stack.default]
        assert len(stacks) == (1 if batched else 0)  # sqrt, mul and pow share one stack
        for got, want in zip(gm(*xs), per_tensor(*xs), strict=True):
            torch.testing.assert_close(got, want)


_WIDENING = [(torch.uint8, torch.int16), (torch.int8, torch.float16), (torch.uint8, torch.float32),
             (torch.int8, torch.int64), (torch.int16, torch.bfloat16), (torch.int16, torch.float64),
             (torch.float16, torch.int32), (torch.bfloat16, torch.float32), (torch.int32, torch.int64),
             (torch.float32, torch.float64), (torch.float32, torch.int64)]


@pytest.mark.parametrize("source, target", _WIDENING, ids=lambda d: str(d).removeprefix("torch."))
def test_dtype_views_to_a_wider_element_compile_bit_exact(source, target):
    """``x.view(int64)`` of int32 values failed to lower (torch-mlir lowers only views that keep or
    narrow the width), and with it every in-place op through a narrowing view (its inverse view
    writes the base back). Random bits, negative and NaN patterns included, match eager's bit for bit."""
    torch.manual_seed(0)
    ratio = target.itemsize // source.itemsize
    x = torch.randint(0, 256, (3, 4 * ratio * source.itemsize), dtype=torch.uint8).view(source)
    x.view(torch.uint8)[0, :8] = 255  # all ones: -1 and NaN patterns

    def f(t):
        return t.view(target)

    def written_through(t):
        wide = t.clone()
        narrow = wide.view(source)[..., ::2]
        narrow.zero_() if source.is_floating_point else narrow.add_(1)
        return wide

    got = torch.compile(f, backend="neuron")(x)
    assert got.dtype == target and torch.equal(got.view(torch.uint8), f(x).view(torch.uint8))
    y = f(x)
    torch._dynamo.reset()
    got = torch.compile(written_through, backend="neuron")(y)
    assert torch.equal(got.view(torch.uint8), written_through(y).view(torch.uint8))


def test_alike_one_element_ops_of_the_same_operands_become_one_op():
    """Groups of the same op on the same operands (common subexpressions: nothing to stack) were
    batched as one op on the 0-d operand typed as a stack of them, which the lowering refused
    ("inferred type(s) 'tensor<f32>' are incompatible with 'tensor<2xf32>'")."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_neuronx.compiler.passes.scalar_batches import MIN_SCALARS, scalar_ops_batched

    def repeated(x):
        s = x.sum()
        return [(s * 4.0 >= 2.0).int() for _ in range(MIN_SCALARS)]

    x = torch.randn(3)
    gm = scalar_ops_batched(make_fx(repeated)(x))
    assert sum(1 for n in gm.graph.nodes if n.target == torch.ops.aten.mul.Tensor) <= 1
    assert not [n for n in gm.graph.nodes if n.target == torch.ops.aten.stack.default]
    for got, want in zip(gm(x), repeated(x), strict=True):
        torch.testing.assert_close(got, want)
    compiled = torch.compile(repeated, backend="neuron")
    for got, want in zip(compiled(x), repeated(x), strict=True):
        torch.testing.assert_close(got, want)
