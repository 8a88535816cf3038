"""Eager kernels are functions of their dispatch key alone: no sequence of ops changes another op's result.

A kernel is traced once per dispatch key (op, shapes, strides, dtypes, other arguments) and
serves every later call of that key, in this process and, through the HLO cache, in every
process sharing the cache. So what a trace computes must not depend on anything the key does
not hold, such as one tensor passed as two arguments (``a * a``) or arguments that share memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_neuronx  # noqa: F401  (registers the neuron device)

BINARY = {
    "mul": torch.mul,
    "div": torch.div,
    "sub": torch.sub,
    "atan2": torch.atan2,
}


def _pool(device: str) -> list[torch.Tensor]:
    """Arguments that alias in every way a call can: one tensor, a view of it, a row of a matrix."""
    a = torch.tensor([3.0, 4.0, -5.0], device=device)
    b = torch.tensor([6.0, 8.0, 2.5], device=device)
    m = torch.tensor([[1.0, -2.0, 0.5], [7.0, 9.0, -1.5]], device=device)
    return [a, b, a.view(3), m, m[1]]


def _run(steps: list[tuple[str, int, int, bool]], device: str) -> list[torch.Tensor]:
    pool = _pool(device)
    results = []
    for name, i, j, in_place in steps:
        op = BINARY[name]
        if in_place:  # the target is a copy; "j == i" passes that very copy as the other argument
            target = pool[i] + 0
            other = target if j == i else pool[j]
            try:
                getattr(target, f"{name}_")(other)
            except RuntimeError:  # a result that does not fit the target: the same on both devices
                results.append(None)
                continue
            results.append(target)
        else:
            results.append(op(pool[i], pool[j]))
    return results


STEP = st.tuples(st.sampled_from(sorted(BINARY)), st.integers(0, 4), st.integers(0, 4), st.booleans())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(STEP, min_size=1, max_size=6))
def test_no_sequence_of_ops_changes_another_ops_result(steps):
    expected = _run(steps, "cpu")
    got = _run(steps, "neuron")
    for step, e, g in zip(steps, expected, got):
        if e is None:
            assert g is None, step
            continue
        torch.testing.assert_close(g.cpu(), e, msg=lambda m, step=step: f"{step}: {m}")


def test_an_op_with_one_argument_twice_leaves_the_next_call_of_its_key_right():
    a = torch.tensor([3.0, 4.0], device="neuron")
    b = torch.tensor([6.0, 8.0], device="neuron")
    assert (a * a).tolist() == [9.0, 16.0]
    assert (b * a).tolist() == [18.0, 32.0]
    assert (a / a).tolist() == [1.0, 1.0]
    assert (b / a).tolist() == [2.0, 2.0]
    c = torch.tensor(2.0, device="neuron")
    torch.corrcoef(torch.tensor([1.0, 2.0, 4.0], device="neuron"))  # divides a 0-d tensor by itself
    assert (torch.tensor(6.0, device="neuron") / c).item() == 3.0


FIRST = """
import torch, torch_neuronx
a = torch.tensor([3., 4.], device="neuron")
print((a * a).tolist(), (a / a).tolist())
"""

SECOND = """
import json, torch, torch_neuronx
from torch_neuronx import metrics
a = torch.tensor([3., 4.], device="neuron"); b = torch.tensor([6., 8.], device="neuron")
print(json.dumps({"mul": (b * a).tolist(), "div": (b / a).tolist(), "traces": metrics.counter("kernel_traces"),
                  "hits": metrics.counter("eager_hlo_cache_hits")}))
"""


def test_kernels_a_process_stores_serve_other_processes_other_aliasing(tmp_path):
    env = {**os.environ, "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"),
           "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    for script in (FIRST, SECOND):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    second = json.loads(out.stdout.strip().splitlines()[-1])
    assert second == {"mul": [18.0, 32.0], "div": [2.0, 2.0], "traces": 0, "hits": 2}


# Constants a kernel bakes in that compare equal to another value but are not it: -0.0 == 0.0,
# and NaN != NaN. Each pair runs the same op with either constant; the second must not reuse
# the first one's kernel.
_EQUAL_BUT_NOT_THE_SAME = {
    "pow_base": lambda b, c: torch.pow(c, b),
    "where_other": lambda b, c: torch.where(b > 0, b, c),
    "nan_to_num": lambda b, c: torch.nan_to_num(b / 0, nan=c, posinf=c, neginf=c),
    "add_runtime_scalar": lambda b, c: b * 0 + c,
    "pow_exponent": lambda b, c: torch.pow(b, c),
    "masked_fill": lambda b, c: b.masked_fill(b < 2, c),
}


@pytest.mark.parametrize("name", _EQUAL_BUT_NOT_THE_SAME)
def test_constants_equal_in_value_but_not_the_same_never_share_a_kernel(name):
    fn = _EQUAL_BUT_NOT_THE_SAME[name]
    b = torch.tensor([-1.0, 0.0, 1.0, 3.0])
    for constants in ((0.0, -0.0), (-0.0, 0.0), (float("nan"), -0.0, float("nan"))):
        for c in constants:
            got, want = fn(b.to("neuron"), c).cpu(), fn(b, c)
            assert torch.equal(got.isnan(), want.isnan()), (name, c, got, want)
            same = ~want.isnan()
            assert torch.equal(got[same], want[same]) and torch.equal(got[same].signbit(), want[same].signbit()), \
                (name, c, got, want)
