"""``pow`` at C's special values, compiled and on the eager device.

IREE computes ``pow`` as ``exp(b * log(a))``: a negative base gave NaN even for an integral
exponent (``torch.pow(x, y)`` with x=-2, y=2 was NaN, not 4), ``0 ** 0``, ``nan ** 0`` and
``1 ** nan`` NaN, not 1, ``(-2.0) ** x`` zeros, and ``atan2`` of bools NaN at (False, False);
MLIR folded pow of a constant NaN base to 1.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_neuronx  # noqa: F401

_NAN, _INF = float("nan"), float("inf")
BASES = torch.tensor([0.0, -2.0, -2.0, -2.0, 0.0, _NAN, 1.0, -0.0, 2.0, -0.0, _INF, -_INF, -1.0, 0.5, 3.0, -3.0])
EXPONENTS = torch.tensor([0.0, 2.0, 3.0, 0.5, -1.0, 0.0, _NAN, 3.0, 10.0, -1.0, -1.0, 3.0, _INF, -_INF, 0.0, -2.0])

CASES = {
    "tensor_tensor": lambda a, b: torch.pow(a, b),
    "float_power": lambda a, b: torch.float_power(a, b),
    "scalar_base_negative": lambda a, b: (-2.0) ** b,
    "scalar_base_zero": lambda a, b: 0.0 ** b,
    "scalar_base_positive": lambda a, b: 2.0 ** b,
    "scalar_base_nan": lambda a, b: _NAN ** b,
    "constant_nan_base": lambda a, b: torch.full_like(b, _NAN) ** b,
    "constant_nan_exponent": lambda a, b: a ** torch.full_like(a, _NAN),
    "tensor_scalar": lambda a, b: a ** 3,
    "tensor_scalar_integral_float": lambda a, b: a ** 7.0,
    "tensor_scalar_fraction": lambda a, b: a ** (1 / 3),
    "tensor_scalar_half": lambda a, b: a ** 0.5,
    "tensor_scalar_nan": lambda a, b: a ** _NAN,
    "tensor_scalar_inf": lambda a, b: a ** _INF,
    "tensor_scalar_minus_inf": lambda a, b: a ** -_INF,
    "atan2_bools": lambda a, b: torch.atan2(a > 0, b > 0),
}


def _same(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal values (NaN where NaN, the sign of zeros too), within float rounding."""
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return False
    close = torch.isclose(got, expected, rtol=1e-6, atol=0.0, equal_nan=True)
    return bool(close.all()) and torch.equal(got.signbit() & (got == 0), expected.signbit() & (expected == 0))


@pytest.mark.parametrize("name", CASES)
def test_pow_follows_c_at_special_values(name: str) -> None:
    fn = CASES[name]
    expected = fn(BASES, EXPONENTS)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", dynamic=False)(BASES, EXPONENTS)
    eager = fn(BASES.to("neuron"), EXPONENTS.to("neuron")).cpu()
    assert _same(compiled, expected), (compiled, expected)
    assert _same(eager, expected), (eager, expected)


_EXPONENTS = [-3, -2, -1, 0, 1, 2, 3, 7, 31, 32, 33, 62, 63, 64, 65, 100, 1000]
_BASES = [-3, -2, -1, 0, 1, 2, 3, 5, 10, 255, -128, 123456789]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.uint8])
def test_integer_powers_wrap_as_torchs(dtype):
    """Integer powers wrap as torch's square-and-multiply does (``2 ** 64`` is 0 in int64, ``3 **
    64`` 8733086111712066817), negative exponents give 1, +-1 or 0: IREE's looped over too few
    of the exponent's bits (``2 ** 64`` was 1, ``2 ** 100`` 2**36). Compiled and on the eager
    device, a Python base, a tensor base with a tensor exponent, and a Python exponent."""
    exponents = torch.tensor(_EXPONENTS).clamp(min=0 if dtype == torch.uint8 else -3).to(dtype)
    bases = torch.tensor(_BASES).to(dtype)[:, None]

    def f(b, e):
        return 3 ** e, (-2) ** e, b ** e, b ** 100, b ** 7

    expected = f(bases, exponents)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        # on the device, not the CPU: int64's 63 bit masks made a dispatch of 64 bindings, which
        # the runtime refuses above 32 (every int64 power fell back, a 0-d one too)
        warnings.simplefilter("error", RuntimeWarning)
        checks = [(torch.compile(f, backend="neuron")(bases, exponents), expected)]
        if dtype == torch.int64:  # the eager device shares the decomposition: one dtype suffices
            checks.append((f(bases.to("neuron"), exponents.to("neuron")), expected))
            e = exponents[3]  # 0-d
            checks.append(((2 ** e.to("neuron"), e.to("neuron") ** e.to("neuron")), (2 ** e, e ** e)))
    for got, wanted in checks:
        for g, w in zip(got, wanted, strict=True):
            assert g.dtype == w.dtype and torch.equal(g.cpu(), w), (dtype, g.cpu(), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_powers_of_a_number_exponent_are_right_in_every_dtype(dtype):
    """float64 ``x ** 2.5`` (and 4, 1.5, 0.25; ``float_power``) gave 1.0 everywhere on the eager
    device: torch-mlir folded the decomposition's ``full_like(x, 2.5) == 0`` to true, reading the
    float64 splat wrong (some exponents, some runs; once cached, in every later process)."""
    values = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -3.3, _INF, -_INF, _NAN, 1e-300]
    x = torch.tensor(values, dtype=dtype)
    for exponent in (4, 2.5, 1.5, 0.25, 1 / 3, -3, 7.0, 0):
        expected = x ** exponent
        torch._dynamo.reset()
        compiled = torch.compile(lambda t, e=exponent: t ** e, backend="neuron")(x)
        for got in ((x.to("neuron") ** exponent).cpu(), compiled):
            torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-6, atol=0, msg=f"x ** {exponent}")
            finite = ~expected.isnan()
            assert torch.equal(got[finite].signbit(), expected[finite].signbit()), exponent
    assert torch.allclose(torch.float_power(x.float().to("neuron"), 2.5).cpu(), torch.float_power(x.float(), 2.5),
                          equal_nan=True)
