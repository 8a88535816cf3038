"""``searchsorted`` and ``bucketize``, compiled and on the eager device: torch's binary search.

Counting the sequence's elements before each value gave wrong indices as soon as the sequence
held NaN (``torch.sort`` puts them last) or was out of order, and cost a comparison per element.
"""

from __future__ import annotations

import pytest
import torch

nan = float("nan")


def _cases() -> list[tuple[str, torch.Tensor, object]]:
    g = torch.Generator().manual_seed(0)
    sorted_with_nan = torch.sort(torch.tensor([2.0, nan, 0.0, 1.0, nan, 1.0]))[0]
    return [
        ("nan last", sorted_with_nan, torch.tensor([-1.0, 0.5, 1.0, 1.5, 5.0, nan])),
        ("nan only", torch.tensor([nan, nan, nan]), torch.tensor([0.0, nan])),
        ("unsorted", torch.randn(37, generator=g), torch.randn(4, 5, generator=g)),
        ("ties", torch.tensor([0, 1, 1, 1, 2, 2, 7]), torch.tensor([[1, 2], [0, 9], [-3, 7]])),
        ("batched", torch.sort(torch.randn(3, 33, generator=g))[0], torch.randn(3, 8, generator=g)),
        ("one element", torch.tensor([0.5]), torch.tensor([0.0, 0.5, 1.0])),
        ("scalar value", torch.tensor([0.0, 1.0, 2.0, nan]), 1.0),
        ("zero-d value", torch.arange(10.0), torch.tensor(4.5)),
    ]


@pytest.mark.parametrize("name, seq, values", _cases(), ids=[c[0] for c in _cases()])
def test_searchsorted_and_bucketize_give_torchs_indices(name, seq, values):
    def ops(seq, values):
        found = []
        for right in (False, True):
            found += [torch.searchsorted(seq, values, right=right),
                      torch.searchsorted(seq, values, side="right" if right else "left", out_int32=True)]
            if isinstance(values, torch.Tensor) and seq.dim() == 1:
                found.append(torch.bucketize(values, seq, right=right))
        return found

    expected = ops(seq, values)
    on_device = (seq.to("neuron"), values.to("neuron") if isinstance(values, torch.Tensor) else values)
    torch._dynamo.reset()
    for how, got in (("eager", ops(*on_device)), ("compiled", torch.compile(ops, backend="neuron")(*on_device))):
        for e, g in zip(expected, got, strict=True):
            assert g.dtype == e.dtype and torch.equal(g.cpu(), e), (how, g.cpu(), e)


def test_searchsorted_with_a_sorter_permutes_the_sequence_first():
    g = torch.Generator().manual_seed(1)
    seq = torch.randn(2, 40, generator=g)
    sorter = seq.argsort(-1)
    values = torch.randn(2, 6, generator=g)
    expected = torch.searchsorted(seq, values, sorter=sorter)
    got = torch.compile(lambda s, v, o: torch.searchsorted(s, v, sorter=o), backend="neuron")(
        seq.to("neuron"), values.to("neuron"), sorter.to("neuron"))
    assert torch.equal(got.cpu(), expected)
