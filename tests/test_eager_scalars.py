"""Python floats of eager ops are runtime inputs of their kernels: training loops stop compiling."""

from __future__ import annotations

import math

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)
from torch_neuronx import config
from torch_neuronx.device import choice, eager, scalars


@pytest.fixture(autouse=True)
def _no_promotion(monkeypatch):
    """Counts of kernels here are about numbers: a shape that an earlier test file (same worker)
    kept calling may be promoted to a kernel of its own when it comes back (its first call there
    long enough ago); that is ``test_eager_dynamic_shapes``' subject, not this file's."""
    monkeypatch.setattr(choice, "PROMOTE_AFTER_S", math.inf)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _optimizers():
    return {
        "adamw": lambda p: (torch.optim.AdamW(p, lr=1e-2), None),
        "adam": lambda p: (torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3), None),
        "sgd_scheduled": lambda p: (opt := torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                    torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)),
    }


def _train(device: str, make, steps: int, compiled_after: list[int] | None = None,
           dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    model = _model().to(device, dtype)
    opt, scheduler = make(model.parameters())
    torch.manual_seed(1)
    x, y = torch.randn(4, 6, dtype=dtype), torch.randn(4, 2, dtype=dtype)
    x, y = x.to(device), y.to(device)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if scheduler is not None:
            scheduler.step()
        if compiled_after is not None:
            compiled_after.append(len(eager._kernels))
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("name", list(_optimizers()))
def test_training_loops_stop_compiling_after_their_first_steps(name):
    make = _optimizers()[name]
    kernels: list[int] = []
    on_neuron = _train("neuron", make, 6, kernels)
    on_cpu = _train("cpu", make, 6)
    # Optimizer state appears in the first step and its updates in the second; a shape first run on
    # its family's dynamic kernel gets its own at its next call: nothing compiles after step 3.
    assert kernels[3:] == [kernels[2]] * 3, f"kernels compiled after step 3: {kernels}"
    for a, b in zip(on_neuron, on_cpu):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _per_tensor_optimizers():
    """Optimizers whose per-parameter (``foreach=False``) steps pass their step-dependent numbers to
    single-tensor ops, and a hand-written EMA whose decay warms up."""
    class WarmingEMA:
        def __init__(self, params):
            self.params, self.shadow, self.n = list(params), None, 0

        def step(self):
            self.n += 1
            decay = min(0.999, (1 + self.n) / (10 + self.n))
            if self.shadow is None:
                self.shadow = [p.detach().clone() for p in self.params]
            with torch.no_grad():
                for s, p in zip(self.shadow, self.params):
                    s.lerp_(p, 1 - decay)
                    p.sub_(p.grad, alpha=0.1 * decay)

        def zero_grad(self):
            for p in self.params:
                p.grad = None

    return {
        "adam": lambda p: (torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3, foreach=False), None),
        "sgd_scheduled": lambda p: (opt := torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
                                    torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)),
        "warming_ema": lambda p: (WarmingEMA(p), None),
    }


@pytest.mark.parametrize("name", [  # (CI time: float32's Adam and AdamW stay in the fast suite)
    pytest.param(n, marks=pytest.mark.slow) if n == "adam" else n for n in _per_tensor_optimizers()])
def test_half_precision_training_loops_stop_compiling_after_their_first_steps(name):
    """float16/bfloat16 numbers were constants of their kernels: a per-tensor optimizer's bias
    corrections, a scheduled learning rate or a warming EMA's decay compiled kernels every step.
    (bfloat16: float16 Adam's eps of 1e-8 is 0, and its steps divide by zero on the CPU too.)"""
    make, dtype = _per_tensor_optimizers()[name], torch.bfloat16
    kernels: list[int] = []
    on_neuron = _train("neuron", make, 6, kernels, dtype)
    on_cpu = _train("cpu", make, 6, dtype=dtype)
    assert kernels[3:] == [kernels[2]] * 3, f"kernels compiled after step 3: {kernels}"
    for a, b in zip(on_neuron, on_cpu):  # (the matrix products may round differently)
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


