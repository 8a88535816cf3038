"""Reductions over index tensors and division modes (float and integer), compiled vs eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _grads(fn, args, weights=None):
    """``fn(*args)`` and the gradients of ``(out * weights).sum()`` w.r.t. the float inputs."""
    out = fn(*args)
    weights = torch.randn_like(out) if weights is None else weights
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return out, torch.autograd.grad((out * weights).sum(), leaves), weights


def _check(fn, *args, **tolerance):
    expected, expected_grads, weights = _grads(fn, args)
    got, got_grads, _ = _grads(torch.compile(fn, backend="neuron"), args, weights)
    torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, equal_nan=True, **tolerance)


def _leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_every_mode_forward_and_backward(include_self):
    """Duplicate targets, untouched targets, a non-leading dim; backward through torch's formulas."""
    torch.manual_seed(0)
    index = torch.tensor([[0, 0, 3, 0, 3], [1, 1, 1, 4, 4], [2, 0, 2, 0, 2]])

    def fn(x, src):
        outs = [x.scatter_reduce(1, index, src, reduce, include_self=include_self)
                for reduce in ("sum", "mean", "amax", "amin")]
        # prod's backward divides by the sources: keep them away from zero
        outs.append(x.scatter_reduce(1, index, src.abs() + 0.5, "prod", include_self=include_self))
        return torch.stack(outs)

    _check(fn, _leaf(3, 6), _leaf(3, 5))


def test_scatter_reduce_along_dim_0_of_3d_with_larger_source_and_nan():
    torch.manual_seed(1)
    index = torch.randint(0, 4, (5, 2, 3))
    src = torch.randn(6, 3, 3)
    src[2, 1, 0] = float("nan")
    x = torch.randn(4, 2, 3)

    def fn(x, src):
        return torch.stack([x.scatter_reduce(0, index, src, reduce) for reduce in ("amax", "amin", "sum")])

    expected = fn(x, src)
    assert expected.isnan().any()
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x, src), expected, equal_nan=True)


@pytest.mark.filterwarnings(r"ignore:index_reduce\(\) is in beta")
def test_scatter_reduce_of_integers_and_index_reduce():
    index = torch.tensor([0, 2, 0, 3, 2, 0])
    ints = torch.tensor([7, -3, 5, 2, 9, -8])

    def fn(x, src, y):
        mean = torch.zeros(4, dtype=torch.int64).scatter_reduce(0, index, ints, "mean", include_self=False)
        amax = x.index_reduce(0, index, src, "amax")
        prod = y.index_reduce(1, torch.tensor([1, 1, 0]), src[:3].t(), "prod", include_self=False)
        return mean, amax, prod

    x, src, y = torch.randn(4, 3), torch.randn(6, 3), torch.randn(3, 2)
    for got, expected in zip(torch.compile(fn, backend="neuron")(x, src, y), fn(x, src, y), strict=True):
        torch.testing.assert_close(got, expected)


def test_gnn_style_scatter_mean_trains_like_eager():
    """Message passing: gather node features along edges, reduce them per target node."""
    torch.manual_seed(2)
    edges = torch.randint(0, 12, (2, 40))
    layer = torch.nn.Linear(8, 8)

    def step(x):
        messages = layer(x)[edges[0]]
        agg = torch.zeros_like(x).scatter_reduce(0, edges[1, :, None].expand(-1, 8), messages, "mean",
                                                 include_self=False)
        peak = torch.zeros_like(x).scatter_reduce(0, edges[1, :, None].expand(-1, 8), messages, "amax",
                                                  include_self=False)
        return torch.relu(agg + peak + x)

    _check(step, _leaf(12, 8))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_modes_with_empty_bags_and_padding(mode):
    torch.manual_seed(3)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 7])
    offsets = torch.tensor([0, 2, 2, 6, 10])  # bag 1 and the last bag are empty

    def fn(weight):
        a = F.embedding_bag(indices, weight, offsets, mode=mode)
        b = F.embedding_bag(indices, weight, offsets, mode=mode, padding_idx=4)
        c = F.embedding_bag(indices, weight, torch.tensor([0, 3, 7, 10]), mode=mode, include_last_offset=True)
        d = F.embedding_bag(indices.view(2, 5), weight, mode=mode)
        return torch.cat([a, b, c, d])

    _check(fn, _leaf(10, 4))


