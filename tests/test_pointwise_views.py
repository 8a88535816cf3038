"""Pointwise regions between a view and its inverse are computed in the unviewed shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compare import forward_backward
from torch.fx.experimental.proxy_tensor import make_fx

from torch_neuronx.compiler.passes.pointwise_views import pointwise_views_unviewed

aten = torch.ops.aten


def ffn(x, w1, w2):
    """nn.Linear → GELU → nn.Linear on a 3-d input, as a transformer's feed-forward."""
    return [F.linear(F.gelu(F.linear(x, w1)), w2)]


def swiglu(x, w1, w2):
    """A gated unit: two views meet in the region (silu(a) * b), with a 0-d tensor scale."""
    a, b = F.linear(x, w1), F.linear(x, w1.flip(0))
    return [F.linear(F.silu(a) * b * torch.tensor(0.5), w2)]


def shared(x, w1, w2):
    """An intermediate of the region is also an output: the region must stay as it is."""
    h = F.linear(x, w1)
    g = torch.relu(h)
    return [F.linear(torch.tanh(g), w2), g]


def _inputs(generator: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(4, 6, 16, generator=generator), torch.randn(32, 16, generator=generator),
            torch.randn(16, 32, generator=generator)]


def _traced(fn, inputs):
    gm = make_fx(fn, pre_dispatch=False)(*inputs)
    return gm


def _pointwise_shapes(gm: torch.fx.GraphModule) -> dict[str, tuple[int, ...]]:
    return {str(n.target): tuple(n.meta["val"].shape) for n in gm.graph.nodes
            if n.op == "call_function" and torch.Tag.pointwise in getattr(n.target, "tags", ())
            and n.meta["val"].dim() > 0}


@pytest.mark.parametrize("fn", [ffn, swiglu], ids=["ffn", "swiglu"])
def test_the_region_runs_on_the_matmul_output_and_its_views_go(fn):
    inputs = _inputs(torch.Generator().manual_seed(0))
    gm = _traced(fn, inputs)
    views_before = sum(n.target is aten.view.default for n in gm.graph.nodes)
    expected = gm(*inputs)
    gm = pointwise_views_unviewed(gm)
    gm.graph.lint()
    gm.recompile()
    assert set(_pointwise_shapes(gm).values()) == {(24, 32)}
    assert sum(n.target is aten.view.default for n in gm.graph.nodes) < views_before
    torch.testing.assert_close(gm(*inputs), expected)


def test_a_region_whose_intermediate_is_used_elsewhere_is_left_alone():
    inputs = _inputs(torch.Generator().manual_seed(1))
    gm = _traced(shared, inputs)
    before = gm.print_readable(print_output=False)
    gm = pointwise_views_unviewed(gm)
    assert gm.print_readable(print_output=False) == before


@pytest.mark.parametrize("fn", [ffn, swiglu, shared], ids=["ffn", "swiglu", "shared"])
def test_compiled_forward_and_backward_match_eager(fn):
    generator = torch.Generator().manual_seed(2)
    expected, got, eager_grads, compiled_grads = forward_backward(fn, _inputs(generator), generator)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled_grads, eager_grads, rtol=1e-4, atol=1e-4)


def test_a_product_of_zero_dimensional_tensors_reshaped_compiles():
    """``(a.sum() * (a.max() + 1)).reshape(1)``: the region's operands were all 0-d, its result
    was given the view's shape and the lowering failed ("'chlo.broadcast_multiply' op inferred
    type(s) 'tensor<f32>' are incompatible with return type(s) of operation 'tensor<1xf32>'")."""
    def fn(a):
        return (a.sum() * (a.max() + 1)).reshape(1), ((a > 0).sum() != 3).to(torch.int64).reshape(1, 1)

    a = torch.randn(5, generator=torch.Generator().manual_seed(3))
    for got, expected in zip(torch.compile(fn, backend="neuron")(a), fn(a), strict=True):
        torch.testing.assert_close(got, expected)
