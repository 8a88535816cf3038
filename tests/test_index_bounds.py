"""Indices as torch takes them: negative ones wrap where the op allows them, out-of-range ones raise
torch's error, and no index reads or writes outside its tensor; compiled and on the eager device."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401  (registers the neuron device)

X = torch.arange(12.0).reshape(3, 4)
ROWS = torch.ones(2, 4)

# name -> (fn(x, i), a valid index with negatives where the op takes them, an out-of-range index)
CASES: dict[str, tuple[Callable, torch.Tensor, torch.Tensor]] = {
    "index": (lambda x, i: x[i], torch.tensor([-1, 0, -3]), torch.tensor([-4, 0, 1])),
    "index_dim1": (lambda x, i: x[:, i], torch.tensor([-1, 0, -4]), torch.tensor([4, 0, 1])),
    "take": (lambda x, i: torch.take(x, i), torch.tensor([-1, 0, -12]), torch.tensor([12, 0, 1])),
    "put": (lambda x, i: x.put(i, torch.tensor([7.0, 8.0])), torch.tensor([-1, 3]), torch.tensor([-13, 3])),
    "index_put": (lambda x, i: x.index_put((i,), torch.tensor(5.0)), torch.tensor([-1, 0]), torch.tensor([3, 0])),
    "index_put_acc": (lambda x, i: x.index_put((i,), ROWS, accumulate=True), torch.tensor([-3, -1]),
                      torch.tensor([0, 3])),
    "index_fill": (lambda x, i: x.index_fill(1, i, -2.0), torch.tensor([-1, 1]), torch.tensor([-5, 1])),
    "gather": (lambda x, i: torch.gather(x, 1, i), torch.tensor([[3, 0], [1, 1], [2, 0]]),
               torch.tensor([[3, 0], [-1, 1], [2, 0]])),
    "scatter": (lambda x, i: x.scatter(1, i, 9.0), torch.tensor([[3, 0], [1, 1], [2, 0]]),
                torch.tensor([[4, 0], [1, 1], [2, 0]])),
    "scatter_add": (lambda x, i: x.scatter_add(0, i, torch.ones(2, 4, device=x.device)),
                    torch.tensor([[2, 0, 1, 1], [0, 0, 2, 1]]),
                    torch.tensor([[2, 0, 1, 1], [0, -1, 2, 1]])),
    "scatter_reduce": (lambda x, i: x.scatter_reduce(0, i, -torch.ones(2, 4, device=x.device), "amin"),
                       torch.tensor([[2, 0, 1, 1], [0, 0, 2, 1]]), torch.tensor([[2, 0, 3, 1], [0, 0, 2, 1]])),
    "index_select": (lambda x, i: x.index_select(1, i), torch.tensor([3, 0, 1]), torch.tensor([3, -1, 1])),
    # 0-d indices: torch-mlir failed index_select's ("'stablehlo.convert' op requires the same shape")
    "index_select_0d": (lambda x, i: x.index_select(1, i), torch.tensor(3), torch.tensor(4)),
    "take_0d": (lambda x, i: torch.take(x, i), torch.tensor(-12), torch.tensor(12)),
    "embedding": (lambda x, i: F.embedding(i, x), torch.tensor([[2, 0], [1, 1]]), torch.tensor([[2, 0], [3, 1]])),
    "index_add": (lambda x, i: x.index_add(0, i, ROWS.to(x.device)), torch.tensor([2, 0]), torch.tensor([-1, 0])),
    "index_copy": (lambda x, i: x.index_copy(0, i, ROWS.to(x.device)), torch.tensor([2, 0]), torch.tensor([2, 3])),
}


def _eager_error(fn: Callable, index: torch.Tensor) -> type[BaseException]:
    """The exception eager raises (IndexError or RuntimeError: it depends on the op and dimension)."""
    with pytest.raises((IndexError, RuntimeError)) as info:
        fn(X.clone(), index)
    return type(info.value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_indexing_wraps_negatives_and_raises_out_of_range(name):
    fn, good, bad = CASES[name]
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    torch.testing.assert_close(compiled(X.clone(), good), fn(X.clone(), good))
    with pytest.raises(_eager_error(fn, bad), match="out of (bounds|range)"):
        compiled(X.clone(), bad)  # the same graph: the index is an input


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_neuron_indexing_wraps_negatives_and_raises_out_of_range(name):
    fn, good, bad = CASES[name]
    x = X.to("neuron")
    torch.testing.assert_close(fn(x.clone(), good.to("neuron")).cpu(), fn(X.clone(), good))
    with pytest.raises(_eager_error(fn, bad), match="out of (bounds|range)"):
        fn(x.clone(), bad.to("neuron"))


@pytest.mark.parametrize("name", ["take", "take_0d", "index_select", "index_select_0d"])
def test_take_and_index_select_run_on_the_eager_device(name):
    """``take`` had no lowering and a 0-d index failed ``index_select``'s: both ran on the CPU."""
    from torch_neuronx import metrics

    fn, good, _ = CASES[name]
    before = metrics.counter("eager_fallbacks")  # (a fallback warns once per process: counted instead)
    got = fn(X.to("neuron"), good.to("neuron"))
    assert metrics.counter("eager_fallbacks") == before
    torch.testing.assert_close(got.cpu(), fn(X.clone(), good))