def test_embedding_bag_max_picks_the_first_of_tied_rows():
    weight = torch.tensor([[1.0, 5.0], [1.0, 2.0], [0.0, 5.0]], requires_grad=True)
    indices, offsets = torch.tensor([1, 0, 2, 2, 0]), torch.tensor([0, 3])
    _check(lambda w: F.embedding_bag(indices, w, offsets, mode="max"), weight)


def test_embedding_bag_per_sample_weights_and_module_training():
    torch.manual_seed(4)
    indices, offsets = torch.tensor([3, 1, 1, 8, 6, 0]), torch.tensor([0, 1, 4])
    _check(lambda w, p: F.embedding_bag(indices, w, offsets, mode="sum", per_sample_weights=p),
           _leaf(10, 3), _leaf(6))

    bag = torch.nn.EmbeddingBag(20, 6, mode="mean")
    eager_bag = torch.nn.EmbeddingBag(20, 6, mode="mean")
    eager_bag.load_state_dict(bag.state_dict())
    compiled = torch.compile(bag, backend="neuron")
    opt, eager_opt = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (bag, eager_bag))
    for step in range(3):
        idx = torch.randint(0, 20, (4, 5))
        for model, optimizer in ((compiled, opt), (eager_bag, eager_opt)):
            optimizer.zero_grad()
            model(idx).pow(2).sum().backward()
            optimizer.step()
        torch.testing.assert_close(bag.weight, eager_bag.weight, msg=f"step {step}")
    with torch.no_grad():  # inference goes through _embedding_bag_forward_only
        idx = torch.randint(0, 20, (3, 4))
        torch.testing.assert_close(compiled(idx), eager_bag(idx))


def test_embedding_with_scale_grad_by_freq_and_masked_scatter_backward():
    indices = torch.tensor([[1, 2, 2], [9, 2, 0]])
    mask = torch.tensor([[True, False, True, True], [False, False, True, False], [True, True, False, False]])

    def fn(weight, x, source):
        a = F.embedding(indices, weight, scale_grad_by_freq=True)
        b = F.embedding(indices, weight, padding_idx=2, scale_grad_by_freq=True)
        c = x.masked_scatter(mask, source)  # the source has more elements than the mask selects
        return torch.cat([(a + b).reshape(-1), c.reshape(-1)])

    _check(fn, _leaf(10, 4), _leaf(3, 4), _leaf(4, 3))


@pytest.mark.parametrize(("self_shape", "mask_shape"), [((4,), (2, 4)), ((2, 1), (1, 3)), ((2, 3), (3,))])
def test_masked_scatter_whose_self_or_mask_broadcasts(self_shape, mask_shape):
    """A ``self`` that broadcasts up to the mask's shape failed to lower; the result takes the common shape."""
    torch.manual_seed(1)
    mask = torch.rand(mask_shape) > 0.4

    def fn(x, source):
        return x.masked_scatter(mask, source) * 2

    _check(fn, _leaf(*self_shape), _leaf(12))


def test_float_floor_division_remainder_and_fmod_match_eager_on_special_values():
    inf, nan = float("inf"), float("nan")
    values = torch.tensor([inf, -inf, nan, 0.0, -0.0, 1.0, -1.0, 5.3, -5.3, 7.0, -7.0, 0.3, 2.5, 1e6])
    a, b = values.repeat_interleave(len(values)), values.repeat(len(values))

    def fn(a, b):
        return torch.stack([torch.floor_divide(a, b), torch.div(a, b, rounding_mode="floor"),
                            torch.remainder(a, b), torch.fmod(a, b), torch.floor_divide(a, -2.5),
                            torch.remainder(a, 2.5)])

    got, expected = torch.compile(fn, backend="neuron")(a, b), fn(a, b)
    same = (got == expected) & (got.signbit() == expected.signbit()) | (got.isnan() & expected.isnan())
    assert same.all(), [(a[i % len(a)].item(), b[i % len(a)].item()) for i in (~same).flatten().nonzero()[:5]]


