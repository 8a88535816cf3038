"""Float64 trigonometric functions through the compile path (``decompositions/float64_math.py``).

IREE cannot link libm's float64 sin, cos, tanh and atan2, so in float64 graphs
sin, cos, tan, tanh, atan, asin, acos and atan2 compile as Cephes-style
arithmetic. One compiled function batches every op (a compile costs seconds)
over small, moderate and large arguments (to 1e6), points next to multiples of
pi/2 and pi/4, +-1 for asin and acos, signed zeros, infinities and NaN, and is
compared with eager far tighter than ``assert_close``'s float64 defaults (1e-7):
measured, the compiled values are within 2 ulp of eager (relative 4e-16), so
``rtol=1e-15`` and no absolute slack (Cephes' own 3-part pi/4 split fails it
next to multiples of pi/2: 4e-12 relative at 29 pi/2, more further out). Gradients compile
from the same decompositions (the backward of sin is cos, and so on). Other
dtypes keep the old lowering: float32 still matches eager at float32 tolerance; float32 sin,
cos and tan, whose IREE versions lose accuracy with |x| (tan next to its poles too), are
measured against the float64 values over wide ranges.
"""

from __future__ import annotations

import math

import pytest
import torch

from torch_neuronx.compiler.decompositions import float64_math

_INF, _NAN = float("inf"), float("nan")
_SPECIAL = [0.0, -0.0, _INF, -_INF, _NAN]

#: float64 forward: every op within 2 ulp of eager (measured max 4e-16 relative, tan's).
_RTOL = 1e-15
#: float64 gradients (rtol, atol) in the order of :func:`_training`'s arguments, measured max
#: relative error in brackets. sin, cos, atan, atan2 (2e-16 to 4e-16): as the forward. tan's,
#: 1 + tan(x)**2, doubles tan's relative error (5e-16). tanh's, 1 - tanh(x)**2, cancels: an
#: ulp of tanh(x) near 1 is 2e-16 absolute in it, a large relative error once it is small
#: (2e-15 measured, where the values agree to the bit). asin's and acos's, 1 / sqrt(1 - u * u),
#: differ by how ``1 - u * u`` rounds (the compiled code fuses it into one multiply-add, eager
#: rounds ``u * u`` first), magnified by u**2 / (1 - u**2), 500 at |u| = 0.999 (7e-15; 2.5e-13
#: at 1 - 1e-12, left out).
_GRAD_TOL = ((1e-15, 0.0), (1e-15, 0.0), (2e-15, 0.0), (4e-15, 5e-16), (1e-15, 0.0), (3e-14, 0.0),
             (3e-14, 0.0), (1e-15, 0.0), (1e-15, 0.0))


def _cat(*parts) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=torch.float64).flatten() for p in parts])


