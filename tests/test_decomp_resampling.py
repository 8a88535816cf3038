"""Antialiased resizing (``decompositions/resampling.py``) through the compile path against eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from compare import forward_backward


def test_antialiased_resizing_forward_and_backward():
    """Bilinear and bicubic, down and up, by size and by scale factor, both corner alignments."""
    def fn(x):
        return [F.interpolate(x, mode=mode, antialias=True, align_corners=corners, **how)
                for mode in ("bilinear", "bicubic") for corners in (False, True)
                for how in ({"size": (7, 9)}, {"scale_factor": (0.5, 1.7)})]

    g = torch.Generator().manual_seed(0)
    expected, got, eager_grads, compiled_grads = forward_backward(fn, [torch.randn(2, 3, 17, 23, generator=g)], g)
    for got_t, expected_t in zip(got, expected, strict=True):
        torch.testing.assert_close(got_t, expected_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_grads, eager_grads, rtol=1e-5, atol=1e-5)
