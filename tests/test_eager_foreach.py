"""``torch._foreach_*`` ops on neuron tensors: in-place ones queued whole as torch's host kernel
(device/host_kernels.py), per tensor where that route declines (device/foreach.py), never a CPU
fallback (no host synchronization), with the CPU's values;
optimizers with ``foreach=True`` (SGD with momentum, Adam, AdamW) and gradient clipping match the
same loop on the CPU."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import observe


def _pair(n: int = 3):
    torch.manual_seed(0)
    host = [torch.randn(4, 5) for _ in range(n)]
    return host, [t.clone().to("neuron") for t in host]


@pytest.mark.parametrize("name, op", [
    ("mul_ Scalar", lambda xs, ys: torch._foreach_mul_(xs, 0.9)),
    ("add_ List alpha", lambda xs, ys: torch._foreach_add_(xs, ys, alpha=-0.25)),
    ("add_ ScalarList", lambda xs, ys: torch._foreach_add_(xs, [0.5, -1.0, 2.0])),
    ("mul_ Tensor", lambda xs, ys: torch._foreach_mul_(xs, ys[0][0, 0])),
    ("addcmul_ Scalar", lambda xs, ys: torch._foreach_addcmul_(xs, ys, ys, value=0.2)),
    ("addcdiv_ ScalarList", lambda xs, ys: torch._foreach_addcdiv_(xs, ys, [y.abs() + 1 for y in ys],
                                                                   [0.1, 0.2, 0.3])),
    ("addcdiv_ Tensor", lambda xs, ys: torch._foreach_addcdiv_(xs, ys, [y.abs() + 1 for y in ys],
                                                               torch.tensor([0.1, -0.2, 0.3]))),
    ("lerp_ Scalar", lambda xs, ys: torch._foreach_lerp_(xs, ys, 0.1)),
    ("copy_", lambda xs, ys: torch._foreach_copy_(xs, ys)),
])
def test_in_place_foreach_ops_are_queued_without_fallbacks(name, op):
    host, device = _pair()
    others_host, others_device = _pair()
    others_host = [t * 2 + 1 for t in others_host]
    others_device = [t * 2 + 1 for t in others_device]
    before = observe.counter("eager_fallbacks")
    op(host, others_host)
    op(device, others_device)
    assert observe.counter("eager_fallbacks") == before, f"{name} fell back to the CPU"
    for h, d in zip(host, device):
        torch.testing.assert_close(d.cpu(), h)


def test_out_of_place_foreach_ops_return_device_tensors():
    host, device = _pair()
    results = torch._foreach_sqrt([t.abs() for t in device])
    assert all(r.device.type == "neuron" for r in results)
    for r, h in zip(results, torch._foreach_sqrt([t.abs() for t in host])):
        torch.testing.assert_close(r.cpu(), h)


@pytest.mark.parametrize("optimizer, kwargs", [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 0.01}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
])
def test_foreach_optimizers_match_the_cpu_without_fallbacks(optimizer, kwargs):
    torch.manual_seed(0)
    host = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    device = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    device.load_state_dict(host.state_dict())
    device = device.to("neuron")
    opt_host = optimizer(host.parameters(), foreach=True, **kwargs)
    opt_device = optimizer(device.parameters(), foreach=True, **kwargs)
    x = torch.randn(5, 8)
    before = observe.counter("eager_fallbacks")
    for _ in range(4):
        for model, opt, inputs in ((host, opt_host, x), (device, opt_device, x.to("neuron"))):
            opt.zero_grad()
            model(inputs).pow(2).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
    for h, d in zip(host.parameters(), device.parameters()):
        torch.testing.assert_close(d.cpu(), h, rtol=1e-4, atol=1e-5)
    assert observe.counter("eager_fallbacks") == before


def test_a_call_writing_a_host_tensor_runs_per_tensor_on_the_device():
    """host_kernels declines a list holding a host tensor; each element then runs as its per-tensor
    op (the neuron ones queued), with the CPU's values."""
    host, device = _pair(2)
    mixed = [device[0], host[1].clone()]
    torch._foreach_mul_(mixed, 3.0)
    torch.testing.assert_close(mixed[0].cpu(), host[0] * 3)
    torch.testing.assert_close(mixed[1], host[1] * 3)
