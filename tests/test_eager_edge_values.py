"""Ordinary ops at inputs test suites forget (found by a sweep of the eager device against the CPU)."""

from __future__ import annotations

import re

import pytest
import torch


def _both(fn, *tensors):
    """``fn`` on the CPU and on the eager device (result brought back)."""
    return fn(*tensors), fn(*(t.to("neuron") for t in tensors)).cpu()


def test_the_angle_of_complex_zeros_and_infinities():
    """``angle(0j)`` was NaN (IREE's atan2), so every zero bin of a spectrum's phase was NaN."""
    inf, nan = float("inf"), float("nan")
    z = torch.tensor([0j, complex(-0.0, 0.0), complex(0.0, -0.0), complex(-0.0, -0.0), 1 + 1j,
                      complex(inf, inf), complex(-inf, inf), complex(-inf, -inf), complex(nan, 0.0), -2 + 0j],
                     dtype=torch.complex64)
    expected, got = _both(torch.angle, z)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert torch.equal(got.signbit(), expected.signbit())


@pytest.mark.parametrize("reduce", [torch.all, torch.any])
def test_all_and_any_over_no_dims_are_elementwise(reduce):
    """``dim=()`` reduces over no dims (torch 2.13): it reduced over every dim."""
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, float("nan"), -0.5]])
    expected, got = _both(lambda t: reduce(t, dim=()), x)
    assert got.shape == expected.shape and torch.equal(got, expected)
    expected, got = _both(lambda t: reduce(t, dim=(0, 1)), x)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("op", [torch.atan2, torch.hypot])
def test_a_zero_dim_tensor_of_a_wider_float_does_not_widen_the_result(op):
    """``atan2(float32, 0-d float64)`` was float64 (the dtypes were promoted after broadcasting)."""
    for dtype, wide in ((torch.float32, torch.float64), (torch.bfloat16, torch.float32)):
        x, s = torch.tensor([0.5, -1.5, 2.0], dtype=dtype), torch.tensor(2.0, dtype=wide)
        expected, got = _both(op, x, s)
        assert got.dtype == expected.dtype == dtype
        torch.testing.assert_close(got, expected)


def test_long_cumulative_sums_accumulate_as_torch_does():
    """float32 running sums drifted (100000 times 0.1 came to 9998.56; torch accumulates in
    float64: 10000.0); float16 and bfloat16 accumulate in float32, rounded once."""
    x = torch.full((100000,), 0.1)
    expected, got = _both(lambda t: t.cumsum(0), x)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        y = torch.randn(2, 3000).to(dtype)
        expected, got = _both(lambda t: t.cumsum(1), y)
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    compiled = torch.compile(lambda t: t.cumsum(0), backend="neuron")
    torch.testing.assert_close(compiled(x), x.cumsum(0), rtol=1e-6, atol=0)


def test_indices_into_a_dimension_of_size_zero_raise_as_on_the_cpu():
    """Any index is out of bounds in a dimension of size 0: the write into an empty tensor passed
    silently (its empty result was folded to a constant); ``index_add`` checks nothing there in
    torch either."""
    index = torch.tensor([0, 0])
    cases = [
        (IndexError, lambda e, i: e.index_put((i,), torch.ones(4, device=e.device))),
        (IndexError, lambda e, i: e.index_put((i,), torch.ones(4, device=e.device), accumulate=True)),
        (IndexError, lambda e, i: e.reshape(4, 0).index_put_((torch.arange(4, device=e.device)[:, None], i),
                                                             torch.tensor(1.0, device=e.device))),
        (RuntimeError, lambda e, i: e.reshape(0, 4).scatter_add(0, i.reshape(1, 2),
                                                                torch.ones(1, 2, device=e.device))),
    ]
    for error, op in cases:
        with pytest.raises(error):
            op(torch.empty(0, 4), index)
        with pytest.raises(error, match="out of bounds for dimension"):
            op(torch.empty(0, 4, device="neuron"), index.to("neuron")).cpu()
    added = torch.empty(0, 4, device="neuron").index_add(0, index.to("neuron"), torch.ones(2, 4, device="neuron"))
    assert added.shape == (0, 4)


def test_ops_torch_refuses_for_bool_tensors_are_refused():
    """argmax, argmin, median, nanmedian and kthvalue of a bool tensor computed where torch raises."""
    mask = torch.tensor([True, False, True])
    for op in (torch.argmax, torch.argmin, torch.median, torch.nanmedian, lambda t: torch.kthvalue(t, 1),
               lambda t: torch.median(t, 0), lambda t: torch.argmax(t, 0)):
        with pytest.raises(RuntimeError) as expected:
            op(mask)
        with pytest.raises(RuntimeError, match=re.escape(str(expected.value))):
            op(mask.to("neuron"))
    assert torch.argmax(mask.to("neuron").to(torch.uint8)).item() == 0  # the usual spelling still works


_COMPARISONS = (torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne)


@pytest.mark.parametrize("pair", [(torch.uint8, torch.int8), (torch.int16, torch.uint8), (torch.uint8, torch.bool)],
                         ids=lambda p: f"{p[0]}-{p[1]}".replace("torch.", ""))
