"""Integer division by zero (compiler/passes/zero_divisors.py): torch's RuntimeError, compiled and
on the eager device, instead of whatever IREE's division returned; valid divisions unchanged."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401

OPS = {
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
}


@pytest.mark.parametrize("name", list(OPS))
def test_an_integer_division_by_zero_raises_torchs_error(name):
    op = OPS[name]
    a, b = torch.tensor([7, -7, 5]), torch.tensor([0, 3, 2])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.compile(op, backend="neuron")(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(a.to("neuron"), b.to("neuron")).cpu()


@pytest.mark.parametrize(("name", "divisor", "dtype"), [
    *((name, divisor, torch.int64) for name in (*OPS, "floor_divide_", "floor rounding", "rfloordiv")
      for divisor in (0, -3)),
    ("floor_divide", 0, torch.uint8), ("remainder", 3, torch.uint8)])
def test_integer_division_by_a_python_number(name, divisor, dtype):
    """A Python 0 divisor stays a literal in the kernel (``a // 0``, ``a % 0``, ``5 // t``): its
    divisions returned garbage on the eager device and compiled ([7, -8, 9] // 0 was [-1, -2, -1])."""
    ops = {**{k: (lambda op: lambda a: op(a, divisor))(v) for k, v in OPS.items()},
           "floor_divide_": lambda a: a.clone().floor_divide_(divisor),
           "floor rounding": lambda a: torch.div(a, divisor, rounding_mode="floor"),
           "rfloordiv": lambda a: 5 // (a * 0 + divisor)}
    op = ops[name]
    a = torch.tensor([7, 8, 9] if dtype == torch.uint8 else [7, -8, 9], dtype=dtype)
    if divisor == 0:
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            op(a)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            op(a.to("neuron")).cpu()
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.compile(op, backend="neuron")(a)
    else:
        torch.testing.assert_close(op(a.to("neuron")).cpu(), op(a))
        torch.testing.assert_close(torch.compile(op, backend="neuron")(a), op(a))
    torch._dynamo.reset()


@pytest.mark.parametrize("name", list(OPS))
def test_valid_integer_divisions_match_torch(name):
    op = OPS[name]
    torch.manual_seed(0)
    compiled = torch.compile(op, backend="neuron", dynamic=True)
    for n in (5, 9, 13):
        a = torch.randint(-50, 50, (n,))
        b = torch.randint(1, 9, (n,)) * torch.where(torch.rand(n) < 0.5, -1, 1)
        torch.testing.assert_close(compiled(a, b), op(a, b))
        torch.testing.assert_close(op(a.to("neuron"), b.to("neuron")).cpu(), op(a, b))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # a dynamic-shape graph checks too
        compiled(torch.ones(7, dtype=torch.int64), torch.zeros(7, dtype=torch.int64))


def test_float_division_by_zero_still_gives_infinities():
    a, b = torch.tensor([1.0, -1.0, 0.0]), torch.zeros(3)
    torch.testing.assert_close(torch.compile(lambda x, y: x / y, backend="neuron")(a, b), a / b, equal_nan=True)
