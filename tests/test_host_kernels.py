"""List-writing updates (device/host_kernels.py): in-place ``_foreach_`` ops, fused optimizers and
GradScaler's ops queued on the stream as torch's host kernels over the device memory.

Given the same gradients, every optimizer and GradScaler must leave the CPU's values (the same
kernels run the updates; the out-of-place foreach ops around them, compiled, may differ by an
ulp), without a CPU fallback; a bad call raises torch's error where it is made
and leaves the tensors usable; the update is ordered on its stream like any kernel."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import observe


def _params(seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [torch.randn(4, 5), torch.randn(5), torch.randn(3, 2, 2), torch.randn(())]


def _steps(optimizer, kwargs: dict, device: str, steps: int = 4) -> list[torch.Tensor]:
    """``steps`` optimizer steps over fixed parameters with the same seeded gradients each run."""
    params = [p.to(device).requires_grad_() for p in _params()]
    opt = optimizer(params, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(device)
        opt.step()
    return [p.detach().cpu() for p in params]


@pytest.mark.parametrize("optimizer, kwargs", [
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "foreach": True}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "fused": True}),
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True, "maximize": True, "fused": True}),
    (torch.optim.Adam, {"lr": torch.tensor(0.01), "fused": True}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "foreach": True}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "fused": True}),
    (torch.optim.SGD, {"lr": 0.1, "fused": True}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True, "foreach": True}),
    (torch.optim.Adagrad, {"lr": 0.1, "foreach": True}),
])
def test_optimizers_leave_the_cpus_values_without_fallbacks(optimizer, kwargs):
    host = _steps(optimizer, kwargs, "cpu")
    before = observe.counter("eager_fallbacks")
    device = _steps(optimizer, kwargs, "neuron")
    assert observe.counter("eager_fallbacks") == before
    for h, d in zip(host, device):
        torch.testing.assert_close(d, h, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.ASGD])
def test_optimizers_default_to_their_multi_tensor_step_as_on_cuda(optimizer):
    """With ``foreach`` left unset, an optimizer over neuron parameters takes its multi-tensor step,
    as over CUDA's (torch chooses it only for the tensor types it lists: the per-tensor loop issued
    about twice the ops), and leaves the CPU's values."""
    from torch.optim.optimizer import _default_to_fused_or_foreach
    from torch.utils._foreach_utils import _has_foreach_support

    params = [torch.zeros(3, device="neuron", requires_grad=True)]
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, True)
    assert _has_foreach_support(params, params[0].device)
    host = _steps(optimizer, {}, "cpu", steps=3)
    before = observe.counter("eager_fallbacks")
    device = _steps(optimizer, {}, "neuron", steps=3)
    assert observe.counter("eager_fallbacks") == before
    for h, d in zip(host, device):
        torch.testing.assert_close(d, h, rtol=1e-5, atol=1e-6)


def test_a_fused_optimizers_mismatched_lists_raise_before_any_parameter_changes():
    params = [torch.randn(3, device="neuron"), torch.randn(2, device="neuron")]
    before = [p.cpu() for p in params]
    grads = [torch.randn(3, device="neuron"), torch.randn(3, device="neuron")]
    with pytest.raises(RuntimeError, match=r"grads\[1\] has shape \[3\]"):
        torch._fused_sgd_(params, grads, [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0,
                          nesterov=False, maximize=False, is_first_step=True)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.cpu(), b)


def _scaled_steps(device: str, dtype: torch.dtype) -> tuple[list[torch.Tensor], float]:
    """AdamW under a GradScaler: the second step's gradients hold an inf, so it is skipped and the
    scale backs off."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=2)
    x = torch.randn(4, 6)
    for step in range(4):
        opt.zero_grad()
        with torch.autocast(device, dtype=dtype):
            loss = model(x.to(device)).float().square().mean()
        scaler.scale(loss * (float("inf") if step == 1 else 1.0)).backward()
        scaler.step(opt)
        scaler.update()
    return [p.detach().cpu() for p in model.parameters()], scaler.get_scale()


def test_grad_scaler_skips_the_inf_step_and_updates_its_scale_like_the_cpu():
    host, host_scale = _scaled_steps("cpu", torch.bfloat16)
    before = observe.counter("eager_fallbacks")
    device, device_scale = _scaled_steps("neuron", torch.bfloat16)
    assert observe.counter("eager_fallbacks") == before
    assert device_scale == host_scale == 2.0 ** 9 * 2  # backed off once, grew once after 2 good steps
    for h, d in zip(host, device):
        torch.testing.assert_close(d, h, rtol=1e-2, atol=1e-3)  # bfloat16 autocast on both


@pytest.mark.parametrize("call, message", [
    (lambda xs, ys: torch._foreach_add_(xs, ys[:2]), "same number"),
    (lambda xs, ys: torch._foreach_add_(xs, [y.t() for y in ys]), "size"),
    (lambda xs, ys: torch._foreach_add_([x.expand(4, 4, 4) for x in xs[:1]], 1.0), "memory location"),
])
def test_a_bad_call_raises_where_it_is_made_and_leaves_the_tensors_usable(call, message):
    """As on the CPU: torch's error at the call; the tensors written as the CPU leaves them (a foreach
    op applies element by element there) and usable after."""
    torch.manual_seed(0)
    host = [torch.randn(4, 4), torch.randn(3, 4), torch.randn(3, 4)]
    xs = [t.to("neuron") for t in host]
    ys = [t.to("neuron") for t in host]
    with pytest.raises(RuntimeError, match=message):
        call(host, [h.clone() for h in host])
    with pytest.raises(RuntimeError, match=message):
        call(xs, ys)
    torch._foreach_mul_(xs, 2.0)
    for x, h in zip(xs, host):
        torch.testing.assert_close(x.cpu(), h * 2)


def test_the_update_is_ordered_on_its_stream():
    torch.manual_seed(0)
    xs = [torch.randn(256, 256, device="neuron") for _ in range(3)]
    expected = [x.cpu() * 3 + 1 for x in xs]
    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        ys = [x * 3 for x in xs]  # written on the side stream
        torch._foreach_add_(ys, 1.0)  # queued after them there
    torch.neuron.current_stream().wait_stream(side)
    for y, e in zip(ys, expected):
        torch.testing.assert_close(y.cpu(), e)


def test_a_compiled_graph_sees_the_update_of_its_resident_weights():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(3, 4, device="neuron")
    with torch.no_grad():
        compiled(x)
        torch._foreach_add_(list(model.parameters()), 1.0)
        weight, bias = (p.detach().cpu() for p in model.parameters())
        torch.testing.assert_close(compiled(x).cpu(), x.cpu() @ weight.t() + bias)
