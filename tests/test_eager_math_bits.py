"""Conjugate and negative views on the eager device: every way an op meets them gives the CPU's values.

``x.conj()``, ``x.conj().imag`` and ``torch._neg_view(x)`` share ``x``'s memory and carry a bit
saying the values are the conjugate (negation) of the memory's. Before, the wrapper lost the bit:
``_neg_view(x) + 1`` computed ``x + 1`` and ``x.conj().resolve_conj()`` raised.
"""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401

torch.manual_seed(0)
_C = torch.randn(4, 4, dtype=torch.complex64)
_D = torch.randn(4, 4, dtype=torch.complex64)
_R = torch.randn(4, 4)
_S = torch.randn(4, 4)

# Each case: a function of fresh tensors (complex c, d; real r, s) returning a tensor; what it
# writes into its arguments is compared too.
CASES = {
    # conjugate views read by ops torch resolves above the backend
    "conj_mul": lambda c, d: c.conj() * d,
    "conj_add_scalar": lambda c: c.conj() + 1.0,
    "conj_abs": lambda c: c.conj().angle(),
    # ... and by ops torch hands the bit (mm, clone, dot, resolve_conj)
    "conj_mm": lambda c, d: c.conj() @ d,
    "conj_t_mm": lambda c, d: c.conj().t() @ d,
    "conj_clone": lambda c: c.conj().clone(),
    "conj_resolve_view_as_real": lambda c: torch.view_as_real(c.conj().resolve_conj()),
    "conj_vdot": lambda c, d: torch.vdot(c[0], d[0].conj()),
    "conj_addmm": lambda c, d: torch.addmm(d, c.conj(), d),
    "conj_twice": lambda c: c.conj().conj() * 2,
    # writes through a conjugate view land conjugated in the base
    "conj_mul_": lambda c: c.conj().mul_(2j),
    "conj_copy_": lambda c, d: c.conj().copy_(d),
    "conj_addmm_": lambda c, d: c.conj().addmm_(d, d),
    # the imaginary part of a conjugate view is a negative view
    "conj_imag": lambda c: c.conj().imag * 3,
    "conj_imag_mm": lambda c: c.conj().imag @ c.real,
    # negative views of real tensors
    "neg_add": lambda r: torch._neg_view(r) + 1.0,
    "neg_clone": lambda r: torch._neg_view(r).clone(),
    "neg_mm": lambda r, s: torch._neg_view(r) @ s,
    "neg_bmm": lambda r, s: torch.bmm(torch._neg_view(r)[None], s[None]),
    "neg_dot": lambda r, s: torch.dot(torch._neg_view(r)[0], s[0]),
    "neg_repeat_interleave": lambda r: torch._neg_view(r).repeat_interleave(2, dim=0),
    "neg_resolve": lambda r: torch._neg_view(r).resolve_neg(),
    "neg_add_": lambda r, s: torch._neg_view(r).add_(s),
    "neg_copy_": lambda r, s: torch._neg_view(r).copy_(s),
    "neg_to_cpu": lambda r: torch._neg_view(r).to("cpu"),
    "neg_sum": lambda r: torch._neg_view(r).sum(0),
}
_INPUTS = {"c": _C, "d": _D, "r": _R, "s": _S}


def _run(fn, device: str) -> tuple:
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    inputs = [_INPUTS[n].clone().to(device) for n in names]
    out = fn(*inputs)
    return out.cpu(), [t.cpu() for t in inputs]


@pytest.mark.parametrize("name", CASES)
def test_conjugate_and_negative_views_give_the_cpus_values(name: str) -> None:
    fn = CASES[name]
    expected, expected_inputs = _run(fn, "cpu")
    for _ in range(2):  # the second call takes the launch plans the first left
        got, got_inputs = _run(fn, "neuron")
        torch.testing.assert_close(got, expected)
        for g, e in zip(got_inputs, expected_inputs):
            torch.testing.assert_close(g, e)


def test_views_carry_their_inner_tensors_bits() -> None:
    c = _C.to("neuron")
    assert c.conj().is_conj() and not c.conj().conj().is_conj()
    assert c.conj().imag.is_neg()
    assert torch._neg_view(_R.to("neuron")).is_neg()
    assert not c.conj().resolve_conj().is_conj()
