"""Ops that reached torch-mlir whole and failed to lower (OpInfo's sweep found them), against eager:
0-d selections (median, nanmedian, kthvalue along dim 0), ``scatter``'s legacy ``reduce=``,
``as_strided_scatter``, ``unfold`` of a 0-d tensor, ``addmv``, ``dist``, real ``angle``,
``_batch_norm_with_update`` and the grid samplers called directly. A few graphs, many cases each."""

from __future__ import annotations

import pytest
import torch

_G = torch.Generator().manual_seed(0)


def _check(fn, *args, mutated=(), **tolerance):
    """``fn`` compiled against eager; inputs other than the ``mutated`` positions must be left alone."""
    expected = fn(*[a.clone() for a in args])
    inputs = [a.clone() for a in args]
    got = torch.compile(fn, backend="neuron")(*inputs)
    for i, (a, original) in enumerate(zip(inputs, args, strict=True)):
        if i not in mutated:
            torch.testing.assert_close(a, original, rtol=0, atol=0, equal_nan=True, msg=f"input {i} was written to")
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(g, e, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}", **tolerance)


def _selections_scatters_views(s, x, index, src, base, base_t, one):
    return [
        *torch.median(s, 0), *torch.median(s, 0, keepdim=True), *torch.nanmedian(s, -1), *torch.kthvalue(s, 1, 0),
        x.scatter(0, index, src, reduce="add"),
        x.scatter(1, index[:, :3], src[:, :3], reduce="multiply"),
        x.scatter(0, index, 2.5, reduce="multiply"),
        torch.as_strided_scatter(base, src[:2, :2], (2, 2), (1, 3), 1),
        torch.as_strided_scatter(base_t.t(), src[:2, :3], (2, 3), (4, 1), 2),  # a transposed input's storage order
        torch.as_strided_scatter(one, s, (), (), 0),
        s.unfold(0, 1, 1), s.unfold(0, 0, 2), torch.ops.aten.unfold_copy(s, 0, 1, 3), x.unfold(1, 2, 2),
    ]


def test_selections_of_scalars_legacy_scatter_reduce_and_strided_scatter_match_eager():
    x = torch.randn(10, 5, generator=_G)
    index = torch.randint(0, 10, (5, 5), generator=_G)
    index[:, :3] %= 5
    _check(_selections_scatters_views, torch.tensor(3.5), x, index, torch.randn(5, 5, generator=_G),
           torch.randn(4, 3, generator=_G), torch.randn(3, 4, generator=_G), torch.randn(1, generator=_G))


def _value_scatters(s, x, index, src, one):
    return [x.scatter(0, index, 2.5, reduce="multiply"), x.scatter(1, index[:, :3] % 5, src[:, :3], reduce="multiply"),
            x.scatter(0, index, -1.0, reduce="add"), torch.as_strided_scatter(one, s, (), (), 0)]