def test_comparisons_of_two_integer_types_compare_in_the_promoted_type(pair):
    """torch-mlir compared uint8 with int8 as signed bytes: ``uint8(255) < int8(127)`` was True
    (torch compares in int16), on the device and compiled."""
    first, second = pair
    a = torch.tensor([200, 255, 128, 5, 0], dtype=torch.int64).to(first)
    b = torch.tensor([-100, 127, -1, 5, 1], dtype=torch.int64).to(second)
    expected = [op(a, b) for op in _COMPARISONS]
    on_device = [op(a.to("neuron"), b.to("neuron")).cpu() for op in _COMPARISONS]
    compiled = torch.compile(lambda x, y: [op(x, y) for op in _COMPARISONS], backend="neuron")(a, b)
    for want, eager, graph in zip(expected, on_device, compiled, strict=True):
        assert torch.equal(eager, want) and torch.equal(graph, want), (want, eager, graph)


@pytest.mark.parametrize("op", [torch.reciprocal, torch.erf, lambda t: 1 / t], ids=["reciprocal", "erf", "one_over"])
def test_float_functions_of_integer_tensors_compile(op):
    """torch-mlir legalizes ``reciprocal`` and ``erf`` of floats only: ``1 / n`` of an int64 tensor
    (SWA's ``AveragedModel`` weight) failed to compile, and ran on the CPU with a warning on the device."""
    import warnings

    n = torch.tensor([2, 3, 6, -1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs on the CPU" fallback
        on_device = op(n.to("neuron")).cpu()
    compiled = torch.compile(op, backend="neuron")(n)
    torch.testing.assert_close(on_device, op(n))
    torch.testing.assert_close(compiled, op(n))


def test_sparse_embedding_gradients_are_a_clear_error():
    """``nn.Embedding(sparse=True)``: its forward computes on the device (the flag concerns the
    gradient), its sparse gradient is refused naming the remedy (it was torch's raw "Could not
    run ... from the 'Sparseneuron' backend")."""
    import warnings

    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    ids = torch.tensor([1, 2, 1])
    on_device = torch.nn.Embedding(10, 3, sparse=True).to("neuron")
    on_device.load_state_dict(embedding.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs on the CPU" fallback
        out = on_device(ids.to("neuron"))
    torch.testing.assert_close(out.cpu(), embedding(ids))
    with pytest.raises(NotImplementedError, match="dense tensors only.*sparse=False"):
        out.sum().backward()


def test_rounding_integers_to_decimals_is_torchs_error():
    """torch's CPU kernel has no ``round(decimals=d)`` for integers; here ``round(ints,
    decimals=-1)`` returned the integers unchanged (where 20 might have been expected)."""
    x = torch.tensor([15, -25], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="not implemented for 'Int'"):
        torch.round(x, decimals=-1)
    with pytest.raises(NotImplementedError, match="not implemented for 'Int'"):
        torch.round(x.to("neuron"), decimals=-1).cpu()
    assert torch.equal(torch.round(x.to("neuron")).cpu(), x)  # without decimals: the integers


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rounding_floats_to_decimals_matches_the_cpu_kernel(dtype):
    """torch's kernel scales in float32 for float16 and bfloat16 (scaled in float16,
    ``round(1000.25, decimals=2)`` was inf) and divides by the power of ten for negative decimals."""
    torch.manual_seed(0)
    x = (torch.randn(3000) * torch.logspace(-3, 4, 3000)).to(dtype)
    x[:4] = torch.tensor([1000.25, 700.125, 60000.0, 0.35]).to(dtype)

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.round(t, decimals=d) for d in (-2, -1, 1, 2, 3)])

    expected = rounded(x)
    assert torch.equal(rounded(x.to("neuron")).cpu(), expected)
    assert torch.equal(torch.compile(rounded, backend="neuron")(x), expected)


def test_integer_clamps_convert_their_bounds_as_torch():
    """An int bound out of the tensor's range is torch's overflow error (compiled, a uint8 tensor
    clamped to 300 came back wrapped), a negative bound of an unsigned tensor wraps as torch's
    conversion does (``clamp(uint8, min=-1)`` is 255 everywhere)."""
    x = torch.tensor([0, 5, 44, 250], dtype=torch.uint8)
    fine = [lambda t: t.clamp(-1, 100), lambda t: t.clamp_min(-3), lambda t: t.clamp(-200, 100),
            lambda t: t.clamp_max(200), lambda t: t.to(torch.int8).clamp(-128, 50)]
    for fn in fine:
        assert torch.equal(torch.compile(fn, backend="neuron")(x), fn(x))
        assert torch.equal(fn(x.to("neuron")).cpu(), fn(x))
    for fn in (lambda t: t.clamp(0, 300), lambda t: t.to(torch.int8).clamp_min(-200)):
        with pytest.raises(RuntimeError, match="without overflow"):
            fn(x)
        with pytest.raises(Exception, match="value cannot be converted to type u?int8_t without overflow"):
            torch.compile(fn, backend="neuron")(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_atan2_at_infinities_and_underflowing_ratios_keeps_ys_sign(dtype):
    """``atan2(-1, -inf)`` and ``atan2(-1, -3e38)`` were +pi (torch -pi): IREE's approximation lost
    y's sign where y / x underflows; infinite y over finite x is +-pi/2."""
    import itertools

    values = [0.0, -0.0, 1.0, -1.0, 2.5, -3e38, 3e38, float("inf"), -float("inf"), float("nan")]
    pairs = torch.tensor(list(itertools.product(values, values))).to(dtype)
    y, x = pairs[:, 0], pairs[:, 1]
    expected = torch.atan2(y, x)
    for got in (torch.compile(torch.atan2, backend="neuron")(y, x), torch.atan2(y.to("neuron"), x.to("neuron")).cpu()):
        torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-3, atol=1e-6)
        assert torch.equal(got.signbit() | expected.isnan(), expected.signbit() | expected.isnan())


def test_copysign_of_integers_converts_them_first():
    """``copysign(INT_MIN, 1)`` was negative (the magnitude overflowed in the integers); bools ran
    on the CPU."""
    from torch_neuronx import metrics

    cases = [(torch.tensor([torch.iinfo(dt).min, -5, 5, 0], dtype=dt), torch.tensor([1, 1, -1, -1], dtype=dt))
             for dt in (torch.int32, torch.int64)]
    cases.append((torch.tensor([True, False, True]), torch.tensor([False, True, True])))
    before = metrics.counter("eager_fallbacks")
    for a, b in cases:
        expected = torch.copysign(a, b)
        assert torch.equal(torch.compile(torch.copysign, backend="neuron")(a, b), expected)
        assert torch.equal(torch.copysign(a.to("neuron"), b.to("neuron")).cpu(), expected)
    assert metrics.counter("eager_fallbacks") == before


def test_equal_computes_on_the_device():
    """``torch.equal`` ran on the CPU with a fallback warning (training code checks with it)."""
    import warnings

    a = torch.tensor([1.0, 2.0, float("nan")])
    cases = [(a[:2], a[:2].clone()), (a[:2], torch.tensor([1, 2])), (a[:2], a[:1]), (a, a.clone()),
             (a[:2], torch.tensor([1.0, 2.5])), (torch.zeros(0), torch.zeros(0))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for x, y in cases:
            assert torch.equal(x.to("neuron"), y.to("neuron")) == torch.equal(x, y), (x, y)
    with pytest.raises(RuntimeError, match="same device"):
        torch.equal(a.to("neuron"), a)


@pytest.mark.parametrize("mode", [torch.enable_grad, torch.inference_mode], ids=["grad", "inference_mode"])
def test_host_reads_compute_on_the_device_in_every_mode(mode):
    """``torch.allclose`` ran on the CPU with a fallback warning; in inference mode ``bool(t)``
    (``is_nonzero``, a composite that decomposes above autograd otherwise) fell back too, once per
    token of a transformers ``generate()``. Both read their answer on the host as the CPU's."""
    import warnings

    a = torch.tensor([1.0, 0.0, float("nan")])
    with warnings.catch_warnings(), mode():
        warnings.simplefilter("error")
        n = a.to("neuron")
        for kwargs in ({}, {"equal_nan": True}, {"rtol": 0.0, "atol": 1e-6}):
            assert torch.allclose(n, n + 1e-9, **kwargs) == torch.allclose(a, a + 1e-9, **kwargs)
        assert torch.allclose(n[:2], torch.zeros(1, device="neuron")) is False
        assert bool(n[0] == 1) is True and bool(n[1]) is False and bool(n.isnan().any()) is True
        for bad in (n, n[:0]):
            with pytest.raises(RuntimeError, match="ambiguous"):
                bool(bad)
        with pytest.raises(RuntimeError, match="Float did not match Double"):
            torch.allclose(n, n.double())


def test_dtype_queries_compile_no_kernel():
    """``result_type`` answers from dtypes: the backward of ``pow(x, 3.0)`` compiled a kernel for it,
    one per shape of ``x`` (never a dynamic one: GPT-2's gelu_new paid it for each new length)."""
    from torch_neuronx import metrics

    def kernels_made():
        return metrics.counter("eager_ops_compiled") + metrics.counter("eager_hlo_cache_hits")

    aten = torch.ops.aten
    for shape in ((3,), (2, 5), ()):
        x = torch.ones(shape, device="neuron")
        i = torch.ones(shape, dtype=torch.int64, device="neuron")
        d = x.double()
        before = kernels_made()
        with torch.inference_mode():  # below autograd, as the backward's formulas call it (above, it decomposes)
            got = [aten.result_type.Scalar(x, 3.0), aten.result_type.Scalar(i, 2.5), aten.result_type.Tensor(i, d),
                   aten.result_type.Scalar_Tensor(2, i)]
        assert kernels_made() == before
        x, i, d = x.cpu(), i.cpu(), d.cpu()
        assert got == [aten.result_type.Scalar(x, 3.0), aten.result_type.Scalar(i, 2.5), aten.result_type.Tensor(i, d),
                       aten.result_type.Scalar_Tensor(2, i)]
