"""Ops that write into neuron tensors with no functional form: ``out=`` variants and ``resize_``.

``torch.arange(3, device="neuron")`` is ``arange.out`` into an empty tensor; it used to return a
tensor of shape ``(0,)`` whose inner tensor held the three values in host memory the device did
not own (and ``torch.eye``, ``torch.add(..., out=torch.empty(0, ...))`` alike).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.runtime.tensor import NeuronTensor


def _on_device_memory(t: torch.Tensor) -> None:
    """``t`` is a neuron tensor whose shape is its inner tensor's, held in its own allocator block."""
    assert type(t) is NeuronTensor
    assert t.shape == t._data.shape and t.stride() == t._data.stride()
    start = t._allocation.address
    assert start <= t._data.data_ptr() < start + max(t._allocation.nbytes, 1) or t.numel() == 0


_CASES = {
    "arange_end": lambda d: torch.arange(3.0, device=d),
    "arange_start_end_step": lambda d: torch.arange(1, 10, 2, device=d),
    "arange_int64": lambda d: torch.arange(5, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "eye_rectangular": lambda d: torch.eye(2, 3, device=d),
    "add_into_empty": lambda d: torch.add(torch.ones(3, device=d), 1, out=torch.empty(0, device=d)),
    "add_into_same_size": lambda d: torch.add(torch.ones(3, device=d), 1, out=torch.empty(3, device=d)),
    "sum_into_empty": lambda d: torch.sum(torch.ones(3, 2, device=d), 0, out=torch.empty(0, device=d)),
    "cumsum_into_wrong_size": lambda d: torch.cumsum(torch.arange(4.0, device=d), 0, out=torch.empty(7, device=d)),
}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_out_variants_give_their_shape_and_values_in_device_memory(name):
    make = _CASES[name]
    expected = make("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # out= variants run on the CPU, with a warning
        got = make("neuron")
    _on_device_memory(got)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


def test_an_out_variant_returns_its_out_tensor_and_later_ops_see_its_shape():
    out = torch.empty(0, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        returned = torch.add(torch.ones(2, device="neuron"), 2, out=out)
    assert returned is out and out.shape == (2,)
    positions = torch.arange(4, device="neuron")
    table = torch.randn(10, 3)
    embedded = torch.nn.functional.embedding(positions, table.to("neuron"))
    assert torch.equal(embedded.cpu(), table[:4])
    assert torch.equal((torch.arange(5.0, device="neuron") * 2 + 1).cpu(), torch.arange(5.0) * 2 + 1)
    assert torch.equal(torch.arange(10.0, device="neuron")[torch.arange(3, device="neuron")].cpu(),
                       torch.arange(3.0))


@pytest.mark.parametrize("size", [(4,), (2, 2), (1,), (0,)])
def test_resize_keeps_the_leading_values_in_new_device_memory(size):
    t = torch.arange(3.0).to("neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert t.resize_(size) is t
    _on_device_memory(t)
    assert t.shape == size
    keep = min(3, t.numel())
    assert torch.equal(t.cpu().reshape(-1)[:keep], torch.arange(3.0)[:keep])


def _same_size(d):
    x = torch.arange(6.0).to(d)
    y = x.view(2, 3)
    x.resize_(3, 2)
    x.add_(1)
    return y, x


def _shrink(d):
    x = torch.arange(6.0).to(d)
    y = x[1:4]
    x.resize_(2)
    x.add_(1)
    return y, x


def _grow(d):
    x = torch.arange(6.0).to(d)
    y = x[1:4]
    x.resize_(8)
    x[:6].add_(1)
    y.mul_(10)
    return y, x[:6]


def _view_past_its_end(d):
    x = torch.arange(6.0).to(d)
    v = x[4:]
    v.resize_(4)
    v[:2].fill_(-1)
    return x, v[:2], torch.tensor(v.storage_offset())


def _transposed(d):
    x = torch.arange(6.0).to(d).view(2, 3).t()
    x.resize_(3, 2)
    return x, torch.tensor(x.stride())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("out_shape", [(6, 6), (0,)])
def test_kron_writes_its_out_through_an_unsafe_view(dtype, out_shape):
    """kron(..., out=) writes ``out`` through ``_unsafe_view``, which the device ran as a computation
    (a copy): a correctly sized ``out`` was never written."""
    a, b = torch.randn(2, 3).to(dtype), torch.randn(3, 2).to(dtype)
    out = torch.full(out_shape, 7.0, dtype=dtype).to("neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.kron(a.to("neuron"), b.to("neuron"), out=out) is out
    torch.testing.assert_close(out.cpu(), torch.kron(a, b))


def test_an_in_place_op_whose_functional_form_orders_its_arguments_otherwise():
    """polygamma_(self, n) was run as polygamma(n, self): a cast error of torch's."""
    x = torch.rand(4) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = x.to("neuron").polygamma_(1)
    torch.testing.assert_close(got.cpu(), x.clone().polygamma_(1))


@pytest.mark.parametrize("case", [_same_size, _shrink, _grow, _view_past_its_end, _transposed])
def test_resize_keeps_sharing_memory_with_views_as_on_the_cpu(case):
    """resize_ gave the tensor new memory even when its storage was large enough: views stopped
    seeing its writes (a view of 6 elements resized to 3x2 kept the old values)."""
    for got, expected in zip(case("neuron"), case("cpu"), strict=True):
        assert got.shape == expected.shape
        torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("make", [
    lambda d: torch.tril_indices(4, 3, device=d),
    lambda d: torch.triu_indices(3, 3, 1, device=d),
    lambda d: torch.hann_window(5, device=d),
    lambda d: torch.scalar_tensor(3.0, device=d),
], ids=["tril_indices", "triu_indices", "hann_window", "scalar_tensor"])
def test_factories_without_a_kernel_of_their_own_are_made_on_the_device(make):
    expected = make("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = make("neuron")
    _on_device_memory(got)
    torch.testing.assert_close(got.cpu(), expected)  # hann_window computes cosines on the device


def test_random_ops_that_write_their_arguments_keep_shapes_and_draw_from_the_device_generator():
    torch.manual_seed(3)
    permutation = torch.randperm(6, device="neuron")
    _on_device_memory(permutation)
    assert sorted(permutation.tolist()) == list(range(6))
    torch.manual_seed(3)
    assert torch.equal(torch.randperm(6, device="neuron").cpu(), permutation.cpu())  # seeded: reproducible
    filled = torch.empty(2, 3, device="neuron").normal_()
    _on_device_memory(filled)
    assert filled.shape == (2, 3) and bool(torch.isfinite(filled.cpu()).all())


def test_out_variants_of_the_outs_shape_are_queued_without_a_fallback():
    """``torch.mul(a, b, out=c)`` with ``c`` of the result's shape: the functional twin queued and
    copied into ``out`` (no CPU fallback, no synchronization); ``out`` aliasing an input, a
    keyword of the op, a reduction, and a cast to ``out``'s dtype give torch's values."""
    from torch_neuronx import observe

    a, b = torch.randn(4, 5), torch.randn(4, 5)
    na, nb = a.to("neuron"), b.to("neuron")
    out = torch.empty(4, 5, device="neuron")
    before = observe.counter("eager_fallbacks")
    assert torch.mul(na, nb, out=out) is out
    torch.testing.assert_close(out.cpu(), a * b)
    torch.add(na, nb, alpha=2.0, out=out)
    torch.testing.assert_close(out.cpu(), a + 2.0 * b)
    torch.mul(na, 0.5, out=na)  # out is an input
    torch.testing.assert_close(na.cpu(), a * 0.5)
    sums = torch.empty(4, device="neuron")
    torch.sum(nb, 1, out=sums)
    torch.testing.assert_close(sums.cpu(), b.sum(1))
    wide = torch.empty(4, 5, dtype=torch.float64, device="neuron")
    torch.mul(nb, nb, out=wide)
    torch.testing.assert_close(wide.cpu(), (b * b).double())
    assert observe.counter("eager_fallbacks") == before
    with pytest.raises(RuntimeError, match="can't be cast"):  # torch's own error, as on the CPU
        torch.mul(nb, nb, out=torch.empty(4, 5, dtype=torch.int64, device="neuron"))


@pytest.mark.parametrize("name", ["mul", "gt", "cumsum", "sort", "sort_of_its_shape", "max", "topk", "cummax"])
def test_empty_outs_and_several_outs_are_queued_as_torch_fills_them(name):
    """``out=torch.empty(0)`` (resized, as torch resizes it) and ops with several ``out=`` tensors
    (``sort(out=(values, indices))``, ``max(dim, out=...)``) ran on the CPU with a fallback warning."""
    from torch_neuronx import observe

    torch.manual_seed(0)
    a = torch.randn(4, 5)
    n = a.to("neuron")

    def empty(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="neuron")

    long = torch.long
    calls = {
        "mul": (lambda x, o: torch.mul(x, x, out=o[0]), [empty(0)]),
        "gt": (lambda x, o: torch.gt(x, 0.1, out=o[0]), [empty(0, dtype=torch.bool)]),
        "cumsum": (lambda x, o: torch.cumsum(x, 1, out=o[0]), [empty(0)]),
        "sort": (lambda x, o: torch.sort(x, 1, out=tuple(o)), [empty(0), empty(0, dtype=long)]),
        "sort_of_its_shape": (lambda x, o: torch.sort(x, 0, descending=True, out=tuple(o)),
                              [empty(4, 5), empty(4, 5, dtype=long)]),
        "max": (lambda x, o: torch.max(x, 1, out=tuple(o)), [empty(0), empty(0, dtype=long)]),
        "topk": (lambda x, o: torch.topk(x, 2, out=tuple(o)), [empty(0), empty(0, dtype=long)]),
        "cummax": (lambda x, o: torch.cummax(x, 1, out=tuple(o)), [empty(0), empty(0, dtype=long)]),
    }
    call, outs = calls[name]
    expected = [torch.empty(0, dtype=o.dtype) for o in outs]
    call(a, expected)
    before = observe.counter("eager_fallbacks")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        returned = call(n, outs)
    assert observe.counter("eager_fallbacks") == before
    for got in (returned if isinstance(returned, tuple) else (returned,)):
        assert any(got is o for o in outs)
    for out, want in zip(outs, expected):
        assert out.shape == want.shape
        torch.testing.assert_close(out.cpu(), want)



def test_compiled_out_variants_resize_an_empty_out():
    """Compiled, an emptied ``out`` failed in Dynamo's fake-tensor run ("expand ... 5 -> 0"): the
    traced op resized a host copy of the graph's own ``torch.empty(0, device=...)``."""
    def mul(x):
        out = torch.empty(0, device=x.device)
        torch.mul(x, x, out=out)
        return out

    def sort(x):
        values, indices = torch.empty(0, device=x.device), torch.empty(0, dtype=torch.long, device=x.device)
        torch.sort(x, 1, out=(values, indices))
        return values, indices

    a = torch.randn(4, 5)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(mul, backend="neuron")(a.to("neuron")).cpu(), a * a)
    values, indices = torch.compile(sort, backend="neuron")(a.to("neuron"))
    torch.testing.assert_close((values.cpu(), indices.cpu()), tuple(torch.sort(a, 1)))


@pytest.mark.parametrize("make", [
    lambda d: torch.arange(7, device=d),
    lambda d: torch.arange(2, 11, 3, device=d, dtype=torch.float32),
    lambda d: torch.arange(0.5, 2.0, 0.25, device=d, dtype=torch.bfloat16),
    lambda d: torch.arange(0, device=d),
    lambda d: torch.arange(4, out=torch.empty(4, dtype=torch.int64, device=d)),
    lambda d: torch.eye(3, device=d),
    lambda d: torch.eye(2, 4, device=d, dtype=torch.int64),
    lambda d: torch.linspace(0, 1, 5, device=d),
    lambda d: torch.logspace(0, 2, 3, device=d),
], ids=["end", "start_step", "bfloat16", "empty", "out_of_its_shape", "eye", "eye_m", "linspace", "logspace"])
def test_host_factories_are_made_on_the_stream_without_a_fallback(make):
    """``torch.arange(n, device="neuron")`` reaches the device as ``arange.start_out`` into an empty
    tensor (every Hugging Face model makes its position ids so): the values are computed on the host
    and queued into the resized tensor; it warned of a CPU fallback and synchronized each call."""
    from torch_neuronx import observe

    before = observe.counter("eager_fallbacks")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = make("neuron")
    assert observe.counter("eager_fallbacks") == before
    if got.numel():
        _on_device_memory(got)
    torch.testing.assert_close(got.cpu(), make("cpu"))
    torch.testing.assert_close(got.add(1).cpu(), make("cpu") + 1)  # later ops see its shape and values


_SHARED_VIEW_WRITES = [
    lambda u, d: u.__setitem__(torch.tensor([0], device=d), 9.0),
    lambda u, d: u.index_fill_(1, torch.tensor([1], device=d), 5.0),
    lambda u, d: u.masked_fill_(torch.tensor([[True, True], [False, False], [False, False]], device=d), 9.0),
    lambda u, d: u.index_put_((torch.tensor([0], device=d),), torch.tensor(1.0, device=d), accumulate=True),
    lambda u, d: u.index_copy_(0, torch.tensor([0], device=d), torch.tensor([[7.0, 8.0]], device=d)),
]


@pytest.mark.parametrize("view", ["unfold", "expand"])
@pytest.mark.parametrize("write", range(len(_SHARED_VIEW_WRITES)))
def test_writes_into_views_whose_elements_share_memory_follow_the_cpu(view, write, recwarn):
    """A write into an unfolded or expanded view sets every view of an element it writes, as the
    CPU's kernel does (the copy of a functional result lost updates: ``u[idx] = 9.`` on
    ``unfold(0, 2, 1)`` left x[1] at 1; writes through an expanded view raised)."""
    results = []
    for device in ("cpu", "neuron"):
        x = torch.arange(4.0, device=device)
        u = x.unfold(0, 2, 1) if view == "unfold" else x[:2].expand(3, 2)
        try:
            _SHARED_VIEW_WRITES[write](u, device)
        except RuntimeError as exc:  # what the CPU refuses (index_copy_ into an expanded view)
            results.append(str(exc))
        else:
            results.append(x.cpu().tolist())
    assert results[1] == results[0], results
    with pytest.raises(RuntimeError, match="single memory location"):  # what the CPU refuses stays refused
        torch.arange(4.0, device="neuron").expand(3, 4).add_(1)


def test_put_with_a_source_of_another_length_raises_as_the_cpu():
    """``put_`` broadcast a 1-element source over a longer index where the CPU raises; compiled too."""
    message = "Expected source and index to have the same number of elements"
    for source in (torch.tensor([5.0]), torch.tensor([5.0, 6.0, 7.0])):
        x = torch.zeros(2, 3, device="neuron")
        with pytest.raises(IndexError, match=message):
            x.put_(torch.tensor([1, 2], device="neuron"), source.to("neuron"))
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            compiled = torch.compile(lambda t, i, s: t.put(i, s), backend="neuron")
            compiled(torch.zeros(2, 3), torch.tensor([1, 2]), source)
    x = torch.zeros(2, 3, device="neuron")
    x.put_(torch.tensor([1, 2], device="neuron"), torch.tensor([5.0, 6.0], device="neuron"))
    assert x.cpu().tolist() == [[0.0, 5.0, 6.0], [0.0, 0.0, 0.0]]