def test_two_value_scatters_on_one_index_next_to_another_op_match_eager():
    """An adding scatter of a flattened input wrote into the input's own buffer (IREE elided its
    copy behind the barrier our aliasing fixup put on the reshape), before a multiplying scatter
    of the same input read it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 5, generator=g)
    index = torch.randint(0, 10, (5, 5), generator=g)
    _check(_value_scatters, torch.tensor(3.5), x, index, torch.randn(5, 5, generator=g), torch.randn(1, generator=g))


def _math(v, m, vec, a, b, ints, x, weight, bias, mean, var):
    out = torch.ops.aten._batch_norm_with_update(x, weight, bias, mean, var, 0.1, 1e-5)
    return [
        torch.addmv(v, m, vec), torch.addmv(v, m, vec, beta=0.5, alpha=-2),
        torch.dist(a, b), torch.dist(a, b, 3), torch.dist(a, b, float("inf")), torch.dist(a, b, 0),
        torch.angle(v), torch.angle(ints),
        *out, mean, var,  # an empty uint8 reserve; running statistics updated in place, as eager does
    ]


def test_addmv_dist_angle_and_batch_norm_with_update_match_eager():
    special = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), float("-inf")])
    _check(_math, special, torch.randn(6, 3, generator=_G), torch.randn(3, generator=_G),
           torch.randn(4, 3, generator=_G), torch.randn(3, generator=_G), torch.tensor([-2, 0, 5]),
           torch.randn(4, 3, 5, generator=_G), torch.randn(3, generator=_G), torch.randn(3, generator=_G),
           torch.zeros(3), torch.ones(3), mutated=(9, 10), rtol=1e-4, atol=1e-5)


def _samplers(x2, g2, x3, g3):
    return [torch.grid_sampler_2d(x2, g2, mode, padding, corners)
            for mode, padding, corners in ((0, 0, False), (1, 1, True), (2, 2, False))] + \
           [torch.grid_sampler_3d(x3, g3, mode, padding, corners)
            for mode, padding, corners in ((0, 2, True), (1, 0, False))]


def test_grid_samplers_called_directly_match_eager():
    _check(_samplers, torch.randn(2, 3, 5, 6, generator=_G), torch.rand(2, 4, 3, 2, generator=_G) * 2.4 - 1.2,
           torch.randn(2, 3, 4, 5, 6, generator=_G), torch.rand(2, 2, 4, 3, 3, generator=_G) * 2.4 - 1.2,
           rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_addbmm_with_scales_and_a_zero_beta_matches_eager(dtype):
    """torch-mlir's own addbmm failed to lower bfloat16; a zero ``beta`` ignores ``self``'s NaNs."""
    torch.manual_seed(0)
    x, b1, b2 = torch.randn(5, 10), torch.randn(3, 5, 4), torch.randn(3, 4, 10)
    x[0, 0] = float("nan")
    x, b1, b2 = x.to(dtype), b1.to(dtype), b2.to(dtype)

    def f(x, b1, b2):
        return (torch.addbmm(x, b1, b2), torch.addbmm(x, b1, b2, beta=0.0, alpha=2.0),
                torch.addbmm(x[0], b1, b2, beta=0.5), torch.addbmm(x[:1, :1], b1, b2, beta=0.0))

    tolerance = {"atol": 0.05, "rtol": 0.02} if dtype == torch.bfloat16 else {}
    for got, expected in zip(torch.compile(f, backend="neuron")(x, b1, b2), f(x, b1, b2)):
        torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)
    for got, expected in zip(f(x.to("neuron"), b1.to("neuron"), b2.to("neuron")), f(x, b1, b2)):
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True, **tolerance)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8])
def test_integer_addmm_and_addbmm_compile_and_run_on_the_device(dtype):
    """torch-mlir's lowering of integer ``addmm``/``addbmm`` did not legalize ("torch.constant.int"):
    compiled graphs failed and the eager device fell back to the CPU."""
    import warnings

    b, x, w = (torch.randint(0, 60, shape, generator=_G).to(dtype) for shape in ((16,), (8, 24), (24, 16)))

    def f(b, x, w):
        batched = (x.unsqueeze(0).expand(3, 8, 24), w.unsqueeze(0).expand(3, 24, 16))
        return (torch.addmm(b, x, w), torch.addmm(b, x, w, beta=3, alpha=2), torch.addmm(b, x, w, beta=0),
                torch.addbmm(b, *batched), torch.addbmm(b, *batched, beta=2, alpha=5))

    expected = f(b, x, w)
    for got, want in zip(torch.compile(f, backend="neuron")(b, x, w), expected, strict=True):
        assert torch.equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        on_device = f(b.to("neuron"), x.to("neuron"), w.to("neuron"))
    for got, want in zip(on_device, expected, strict=True):
        assert torch.equal(got.cpu(), want)


def test_addmm_with_zero_beta_ignores_its_input_nans_included():
    """torch documents that ``input`` is ignored when beta=0 (``addmm(torch.empty(...), a, b, beta=0)``):
    lowered whole, 0 * NaN gave NaN (eager device and compiled; ``addmm_`` through it)."""
    x = torch.tensor([[float("nan"), float("inf")], [1.0, -float("inf")]])
    a, b = torch.randn(2, 3), torch.randn(3, 2)

    def products(x, a, b):
        return torch.addmm(x, a, b, beta=0), torch.addmm(x, a, b, beta=0, alpha=2.5), torch.addmm(x[:1], a, b, beta=0)

    want = products(x, a, b)
    for got in (products(x.to("neuron"), a.to("neuron"), b.to("neuron")),
                torch.compile(products, backend="neuron")(x, a, b)):
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w)
    inplace = x.clone().to("neuron").addmm_(a.to("neuron"), b.to("neuron"), beta=0)
    torch.testing.assert_close(inplace.cpu(), want[0])


def test_uint8_fills_run_on_the_device_and_compile():
    """``zero_``, ``fill_`` and ``*_like`` fills of uint8 tensors: torch-mlir made a uint8 literal,
    which does not lower, so each fell back to the CPU on the eager device (with a warning)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        x = torch.ones(3, dtype=torch.uint8, device="neuron")
        assert x.zero_().tolist() == [0, 0, 0]
        assert x.fill_(-1).tolist() == [255, 255, 255]
        assert x.fill_(7).tolist() == [7, 7, 7]
        assert torch.zeros_like(x).tolist() == [0, 0, 0] and torch.full_like(x, 200).tolist() == [200] * 3
    fills = torch.compile(lambda a: (a.fill_(250) + 1, torch.zeros_like(a), torch.full_like(a, 255)), backend="neuron")
    got = fills(torch.zeros(2, dtype=torch.uint8))
    assert [t.tolist() for t in got] == [[251, 251], [0, 0], [255, 255]]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_shifts_by_the_width_or_more_match_torchs_kernel(dtype):
    """``x >> 31`` of int32 flipped signs (2**31 wrapped to INT_MIN as the divisor), ``x >> 32``
    divided by zero, ``uint8 << 70`` gave 192: shifts past the width give the sign (right, signed)
    or 0, as torch's CPU kernel does; eager and compiled, tensor and scalar shifts."""
    import warnings

    info, width = torch.iinfo(dtype), torch.iinfo(dtype).bits
    a = torch.tensor([5, info.min, info.max, 0, 1, 3, -7 if dtype.is_signed else 200], dtype=dtype)
    shifts = torch.tensor([s for s in (-1, 0, 1, width - 2, width - 1, width, width + 3, 2 * width + 6)
                           if s >= 0 or dtype.is_signed], dtype=dtype)
    a, shifts = a[:, None].expand(-1, len(shifts)).contiguous(), shifts[None, :].expand(len(a), -1).contiguous()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CPU fallback
        for fn in (lambda x, y: x >> y, lambda x, y: x << y):
            expected = fn(a, shifts)
            assert torch.equal(fn(a.to("neuron"), shifts.to("neuron")).cpu(), expected)
            torch._dynamo.reset()
            assert torch.equal(torch.compile(fn, backend="neuron", dynamic=False)(a, shifts), expected)
            for shift in (width - 1, width + 5):
                assert torch.equal(fn(a.to("neuron"), shift).cpu(), fn(a, shift))
            for number in (1, 3):  # a number shifted by a tensor (a bit mask: ``1 << bit``) failed to lower
                expected = fn(number, shifts)
                assert torch.equal(fn(number, shifts.to("neuron")).cpu(), expected)
                assert torch.equal(torch.compile(fn, backend="neuron", dynamic=False)(number, shifts), expected)


@pytest.mark.parametrize("shrink", ["hardshrink", "softshrink"])
def test_shrink_backwards_run_on_the_device_and_compile(shrink):
    """hardshrink's and softshrink's backwards had no lowering: the eager device ran them on the
    CPU (a warning per call site)."""
    from torch_neuronx import observe

    fn = getattr(torch.nn.functional, shrink)
    x = torch.tensor([-2.0, -0.5, -0.3, 0.0, 0.3, 0.5, 0.7, 3.0])
    reference = x.clone().requires_grad_()
    want = torch.autograd.grad(fn(reference, 0.5).mul(torch.arange(8.0)).sum(), [reference])[0]
    before = observe.counter("eager_fallbacks")
    leaf = x.to("neuron").requires_grad_()
    fn(leaf, 0.5).mul(torch.arange(8.0, device="neuron")).sum().backward()
    assert observe.counter("eager_fallbacks") == before
    torch.testing.assert_close(leaf.grad.cpu(), want)
    compiled_leaf = x.clone().requires_grad_()
    torch.compile(lambda t: fn(t, 0.5).mul(torch.arange(8.0)).sum(), backend="neuron")(compiled_leaf).backward()
    torch.testing.assert_close(compiled_leaf.grad, want)
