"""Tensor assertions inside compiled functions raise as in eager (``passes/host_checks.py``)."""

from __future__ import annotations

import pytest
import torch

# (compiled from text: pytest's assertion rewriting would make the assert Python code Dynamo breaks at)
_TEXT = "def positive_log(x):\n    assert x.min() > 0, 'must be positive'\n    return x.log()\n"
_namespace: dict = {}
exec(compile(_TEXT, "<assertions>", "exec"), _namespace)
_positive_log = _namespace["positive_log"]


def _in_a_branch(x):  # the assertion holds only where its branch is taken
    def checked(a):
        torch._assert_async((a > 0).all(), "branch needs positives")
        return a.sqrt()
    return torch.cond(x.sum() > 0, checked, lambda a: a * 0, (x,))


@pytest.mark.parametrize("device", ["cpu", "neuron"])
@pytest.mark.parametrize("fn, good, bad, message", [
    (_positive_log, [1.0, 2.0, 3.0], [-1.0, 2.0, 3.0], "must be positive"),
    (_in_a_branch, [1.0, 4.0, 9.0], [4.0, -1.0, 9.0], "branch needs positives"),
], ids=["assert statement", "inside a cond branch"])
def test_a_failing_assertion_raises_and_a_holding_one_computes(device, fn, good, bad, message):
    """``assert x.min() > 0, "msg"`` was dropped by the lowering: the compiled call returned NaNs
    where eager (and inductor) raise ``RuntimeError("msg")``."""
    compiled = torch.compile(fn, backend="neuron")
    x = torch.tensor(good, device=device)
    torch.testing.assert_close(compiled(x).cpu(), fn(x.cpu()))
    with pytest.raises(RuntimeError, match=message):
        compiled(torch.tensor(bad, device=device))
    negatives = torch.tensor([-1.0, -2.0, -3.0], device=device)
    if fn is _in_a_branch:  # the branch not taken: its assertion does not apply
        torch.testing.assert_close(compiled(negatives).cpu(), fn(negatives.cpu()))


def _checked_item(x):
    s = x.sum().item()
    torch._check(s > 0)
    torch._check(2.0 <= s * 4)  # (a number first, arithmetic on the value)
    return x * s


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_checks_on_values_read_with_item_compile_and_hold(device):
    """``torch._check(s > 0)`` on ``s = t.item()`` (captured as a graph value) failed to lower
    ("failed to legalize operation 'torch.runtime.assert'") even when it held; it runs, and a
    check that fails raises as aot_autograd's own runtime assertion does."""
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = torch.compile(_checked_item, backend="neuron")
        x = torch.ones(3, device=device)
        torch.testing.assert_close(compiled(x).cpu(), _checked_item(x.cpu()))
        with pytest.raises(RuntimeError, match="Runtime assertion failed"):
            compiled(-x)
