"""Pooling through our decompositions (torch_neuronx/compiler/decompositions/pooling.py): 3-d max,
average and adaptive pooling, 2-d max and adaptive max pooling (and the 1-d ops that run through
them). Forward values, indices and input gradients of ``torch.compile(backend="neuron")`` against
eager, with ties, NaN and all -inf windows for max pooling.

Each test compiles one function that runs many pooling configurations, to keep compile count low.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from compare import forward_backward
from torch.utils._pytree import tree_leaves

from torch_neuronx.compiler.decompositions import max_pool_backward, pooling, table

aten = torch.ops.aten
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _run(fn: Callable, inputs: list[torch.Tensor],
         weights: list[torch.Tensor] | None) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """fn's outputs (flattened) and the inputs' gradients of sum(output * weight) over float outputs."""
    leaves = tree_leaves(fn(*inputs))
    floats = [o for o in leaves if o.is_floating_point()]
    if weights is None:
        weights = [torch.randn(o.shape, dtype=torch.float64).to(o.dtype) for o in floats]
    # NaN outputs make the loss NaN but leave the input gradients (the weights, routed) finite.
    loss = sum((o * w).sum() for o, w in zip(floats, weights))
    grads = torch.autograd.grad(loss, inputs)
    return [o.detach() for o in leaves], list(grads), weights


def _check(fn: Callable, *tensors: torch.Tensor, **tolerance) -> None:
    """Compiled fn matches eager fn: outputs (NaN where eager has NaN; integer outputs, i.e.
    indices, exactly) and the gradients of every input under random upstream weights."""
    expected, expected_grads, weights = _run(fn, [_leaf(t) for t in tensors], None)
    got, got_grads, _ = _run(torch.compile(fn, backend="neuron"), [_leaf(t) for t in tensors], weights)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape and g.dtype == e.dtype, (i, g.shape, e.shape, g.dtype, e.dtype)
        if e.is_floating_point():
            torch.testing.assert_close(g, e, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}", **tolerance)
        else:
            assert torch.equal(g, e), (i, g, e)
    for i, (g, e) in enumerate(zip(got_grads, expected_grads)):
        torch.testing.assert_close(g, e, msg=lambda m, i=i: f"gradient of input {i}: {m}", **tolerance)


def _ties(*shape: int) -> torch.Tensor:
    """Small integers: many equal values in every window."""
    return torch.randint(-2, 3, shape).to(torch.float32)


def _with_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[0, 0, 0, 0, 0] = x[0, 0, 0, 0, 1] = NAN  # two NaNs in one window: torch keeps the later one
    x[0, 1, 2, 3, 1] = NAN
    x[1, 2, -1, -1, -1] = NAN
    x[1, 0, :4, :4, :4] = -INF  # windows with nothing but -inf (or padding): the first element wins
    return x


def test_pooling_ops_are_in_the_table():
    """The compile path traces with our decompositions for these ops (not torch's or none)."""
    decompositions = table()
    for op in (aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
               aten.avg_pool3d.default, aten.avg_pool3d_backward.default,
               aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d_backward.default,
               aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default):
        entry = decompositions[op]
        while entry is not pooling.DECOMPOSITIONS[op] and hasattr(entry, "__wrapped__"):
            entry = entry.__wrapped__  # float16/bfloat16 average pooling runs it in float32 (precision.py)
        assert entry is pooling.DECOMPOSITIONS[op], op
    for op in (aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default,
               aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default):
        assert decompositions[op] is max_pool_backward.DECOMPOSITIONS[op], op  # no scatter


@pytest.mark.slow  # CI time: 2-d max pooling covers these cases
def test_max_pool3d_matches_eager_with_ties_nan_padding_dilation_and_ceil_mode():
    """Values, torch's indices (first maximum, last NaN, first element of an all -inf window)
    and gradients scattered to them, overlapping windows accumulating."""
    dilated = {"kernel_size": (2, 3, 2), "stride": (1, 2, 2), "padding": (1, 1, 0), "dilation": (2, 1, 2),
               "ceil_mode": True, "return_indices": True}

    def fn(a, ties, nan):
        return (
            F.max_pool3d(nan, 2),
            F.max_pool3d(ties, 3, stride=2, padding=1, return_indices=True),
            F.max_pool3d(nan, 3, stride=2, padding=1, return_indices=True),
            F.max_pool3d(nan, **dilated),
            F.max_pool3d(ties[0], **dilated),  # unbatched
            F.max_pool3d(a, (3, 2, 3), stride=(2, 3, 1), padding=(0, 1, 1), ceil_mode=True, return_indices=True),
        )

    _check(fn, torch.randn(2, 3, 7, 6, 5), _ties(2, 3, 5, 7, 6), _with_nan(torch.randn(2, 3, 5, 6, 7)))


def test_avg_pool3d_matches_eager_in_every_mode():
    """Padding counted or not, ceil_mode windows past the input, divisor_override."""
    def fn(a, b):
        return (
            F.avg_pool3d(a, 2),
            F.avg_pool3d(b, 3, stride=2, padding=1),  # unbatched; padding counted
            F.avg_pool3d(a, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            F.avg_pool3d(a, (2, 3, 2), stride=(3, 2, 1), padding=(1, 1, 0), ceil_mode=True),
            F.avg_pool3d(b, (3, 2, 2), stride=(1, 2, 3), padding=(1, 0, 1), divisor_override=5),
        )

    _check(fn, torch.randn(2, 3, 7, 6, 5), torch.randn(3, 5, 8, 7))


def test_adaptive_pool3d_matches_eager():
    """Uneven and even windows, global pooling, outputs larger than inputs, None sizes."""
    def fn(a, nan, b):
        return (
            F.adaptive_avg_pool3d(a, (3, 4, 2)),
            F.adaptive_avg_pool3d(a, 1),
            F.adaptive_avg_pool3d(b, (None, 9, 4)),  # unbatched; more outputs than inputs along H
            F.adaptive_max_pool3d(a, (3, 4, 2), return_indices=True),
            F.adaptive_max_pool3d(a, 1, return_indices=True),
            F.adaptive_max_pool3d(nan, (2, 4, 3), return_indices=True),
            F.adaptive_max_pool3d(b, (4, 9, None), return_indices=True),
        )

    ties = _ties(2, 3, 5, 6, 7)
    _check(fn, torch.randn(2, 3, 7, 6, 5), _with_nan(ties), torch.randn(3, 5, 7, 6))


def test_2d_and_1d_pooling_match_eager_with_ties_and_nan():
    """adaptive_max_pool2d (which adaptive_max_pool1d runs through), max_pool2d_with_indices
    (max_pool1d's too; torch-mlir's lowering drops NaN) and 1-d average pooling (through avg_pool2d)."""
    def fn(a, ties, b):
        return (
            F.adaptive_max_pool2d(a, (3, 4), return_indices=True),
            F.adaptive_max_pool2d(ties, (4, 3), return_indices=True),
            F.adaptive_max_pool2d(b, (9, 1), return_indices=True),  # unbatched
            F.adaptive_max_pool1d(a.flatten(-2), 5, return_indices=True),
            F.adaptive_max_pool1d(ties[0], 4, return_indices=True),
            F.max_pool2d(ties, 3, stride=2, padding=1, return_indices=True),
            F.max_pool2d(b, (2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1), ceil_mode=True),
            F.max_pool1d(ties.flatten(-2), 3, stride=2, padding=1, dilation=2, ceil_mode=True, return_indices=True),
            F.avg_pool1d(b, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        )

    ties = _ties(2, 3, 7, 5)
    ties[0, 0, 0, :2] = NAN  # two NaNs side by side: torch keeps the later one
    ties[1, 1, 2, 4] = NAN
    ties[1, 2, :4, :4] = -INF
    _check(fn, torch.randn(2, 3, 7, 5), ties, torch.randn(3, 5, 7))


def test_avg_pool2d_with_a_divisor_override_forward_and_backward():
    """torch-mlir rejected ``divisor_override``; every window's sum is divided by it, padding or not."""
    def fn(x):
        return (F.avg_pool2d(x, 2, divisor_override=3),
                F.avg_pool2d(x, 3, stride=2, ceil_mode=True, divisor_override=5),
                F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False, divisor_override=4))

    g = torch.Generator().manual_seed(0)
    expected, got, eager_grads, compiled_grads = forward_backward(fn, [torch.randn(2, 3, 7, 8, generator=g)], g)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled_grads, eager_grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float64, marks=pytest.mark.slow)])  # CI time
