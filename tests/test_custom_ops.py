"""A user's ``torch.library`` custom ops inside ``torch.compile(backend="neuron")``.

The compute around a custom op is compiled, the op runs its own implementation in between
(``dynamo/collectives.py``): as inductor calls it, an opaque kernel. torch-mlir failed on every
such graph ("failed to legalize operation 'torch.operator'", and "auto_functionalized_v2 not
implemented" for a mutating op).
"""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401


@torch.library.custom_op("neuron_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
    return x + a * y


@scaled_add.register_fake
def _(x, y, a):
    return torch.empty_like(x)


def _backward(ctx, grad):
    return grad, grad * ctx.a, None


def _setup(ctx, inputs, output):
    ctx.a = inputs[2]


scaled_add.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("neuron_test::add_into", mutates_args=("x",))
def add_into(x: torch.Tensor, y: torch.Tensor) -> None:
    x.add_(y)


@add_into.register_fake
def _(x, y):
    return None


_library = torch.library.Library("neuron_test_def", "DEF")
_library.define("twice(Tensor x) -> Tensor")
_library.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
_library.impl("twice", lambda x: torch.empty_like(x), "Meta")


def _functional(x, y):
    z = scaled_add(x.relu(), y, 0.3).sum(0)
    return torch.ops.neuron_test_def.twice(z) + 1


def _mutating(x, y):
    x = x * 2
    add_into(x, y)
    return x.sin()


@pytest.mark.parametrize("device", ["cpu", "neuron"])
@pytest.mark.parametrize("fn", [_functional, _mutating])
def test_custom_ops_run_between_compiled_partitions(fn, device, recwarn):
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    expected = fn(x.clone(), y)
    got = torch.compile(fn, backend="neuron")(x.to(device), y.to(device))
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_a_custom_op_with_autograd_trains_compiled(device):
    torch._dynamo.reset()
    torch.manual_seed(0)
    w = torch.randn(3, 3)

    def loss(x, w):
        return scaled_add(x @ w, x, 0.5).tanh().sum()

    x = torch.randn(4, 3)
    reference = w.clone().requires_grad_()
    loss(x, reference).backward()
    trained = w.clone().to(device).requires_grad_()
    torch.compile(loss, backend="neuron")(x.to(device), trained).backward()
    torch.testing.assert_close(trained.grad.cpu(), reference.grad)