def test_histc_with_a_range_and_with_the_datas_range():
    torch.manual_seed(5)
    x = torch.randn(300)
    x[:3] = torch.tensor([2.0, -2.0, float("nan")])  # both ends of the range, and NaN (not counted)

    def fn(x):
        return torch.histc(x, bins=7, min=-2, max=2), torch.histc(x.nan_to_num(0.0), bins=5), \
            torch.histc(torch.full_like(x[:4], 3.0), bins=4)

    for got, expected in zip(torch.compile(fn, backend="neuron")(x), fn(x), strict=True):
        torch.testing.assert_close(got, expected)


def test_embedding_max_norm_renormalizes_looked_up_rows_in_place():
    torch.manual_seed(6)
    eager, compiled_model = torch.nn.Embedding(10, 4, max_norm=1.0), torch.nn.Embedding(10, 4, max_norm=1.0)
    compiled_model.load_state_dict(eager.state_dict())
    indices = torch.tensor([[1, 2, 2], [7, 0, 1]])
    expected = eager(indices)
    got = torch.compile(compiled_model, backend="neuron")(indices)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled_model.weight, eager.weight)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_floor_division_and_remainder_are_exact_at_the_limits(dtype):
    """torch-mlir divided integers in float32: (2**31 - 1) // 3 came out 715827904, and
    hashing ids with ``% buckets`` went wrong beyond 2**24."""
    info = torch.iinfo(dtype)
    a = torch.tensor([info.max, info.min, info.max - 1, info.min + 1, 0, 5, -7, 100, info.max // 3], dtype=dtype)
    b = torch.tensor([3, -3, 7, -7, 5, -2, 2, 9, -4], dtype=dtype)

    def fn(a, b):
        return torch.stack([a // b, a % b, a // 3, a % 1000003, torch.div(a, b, rounding_mode="floor"), a >> 3])

    torch.testing.assert_close(torch.compile(fn, backend="neuron")(a, b), fn(a, b), rtol=0, atol=0)


def test_boolean_mask_assignment_forward_and_backward():
    """``x[mask] = v`` with a value shared by the selection (the common ``x[x < 0] = 0``).

    The gradient of assigned values that require grad (``grad[mask]``) has a
    data-dependent shape, which aot_autograd cannot trace: the row here needs none.
    """
    torch.manual_seed(0)
    row = torch.randn(5)

    def fn(x):
        y = x * 3
        y[x < 0] = 0
        y[x[:, 0] > 0.5] = row  # a row mask, one row broadcast over the selected rows
        z = (y * 2).long()
        z[z > 2] = 9
        accumulated = y.index_put((x > 1,), torch.tensor(2.0), accumulate=True)
        return y + accumulated + z

    _check(fn, _leaf(6, 5))


def test_masked_assignment_of_values_per_selected_element():
    """``x[x > 0] *= -1`` and ``x[mask] = f(x[mask])``: one value per selected element (failed to
    lower: "The size of tensor a (48) must match the size of tensor b (-9223372036854775808)")."""
    torch.manual_seed(0)

    def fn(x):
        y = x * 1.5
        y[y > 0] *= -1
        rows = y[:, 0] < 0
        y[rows] = y[rows].flip(-1) * 2  # a row mask, one row per selected row
        z = y.clone()
        z[z < -1] = torch.sigmoid(z[z < -1])
        return y + z

    x = torch.randn(6, 5)
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x), fn(x))
    leaf = _leaf(6, 5)
    _check(lambda t: fn(t.detach()) * 0 + fn(t), leaf)


def test_masked_assignment_over_later_dims():
    """``x[:, mask] = v``, ``x[:, mask] += 1``, ``x[..., mask] = x[..., mask] * 10``: a mask after
    full dims failed to lower (on the literal of a scalar value; "cannot be broadcast to indexing
    result of shape [2, 0]" for values per selected element)."""
    torch.manual_seed(0)
    columns = torch.tensor([True, False, True, True, False, False])
    rows = torch.tensor([False, True, True, False])
    plane = torch.rand(4, 6) > 0.5

    def fn(x, m, r, p):
        y = x.clone()
        y[:, r] = 0.0
        y[:, r] += 1
        y[..., m] = y[..., m] * 10
        y[:, :, m] = torch.arange(2.0).reshape(2, 1, 1)  # one value per leading row, broadcast
        y[:, p] = y[:, p].flip(0)  # a 2-d mask over dims 1 and 2, one value per selected element
        return y

    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x, columns, rows, plane),
                               fn(x, columns, rows, plane))


