"""``torch.cond`` in graphs compiled with backend="neuron" (``passes/cond_branches.py``) and on
the eager device (``runtime/hops.py``).

Compiled, both branches run and the predicate selects the results; the host checks of a
branch (index bounds, integer division by zero) hold only when that branch is taken.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _two_outputs(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: (a * 2 + b, a.sum()), lambda a, b: (a - b, a.mean()), (x, y))


def _nested(x, idx):
    def inner(a, i):
        return torch.cond(a[0] > 0, lambda p, j: (p[j] * 2,), lambda p, j: (p[:2] + 1,), (a, i))

    return torch.cond(idx.max() < x.shape[0], inner, lambda a, i: (a[:2] - 1,), (x, idx))


def _divides(x, d):
    return torch.cond(d.min() != 0, lambda a, b: (a // b,), lambda a, b: (a * 0,), (x, d))


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_each_branch_gives_eager_values(device):
    compiled = torch.compile(_two_outputs, backend="neuron")
    for sign in (1, -1):
        x, y = (torch.randn(3) + 3 * sign).to(device), torch.randn(3).to(device)
        for got, want in zip(compiled(x, y), _two_outputs(x, y)):
            assert got.device.type == device
            torch.testing.assert_close(got.cpu(), want.cpu())


def test_checks_hold_only_in_the_branch_taken():
    compiled = torch.compile(_nested, backend="neuron")
    x = torch.tensor([1.0, 2.0, 3.0])
    for values, idx in ((x, [0, 2]), (x, [0, 7]), (-x, [0, 2]), (-x, [0, 7])):
        index = torch.tensor(idx)
        torch.testing.assert_close(compiled(values, index), _nested(values, index))
    divides = torch.compile(_divides, backend="neuron")
    a = torch.tensor([7, -7])
    assert divides(a, torch.tensor([2, 0]))[0].tolist() == [0, 0]  # the division is not taken: no error
    assert divides(a, torch.tensor([2, -2]))[0].tolist() == [3, 3]


def test_an_index_out_of_range_in_the_branch_taken_raises():
    def taken(x, idx):
        return torch.cond(x.sum() > 0, lambda a, i: (a[i],), lambda a, i: (a[:2] * 1,), (x, idx))

    compiled = torch.compile(taken, backend="neuron")
    x = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(compiled(x, torch.tensor([2, 0])), taken(x, torch.tensor([2, 0])))
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(x, torch.tensor([0, 5]))
    torch.testing.assert_close(compiled(-x, torch.tensor([0, 5])), taken(-x, torch.tensor([0, 5])))


@pytest.mark.parametrize("device, compiled", [("cpu", True), ("neuron", True), ("neuron", False)])
def test_gradients_flow_through_the_branch_taken(device, compiled):
    """Compiled (both branches in the NEFF, the predicate selecting) and, on the eager device,
    uncompiled (torch.cond traces itself; the neuron-tensor rule runs the taken branch)."""
    w_host = torch.randn(3)
    w = w_host.clone().to(device).requires_grad_()
    w_ref = w_host.clone().requires_grad_()

    def model(x, weight):
        return torch.cond(x.sum() > 0, lambda a, v: ((a * v).sin(),), lambda a, v: ((a + v).cos(),), (x, weight))[0]

    run = torch.compile(model, backend="neuron") if compiled else model
    for sign in (1.0, -1.0):
        x = torch.tensor([1.0, 2.0, 3.0]) * sign
        out = run(x.to(device), w)
        assert out.device.type == device
        out.sum().backward()
        model(x, w_ref).sum().backward()
        torch.testing.assert_close(out.detach().cpu(), model(x, w_ref).detach())
        torch.testing.assert_close(w.grad.cpu(), w_ref.grad)
        w.grad, w_ref.grad = None, None
