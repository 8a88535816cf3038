"""CPU inputs of a torch.compile graph on the neuron device: copied there, or refused.

TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY (read when Dynamo hands the graph to the
backend; conftest resets Dynamo between tests, so each test compiles afresh).
"""

from __future__ import annotations

import pytest
import torch

from torch_neuronx.dynamo.autocopy import VARIABLE, CpuInputError
from torch_neuronx.runtime.tensor import NeuronTensor


class LinearAndInput(torch.nn.Module):
    """A model whose second output is computed from its input alone."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.linear(x)), x * 2


@pytest.fixture
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model on the host and on the device."""
    torch.manual_seed(0)
    host = LinearAndInput()
    device = LinearAndInput()
    device.load_state_dict(host.state_dict())
    return host, device.to("neuron")


def test_cpu_input_of_a_model_on_neuron_is_copied_and_outputs_match_eager_cpu(models, monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    host, device = models
    compiled = torch.compile(device, backend="neuron")
    for batch in (2, 5):  # the second batch size makes Dynamo compile a symbolic-shape graph
        x = torch.randn(batch, 4)
        outputs = compiled(x)
        for got, want in zip(outputs, host(x), strict=True):
            # Every output is on the device, the one computed from the input alone too.
            assert type(got) is NeuronTensor and got.device == torch.device("neuron", 0)
            torch.testing.assert_close(got.cpu(), want)


def test_disabled_autocopy_raises_naming_the_cpu_input_and_the_variable(models, monkeypatch):
    monkeypatch.setenv(VARIABLE, "1")
    _, device = models
    x = torch.randn(2, 4)
    with pytest.raises(CpuInputError) as raised:
        torch.compile(lambda inp: device(inp), backend="neuron")(x)
    message = str(raised.value)
    assert isinstance(raised.value, RuntimeError)
    assert "L['inp']" in message and "graph input 2" in message  # after the weight and the bias
    assert "shape (2, 4)" in message and "device cpu" in message and "torch.float32" in message
    assert f"{VARIABLE}=1" in message and "x.to(\"neuron\")" in message
    # Moved by the caller, the same input runs.
    torch._dynamo.reset()
    outputs = torch.compile(lambda inp: device(inp), backend="neuron")(x.to("neuron"))
    assert all(out.device.type == "neuron" for out in outputs)


@pytest.mark.parametrize("disabled", ["0", "1"])
def test_graph_with_only_cpu_inputs_is_unaffected_by_the_variable(models, monkeypatch, disabled):
    monkeypatch.setenv(VARIABLE, disabled)
    host, _ = models
    x = torch.randn(2, 4)
    outputs = torch.compile(host, backend="neuron")(x)
    for got, want in zip(outputs, host(x), strict=True):
        assert type(got) is torch.Tensor and got.device.type == "cpu"
        torch.testing.assert_close(got, want)


def test_cpu_input_written_by_the_graph_is_written_back_and_scalars_stay_on_the_host(monkeypatch):
    monkeypatch.setenv(VARIABLE, "1")  # a 0-dim CPU tensor is a scalar, not a refused input
    weight = torch.tensor([1.0, 2.0, 3.0, 4.0]).to("neuron")

    def step(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return w * scale

    out = torch.compile(step, backend="neuron")(weight, torch.tensor(3.0))
    assert out.device.type == "neuron" and out.cpu().tolist() == [3.0, 6.0, 9.0, 12.0]

    monkeypatch.delenv(VARIABLE)
    torch._dynamo.reset()

    def accumulate(total: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        total.add_(w)
        return total * 2

    total = torch.zeros(4)
    out = torch.compile(accumulate, backend="neuron")(total, weight)
    assert total.tolist() == [1.0, 2.0, 3.0, 4.0]  # the caller's CPU tensor, as in eager
    assert out.device.type == "neuron" and out.cpu().tolist() == [2.0, 4.0, 6.0, 8.0]


def test_cpu_inputs_are_copied_under_inference_mode(models, monkeypatch):
    """A serving loop's ``with torch.inference_mode(): out = compiled(batch)``: the copy of an
    inference-mode input has no version counter, and reading it raised ("Inference tensors do not
    track version counter") on the first call. A graph that writes into its input writes back."""
    monkeypatch.delenv(VARIABLE, raising=False)
    host, device = models
    x = torch.randn(5, 4)
    expected = host(x)
    compiled = torch.compile(device, backend="neuron")
    with torch.inference_mode():
        got = compiled(x)
        batch = torch.randn(5, 4)  # an inference tensor
        expected_batch = host(batch)
        got_batch = compiled(batch)
    for g, e in zip(got + got_batch, expected + expected_batch, strict=True):
        torch.testing.assert_close(g.cpu(), e.detach())

    weight = torch.tensor([1.0, 2.0, 3.0, 4.0]).to("neuron")

    def accumulate(total: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        total.add_(w)
        return total * 2

    with torch.inference_mode():
        total = torch.zeros(4)
        out = torch.compile(accumulate, backend="neuron")(total, weight)
    assert total.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert out.cpu().tolist() == [2.0, 4.0, 6.0, 8.0]


def test_gradient_reaches_a_cpu_input_that_requires_it(models, monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    host, device = models
    x = torch.randn(3, 4, requires_grad=True)
    expected = x.detach().clone().requires_grad_()
    sum(out.sum() for out in torch.compile(device, backend="neuron")(x)).backward()
    sum(out.sum() for out in host(expected)).backward()
    assert x.grad is not None and x.grad.device.type == "cpu"
    torch.testing.assert_close(x.grad, expected.grad)
    torch.testing.assert_close(device.linear.weight.grad.cpu(), host.linear.weight.grad)
