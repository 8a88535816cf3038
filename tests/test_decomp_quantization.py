"""Fake quantization (QAT) compiled and on the eager device, against torch's CPU kernels, bit for bit:
torch-mlir lowered none of its ops (compiled QAT steps failed; the eager device ran them on the CPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)


def _inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 16, generator=generator) * 3).to(dtype)
    x[0, :4] = torch.tensor([float("nan"), 1e6, -1e6, float("inf")]).to(dtype)  # NaN, beyond the range, inf
    return [x, torch.tensor([0.05]), torch.tensor([3], dtype=torch.int32),
            torch.rand(6, generator=generator) * 0.1 + 0.01, torch.tensor([0, 3, -5, 10, 1, 2], dtype=torch.int32),
            torch.tensor([0.5, 3.2, -5.0, 10.0, 1.0, 2.7])]


def _fake_quantized(x, scale, zero_point, channel_scales, channel_points, float_points):
    return (torch.fake_quantize_per_tensor_affine(x, scale, zero_point, -128, 127),
            torch.fake_quantize_per_tensor_affine(x, 0.05, 3, 0, 255),
            torch.fake_quantize_per_channel_affine(x, channel_scales, channel_points, 0, -128, 127),
            torch.fake_quantize_per_channel_affine(x.transpose(0, 1), channel_scales, float_points, 1, 0, 15))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fake_quantization_matches_the_cpu_kernels_compiled_and_on_the_device(dtype):
    inputs = _inputs(dtype)
    expected = _fake_quantized(*inputs)
    compiled = torch.compile(_fake_quantized, backend="neuron")(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        on_device = _fake_quantized(*(t.to("neuron") for t in inputs))
    for got, device_got, want in zip(compiled, on_device, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(device_got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_a_compiled_qat_step_trains_like_eager():
    """A linear layer with fake-quantized weights and activations (the straight-through estimator),
    trained compiled: the same parameters as eager on the CPU."""
    def step(model: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        weight = torch.fake_quantize_per_channel_affine(
            model.weight, model.weight.detach().abs().amax(1) / 127, torch.zeros(4, dtype=torch.int32), 0, -127, 127)
        out = torch.nn.functional.linear(torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127), weight,
                                         model.bias)
        return out.square().mean()

    torch.manual_seed(0)
    eager, compiled_model = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    compiled_model.load_state_dict(eager.state_dict())
    compiled_step = torch.compile(step, backend="neuron")
    for model, run in ((eager, step), (compiled_model, compiled_step)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            optimizer.zero_grad()
            run(model, torch.randn(5, 8, generator=generator)).backward()
            optimizer.step()
    for p, q in zip(compiled_model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
