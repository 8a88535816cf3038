"""Long floating sums (compiler/decompositions/summation.py): ``sum``, ``mean`` and
``linalg_vector_norm`` over many values keep torch's accuracy, compiled and on the eager device,
static and dynamic-shape kernels alike (IREE's running sums were off by 1% over a million values)."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import config


def _close(got: torch.Tensor, values: torch.Tensor, reference) -> None:
    """``got`` against the float64 result of ``reference`` on ``values``, as near as torch's own."""
    exact = reference(values.double())
    torch_error = (reference(values).double() - exact).abs().max().item()
    error = (got.double().cpu() - exact).abs().max().item()
    scale = exact.abs().max().item()
    assert error <= max(4 * torch_error, 2e-6 * scale), (error, torch_error, scale)


CASES = [
    ("sum of all", (1_000_000,), lambda t: t.sum()),
    ("mean of a matrix", (1000, 1000), lambda t: t.mean()),
    ("sum over rows", (3000, 7), lambda t: t.sum(0)),
    ("sum over columns, kept", (7, 5001), lambda t: t.sum(1, keepdim=True)),
    ("mean over batch norm dims", (8, 3, 61, 67), lambda t: t.mean((0, 2, 3))),
    ("sum in float64", (70_001,), lambda t: t.sum(dtype=torch.float64)),
    ("2-norm", (300_000,), lambda t: torch.linalg.vector_norm(t)),
    ("3-norm over dims", (40, 9000), lambda t: torch.linalg.vector_norm(t, 3, dim=1)),
]


@pytest.mark.parametrize("name, shape, op", CASES, ids=[c[0] for c in CASES])
def test_long_sums_compiled_keep_torchs_accuracy(name, shape, op):
    torch.manual_seed(0)
    values = torch.rand(shape) + 0.1  # all positive: every rounding error adds up
    _close(torch.compile(op, backend="neuron")(values), values, op)


def test_long_sums_on_the_eager_device_keep_torchs_accuracy():
    """Kernels per shape (a dynamic-shape kernel's symbolic sizes are not chunked: known-limits)."""
    torch.manual_seed(0)
    with config.override(TORCH_NEURONX_EAGER_DYNAMIC_SHAPES=False):
        for n in (10, 1000, 100_003, 1_000_000, 17):
            values = torch.full((n,), 0.1) + torch.rand(n) * 1e-3
            _close(values.to("neuron").sum(), values, lambda t: t.sum())
            _close(values.to("neuron").mean(), values, lambda t: t.mean())


def test_half_precision_and_integer_sums():
    torch.manual_seed(0)
    values = torch.rand(200_000) + 0.1
    half = values.bfloat16()
    got = torch.compile(lambda t: t.sum(), backend="neuron")(half)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), half.sum().float(), rtol=8e-3, atol=0)
    ints = torch.randint(-1000, 1000, (300_000,))
    assert torch.compile(lambda t: t.sum(), backend="neuron")(ints).item() == ints.sum().item()
    assert (ints.to("neuron").sum().cpu() == ints.sum()).item()


def test_zero_size_and_small_sums_are_unchanged():
    for shape, dim in (((0, 5), 0), ((4, 0), None), ((3, 4), 1)):
        x = torch.randn(shape)
        got = torch.compile(lambda t, dim=dim: t.sum(dim) if dim is not None else t.sum(), backend="neuron")(x)
        torch.testing.assert_close(got, x.sum(dim) if dim is not None else x.sum())
