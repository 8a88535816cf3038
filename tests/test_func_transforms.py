"""torch.func's forward-mode transforms over eager neuron tensors, against the same on the CPU."""

from __future__ import annotations

import warnings

import torch
import torch.autograd.forward_ad as fwAD
from torch.func import jacfwd, jvp, linearize


def _f(a: torch.Tensor) -> torch.Tensor:
    return (a.sin() * a.T.sum()).cumsum(1)[:, 1:]


def test_forward_mode_products_on_the_device_match_the_cpu():
    """jvp, jacfwd and a dual of a view give the CPU's values without a CPU fallback."""
    torch.manual_seed(0)
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        _, got = jvp(_f, (x.to("neuron"),), (t.to("neuron"),))
        jacobian = jacfwd(_f)(x.to("neuron"))
        with fwAD.dual_level():
            dual = fwAD.make_dual(x.to("neuron")[:, 1:3], t.to("neuron")[:, 1:3])
            tangent = fwAD.unpack_dual(dual.exp()).tangent
    torch.testing.assert_close(got.cpu(), jvp(_f, (x,), (t,))[1])
    torch.testing.assert_close(jacobian.cpu(), jacfwd(_f)(x))
    torch.testing.assert_close(tangent.cpu(), x[:, 1:3].exp() * t[:, 1:3])


def test_linearize_of_neuron_primals_gives_the_jvp():
    """``linearize``'s ``jvp_fn`` returned zeros for neuron primals (its make_fx trace recorded the
    device's bookkeeping, not the ops)."""
    x = torch.linspace(0.1, 1.0, 7)
    out, jvp_fn = linearize(torch.sin, x.to("neuron"))
    torch.testing.assert_close(out.cpu(), x.sin())
    for tangent in (torch.ones(7), torch.arange(7.0)):
        torch.testing.assert_close(jvp_fn(tangent.to("neuron")).cpu(), x.cos() * tangent)
    cpu_out, cpu_jvp = linearize(torch.sin, x)  # CPU primals keep torch's own linearize
    torch.testing.assert_close(cpu_jvp(torch.ones(7)), x.cos())
