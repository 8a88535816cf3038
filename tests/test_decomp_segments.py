"""``torch.segment_reduce`` through the compile path (``decompositions/segments.py``) against eager.

torch-mlir does not lower ``aten.segment_reduce``. One compiled function (a compile costs
seconds) runs every reduction over lengths and offsets (the segments' bounds are graph inputs,
data to the compiled code), along a leading and an inner axis, with and without ``initial``:
empty segments (the initial value, the identity, NaN for mean), NaN in a segment (max and min
propagate it), offsets not starting at 0 and segments not covering the data (``unsafe``).
"""

from __future__ import annotations

import pytest
import torch

_NAN = float("nan")
_REDUCTIONS = ("max", "min", "sum", "mean", "prod")


def _segments(data: torch.Tensor, inner: torch.Tensor, lengths: torch.Tensor, offsets: torch.Tensor,
              rows: torch.Tensor, short: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for reduce in _REDUCTIONS:
        out[f"{reduce}_lengths"] = torch.segment_reduce(data, reduce, lengths=lengths)
        out[f"{reduce}_offsets_initial"] = torch.segment_reduce(data, reduce, offsets=offsets, initial=2)
        out[f"{reduce}_axis1_initial"] = torch.segment_reduce(inner, reduce, lengths=rows, axis=1, initial=-1.5)
    # segments covering only part of the data, an empty last one, axis counted from the end
    out["sum_unsafe"] = torch.segment_reduce(inner, "sum", lengths=short, axis=-2, unsafe=True)
    out["max_nan_initial"] = torch.segment_reduce(data, "max", lengths=lengths, initial=_NAN)
    return out


def test_segment_reduce():
    torch.manual_seed(0)
    data = torch.randn(9, 3)
    data[4, 1] = _NAN  # in the segment [3, 6) of `lengths`
    inner = torch.randn(2, 7, 3)
    inner[1, 2, 0] = _NAN
    lengths = torch.tensor([2, 0, 1, 3, 0, 3])
    offsets = torch.tensor([1, 1, 4, 4, 8, 9])  # starts past 0: row 0 is in no segment
    rows = torch.tensor([[0, 3, 4, 0], [7, 0, 0, 0]])
    short = torch.tensor([[1, 2, 0], [3, 3, 0]])
    args = (data, inner, lengths, offsets, rows, short)
    expected = _segments(*args)
    got = torch.compile(_segments, backend="neuron")(*args)
    assert expected["max_lengths"].isnan().any() and expected["mean_lengths"].isnan().any()
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_trains_compiled(reduce):
    """``aten._segment_reduce_backward`` has no lowering: the backward failed to compile; it runs on
    the host between the compiled partitions."""
    data, lengths = torch.randn(10, 2), torch.tensor([3, 0, 4, 1, 2])

    def fn(d):
        return torch.segment_reduce(d, reduce, lengths=lengths, initial=0.0).pow(2).sum()

    expected_leaf, leaf = data.clone().requires_grad_(), data.clone().requires_grad_()
    fn(expected_leaf).backward()
    torch.compile(fn, backend="neuron")(leaf).backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad)


_BAD_SEGMENTS = [  # (lengths or offsets, torch's error)
    ({"lengths": [5, -1]}, "lengths contains negative value!"),
    ({"lengths": [2, 2]}, "Expected all rows of lengths along axis to sum"),
    ({"offsets": [0, 3, 2]}, "Expected segment_length >= 0"),
]


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_invalid_segments_raise_torchs_errors(mode):
    """Lengths that are negative or do not cover the data (offsets that decrease) gave made-up
    segments where torch raises; ``unsafe=True`` still skips the checks, as torch's does."""
    data = torch.arange(6.0)

    def reduce(data, bounds, unsafe=False):
        return torch.segment_reduce(data, "sum", unsafe=unsafe, **bounds)

    run = torch.compile(reduce, backend="neuron") if mode == "compiled" else reduce
    for spec, message in _BAD_SEGMENTS:
        bounds = {k: torch.tensor(v) for k, v in spec.items()}
        with pytest.raises(RuntimeError, match=message):
            reduce(data, bounds)  # torch's own
        with pytest.raises(RuntimeError, match=message):
            run(data.to("neuron"), {k: v.to("neuron") for k, v in bounds.items()}).cpu()
    lengths = torch.tensor([2, 2])
    torch.testing.assert_close(run(data.to("neuron"), {"lengths": lengths.to("neuron")}, True).cpu(),
                               reduce(data, {"lengths": lengths}, True))