def test_masked_assignment_of_another_count_of_values_raises_as_eager():
    def fn(x, values):
        y = x.clone()
        y[y > 0] = values
        return y

    x = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x, torch.tensor([7.0, 8.0, 9.0])),
                               fn(x, torch.tensor([7.0, 8.0, 9.0])))
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[2\] cannot be broadcast"):
        fn(x, torch.tensor([7.0, 8.0]))
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[2\] cannot be broadcast"):
        torch.compile(fn, backend="neuron")(x, torch.tensor([7.0, 8.0]))


def test_masked_scatter_with_a_short_source_raises_as_eager():
    """A source with fewer elements than set mask elements: eager raises; compiled and on the
    eager device the last element was repeated. A source long enough still gives eager's values."""
    x, mask = torch.zeros(3, 4), torch.ones(3, 4, dtype=torch.bool)

    def f(x, mask, source):
        return x.masked_scatter(mask, source)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="neuron")
    for run in (compiled, lambda *a: f(*(t.to("neuron") for t in a)).cpu()):
        with pytest.raises(RuntimeError, match="Number of elements of source < number of ones in mask"):
            run(x, mask, torch.arange(5.0))
        long_enough = torch.arange(14.0)
        assert torch.equal(run(x, mask, long_enough), f(x, mask, long_enough))


_SEPARATED = [  # index tensors with full dimensions between them (torch-mlir cannot lower these)
    lambda i, j: (i, Ellipsis, j),
    lambda i, j: (i, slice(None), j),
    lambda i, j: (slice(None), i, slice(None), j),
    lambda i, j: (i, slice(None), slice(None), j),
    lambda i, j: (i.reshape(2, 1), slice(None), j.reshape(1, 2)),  # broadcast to 2x2
]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("pattern", [0, 2, *(pytest.param(p, marks=pytest.mark.slow) for p in (1, 3, 4))])
def test_index_put_with_separated_index_tensors(pattern, accumulate):
    """``x[i, :, j] = v`` (values per element, negative and repeated indices): eager's values on
    the eager device without a CPU fallback, and compiled, forward and backward."""
    import warnings

    torch.manual_seed(pattern)
    i, j = torch.tensor([0, -1]), torch.tensor([-2, -2] if accumulate else [3, -2])
    x = torch.randn(3, 4, 5, 6)
    key = _SEPARATED[pattern](i, j)
    shape = x[key].shape
    values = torch.randn(shape)
    aten_key = [k if isinstance(k, torch.Tensor) else None for k in key]
    if Ellipsis in key:
        aten_key = [aten_key[0], None, None, aten_key[-1]]

    def put(x, values):
        y = x * 2
        if accumulate:  # aten's own form: None for a full dimension
            torch.ops.aten.index_put_(y, aten_key, values, True)
        else:
            y[key] = values
        return y

    expected = put(x, values)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        got = put(x.to("neuron"), values.to("neuron")).cpu()
    torch.testing.assert_close(got, expected)
    _check(put, x.clone().requires_grad_(), values.clone().requires_grad_())
    row = torch.randn(shape[-1])  # one row broadcast over the selection
    torch.testing.assert_close(put(x.to("neuron"), row.to("neuron")).cpu(), put(x, row))


def test_index_fill_of_transposed_and_permuted_tensors():
    """torch's reference index_fill keeps a non-contiguous input's layout through prims.copy_strided,
    which torch-mlir could not lower: compiled it failed, on the eager device it ran on the CPU."""
    from torch_neuronx import observe

    transposed = torch.arange(12.0).view(3, 4).t()
    permuted = torch.arange(24.0).view(2, 3, 4).permute(2, 0, 1)
    index = torch.tensor([0, -1])

    def fill(a, i):
        return a.index_fill(1, i, 3.0)

    for a in (transposed, permuted):
        want = fill(a, index)
        got = torch.compile(fill, backend="neuron")(a, index)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
        before = observe.counter("eager_fallbacks")
        on_device = fill(a.to("neuron"), index.to("neuron"))
        assert observe.counter("eager_fallbacks") == before
        torch.testing.assert_close(on_device.cpu(), want)
