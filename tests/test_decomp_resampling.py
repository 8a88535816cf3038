"""Antialiased resizing (``decompositions/resampling.py``) through the compile path against eager."""

from __future__ import annotations

import pytest
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


def test_plain_resizing_runs_on_the_eager_device_forward_and_backward():
    """``F.interpolate`` (bilinear, bicubic, nearest; sizes or scale factors) on neuron tensors:
    torch-mlir lowered neither the plain bilinear and bicubic kernels as the eager device traces
    them nor the backwards, so each ran on the CPU with a fallback warning."""
    import warnings

    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6)
    for kw in (dict(scale_factor=2, mode="bilinear"), dict(size=(7, 9), mode="bilinear", align_corners=True),
               dict(size=(3, 4), mode="bicubic"), dict(scale_factor=1.5, mode="bicubic", align_corners=True),
               dict(scale_factor=2, mode="nearest"), dict(size=(4, 11), mode="nearest")):
        expected = x.clone().requires_grad_()
        F.interpolate(expected, **kw).square().sum().backward()
        got = x.to("neuron").requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            out = F.interpolate(got, **kw)
            out.square().sum().backward()
        torch.testing.assert_close(out.cpu(), F.interpolate(x, **kw), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=1e-4, atol=1e-4)


def test_uint8_images_resize_compiled_and_eager_within_one_of_torch():
    """Antialiased uint8 resizing (torchvision's ``Resize`` of an image tensor) failed to lower
    ("failed to legalize ... _upsample_bilinear2d_aa"); a bicubic one that overshoots must clamp
    between its two passes, as torch's fixed-point kernel does (11 off otherwise)."""
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (1, 3, 40, 50), dtype=torch.uint8, generator=g)
    image[..., ::7, :] = 255  # edges that make bicubic lobes overshoot
    for mode in ("bilinear", "bicubic"):
        for size in ((20, 24), (80, 33)):
            def fn(x, mode=mode, size=size):
                return F.interpolate(x, size=size, mode=mode, antialias=True)
            expected = fn(image)
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="neuron")(image)
            eager = fn(image.to("neuron")).cpu()
            for got in (compiled, eager):
                assert got.dtype == torch.uint8 and got.shape == expected.shape
                assert (got.int() - expected.int()).abs().max() <= 1, (mode, size)


@pytest.mark.parametrize("shape, mode", [((1, 2, 3, 4, 5), "trilinear"), ((2, 3, 7), "linear")])
@pytest.mark.parametrize("align_corners", [False, True])
def test_linear_and_trilinear_resizing_run_on_the_device(shape, mode, align_corners):
    """The eager device traced ``upsample_trilinear3d`` and ``upsample_linear1d`` whole, which
    torch-mlir does not lower: they ran on the CPU. By scale and by size."""
    from torch_neuronx import observe

    x = torch.randn(*shape)
    before = observe.counter("eager_fallbacks")
    for kwargs in ({"scale_factor": 2}, {"size": tuple(s + 3 for s in shape[2:])}):
        got = F.interpolate(x.to("neuron"), mode=mode, align_corners=align_corners, **kwargs)
        want = F.interpolate(x, mode=mode, align_corners=align_corners, **kwargs)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    assert observe.counter("eager_fallbacks") == before
