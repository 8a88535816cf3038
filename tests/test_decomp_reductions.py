"""Reductions torch-mlir lowered wrongly for some dtypes, compiled and on the eager device.

- Extremes of unsigned and bool tensors: torch-mlir reduces them from a signed initial value:
  uint8's max started from -128 (read as 128), bool's from True, so
  ``torch.tensor([1, 5], dtype=torch.uint8).max()`` gave 128 and a mask of all False had
  ``max()`` True. Each op here runs on values below and above the signed range's middle.
- ``any``: over a uint8 tensor torch-mlir ORed the values (``any`` of 5 gave 5, not 1), and over
  several dims (``torch.any(x, dim=(0,))``) it summed the values cast to int32 (0.5, NaN, and
  -1 next to 1 counted as false).
- Accumulations into bool tensors (scatter-add, index-add, ``index_put(accumulate=True)``) added
  bits (``True + True`` was ``False``) and ``clamp_min`` of bools compared signed bits.
"""

from __future__ import annotations

import warnings

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


TRUTH_OPS = {
    "any": lambda t: t.any(),
    "any_dim_keepdim": lambda t: t.any(-1, keepdim=True),
    "any_dims": lambda t: torch.any(t, dim=(0,)),
    "any_all_dims": lambda t: torch.any(t, dim=tuple(range(t.dim()))),
    "all": lambda t: t.all(),
    "all_dim": lambda t: t.all(0),
    "all_dims": lambda t: torch.all(t, dim=(0,)),
}
TRUTH_INPUTS = {
    "fractions": torch.tensor([[0.5, 0.0], [0.0, 0.0]]),
    "nan": torch.tensor([[float("nan"), 1.0], [2.0, 0.0]]),
    "opposite_signs": torch.tensor([[-1, 1], [0, 3]]),
    "uint8": torch.tensor([[0, 5], [7, 9]], dtype=torch.uint8),
    "uint8_scalar": torch.tensor(5, dtype=torch.uint8),
    "bool": torch.tensor([[True, False], [True, True]]),
}


@pytest.mark.parametrize("inputs", TRUTH_INPUTS)
def test_any_and_all_give_torchs_values_and_dtypes(inputs: str) -> None:
    x = TRUTH_INPUTS[inputs]
    for name, fn in TRUTH_OPS.items():
        if x.dim() == 0 and name not in ("any", "all"):
            continue
        expected = fn(x)
        torch._dynamo.reset()
        for got in (torch.compile(fn, backend="neuron", dynamic=False)(x), fn(x.to("neuron")).cpu()):
            assert got.dtype == expected.dtype and torch.equal(got, expected), (name, got, expected)


_MASK = torch.tensor([[True, False, True], [False, False, True]])
_INDEX = torch.tensor([[0, 0, 1], [0, 0, 1]])
BOOL_OPS = {  # torch adds bools with saturation: True + True is True
    "scatter_add": lambda t: t.new_zeros(2, 3).scatter_add(0, _INDEX.to(t.device), t),
    "index_add": lambda t: t.index_add(0, torch.tensor([0, 0], device=t.device), t),
    "scatter_reduce_sum": lambda t: t.scatter_reduce(1, _INDEX.to(t.device), t.flip(0), "sum"),
    "index_put_accumulate": lambda t: t.index_put((torch.tensor([1, 1], device=t.device),), t, accumulate=True),
    "clamp_min": lambda t: torch.clamp_min(t, t.flip(0)),
    "clamp_max": lambda t: torch.clamp_max(t, t.flip(1)),
}


@pytest.mark.parametrize("name", BOOL_OPS)
def test_accumulations_and_clamps_of_bools_saturate_as_torchs(name: str) -> None:
    fn = BOOL_OPS[name]
    expected = fn(_MASK)
    torch._dynamo.reset()
    for got in (torch.compile(fn, backend="neuron", dynamic=False)(_MASK), fn(_MASK.to("neuron")).cpu()):
        assert got.dtype == torch.bool and torch.equal(got, expected), (name, got, expected)


def test_mode_counts_nans_as_one_value():
    """torch's mode counts NaNs as equal: a row with more NaNs than any other value has mode NaN
    (each NaN counted alone, ``mode([nan, nan, 1.])`` was 1.0), compiled and on the eager device."""
    nan = float("nan")
    x = torch.tensor([[nan, nan, 1.0], [nan, nan, 1.0], [2.0, 3.0, 2.0]])
    expected = torch.mode(x, 1).values
    torch._dynamo.reset()
    for got in (torch.compile(lambda t: torch.mode(t, 1).values, backend="neuron")(x),
                torch.mode(x.to("neuron"), 1).values.cpu()):
        torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_means_of_integers_with_a_dtype_compile(dtype):
    """``t.mean(dim, dtype=torch.float64)`` of integers failed to lower (a ``torch.constant.int``
    torch-mlir could not legalize); the eager device ran it on the CPU."""
    x = torch.randint(-1000, 1000, (3, 10)).to(dtype)
    for fn in (lambda t: t.mean(-1, dtype=torch.float64), lambda t: t.mean(dtype=torch.float32),
               lambda t: torch.mean(t, (0, 1), keepdim=True, dtype=torch.float64)):
        expected = fn(x)
        torch.testing.assert_close(torch.compile(fn, backend="neuron")(x), expected)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no CPU fallback
            torch.testing.assert_close(fn(x.to("neuron")).cpu(), expected)
