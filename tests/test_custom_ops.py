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


# Ops with a kernel for the neuron device: it, not the default one, runs on neuron tensors. The
# kernels here compute different things, so a result tells which one ran.
@torch.library.custom_op("neuron_test::which", mutates_args=())
def which(x: torch.Tensor) -> torch.Tensor:
    return x + 100  # the default kernel


@which.register_kernel("neuron")
def _(x):
    assert x.device.type == "neuron"
    return x * 2


@which.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("neuron_test::neuron_only", mutates_args=(), device_types="neuron")
def neuron_only(x: torch.Tensor) -> torch.Tensor:
    return x.cos() * 3


@neuron_only.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("neuron_test::scale_into", mutates_args=("x",), device_types="neuron")
def scale_into(x: torch.Tensor, y: torch.Tensor) -> None:
    x.mul_(y)


@scale_into.register_fake
def _(x, y):
    return None


_device_library = torch.library.Library("neuron_test_backend", "DEF")
_device_library.define("plus_one(Tensor x) -> Tensor")
_device_library.impl("plus_one", lambda x: x + 1, "PrivateUse1")
_device_library.impl("plus_one", lambda x: torch.empty_like(x), "Meta")


def _device_kernels(x, y):
    a = which(x.relu())
    b = neuron_only(a - y)
    c = torch.ops.neuron_test_backend.plus_one(b)
    d = c * 1.5
    scale_into(d, y)
    return d.sin()


def _device_kernels_expected(x, y):
    b = (x.relu() * 2 - y).cos() * 3
    return ((b + 1) * 1.5 * y).sin()


def test_a_custom_ops_neuron_kernel_runs_on_neuron_tensors_eager_and_compiled():
    """``register_kernel("neuron")``, ``custom_op(device_types="neuron")`` (a mutating one too) and
    ``Library.impl(..., "PrivateUse1")``: the neuron device's dispatcher runs before the backend's
    key, and ran the default kernel on host copies (an op with a neuron kernel only raised "Could
    not run ... with arguments from the 'CPU' backend"); compiled graphs called the ops on their
    host values likewise. On host tensors the default kernel still runs."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    expected = _device_kernels_expected(x, y)
    xd, yd = x.to("neuron"), y.to("neuron")
    for how, fn in (("eager", _device_kernels), ("compiled", torch.compile(_device_kernels, backend="neuron"))):
        got = fn(xd, yd)
        assert got.device.type == "neuron", how
        torch.testing.assert_close(got.cpu(), expected, msg=how)
    torch.testing.assert_close(which(x), x + 100)


_lib = torch.library.Library("neuron_test_names", "DEF")
_lib.define("silu_(Tensor(a!) self) -> Tensor(a!)")
_lib.impl("silu_", lambda self: self.mul_(torch.sigmoid(self)).mul_(2.0), "CPU")  # not aten's silu
_lib.define("sigmoid(Tensor self, *, Tensor(a!) out) -> Tensor(a!)")
_lib.impl("sigmoid", lambda self, *, out: out.copy_((self / 6 + 0.5).clamp(0, 1)), "CPU")  # a hard sigmoid


@torch.library.custom_op("neuron_test_names::add_", mutates_args=("a",))
def _add_(a: torch.Tensor, b: torch.Tensor) -> None:
    a.add_(b)


def test_a_librarys_ops_named_like_atens_run_their_own_kernels():
    """``mylib::silu_`` (in place) and ``mylib::sigmoid(out=)`` ran ``aten.silu``/``aten.sigmoid``
    on neuron tensors (the namespace was ignored when looking for the functional twin), and
    ``mylib::add_`` raised "operator aten::add does not exist"."""
    x = torch.tensor([-1.0, 0.5, 2.0])
    expected = torch.ops.neuron_test_names.silu_(x.clone())
    on = x.to("neuron")
    torch.ops.neuron_test_names.silu_(on)
    torch.testing.assert_close(on.cpu(), expected)
    compiled = torch.compile(lambda t: torch.ops.neuron_test_names.silu_(t.clone()) * 1, backend="neuron")
    torch.testing.assert_close(compiled(x.to("neuron")).cpu(), expected)
    out = torch.empty(3).to("neuron")
    torch.ops.neuron_test_names.sigmoid(x.to("neuron"), out=out)
    torch.testing.assert_close(out.cpu(), (x / 6 + 0.5).clamp(0, 1))
    a = torch.zeros(3).to("neuron")
    _add_(a, torch.ones(3).to("neuron"))
    torch.testing.assert_close(a.cpu(), torch.ones(3))
