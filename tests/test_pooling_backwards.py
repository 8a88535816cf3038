"""Pooling backwards at training sizes: input gradients of ``torch.compile(backend="neuron")`` against
eager, and every graph compiled by iree-compile's first attempt.

Max pooling's backward was a scatter-add; IREE fused its elementwise producers into the scatter's
serial dispatch and put them on the stack, so a ResNet stem's backward (4x16x8x8 pooled) failed
with "exceeded stack allocation limit" until a fallback compile without aggressive fusion (three
compiles in all). It is now routed without a scatter (decompositions/max_pool_backward.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class _Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def test_resnet_stem_trains_as_in_eager_in_one_compile_per_graph(retries):
    """Conv, BatchNorm2d, ReLU, MaxPool2d(3, 2, 1), a residual block: one training step's loss,
    gradients and updated parameters as eager's."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), _Block(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    model = copy.deepcopy(eager)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    losses = []
    for net, run in ((eager, eager), (model, torch.compile(model, backend="neuron"))):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        loss = F.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0])
    for p, q in zip(eager.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    assert retries() == []


def _poolings(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    """Max pooling 1-d to 3-d (with and without indices, padding, dilation, ceil_mode), adaptive
    max pooling (windows that divide the input and windows that do not) and average pooling; each
    output through an elementwise op, whose gradient IREE fuses into the pooling's backward."""
    outs = [
        F.max_pool2d(a * 2 + 1, 3, 2, 1),
        F.max_pool2d(a, 3, 2, return_indices=True)[0],  # overlapping windows, no padding
        F.max_pool2d(a, (2, 3), stride=(2, 1), padding=(1, 1), dilation=(1, 2), ceil_mode=True, return_indices=True)[0],
        F.max_pool2d(a, 2),
        F.max_pool1d(a.flatten(-2), 5, stride=3, padding=2, dilation=2, ceil_mode=True),
        F.max_pool3d(b, 3, stride=2, padding=1, ceil_mode=True, return_indices=True)[0],
        F.max_pool3d(b, (2, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 1)),
        F.adaptive_max_pool2d(a, (7, 5)),
        F.adaptive_max_pool2d(a, 4, return_indices=True)[0],
        F.adaptive_max_pool1d(c, 6),
        F.adaptive_max_pool3d(b, (3, 4, 5)),
        F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        F.adaptive_avg_pool2d(a, (5, 3)),
        F.avg_pool3d(b, 3, stride=2, padding=1),
    ]
    return [o.sin() for o in outs]


def _some_poolings(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    """Max pooling 1-d to 3-d, adaptive max pooling and average pooling, within what eager's
    bfloat16 kernels have (no avg_pool3d) and what IREE compiles: its constant evaluation cannot
    build avg_pool2d's bfloat16 divisor table for ceil_mode or uncounted padding (undefined
    __truncsfbf2), and a float64 graph padding one input twice fails stream partitioning
    ("'stream.yield' op used resource not listed in explicit captures"), so each input is
    padded once here."""
    outs = [
        F.max_pool2d(a * 2 + 1, 3, 2, 1, return_indices=True)[0],
        F.max_pool2d(a, 3, 2),  # overlapping windows, no padding
        F.max_pool1d(c, 4, stride=3, padding=1, dilation=2, ceil_mode=True),
        F.max_pool3d(b, 3, stride=2, padding=1, return_indices=True)[0],
        F.adaptive_max_pool2d(a, (5, 3)),
        F.adaptive_max_pool3d(b, (2, 3, 4)),
        F.avg_pool2d(a, 3, 2),
    ]
    return [o.sin() for o in outs]


@pytest.mark.parametrize("dtype, shapes, fn", [
    (torch.float32, ((16, 32, 32, 32), (8, 32, 16, 16, 16), (32, 64, 30)), _poolings),
    pytest.param(torch.bfloat16, ((8, 32, 16, 16), (2, 16, 9, 8, 10), (8, 32, 17)), _some_poolings,
                 marks=pytest.mark.slow),  # about 20 s each on two cores; float32 covers every kind
    pytest.param(torch.float64, ((8, 32, 16, 16), (2, 16, 9, 8, 10), (8, 32, 17)), _some_poolings,
                 marks=pytest.mark.slow),
], ids=["float32", "bfloat16", "float64"])
def test_pooling_backwards_match_eager_at_training_sizes(retries, dtype, shapes, fn):
    """Every pooling's input gradient under random upstream weights, as eager's, each graph compiled once."""
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]
    weights = None
    grads = []
    for run in (fn, torch.compile(fn, backend="neuron")):
        leaves = [t.clone().requires_grad_() for t in inputs]
        outs = run(*leaves)
        if weights is None:
            weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype) for o in outs]
        grads.append(torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), leaves))
    # Eager's bfloat16 kernels add overlapping windows' gradients in bfloat16 (ours in float32).
    tolerance = {"atol": 6e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    for i, (got, expected) in enumerate(zip(grads[1], grads[0])):
        torch.testing.assert_close(got, expected, msg=lambda m, i=i: f"gradient of input {i}: {m}", **tolerance)
    assert retries() == []