def test_pooling_in_other_dtypes_matches_eager(dtype):
    """bfloat16 (max pooling compares, average pooling sums in float32) and float64 (kept)."""
    def fn(x):
        outs = [
            F.max_pool3d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True),
            F.adaptive_avg_pool3d(x, (3, 2, 4)),
            F.adaptive_max_pool3d(x, (3, 2, 4), return_indices=True),
        ]
        if x.dtype != torch.bfloat16:  # eager has no bfloat16 avg_pool3d on CPU
            outs.append(F.avg_pool3d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False))
        return outs

    # Eager's bfloat16 adaptive_avg_pool3d is off by up to ~3e-3 here, and its max_pool3d backward adds
    # overlapping windows' gradients in bfloat16 (4e-2 from the float64 sums; ours, in float32, 1.6e-2):
    # a looser atol.
    tolerance = {"atol": 4e-2, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {}
    _check(fn, torch.randn(2, 3, 6, 5, 7).to(dtype), **tolerance)


@pytest.mark.parametrize("bad", [-1, 100])
def test_max_unpool_refuses_indices_outside_the_output_as_eager_does(bad):
    """A negative index was wrapped (written to the last pixel) where torch raises "Found an invalid
    max index"; one past the end raised ``index_put``'s message."""
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    good = torch.tensor([[[[0, 1], [14, 3]]]])
    bad_index = torch.tensor([[[[0, 1], [bad, 3]]]])
    calls = {"2d": lambda a, i: F.max_unpool2d(a, i, 2),
             "3d": lambda a, i: F.max_unpool3d(a.unsqueeze(2), i.unsqueeze(2), (1, 2, 2))}
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="Found an invalid max index") as expected:
            call(x, bad_index)
        message = str(expected.value).split(" (output volumes")[0]
        compiled = torch.compile(call, backend="neuron")
        with pytest.raises(RuntimeError, match=message):
            call(x.to("neuron"), bad_index.to("neuron")).cpu()
        with pytest.raises(RuntimeError, match=message):
            compiled(x, bad_index)
        torch.testing.assert_close(compiled(x, good), call(x, good), msg=name)
