"""Whole training steps under torch.compile(backend="neuron"): optimizers, clipping, .backward() inside."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


_X, _Y = torch.randn(6, 8), torch.randn(6, 4)


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),  # lerp: torch's decomposition emits prims.fma
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),  # the _foreach_* ops
    lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, foreach=True),
], ids=["adam", "adamw_foreach", "sgd_nesterov_foreach"])
def test_compiled_optimizer_steps_match_eager(make_optimizer):
    eager, compiled = _model(), _model()
    eager_opt, opt = make_optimizer(eager.parameters()), make_optimizer(compiled.parameters())
    step = torch.compile(opt.step, backend="neuron")
    for _ in range(3):
        for model, optimizer, run in ((eager, eager_opt, eager_opt.step), (compiled, opt, step)):
            optimizer.zero_grad()
            F.mse_loss(model(_X), _Y).backward()
            run()
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_backward_and_gradient_clipping_inside_a_compiled_step():
    """.backward() inside the compiled function breaks the graph: the backward graph is then
    compiled and run while Dynamo is active (it must not trace the backend's own code)."""
    eager, compiled = _model(), _model()

    def train_step(model):
        loss = F.mse_loss(model(_X), _Y)
        loss.backward()
        return torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)

    expected = train_step(eager)
    got = torch.compile(train_step, backend="neuron")(compiled)
    torch.testing.assert_close(got, expected)
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)


def test_weight_norm_trains_as_in_eager():
    """``weight_norm`` (its backward, ``_weight_norm_interface_backward``, had no lowering), first and last dim."""
    from torch.nn.utils import parametrizations

    def make():
        torch.manual_seed(0)
        return nn.Sequential(parametrizations.weight_norm(nn.Conv1d(3, 4, 3)), nn.Flatten(),
                             parametrizations.weight_norm(nn.Linear(16, 5), dim=-1))

    eager, compiled_model = make(), make()
    x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(1))
    expected, got = eager(x), torch.compile(compiled_model, backend="neuron")(x)
    torch.testing.assert_close(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")


class _TwoBiases(nn.Module):
    """Three parameters whose gradients are equal (``x + a + b + c[None]``): one gradient, as far
    as the compiled backward can tell."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4))
        self.c = nn.Parameter(torch.zeros(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.a + self.b + self.c[0]).relu()


def test_parameters_with_equal_gradients_get_gradients_of_their_own():
    """IREE returned one buffer for the equal results of a backward (a ResNet block's two
    BatchNorm biases), and the parameters shared one ``.grad``: accumulating two micro-batches gave
    6 for eager's 4, and ``clip_grad_norm_`` scaled the shared tensor twice."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    got, expected = _TwoBiases(), _TwoBiases()
    compiled = torch.compile(got, backend="neuron")
    for _ in range(2):  # two micro-batches accumulate
        compiled(x).sum().backward()
        expected(x).sum().backward()
    pointers = {p.grad.data_ptr() for p in got.parameters()}
    assert len(pointers) == 3
    for g, e in zip(got.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(g.grad, e.grad)
    torch.nn.utils.clip_grad_norm_(got.parameters(), 1.0)
    torch.nn.utils.clip_grad_norm_(expected.parameters(), 1.0)
    for g, e in zip(got.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(g.grad, e.grad)


@pytest.mark.parametrize("foreach", [False, True])
def test_compiled_steps_of_several_groups_on_the_device_keep_every_groups_step(foreach):
    """Dynamo initializes the groups one by one and moves CPU ``step`` tensors to the device
    before each; neuron groups did not start capturable as CUDA's do, so the first group's steps
    were traced, then replaced: after a learning-rate change (a recompile) every group but the
    last used the bias correction of the wrong step, and ``state_dict()`` saved ``step=0``."""
    def run(device: str, compiled: bool) -> tuple[list[torch.Tensor], list[float]]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        params = [torch.randn(4, 3, device=device, requires_grad=True), torch.randn(5, device=device,
                                                                                    requires_grad=True)]
        opt = torch.optim.AdamW([{"params": [params[0]]}, {"params": [params[1]], "weight_decay": 0.0}],
                                lr=0.01, foreach=foreach)
        step = torch.compile(opt.step, backend="neuron") if compiled else opt.step
        for i, lr in enumerate([0.01, 0.02, 0.03]):  # what a scheduler does: a new float each step
            for group in opt.param_groups:
                group["lr"] = lr
            for p in params:
                p.grad = torch.full_like(p, 1.0 + i)
            step()
        steps = [float(s["step"]) for s in opt.state_dict()["state"].values()]
        return [p.detach().cpu() for p in params], steps

    expected, expected_steps = run("cpu", compiled=False)
    got, steps = run("neuron", compiled=True)
    assert steps == expected_steps == [3.0, 3.0]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layers", [5, pytest.param(40, marks=pytest.mark.slow)])  # (40: CI time)
def test_a_compiled_step_over_many_parameters_loads_and_matches_eager(layers):
    """IREE put every one-element op of a graph into one dispatch, whatever their number: the
    per-parameter bias corrections of foreach AdamW and the norm of each gradient in
    ``clip_grad_norm_`` made a dispatch of one binding per parameter, which the runtime refused
    past 32 and 64 ("binding count 42 > 32"): any model of a few dozen parameters failed, then
    (batched from 16 alike ops on) those of 9 to 15 parameters, a LoRA fine-tune's."""
    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])  # 10 or 80 parameters
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)

    def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
        opt.step()
        opt.zero_grad()
        return norm

    eager, eager_opt = make()
    compiled, opt = make()
    compiled_step = torch.compile(step, backend="neuron")
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled_step(compiled, opt, x), step(eager, eager_opt, x))
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


_NEW_KERNELS_UNDER_DYNAMO = """
import torch
torch.compile(lambda x: x + 1, backend="neuron")(torch.ones(2))  # a first compile sets traces' locking up
params = [torch.randn(23, 29, device="neuron", requires_grad=True)]
opt = torch.optim.Adam(params, lr=0.1)
for p in params:
    p.grad = torch.ones_like(p)
torch.compile(opt.step, backend="neuron")()  # Adam's state is made by eager ops while Dynamo traces
print(float(params[0].detach().cpu()[0, 0] - 0))
"""


def test_eager_kernels_traced_while_dynamo_compiles_do_not_deadlock(tmp_path):
    """A trace holds Dynamo's compile lock; an eager op run by Dynamo's trace (an optimizer's
    state made on the device) traces its kernel on the compile thread while the tracing thread,
    holding that lock, waits for it: it waited forever before the lock was lent."""
    env = {**os.environ, "TORCH_NEURONX_HLO_CACHE": "0"}  # every kernel traced, none from the cache
    result = subprocess.run([sys.executable, "-c", _NEW_KERNELS_UNDER_DYNAMO], capture_output=True, text=True,
                            timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