_CASES = {
    "add_alpha": lambda x, y: torch.add(x, y, alpha=0.37),
    "sub_alpha": lambda x, y: torch.sub(x, y, alpha=-1.5),
    "addcdiv": lambda x, y: torch.addcdiv(x, y, y.abs() + 1, value=-0.0123),
    "addcmul": lambda x, y: torch.addcmul(x, y, y, value=0.25),
    "lerp": lambda x, y: torch.lerp(x, y, 0.3),
    "mul_scalar": lambda x, y: x.mul(2.5),
    "div_scalar": lambda x, y: x.div(0.7),
    "div_tensor_slot": lambda x, y: x / 0.0547,
    "rsub": lambda x, y: 1.25 - x,
    "where": lambda x, y: torch.where(x > 0, x, -0.5),
    "minus_zero": lambda x, y: x * -0.0,
    "nan": lambda x, y: x + math.nan,
    "int_add": lambda x, y: x + 3,
    "int_alpha": lambda x, y: torch.add(x, y, alpha=2),
    "int_rdiv": lambda x, y: x / 7,
    "int_beyond_float32": lambda x, y: x * (2**40 + 1) - 2**40,
    "int_where": lambda x, y: torch.where(x > 0, x, -2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(_CASES))
def test_runtime_scalars_compute_what_eager_does(case, dtype):
    torch.manual_seed(2)
    x, y = torch.randn(3, 4, dtype=dtype), torch.randn(3, 4, dtype=dtype)
    expected = _CASES[case](x, y)
    got = _CASES[case](x.to("neuron"), y.to("neuron"))
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    if case == "minus_zero":
        assert torch.equal(torch.signbit(got.cpu()), torch.signbit(expected))


_HALF_CASES = {
    **{name: _CASES[name] for name in ("add_alpha", "sub_alpha", "addcdiv", "addcmul", "lerp", "mul_scalar",
                                       "div_scalar", "div_tensor_slot", "rsub", "minus_zero", "int_add",
                                       "int_alpha", "int_rdiv")},
    "add": lambda x, y: x + 0.1234567,
    "sub_int_beyond_half": lambda x, y: x - 70001,
    "mul_beyond_half": lambda x, y: x * 1e5,     # float32 arithmetic, rounded once: inf only where it is
    "div_beyond_half": lambda x, y: x / 1e-7,
    "lerp_large_weight": lambda x, y: torch.lerp(x, y, 0.7),
    "lerp_ema": lambda x, y: x.clone().lerp_(y, 1 - 0.999),  # 0.999 is 1.0 in bfloat16
    "addcdiv_": lambda x, y: x.clone().addcdiv_(y, y.abs() + 0.5, value=-3.3333333),
    "addcmul_": lambda x, y: x.clone().addcmul_(y, y, value=1 - 0.999),
    "mul_": lambda x, y: x.clone().mul_(0.9),
    "add_": lambda x, y: x.clone().add_(y, alpha=-0.0123),
    "gt": lambda x, y: x > 0.1234567,
    "le": lambda x, y: x <= -1.0001,
    "eq_int": lambda x, y: x == 3,
    "nan": lambda x, y: x * math.nan,
    "addcmul_loss_scale": lambda x, y: x.clone().addcmul_(y, y, value=65536.0),  # float32 values: no overflow
    "addcdiv_large": lambda x, y: torch.addcdiv(x, y, y.abs() + 1, value=1e5),
    "pow_tiny": lambda x, y: x.abs() ** 1e-8,  # the exponent rounded first: float16's 0
    "rpow": lambda x, y: 1e5 ** (x / 8),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runtime_scalars_are_eagers_bits(dtype):
    """float16/bfloat16 ops take their numbers at run time as float32 and use them as eager's kernels
    do: multiplied and divided as they are, added and compared after rounding to the tensors' dtype,
    all in float32 and rounded once. Bit for bit on many values. (Sizes are multiples of the CPU's
    vector width: torch computes the leftover elements of a vectorized loop another way.)"""
    torch.manual_seed(3)
    x, y = (torch.randn(4096) * 4).to(dtype), (torch.randn(4096) * 4).to(dtype)
    x[:3] = torch.tensor([3.0, -0.0, 65504.0 if dtype == torch.float16 else 1e30])
    nx, ny = x.to("neuron"), y.to("neuron")
    for name, case in _HALF_CASES.items():
        expected, got = case(x, y), case(nx, ny)
        assert got.dtype == expected.dtype, name
        assert torch.equal(got.cpu().view(-1).float().nan_to_num(7.0),
                           expected.view(-1).float().nan_to_num(7.0)), name
        if got.is_floating_point():
            numbers = ~torch.isnan(expected)
            assert torch.equal(torch.signbit(got.cpu()[numbers]), torch.signbit(expected[numbers])), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_ops_compile_once_for_every_value(dtype):
    x = torch.randn(64, 8).to(dtype)  # (a multiple of the CPU's vector width, as above)
    nx = x.to("neuron")

    def ops(t: torch.Tensor, v: float) -> list[torch.Tensor]:
        return [t * v, t + v, v - t, t / v, t.clone().lerp_(t, v), t > v, torch.add(t, t, alpha=v)]

    for v in (0.5, 1.5):
        [r.cpu() for r in ops(nx, v)]
    before = set(eager._kernels)
    for v in (3.5, 0.001, -2.25, 7):
        for got, expected in zip(ops(nx, v), ops(x, v), strict=True):
            assert torch.equal(got.cpu(), expected)
    assert set(eager._kernels) - before == set()


def test_half_precision_numbers_keep_one_dynamic_kernel_per_op():
    """The numbers that torch rounds to bfloat16 are rounded on the host: rounded in the kernel, a
    dynamic-shape kernel failed to compile ("op was not bufferized"), so every shape compiled one."""
    from torch_neuronx.device import kernels

    for n in (64, 128, 192, 256):
        x = torch.randn(n).to(torch.bfloat16)
        nx = x.to("neuron")
        for op in (lambda t: t + 0.1234567, lambda t: t > 0.1234567, lambda t: 0.77 - t):
            assert torch.equal(op(nx).cpu(), op(x))
    dynamic = {k[1]: v for k, v in eager._kernels.items() if k[0] == "dynamic" and "bfloat16" in str(k)}
    for name in ("aten.add.Tensor", "aten.gt.Scalar", "aten.rsub.Scalar"):
        assert name in dynamic and dynamic[name] is not kernels.STATIC, name


def test_one_kernel_serves_every_value():
    x = torch.randn(5, 3).to("neuron")
    results = [(x * v).cpu() for v in (0.5, 1.5, -2.25)]
    before = len(eager._kernels)
    more = [(x * v).cpu() for v in (3.5, 7.0, -0.125)]
    assert len(eager._kernels) == before
    for v, got in zip((0.5, 1.5, -2.25, 3.5, 7.0, -0.125), results + more):
        torch.testing.assert_close(got, x.cpu() * v)


@pytest.mark.parametrize(("make", "expected_dtype"), [
    (lambda: torch.arange(4).to("neuron") * 0.5, torch.float32),                         # ints keep constants
    (lambda: torch.tensor(3.0).to("neuron") * 0.1, torch.float32),                       # 0-d float32
    (lambda: torch.tensor(3.0, dtype=torch.bfloat16).to("neuron") * 0.1, torch.bfloat16),  # half types too
])
def test_result_dtypes_follow_eagers_promotion(make, expected_dtype):
    assert make().dtype == expected_dtype


def test_scalar_tensors_are_cached_per_value_and_dtype(monkeypatch):
    a = scalars.scalar_tensor(0.123, torch.float32)
    assert scalars.scalar_tensor(0.123, torch.float32) is a
    assert scalars.scalar_tensor(0.123, torch.float64) is not a
    assert scalars.scalar_tensor(-0.0, torch.float32) is not scalars.scalar_tensor(0.0, torch.float32)
    with config.override(TORCH_NEURONX_ENABLE_SCALAR_CACHE=False):
        assert scalars.scalar_tensor(0.123, torch.float32) is not a


def test_a_loop_over_integer_steps_compiles_once():
    """``x * step`` and ``x + step`` with a Python int that changes every step: one kernel each,
    the int a runtime input as a float is (integer tensors' ints too, where they fit)."""
    x = torch.randn(4, 3)
    nx = x.to("neuron")
    for step in (0, 1):  # (a shape that comes back may get a kernel of its own: dynamic shapes)
        (nx * step + step).cpu()
    before = len(eager._kernels)
    for step in range(2, 8):
        torch.testing.assert_close((nx * step + step).cpu(), x * step + step)
    assert len(eager._kernels) == before
    ints = torch.arange(6).to("neuron")
    assert torch.equal((ints * 3 + 2**40).cpu(), torch.arange(6) * 3 + 2**40)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_a_generation_loops_positions_and_lengths_compile_once(dtype):
    """A generation loop's ``cache_position + step``, ``length == max_length``, ``limit - pos`` and
    ``pos < n`` on integer tensors, with a number new every token: each compiled a kernel per
    value (its number baked in), so every token compiled again. Numbers beyond the dtype, floats
    with integer tensors, and narrow integer dtypes keep eager's values (as constants)."""
    pos = torch.arange(5, dtype=dtype)
    npos = pos.to("neuron")

    def step(t: torch.Tensor, n: int) -> list[torch.Tensor]:
        return [t + n, t == n, t != n, n - t, t < n, t >= n, t * n, t // max(n, 1) if not dtype.is_floating_point
                else t / n]

    for n in (1, 2):  # (a shape or value seen twice may get a kernel of its own)
        [r.cpu() for r in step(npos, n)]
    before = set(eager._kernels)
    for n in range(3, 12):
        for got, expected in zip(step(npos, n), step(pos, n), strict=True):
            assert got.dtype == expected.dtype
            torch.testing.assert_close(got.cpu(), expected)
    assert set(eager._kernels) - before == set()
    if not dtype.is_floating_point:
        big = 2**31 + 5  # beyond int32: eager computes in the tensor's dtype with the number wrapped
        for got, expected in zip(step(npos, big), step(pos, big), strict=True):
            assert got.dtype == expected.dtype
            torch.testing.assert_close(got.cpu(), expected)
        torch.testing.assert_close((npos + 2.5).cpu(), pos + 2.5)
        torch.testing.assert_close((npos == 2.0).cpu(), pos == 2.0)
        narrow = torch.tensor([0, 5, 255], dtype=torch.uint8)
        torch.testing.assert_close((narrow.to("neuron") - 1).cpu(), narrow - 1)
        torch.testing.assert_close((1 - narrow.to("neuron")).cpu(), 1 - narrow)


_NUMBER_OPS = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b,
    "add": lambda a, b: a + b, "add_": lambda a, b: a.clone().add_(b), "mul": lambda a, b: a * b,
    "remainder": lambda a, b: a % b, "fmod": torch.fmod, "floordiv": lambda a, b: a // b,
    "full_like": torch.full_like, "fill_": lambda a, b: a.clone().fill_(b),
    "where": lambda a, b: torch.where(a > 0, a, b), "sub": lambda a, b: a - b,
    "alpha": lambda a, b: torch.add(a, a, alpha=b),
}


@pytest.mark.parametrize("dtype", [torch.bool, pytest.param(torch.int8, marks=pytest.mark.slow), torch.float16])
def test_numbers_of_another_kind_than_the_tensor_give_eagers_values_and_errors(dtype):
    """A number the tensor's dtype cannot hold: ``bool_mask == 2`` was the mask (2 made True),
    ``bool + True`` a xor, ``full_like(mask, 2)`` False, ``int % 2.5`` an int64 ``% 2``,
    ``where(h > 0, h, 1e10)`` of float16 raised, ``full_like(int8, 300)`` wrapped to 44, ``mask - 1``
    and ``add(int8, int8, alpha=300)`` computed: the CPU's values, dtypes and errors."""
    values = {torch.bool: [True, False, True], torch.float16: [2.0, 65504.0, -0.1]}.get(dtype, [7, 100, 0])
    t = torch.tensor(values, dtype=dtype)
    for number in (2, 2.5, True, 300) if dtype != torch.float16 else (2.5, 1e10):
        for name, op in _NUMBER_OPS.items():
            try:
                expected = op(t, number)
            except RuntimeError as exc:
                with pytest.raises(RuntimeError) as raised:
                    op(t.to("neuron"), number).cpu()
                if "not implemented for" not in str(exc):  # a CPU kernel's name: no such kernel here
                    assert str(raised.value).startswith(str(exc)[:40]), (name, number, str(exc))
                continue
            got = op(t.to("neuron"), number).cpu()
            assert got.dtype == expected.dtype, (name, number)
            torch.testing.assert_close(got, expected, equal_nan=True, msg=f"{name} of {dtype} and {number}")