def test_an_index_check_is_bad_input_not_a_reason_to_fall_back(monkeypatch):
    from torch_neuronx import metrics

    before = metrics.counter("eager_fallbacks")
    with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 3"):
        X.to("neuron")[torch.tensor([5], device="neuron")]
    assert metrics.counter("eager_fallbacks") == before


def test_indices_a_graph_computes_are_checked_too():
    # The index is an intermediate: nothing outside the graph could check it first.
    compiled = torch.compile(lambda x, k: x[(k * 2) - 7], backend="neuron")
    torch.testing.assert_close(compiled(X, torch.tensor([2, 3])), X[torch.tensor([-3, -1])])
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        compiled(X, torch.tensor([6, 2]))


def test_one_hot_checks_its_classes_as_eager_does():
    """F.one_hot's traced form gave an all-zero row for a class out of range; torch raises."""
    compiled = torch.compile(lambda y: F.one_hot(y, 3), backend="neuron", dynamic=False)
    for bad, message in ((torch.tensor([0, 3]), "smaller than num_classes"),
                         (torch.tensor([0, -1]), "non-negative")):
        with pytest.raises(RuntimeError, match=message):
            F.one_hot(bad, 3)
        with pytest.raises(RuntimeError, match=message):
            compiled(bad)
    good = torch.tensor([2, 0, 1, 1])
    torch.testing.assert_close(compiled(good), F.one_hot(good, 3))


@pytest.mark.parametrize("values, classes", [([0, 2], 3), ([0, 3], 3), ([0, -1], 3), ([1, 4], -1), ([0, -1], -1)])
def test_one_hot_on_the_eager_device_checks_its_classes(values, classes):
    """torch's composite one_hot checks nothing on other devices than the CPU (an all-zero row)."""
    host = torch.tensor(values)
    try:
        expected = F.one_hot(host, classes)
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=str(error).rstrip(".")):
            F.one_hot(host.to("neuron"), classes)
        return
    torch.testing.assert_close(F.one_hot(host.to("neuron"), classes).cpu(), expected)


