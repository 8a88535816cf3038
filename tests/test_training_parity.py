"""Eager training on the neuron device matches the same loop on the CPU, step for step.

Each case builds a model on the CPU, copies it to the neuron device through its state_dict
(same initial values), and trains both copies for 20 steps on the same batches with the same
optimizer (SGD with momentum, Adam; their default implementations, the ``_foreach_*`` ops on
neuron as on CUDA). No torch.compile: every op is an eager neuron kernel. The losses of every
step and the final parameters and buffers (BatchNorm's running statistics) must agree within
float32 tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx  # noqa: F401  (registers the neuron device)

STEPS = 20
BATCH = 4
EPOCH = 4  # distinct batches, cycled: 20 steps are 5 passes over the same data, so the loss falls
LOSS_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
STATE_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}

class _Cnn(nn.Module):
    """Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d, twice, then a linear classifier.

    The convolutions have no bias, as before every BatchNorm: BatchNorm removes it, so its gradient
    is float32 rounding noise, which Adam (dividing by the gradient's own scale) turns into
    steps as large as the learning rate in whichever direction the noise points, on either device.
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class _Encoder(nn.Module):
    """One post-norm TransformerEncoderLayer (d_model 32, 2 heads, no dropout) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64, dropout=0.0,
                                                batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x).mean(dim=1))


# name -> (model factory, input shape of one batch, number of classes)
_MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], int]] = {
    "mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5)),
            (BATCH, 16), 5),
    "cnn": (_Cnn, (BATCH, 3, 8, 8), 5),
    "transformer": (_Encoder, (BATCH, 8, 32), 5),
}

# Parameter elements whose gradient is zero in exact arithmetic, so float32 noise on either
# device: the key projection's bias (softmax over the keys ignores a constant added to every
# score). Adam moves each by at most about its learning rate per step, so they are only held
# to that bound; every other element is compared at STATE_TOLERANCE.
_NOISE_GRADIENT: dict[str, dict[str, slice]] = {
    "transformer": {"layer.self_attn.in_proj_bias": slice(32, 64)},
}

_LEARNING_RATES = {"sgd_momentum": 0.05, "adam": 1e-3}
_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=_LEARNING_RATES["sgd_momentum"], momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=_LEARNING_RATES["adam"]),
}


def _batches(shape: tuple[int, ...], classes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    epoch = [(torch.randn(shape, generator=generator), torch.randint(classes, (shape[0],), generator=generator))
             for _ in range(EPOCH)]
    return [epoch[step % EPOCH] for step in range(STEPS)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[tuple[torch.Tensor, torch.Tensor]],
           device: str) -> list[torch.Tensor]:
    """Train ``model`` one step per batch; the loss of each step, on the host."""
    model.train()
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().cpu())
    return losses


def _compare_state(device_model: nn.Module, host_model: nn.Module, model_name: str, optimizer_name: str) -> None:
    noise = _NOISE_GRADIENT.get(model_name, {})
    device_state = device_model.state_dict()
    for name, expected in host_model.state_dict().items():
        got = device_state[name]
        assert got.device.type == "neuron", name
        got = got.cpu()
        if name in noise:
            bound = 2 * STEPS * _LEARNING_RATES[optimizer_name]
            assert float((got[noise[name]] - expected[noise[name]]).abs().max()) <= bound, name
            mask = torch.ones(got.shape, dtype=torch.bool)
            mask[noise[name]] = False
            got, expected = got[mask], expected[mask]
        torch.testing.assert_close(got, expected, **STATE_TOLERANCE,
                                   msg=lambda m, name=name: f"{name} after {STEPS} steps: {m}")


# The fast tier keeps the MLP with both optimizers and the batch-norm statistics test (each case compiles its
# ops' kernels: 15-35 s apiece on two cores); the rest is slow.
_CASES = [
    pytest.param("mlp", "sgd_momentum"),
    pytest.param("mlp", "adam"),
    pytest.param("cnn", "sgd_momentum", marks=pytest.mark.slow),
    pytest.param("cnn", "adam", marks=pytest.mark.slow),
    pytest.param("transformer", "sgd_momentum", marks=pytest.mark.slow),
    pytest.param("transformer", "adam", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("model_name", "optimizer_name"), _CASES)
def test_eager_neuron_training_matches_cpu_losses_and_final_state(model_name: str, optimizer_name: str) -> None:
    make_model, shape, classes = _MODELS[model_name]
    torch.manual_seed(0)
    host = make_model()
    device = make_model().to("neuron")
    device.load_state_dict(host.state_dict())  # the same initial values, copied onto the device
    make_optimizer = _OPTIMIZERS[optimizer_name]
    batches = _batches(shape, classes)

    host_losses = _train(host, make_optimizer(host.parameters()), batches, "cpu")
    device_losses = _train(device, make_optimizer(device.parameters()), batches, "neuron")

    for step, (got, expected) in enumerate(zip(device_losses, host_losses, strict=True)):
        torch.testing.assert_close(got, expected, **LOSS_TOLERANCE,
                                   msg=lambda m, step=step: f"loss of step {step}: {m}")
    assert sum(host_losses[-EPOCH:]) < sum(host_losses[:EPOCH])  # the loop really trains
    _compare_state(device, host, model_name, optimizer_name)


def test_batch_norm_in_training_updates_its_running_statistics_as_on_cpu() -> None:
    x = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(2))
    host, device = nn.BatchNorm2d(3), nn.BatchNorm2d(3).to("neuron")
    torch.testing.assert_close(device(x.to("neuron")).cpu(), host(x), rtol=1e-5, atol=1e-5)
    assert int(device.num_batches_tracked) == int(host.num_batches_tracked) == 1
    torch.testing.assert_close(device.running_mean.cpu(), host.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(device.running_var.cpu(), host.running_var, rtol=1e-5, atol=1e-6)