def _angles(n: int, generator: torch.Generator) -> torch.Tensor:
    """Arguments for sin, cos, tan, tanh and atan: small to 1e6, next to multiples of pi/4."""
    k = torch.arange(1, 101, dtype=torch.float64)
    return _cat(torch.linspace(-12, 12, n, dtype=torch.float64),
                (torch.rand(n, generator=generator, dtype=torch.float64) - 0.5) * 2e6,
                (torch.rand(n // 2, generator=generator, dtype=torch.float64) - 0.5) * 2e5,
                torch.logspace(-300, 6, 100, dtype=torch.float64),
                -torch.logspace(-300, 6, 100, dtype=torch.float64),
                k * (math.pi / 2), -k * (math.pi / 4), k * 1e4 * math.pi, [1e5, -1e5, 0.625, 0.66, 2.4142135623730951])


def _units(n: int) -> torch.Tensor:
    """Arguments for asin and acos: [-1, 1] with its ends, tiny values and a little past 1."""
    tail = torch.logspace(-16, -1, 60, dtype=torch.float64)
    return _cat(torch.linspace(-1, 1, n, dtype=torch.float64), 1 - tail, -1 + tail,
                torch.logspace(-300, -1, 40, dtype=torch.float64), [1.0, -1.0, 0.5, -0.5, 1 + 1e-15, -2.0])


def _forward(x, u, y, x2):
    return {"sin": torch.sin(x), "cos": torch.cos(x), "tan": torch.tan(x), "tanh": torch.tanh(x),
            "atan": torch.atan(x), "asin": torch.asin(u), "acos": torch.acos(u), "atan2": torch.atan2(y, x2)}


def _assert_matches(compiled: dict, eager: dict, rtol: float) -> None:
    for name, expected in eager.items():
        actual = compiled[name]
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=0.0, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")
        zeros = expected == 0
        assert torch.equal(actual[zeros].signbit(), expected[zeros].signbit()), f"{name}: signs of zeros differ"


def test_float64_forward_matches_eager():
    g = torch.Generator().manual_seed(0)
    x = _cat(_angles(1000, g), _SPECIAL)
    u = _cat(_units(1001), _SPECIAL)
    # atan2: every quadrant, ratios across the reduction's branches, and each zero/inf/NaN pair.
    special_y, special_x = torch.meshgrid(torch.tensor([0.0, -0.0, 1.0, -1.0, _INF, -_INF, _NAN], dtype=torch.float64),
                                          torch.tensor([0.0, -0.0, 2.0, -2.0, _INF, -_INF, _NAN], dtype=torch.float64),
                                          indexing="ij")
    r = torch.logspace(-3, 3, 301, dtype=torch.float64)
    phase = torch.rand(301, generator=g, dtype=torch.float64) * 2 * math.pi - math.pi
    y = _cat(r * torch.sin(phase), torch.randn(400, generator=g, dtype=torch.float64) * 1e5, [1e308, 1.5e308, 1e-300],
             special_y)
    x2 = _cat(r * torch.cos(phase), torch.randn(400, generator=g, dtype=torch.float64), [1e308, 1e308, -1e300],
              special_x)
    compiled = torch.compile(_forward, backend="neuron")(x, u, y, x2)
    _assert_matches(compiled, _forward(x, u, y, x2), _RTOL)
    # Exact values eager gives at the special points.
    assert torch.equal(compiled["tanh"][-5:-1], torch.tensor([0.0, -0.0, 1.0, -1.0], dtype=torch.float64))
    assert torch.equal(compiled["atan"][-3:-1], torch.tensor([math.pi / 2, -math.pi / 2], dtype=torch.float64))
    assert compiled["sin"][-3:].isnan().all() and compiled["cos"][-3:].isnan().all()


def _training(*args):
    ops = (torch.sin, torch.cos, torch.tan, torch.tanh, torch.atan, torch.asin, torch.acos)
    outputs = [op(a) for op, a in zip(ops, args)]
    outputs.append(torch.atan2(args[-2], args[-1]))
    return sum(o.sum() for o in outputs), outputs


def test_float64_backward_matches_eager():
    g = torch.Generator().manual_seed(1)
    x = _cat(torch.linspace(-10, 10, 201, dtype=torch.float64),
             (torch.rand(100, generator=g, dtype=torch.float64) - 0.5) * 2e5,
             torch.arange(1, 21, dtype=torch.float64) * (math.pi / 2) + 1e-3, [0.0, -0.0, 1e-300, 1e5])
    u = _cat(torch.linspace(-0.999, 0.999, 300, dtype=torch.float64), [0.0, -0.0, 1e-300])
    y, x2 = torch.randn(2, 323, generator=g, dtype=torch.float64) * torch.logspace(-2, 2, 323, dtype=torch.float64)
    inputs = [x, x, x, x, x, u, u, y, x2]

    def run(fn):
        leaves = [a.clone().requires_grad_() for a in inputs]
        total, outputs = fn(*leaves)
        total.backward()
        return outputs, [leaf.grad for leaf in leaves]

    compiled_out, compiled_grads = run(torch.compile(_training, backend="neuron"))
    eager_out, eager_grads = run(_training)
    for i, (actual, expected) in enumerate(zip(compiled_out, eager_out)):
        torch.testing.assert_close(actual, expected, rtol=_RTOL, atol=0.0, msg=lambda m, i=i: f"output {i}: {m}")
    for i, (actual, expected, (rtol, atol)) in enumerate(zip(compiled_grads, eager_grads, _GRAD_TOL)):
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m, i=i: f"grad {i}: {m}")


def test_float32_keeps_its_lowering_except_sin_and_cos():
    x = torch.cat([torch.linspace(-10, 10, 401), torch.tensor([0.0, -0.0, 1e-20])])
    y = torch.tensor([0.0, -0.0, 0.0, -0.0, _INF, -_INF, 1.0, -1.0])
    x2 = torch.tensor([0.0, -0.0, -0.0, 0.0, _INF, -_INF, -2.0, 3.0])
    # The decompositions step aside for float32 (atan2: general's special-value fixes), except
    # sin and cos, whose IREE float32 versions lose accuracy as |x| grows, and tanh, whose IREE
    # float32 version saturates early; never for integers.
    assert float64_math.atan(x) is NotImplemented and float64_math.sin(x.int()) is NotImplemented
    assert torch.equal(float64_math.atan2(y, x2), torch.atan2(y, x2))

    def fn(x, y, x2):
        return torch.sin(x), torch.cos(x), torch.tanh(x), torch.atan(x), torch.atan2(y, x2)

    compiled = torch.compile(fn, backend="neuron")(x, y, x2)
    for actual, expected in zip(compiled, fn(x, y, x2)):
        assert actual.dtype == torch.float32
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(compiled[-1].signbit(), torch.atan2(y, x2).signbit())


def test_float32_sin_and_cos_stay_accurate_for_large_arguments():
    """IREE's float32 sin/cos were off by 2.8e-4 near 1e4 (rotary angles, positional
    encodings); torch's error stays below 4e-8."""
    x = torch.cat([torch.linspace(-1e5, 1e5, 20001), torch.tensor([0.0, -0.0, _INF, -_INF, _NAN, 1e-30])])

    def fn(x):
        return torch.sin(x), torch.cos(x), torch.sin(x.half()).float()

    got = torch.compile(fn, backend="neuron")(x)
    exact = (torch.sin(x.double()), torch.cos(x.double()))
    for actual, truth in zip(got[:2], exact, strict=True):
        assert ((actual.double() - truth).abs() < 2e-7).sum() == x.numel() - 3  # the 3 NaNs
        assert actual[-3:-1].isnan().all()
    assert torch.equal(got[0][-6:-4].signbit(), torch.tensor([False, True]))  # sin(+-0) = +-0
    # half through float32: one rounding at the end (a last-bit flip at most)
    torch.testing.assert_close(got[2], fn(x)[2], equal_nan=True, rtol=0, atol=1e-3)


def _next_to_poles(k: torch.Tensor, ulps: int) -> torch.Tensor:
    """The float32 values nearest ``k pi/2`` and the ``ulps`` on either side of each."""
    nearest = (k * (math.pi / 2)).float()
    out, up, down = [nearest], nearest, nearest
    for _ in range(ulps):
        up, down = torch.nextafter(up, torch.tensor(_INF)), torch.nextafter(down, torch.tensor(-_INF))
        out += [up, down]
    return torch.cat(out)


def test_float32_tan_stays_accurate_near_poles_and_for_large_arguments():
    """IREE's float32 tan reduced with a single-precision pi: 3e-4 relative at -1.5706 (tan
    -6328), 26 at -1420. The decomposition stays within 4 ulp of the float64 value (torch: 1)
    for |x| up to 1.3e7, next to multiples of pi/2 (tan up to 1e8) included."""
    g = torch.Generator().manual_seed(0)
    ranges = [(torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1) * 10.0 ** e for e in range(8)]
    k = torch.cat([torch.arange(1, 200), torch.randint(200, 8_300_000, (2000,), generator=g)]).double()
    x = torch.cat([*ranges, (torch.rand(100, generator=g, dtype=torch.float64) * 2 - 1) * 1.3e7]).float()
    x = torch.cat([x, _next_to_poles(k, 3), -_next_to_poles(k[:200], 3), torch.tensor([1e-30, -1e-30])])
    specials = torch.tensor([0.0, -0.0, _INF, -_INF, _NAN])

    def fn(x, specials):
        return torch.tan(x), torch.tan(specials), torch.tan(x.half())

    got, got_specials, got_half = torch.compile(fn, backend="neuron")(x, specials)
    exact = torch.tan(x.double())
    ulp = (torch.nextafter(exact.float().abs(), torch.tensor(_INF)) - exact.float().abs()).double()
    assert ((got.double() - exact).abs() / ulp).max() <= 4.0
    assert got_specials[2:].isnan().all() and torch.equal(got_specials[:2].signbit(), torch.tensor([False, True]))
    assert torch.equal(got_specials[:2], specials[:2])
    torch.testing.assert_close(got_half, torch.tan(x.half()), rtol=2e-3, atol=0.0, equal_nan=True)


_SMALL_AND_LARGE = [1e-20, -1e-20, 1e-12, -1e-12, 1e-10, 1e-8, 1e-3, -0.3, 0.7, 0.999, -0.999, 1.0, -1.0, 2.5,
                    -2.5, 30.0, -30.0, 700.0, 709.0, 710.0, -745.0, 1e10, -1e10, 0.0, -0.0, float("inf"),
                    -float("inf"), float("nan"), -1.5]


@pytest.mark.parametrize("name", ["expm1", "log1p", "sinh", "asinh", "atanh", "elu"])
def test_float64_functions_of_small_arguments_keep_their_precision(name):
    """float64 ``expm1(1e-20)`` was 0 and ``expm1(1e-12)`` 8.9e-5 off relatively, ``log1p(1e-10)``
    8e-9 (computed as ``exp(x) - 1`` and ``log(1 + x)``), and so were sinh, asinh, atanh and elu
    of small arguments: now within an ulp or two of torch's, eager and compiled, large ones too."""
    fn = torch.nn.functional.elu if name == "elu" else getattr(torch, name)
    x = torch.tensor(_SMALL_AND_LARGE, dtype=torch.float64)
    expected = fn(x)
    torch._dynamo.reset()
    for got in (fn(x.to("neuron")).cpu(), torch.compile(fn, backend="neuron")(x)):
        torch.testing.assert_close(got, expected, rtol=1e-15, atol=0, equal_nan=True)
        finite = ~expected.isnan()
        assert torch.equal(got[finite].signbit(), expected[finite].signbit())


def test_elu_selu_and_celu_of_small_negative_float32_and_half_arguments_keep_their_precision():
    """torch-mlir lowers elu's negative side as ``exp(x) - 1``: float32 ``elu(-1e-6)`` was 1.3% off
    and ``elu(-1e-8)`` 0 (a SAC policy's ELU layers, selu and celu too). Eager, within an ulp or two."""
    functions = (torch.nn.functional.elu, torch.nn.functional.selu, lambda t: torch.nn.functional.celu(t, 0.5))
    for dtype, rtol in ((torch.float32, 3e-7), (torch.bfloat16, 0.0), (torch.float16, 0.0)):
        x = torch.tensor([-1e-4, -1e-6, -1e-8, -3.0, 2.0, 0.0, -0.0, float("nan")], dtype=dtype)
        for fn in functions:
            torch.testing.assert_close(fn(x.to("neuron")).cpu(), fn(x), rtol=rtol, atol=0, equal_nan=True)


def test_float32_tanh_saturates_where_torchs_does():
    """IREE's float32 tanh was exactly +-1 from |x| = 8 (torch's from 9.01, 2 ulp off before): a
    SAC policy's ``TanhTransform().log_prob`` was NaN. Now within an ulp, signed zeros, NaN and
    infinities as torch's; half types through float32."""
    x = torch.cat([torch.linspace(-12, 12, 4801), torch.tensor([0.0, -0.0, 1e-30, -1e-8, float("nan"),
                                                                 float("inf"), -float("inf")])])
    expected, got = torch.tanh(x), torch.tanh(x.to("neuron")).cpu()
    torch.testing.assert_close(got, expected, rtol=0, atol=6e-8, equal_nan=True)
    assert torch.equal(got.abs() == 1, expected.abs() == 1) and torch.equal(got.signbit(), expected.signbit())
    for dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(torch.tanh(x.to(dtype).to("neuron")).cpu(), torch.tanh(x.to(dtype)), equal_nan=True)


def test_float64_tanh_gelu_and_its_backward_compile_and_run_on_the_device():
    """float64 ``gelu(approximate="tanh")`` linked libm's float64 tanh, which IREE lacks ("undefined
    symbol: tanh"): compiled it failed, on the eager device it ran on the CPU. Through torch's
    reference and our tanh now."""
    from torch_neuronx import observe

    x = torch.linspace(-6, 6, 97, dtype=torch.float64)

    def gelu(t):
        return torch.nn.functional.gelu(t, approximate="tanh")

    leaf, ref_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = torch.compile(gelu, backend="neuron")(leaf)
    want = gelu(ref_leaf)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-15)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-12, atol=1e-14)
    before = observe.counter("eager_fallbacks")
    torch.testing.assert_close(gelu(x.to("neuron")).cpu(), want.detach(), rtol=1e-13, atol=1e-15)
    assert observe.counter("eager_fallbacks") == before
