"""Antialiased resizing (``decompositions/resampling.py``) through the compile path against eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def test_antialiased_resizing_forward_and_backward():
    """Bilinear and bicubic, down and up, by size and by scale factor, both corner alignments."""
    def fn(x):
        return [F.interpolate(x, mode=mode, antialias=True, align_corners=corners, **how)
                for mode in ("bilinear", "bicubic") for corners in (False, True)
                for how in ({"size": (7, 9)}, {"scale_factor": (0.5, 1.7)})]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 17, 23, generator=g)
    eager_in, compiled_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = fn(eager_in), torch.compile(fn, backend="neuron")(compiled_in)
    weights = [torch.randn(e.shape, generator=g) for e in expected]
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    sum((c * w).sum() for c, w in zip(got, weights)).backward()
    for got_t, expected_t in zip(got, expected, strict=True):
        torch.testing.assert_close(got_t, expected_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_in.grad, eager_in.grad, rtol=1e-5, atol=1e-5)