@pytest.mark.parametrize("repeats, output_size", [
    ([2, 2], 4), ([2, 2], 3), ([2, 2], 6), ([3, 0, 1], 4), ([0, 0], 0), ([2, -1], 1), ([], 0), ([], 2)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_checks_its_output_size(repeats, output_size, dtype):
    """``repeat_interleave(..., output_size=n)`` with ``n`` other than the repeats' sum gave a
    shorter result (or an index error from inside) where torch raises; negative repeats too.
    Eager neuron, on the repeats alone and on values, and compiled."""
    counts = torch.tensor(repeats, dtype=dtype)
    values = torch.arange(float(len(repeats)))
    calls = {
        "repeats": lambda r, v: torch.repeat_interleave(r, output_size=output_size),
        "values": lambda r, v: torch.repeat_interleave(v, r, output_size=output_size),
    }
    for name, fn in calls.items():
        try:
            want = fn(counts, values)
        except RuntimeError as error:
            message = re.escape(str(error).splitlines()[0][:30])
            with pytest.raises(RuntimeError, match=message):
                fn(counts.to("neuron"), values.to("neuron")).cpu()
            if name == "repeats":
                with pytest.raises(RuntimeError, match=message):
                    torch.compile(fn, backend="neuron", dynamic=False)(counts, values)
            continue
        torch.testing.assert_close(fn(counts.to("neuron"), values.to("neuron")).cpu(), want)
        if name == "repeats":
            torch.testing.assert_close(torch.compile(fn, backend="neuron", dynamic=False)(counts, values), want)


@pytest.mark.parametrize("offsets, last, message", [
    ([1, 0], False, "offsets\\[0\\] has to be 0"), ([0, 5], False, "offsets\\[-1\\] can not be greater"),
    ([0, 3, 1], False, "(must not decrease|Expected i < index_size)"), ([0, 2, 2], False, None),
    ([0, 1, 4], True, None), ([0, 0, 4], True, None)])
def test_embedding_bag_checks_its_offsets(offsets, last, message):
    """Offsets not starting at 0, past the indices' end or decreasing gave made-up bags where
    eager raises (compiled and on the eager device); valid ones, empty bags and
    ``include_last_offset`` included, give eager's values."""
    weight, indices = torch.randn(10, 3), torch.tensor([1, 2, 3, 4])

    def bag(i, o, w):
        return F.embedding_bag(i, w, o, mode="sum", include_last_offset=last)

    o = torch.tensor(offsets)
    runs = [lambda: bag(indices.to("neuron"), o.to("neuron"), weight.to("neuron")).cpu(),
            lambda: torch.compile(bag, backend="neuron", dynamic=False)(indices, o, weight)]
    if message is not None:
        with pytest.raises(RuntimeError, match=message):
            bag(indices, o, weight)
        for run in runs:
            with pytest.raises(RuntimeError, match=message):
                run()
        return
    for run in runs:
        torch.testing.assert_close(run(), bag(indices, o, weight))


@pytest.mark.parametrize("values", [[0.2, 1.5, 0.3], [0.2, float("nan"), 0.3], [-0.1, 0.5, 0.5], [0.0, 1.0, 0.4]])
def test_binary_cross_entropy_checks_its_inputs_range(values):
    """Inputs outside [0, 1] (a NaN too) are eager's error, compiled as on the eager device (the
    compiled loss was NaN or a value); valid ones give eager's loss and gradient."""
    x, target = torch.tensor(values), torch.tensor([0.0, 1.0, 1.0])
    torch._dynamo.reset()
    compiled = torch.compile(F.binary_cross_entropy, backend="neuron", dynamic=False)
    if not all(0.0 <= v <= 1.0 for v in values):
        for run in (lambda: F.binary_cross_entropy(x, target), lambda: compiled(x, target),
                    lambda: F.binary_cross_entropy(x.to("neuron"), target.to("neuron")).cpu()):
            with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
                run()
        return
    leaf = x.clone().requires_grad_()
    compiled(leaf, target).backward()
    expected_leaf = x.clone().requires_grad_()
    expected = F.binary_cross_entropy(expected_leaf, target)
    expected.backward()
    torch.testing.assert_close(compiled(x, target), expected.detach())
    torch.testing.assert_close(leaf.grad, expected_leaf.grad)


@pytest.mark.parametrize("name, fn, message", [
    ("index_add", lambda x, i: x.index_add(0, i, torch.ones(2, 4, dtype=torch.float64, device=x.device)),
     r"index_add_\(\): self \(Float\) and source \(Double\) must have the same scalar type"),
    ("index_copy", lambda x, i: x.index_copy(0, i, torch.ones(2, 4, dtype=torch.float64, device=x.device)),
     r"index_copy_\(\): self and source expected to have the same dtype, but got \(self\) Float and \(source\) Double"),
    ("setitem", lambda x, i: x.index_put((i,), torch.ones(2, 4, dtype=torch.int64, device=x.device)),
     "Index put requires the source and destination dtypes match, got Float for the destination and Long"),
])
def test_a_source_of_another_dtype_is_eagers_error(name, fn, message):
    """torch's meta functions do not check it: the compiled graph failed deep in IREE or torch-mlir."""
    index = torch.tensor([2, 0])
    with pytest.raises(RuntimeError, match=message):
        fn(X.clone(), index)
    with pytest.raises(Exception, match=message):
        torch.compile(fn, backend="neuron")(X.clone(), index)
    with pytest.raises(RuntimeError, match=message):
        fn(X.to("neuron"), index.to("neuron")).cpu()


def test_scatter_and_index_reductions_name_the_users_index_and_dimension():
    """Their decompositions flatten the index: an index out of range was reported as ``index_add``'s,
    with the flattened index and size ("index 29 ... size 15")."""
    x = torch.randn(5, 3)
    index = torch.tensor([0, 1, 9, 2, 3])
    calls = {
        "dim 0": lambda t, i: torch.zeros(5, 3, device=t.device).scatter_reduce(0, i.unsqueeze(1).expand(-1, 3), t,
                                                                               "amax"),
        "dim 1": lambda t, i: torch.zeros(3, 5, device=t.device).scatter_reduce(1, i.unsqueeze(0).expand(3, -1),
                                                                               t.t(), "sum"),
        "index_reduce": lambda t, i: torch.zeros(5, 3, device=t.device).index_reduce(0, i, t, "amax"),
    }
    for call in calls.values():
        with pytest.raises((IndexError, RuntimeError)) as expected:
            call(x, index)
        message = str(expected.value)
        with pytest.raises((IndexError, RuntimeError), match=message):
            call(x.to("neuron"), index.to("neuron")).cpu()
        with pytest.raises((IndexError, RuntimeError), match=message):
            torch.compile(call, backend="neuron")(x, index)
