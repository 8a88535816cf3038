"""Extremes of unsigned and bool tensors, compiled and on the eager device.

torch-mlir reduces these dtypes from a signed initial value: uint8's max started from -128 (read
as 128), bool's from True, so ``torch.tensor([1, 5], dtype=torch.uint8).max()`` gave 128 and a
mask of all False had ``max()`` True. Each op here runs on values below and above the signed
range's middle, so both halves of a wrong initial value show.
"""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401

OPS = {
    "max": lambda t: t.max(),
    "min": lambda t: t.min(),
    "amax": lambda t: t.amax(),
    "amin_dim": lambda t: t.amin(1),
    "max_dim": lambda t: t.max(1).values,
    "min_dim_keepdim": lambda t: t.min(0, keepdim=True).values,
    "aminmax": lambda t: torch.stack(torch.aminmax(t)),
}
_SMALL = [[1, 5, 3], [0, 2, 6]]


def _inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    if dtype == torch.bool:
        return [torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool),
                torch.tensor([[True, False, False], [False, False, True]])]
    large = [[v + 200 for v in row] for row in _SMALL]  # above 128 (the middle of uint8's range)
    return [torch.tensor(values, dtype=torch.int64).to(dtype) for values in (_SMALL, large)]


def _expected(fn, x: torch.Tensor) -> torch.Tensor:
    """The op on the CPU; uint32, whose reductions the CPU lacks, through int64."""
    if x.dtype == torch.uint32:
        return fn(x.to(torch.int64)).to(torch.uint32)
    return fn(x)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.uint32], ids=str)
@pytest.mark.parametrize("name", OPS)
def test_extremes_of_unsigned_and_bool_tensors_compiled(name: str, dtype: torch.dtype) -> None:
    fn = OPS[name]
    if dtype == torch.bool and name == "aminmax":
        pytest.skip("torch has no aminmax for bool")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    for x in _inputs(dtype):
        assert torch.equal(compiled(x), _expected(fn, x)), (name, x)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8], ids=str)
def test_extremes_of_unsigned_and_bool_tensors_on_the_device(dtype: torch.dtype) -> None:
    for name, fn in OPS.items():
        if dtype == torch.bool and name == "aminmax":
            continue
        for x in _inputs(dtype):
            assert torch.equal(fn(x.to("neuron")).cpu(), fn(x)), (name, x)
