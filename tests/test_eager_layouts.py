"""Eager results have torch's strides: an op of a transposed, permuted or channels-last tensor gives
its result in that memory order, as the CPU does (they were all row-major: ``(x.t() * 2).t().view(-1)``,
valid on the CPU, raised on neuron, and forward-mode AD refused tangents of transposed primals)."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import torch_neuronx  # noqa: F401  (registers the neuron device)

_MATRIX_OPS = {
    "add": lambda t: t.t() + 1,
    "mul": lambda t: t.t() * t.t(),
    "relu": lambda t: t.t().relu(),
    "gelu": lambda t: F.gelu(t.t()),
    "where": lambda t: torch.where(t.t() > 0, t.t(), 0.5),
    "clone": lambda t: t.t().clone(),
    "zeros_like": lambda t: torch.zeros_like(t.t()),
    "to_float64": lambda t: t.t().double(),
    "permuted_exp": lambda t: t.reshape(-1, 2, t.shape[1]).permute(2, 0, 1).exp(),
    "softmax": lambda t: t.t().softmax(-1),
    "cumsum": lambda t: t.t().cumsum(0),
    "clone_contiguous": lambda t: t.t().clone(memory_format=torch.contiguous_format),
    "sliced": lambda t: t[:, ::2] + 1,  # not dense: row-major, as on the CPU
}


@pytest.mark.parametrize("name", sorted(_MATRIX_OPS))
def test_results_have_the_cpus_strides_at_every_shape(name):
    """Three shapes: the first have kernels of their own, the third runs on the op's dynamic kernel."""
    op = _MATRIX_OPS[name]
    for rows, cols in ((4, 3), (6, 5), (8, 7)):
        x = torch.randn(rows, cols)
        expected, got = op(x), op(x.to("neuron"))
        assert got.stride() == expected.stride(), (name, rows, cols)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_empty_like_and_empty_keep_the_memory_format():
    x = torch.randn(5, 3)
    image = torch.randn(2, 3, 4, 5)
    assert torch.empty_like(x.t().to("neuron")).stride() == torch.empty_like(x.t()).stride()
    for made in (lambda d: torch.empty(2, 3, 4, 5, device=d, memory_format=torch.channels_last),
                 lambda d: torch.empty_like(image.to(d), memory_format=torch.channels_last),
                 lambda d: torch.empty_like(image.to(d).contiguous(memory_format=torch.channels_last))):
        assert made("neuron").stride() == made("cpu").stride()


def test_channels_last_stays_channels_last():
    image, weight = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3)
    for op in (lambda t: t.contiguous(memory_format=torch.channels_last),
               lambda t: t.to(memory_format=torch.channels_last),
               lambda t: t.contiguous(memory_format=torch.channels_last).relu(),
               lambda t: F.conv2d(t.contiguous(memory_format=torch.channels_last), weight.to(t.device), padding=1),
               lambda t: F.batch_norm(t.contiguous(memory_format=torch.channels_last), None, None, training=True)):
        expected, got = op(image), op(image.to("neuron"))
        assert got.is_contiguous(memory_format=torch.channels_last) and got.stride() == expected.stride()
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


def test_views_that_rely_on_the_layout_work():
    x = torch.randn(4, 6)
    y = (x.to("neuron").t() * 2).t()  # contiguous again, as on the CPU
    assert y.is_contiguous()
    torch.testing.assert_close(y.view(-1).cpu(), (x * 2).view(-1))
    heads = torch.randn(2, 5, 3, 4)  # (batch, tokens, heads, dim) -> heads first, scaled, back, merged
    scaled = heads.to("neuron").transpose(1, 2) * 0.5
    torch.testing.assert_close(scaled.transpose(1, 2).view(2, 5, 12).cpu(), (heads * 0.5).view(2, 5, 12))


