"""Cumulative scans through the compile path (``decompositions/scans.py``) against eager.

torch-mlir's ``logcumsumexp`` was ``log(cumsum(exp(x)))``: inf past 88.7 in float32 (OpInfo's
sample sets a row to 10000) and -inf below -103. One compiled function covers long rows of
large and small magnitudes (against the float64 values: the doubling scan rounds about
log2(n) times, eager once per element), -inf and inf entries in every combination, NaN,
both dims of a 3-d tensor, float64, float16 and bfloat16, a 0-d tensor and an empty one.
"""

from __future__ import annotations

import torch

_INF, _NAN = float("inf"), float("nan")
#: Relative tolerances against eager, which combines in another order: a few roundings.
_RTOL = {torch.float32: 4e-7, torch.float64: 1e-15, torch.float16: 2e-3, torch.bfloat16: 8e-3}

#: Special rows: each column of ``_SPECIAL`` is a case, run along dim 0 of the stacked rows.
_SPECIAL = torch.tensor([
    [10000.0, 1.0, 2.0, 3.0, -1e4],
    [-200.0, -200.0, -300.0, 5.0, -1e4],
    [-_INF, -_INF, 0.0, -_INF, -_INF],
    [_INF, -_INF, 1.0, _INF, 0.0],
    [1.0, _NAN, 2.0, 3.0, -_INF],
    [-_INF, _INF, -_INF, 0.0, _INF],
    [_INF, _INF, 1.0, 2.0, _INF],
    [-_INF, -_INF, -_INF, -_INF, -_INF],
    [_NAN, -_INF, _INF, 0.0, 1.0],
]).T.contiguous()


def _scans(long, special, cube):
    return {
        "long": torch.logcumsumexp(long, 1),
        "long64": torch.logcumsumexp(long.double(), -1),
        "special": torch.logcumsumexp(special, 1),
        "special_dim0": torch.logcumsumexp(special.T, 0),
        "special64": torch.logcumsumexp(special.double(), 1),
        "cube0": torch.logcumsumexp(cube, 0),
        "cube1": torch.logcumsumexp(cube, 1),
        "half": torch.logcumsumexp(cube.half(), 2),
        "bfloat16": torch.logcumsumexp(special.bfloat16(), 1),
        "scalar": torch.logcumsumexp(cube[0, 0, 0], 0),
        "empty": torch.logcumsumexp(cube[:, :0], 1),
    }


def test_logcumsumexp_is_stable_and_keeps_special_values():
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([1e-3, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 3e38])
    long = (torch.randn(8, 3000, generator=g) * scales[:, None]).clamp(-3e38, 3e38)
    cube = torch.randn(5, 5, 5, generator=g) * 20
    cube[0] = 10000.0  # OpInfo's "large number" samples
    got = torch.compile(_scans, backend="neuron")(long, _SPECIAL, cube)
    expected = _scans(long, _SPECIAL, cube)

    exact = torch.logcumsumexp(long.double(), 1)
    error = (got["long"].double() - exact).abs() / exact.abs().clamp(min=1.0)
    assert error.max() < 4e-7  # eager's: 2e-7
    torch.testing.assert_close(got["long64"], exact, rtol=1e-14, atol=1e-14)
    for name in ("special", "special_dim0", "special64", "cube0", "cube1", "half", "bfloat16", "scalar", "empty"):
        rtol = _RTOL[expected[name].dtype]  # infinities and NaN where eager has them
        torch.testing.assert_close(got[name], expected[name], rtol=rtol, atol=0.0, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_narrow_integer_cumsums_in_their_own_type_wrap_as_torchs():
    """``cumsum(dtype=torch.int8)`` (and uint8, int16) crashed torch-mlir's lowering (SIGSEGV)."""
    x = torch.tensor([[100, 100, 3, 5], [-7, 120, 90, 1]], dtype=torch.int16)

    def fn(x):
        return (x.to(torch.int8).cumsum(1, dtype=torch.int8), x.to(torch.uint8).cumsum(1, dtype=torch.uint8),
                (x * 300).cumsum(0, dtype=torch.int16), x.to(torch.int8).cumsum(1))

    for got, on_device, expected in zip(torch.compile(fn, backend="neuron")(x), fn(x.to("neuron")), fn(x),
                                        strict=True):
        assert torch.equal(got, expected) and torch.equal(on_device.cpu(), expected)