def test_forward_ad_takes_tangents_of_transposed_primals():
    x = torch.randn(3, 4)

    def jvp_of(primal: torch.Tensor) -> torch.Tensor:
        with fwAD.dual_level():
            dual = fwAD.make_dual(primal, primal.cos())
            return fwAD.unpack_dual((dual.sin() * 2).exp()).tangent

    torch.testing.assert_close(jvp_of(x.to("neuron").t()).cpu(), jvp_of(x.t()), rtol=1e-5, atol=1e-5)


def test_one_ops_layouts_do_not_leak_into_each_other():
    """An op's dynamic kernel took the memory order of the first layout it met: channels-last and
    expanded inputs sort their dimensions alike, so ``expanded + 1`` came back channels-last
    after ``channels_last + 1`` (and a ``.view()`` valid on the CPU raised)."""
    for rows in (3, 4, 5, 6):
        image = torch.randn(2, 3, rows, 5).contiguous(memory_format=torch.channels_last)
        expanded = torch.randn(2, 1, rows, 5).expand(2, 3, rows, 5)
        for x in (image, expanded, image):
            got, expected = x.to("neuron") + 1, x + 1
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got.cpu(), expected)


def test_a_batch_of_one_keeps_its_permuted_layout():
    """A dimension of size 1 with the stride of another (a batch of one, permuted for a Conv1d)
    made the layout ambiguous, and the result was row-major: permuting back and ``.view(-1)``
    raised where the CPU's result allows it."""
    for steps in (5, 7, 9):
        x = torch.randn(steps, 1, 3)
        h = F.gelu(x.to("neuron").permute(1, 2, 0))
        torch.testing.assert_close(h.permute(2, 0, 1).view(-1).cpu(), F.gelu(x).view(-1))


def test_ops_whose_decomposition_lays_out_otherwise_follow_torch():
    """``max_pool2d`` of a channels-last tensor and a convolution of a channels-last weight kept
    their decomposition's row-major layout; they now have the CPU's (the results are copied)."""
    for rows in (8, 6):
        image = torch.randn(2, 3, rows, 8).contiguous(memory_format=torch.channels_last)
        weight = torch.randn(4, 3, 3, 3).contiguous(memory_format=torch.channels_last)
        for op in (lambda t, w: F.max_pool2d(t, 2), lambda t, w: F.conv2d(t.contiguous(), w)):
            got, expected = op(image.to("neuron"), weight.to("neuron")), op(image, weight)
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_with_runtime_scalars_follow_torchs_layout(dtype):
    """Ops whose numbers are runtime inputs (``addcmul``'s value, ``lerp``'s weight) are traced as
    their rewrite, which laid an expanded-and-transposed result out row-major where torch's kernel
    lays it out column-major (``r.t().view(-1)`` raised on neuron only): torch's layout now, found
    from the op itself with numbers in place of the runtime scalars. The reference is torch's meta
    kernel, an accelerator's layout (torch's CPU kernel differs from it for some float16 and
    bfloat16 ops: a bfloat16 mul of these operands is column-major on the CPU, row-major on meta)."""
    a, m = torch.randn(8).to(dtype), torch.randn(8, 8).to(dtype)
    ops = {
        "addcmul": lambda a, m: torch.addcmul(a.expand(8, 8), a.expand(8, 8), m.t(), value=0.5),
        "addcdiv": lambda a, m: torch.addcdiv(a.expand(8, 8), a.expand(8, 8), m.t().abs() + 1, value=0.5),
        "lerp": lambda a, m: torch.lerp(a.expand(8, 8), m.t(), 0.3),
    }
    for name, op in ops.items():
        meta = op(torch.empty(8, dtype=dtype, device="meta"), torch.empty(8, 8, dtype=dtype, device="meta"))
        for _ in range(2):  # the first call, and the kernel's next (its launch plan)
            got = op(a.to("neuron"), m.to("neuron"))
            assert got.stride() == meta.stride() == (1, 8), (name, got.stride(), meta.stride())
            torch.testing.assert_close(got.t().reshape(-1).cpu(), op(a, m).t().reshape(-1), rtol=1e-2, atol=1e-2)
