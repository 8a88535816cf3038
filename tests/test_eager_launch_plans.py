"""Launch plans (device/launch.py): a repeated eager call takes its recorded route, and that route
gives the same values as the whole way through the eager device, for every kind of argument a plan
keeps (tensors of any strides and devices, runtime floats, constant ints, several results), on any
stream; and nothing that could change the route is skipped (the kernel registry, the variables it
reads, listeners, configuration overrides)."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import observe
from torch_neuronx.device import eager, launch

aten = torch.ops.aten


def _plan_of(func, *args, **kwargs):
    return launch._plans.get(launch.signature(func, args, kwargs))


def _twice(fn):
    """``fn()`` three times (the first records the plan), each result compared on the host."""
    results = [fn() for _ in range(3)]
    torch.neuron.synchronize()
    return results


def test_a_repeated_call_takes_its_plan_and_gives_eagers_values():
    x = torch.randn(7, 5)
    y = torch.randn(7, 5)
    nx, ny = x.to("neuron"), y.to("neuron")
    for out in _twice(lambda: nx * ny + nx):
        torch.testing.assert_close(out.cpu(), x * y + x)
    assert _plan_of(aten.mul.Tensor, nx, ny) is not None
    assert _plan_of(aten.add.Tensor, nx * ny, nx) is not None


def test_runtime_floats_of_a_plan_take_each_calls_value():
    x = torch.randn(6, 4)
    nx = x.to("neuron")
    values = [0.5, -3.25, 0.0, -0.0, 1e-7, float("inf")]
    outs = [nx * v for v in values] + [nx.add(nx, alpha=2.5)]
    torch.neuron.synchronize()
    for out, v in zip(outs, values):
        torch.testing.assert_close(out.cpu(), x * v)
    assert _plan_of(aten.mul.Tensor, nx, 0.5) is not None
    # A float that stays a constant of the kernel (an integer tensor's: no runtime scalar) keeps no plan
    # that another value could take.
    xi = torch.arange(12).reshape(3, 4)
    ni = xi.to("neuron")
    for v in (0.5, 0.25, 3.0):
        torch.testing.assert_close((ni * v).cpu(), xi * v)


def test_constant_ints_strides_and_several_results_key_their_plans():
    x = torch.randn(5, 8)
    nx = x.to("neuron")
    t = nx.t()  # a transposed view: other strides, another plan
    for _ in range(2):
        torch.testing.assert_close(torch.cumsum(nx, 0).cpu(), torch.cumsum(x, 0))
        torch.testing.assert_close(torch.cumsum(nx, 1).cpu(), torch.cumsum(x, 1))
        torch.testing.assert_close((t + 1.5).cpu(), x.t() + 1.5)
        low, high = torch.aminmax(nx)
        torch.testing.assert_close((low.cpu(), high.cpu()), tuple(torch.aminmax(x)))
        mantissa, exponent = torch.frexp(nx)
        torch.testing.assert_close((mantissa.cpu(), exponent.cpu()), tuple(torch.frexp(x)))
    assert _plan_of(aten.cumsum.default, nx, 0) is not _plan_of(aten.cumsum.default, nx, 1)
    assert _plan_of(aten.aminmax.default, nx) is not None
    assert _plan_of(aten.frexp.Tensor, nx) is not None


def test_in_place_ops_use_their_functional_plan():
    x = torch.randn(4, 4)
    acc = torch.zeros(4, 4)
    nx, nacc = x.to("neuron"), acc.to("neuron")
    for step in range(4):
        nacc.add_(nx, alpha=0.5) if step % 2 else nacc.mul_(0.9).add_(nx)
        acc.add_(x, alpha=0.5) if step % 2 else acc.mul_(0.9).add_(x)
    torch.testing.assert_close(nacc.cpu(), acc)
    assert _plan_of(aten.mul.Tensor, nacc, 0.9) is not None
    assert _plan_of(aten.add.Tensor, nacc, nx, alpha=0.5) is not None


def test_keywords_and_lists_of_ints_key_their_plans():
    x = torch.randn(4, 6, 5)
    nx = x.to("neuron")
    for _ in range(2):
        for dims, keep in (([1], True), ([1], False), ([0, 2], False), ([2], True)):
            torch.testing.assert_close(nx.sum(dims, keepdim=keep).cpu(), x.sum(dims, keepdim=keep))
        for alpha in (0.5, -2.0):
            torch.testing.assert_close(torch.add(nx, nx, alpha=alpha).cpu(), x + alpha * x)
    assert _plan_of(aten.add.Tensor, nx, nx, alpha=0.5) is _plan_of(aten.add.Tensor, nx, nx, alpha=-2.0)


def test_a_plan_runs_on_the_current_stream():
    x = torch.randn(16, 16)
    nx = x.to("neuron")
    nx + nx  # the plan, made on the default stream
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        out = nx + nx
    assert out._allocation.writer is None or out._allocation.writer.queue is side._queue
    side.synchronize()
    torch.testing.assert_close(out.cpu(), x + x)


def test_a_changed_kernel_registry_drops_the_plans(monkeypatch):
    x = torch.randn(3, 3)
    nx = x.to("neuron")
    torch.testing.assert_close((nx - nx).cpu(), torch.zeros(3, 3))
    torch.testing.assert_close((nx - nx).cpu(), torch.zeros(3, 3))
    assert _plan_of(aten.sub.Tensor, nx, nx) is not None
    key = next(k for k in eager._kernels if k[0] == "aten.sub.Tensor" and k[1][0][1] == (3, 3))
    real = eager._kernels[key]

    class Failing:
        def __getattr__(self, name):
            return getattr(real.compiled, name)

        def run_into(self, *args, **kwargs):
            raise RuntimeError("injected failure")

        def __call__(self, *args, **kwargs):
            raise RuntimeError("injected failure")

    injected = type(real).__new__(type(real))
    for slot in type(real).__slots__:
        setattr(injected, slot, getattr(real, slot))
    injected.compiled = Failing()
    monkeypatch.setitem(eager._kernels, key, injected)
    monkeypatch.setenv("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "1")  # raise, no CPU fallback
    out = nx - nx  # a stale plan would run the kernel the registry no longer holds
    try:
        out.cpu()
    except Exception as exc:
        assert "injected failure" in str(exc)
    else:
        raise AssertionError("a stale plan ran the kernel the registry no longer holds")
    monkeypatch.undo()
    try:
        torch.neuron.synchronize()
    except Exception:
        pass  # the stream reports the failure once more
    torch.testing.assert_close((nx - nx).cpu(), torch.zeros(3, 3))


def test_a_changed_variable_or_a_listener_takes_the_whole_way(monkeypatch):
    x = torch.randn(8, 3)
    nx = x.to("neuron")
    for _ in range(2):
        nx * 2.0
    assert launch._plans
    monkeypatch.setenv("TORCH_NEURONX_EAGER_DYNAMIC_SHAPES", "0")
    torch.testing.assert_close((nx * 2.0).cpu(), x * 2.0)
    assert _plan_of(aten.mul.Tensor, nx, 2.0) is not None  # made again under the new value
    monkeypatch.delenv("TORCH_NEURONX_EAGER_DYNAMIC_SHAPES")
    seen = []
    with observe.listening(lambda event: seen.append(event.name)):
        nx * 2.0
        nx * 2.0
    assert seen.count("eager.op") == 2  # listeners see every op: plans step aside


@pytest.fixture
def static_kernels(monkeypatch):
    """Kernels of their own shape (a direct run serves a static kernel: an op family that met other
    shapes earlier in the process runs a new one on its dynamic kernel first)."""
    monkeypatch.setenv("TORCH_NEURONX_EAGER_DYNAMIC_SHAPES", "0")


def _direct_plan(func, *args, **kwargs):
    plan = _plan_of(func, *args, **kwargs)
    assert plan is not None and plan.direct is not None, "a small call on an idle stream runs its kernel directly"
    return plan


def test_direct_runs_read_and_write_each_calls_memory(static_kernels):
    """A small kernel on an idle stream runs at once, its argument lists kept by address: every call
    must still read its own inputs and write its own outputs, whatever memory earlier calls used
    (views at other offsets, misaligned ones, negated views, memory freed and handed out again)."""
    base = torch.randn(40, 16)
    nbase = base.to("neuron")
    for offset in (0, 1, 2, 16, 3, 0, 1):  # the same shape and strides: one plan; offsets 1-3 misaligned
        out = nbase[offset:offset + 8] + nbase[offset + 8:offset + 16]
        torch.testing.assert_close(out.cpu(), base[offset:offset + 8] + base[offset + 8:offset + 16])
    _direct_plan(aten.add.Tensor, nbase[:8], nbase[8:16])
    x = torch.randn(8, 16)
    nx = x.to("neuron")
    for negated in (False, True, False, True):  # the same address, with and without the negation bit
        operand = torch._neg_view(nx) if negated else nx
        torch.testing.assert_close((operand * 2.0).cpu(), (-x if negated else x) * 2.0)
    for k in range(6):  # freed memory handed out again: other values at the addresses of earlier calls
        a = nx * float(k)
        out = a + a
        torch.testing.assert_close(out.cpu(), x * k * 2)
        del a, out
    _direct_plan(aten.add.Tensor, nx, nx)


def test_direct_runs_tell_views_of_one_address_apart(static_kernels):
    """Views that start at one address with one shape (a square matrix and its transpose, a
    reinterpreting dtype view) are different arguments: ``x.t().sum(0)`` summed ``x``'s columns
    once ``x.sum(0)`` had run (the kept import was keyed by address, shape and dtype alone)."""
    a = torch.randn(6, 6)
    na = a.to("neuron")
    for _ in range(3):
        torch.testing.assert_close(na.sum(0).cpu(), a.sum(0))
        torch.testing.assert_close(na.t().sum(0).cpu(), a.t().sum(0))
        torch.testing.assert_close(na.t().contiguous().sum(1).cpu(), a.t().sum(1))
        torch.testing.assert_close((na.view(torch.int32) + 1).cpu(), a.view(torch.int32) + 1)
        freed = (na * 3).cpu()  # a contiguous 6x6 block freed, whose address a 0-d tensor may take next
        del freed
        one = torch.ones((), device="neuron")
        torch.testing.assert_close((one.expand(6, 6) * 3).cpu(), torch.full((6, 6), 3.0))  # (autograd's sum backward)
    _direct_plan(aten.sum.dim_IntList, na, [0])


def test_direct_runs_of_other_dtypes_and_several_results(static_kernels):
    i = torch.randint(-50, 50, (6, 10))
    ni = i.to("neuron")
    b = i > 0
    nb = b.to("neuron")
    h = torch.randn(6, 10).to(torch.bfloat16)
    nh = h.to("neuron")
    x = torch.randn(6, 10)
    nx = x.to("neuron")
    for _ in range(4):
        torch.testing.assert_close((ni + ni).cpu(), i + i)
        torch.testing.assert_close(torch.logical_and(nb, ~nb).cpu(), torch.logical_and(b, ~b))
        torch.testing.assert_close((nh * nh).cpu(), h * h)
        low, high = torch.aminmax(nx, dim=1)
        expected = torch.aminmax(x, dim=1)
        torch.testing.assert_close(low.cpu(), expected.min)
        torch.testing.assert_close(high.cpu(), expected.max)
    _direct_plan(aten.add.Tensor, ni, ni)
    _direct_plan(aten.aminmax.default, nx, dim=1)


def test_a_failing_direct_run_takes_the_whole_way(monkeypatch, static_kernels):
    """A direct run that raises (an executable that refuses the call) leaves the op to its whole way
    through the stream's work, which runs the kernel again or falls back: the values are right."""
    x = torch.randn(5, 7)
    nx = x.to("neuron")
    for _ in range(3):
        nx - nx * 0.5
    torch.neuron.synchronize()
    plan = _direct_plan(aten.sub.Tensor, nx, nx * 0.5)
    calls = []

    def refuse(tensors, storage):
        calls.append(len(tensors))
        raise RuntimeError("refused")

    monkeypatch.setattr(plan, "direct", refuse)
    out = nx - nx * 0.5
    torch.testing.assert_close(out.cpu(), x - x * 0.5)
    torch.neuron.synchronize()
    assert calls == [2]


def test_direct_runs_in_threads_on_their_own_streams():
    import threading

    errors, results = [], {}

    def work(k):
        try:
            with torch.neuron.stream(torch.neuron.Stream()):
                x = torch.full((4, 9), float(k)).to("neuron")
                acc = x
                for _ in range(50):
                    acc = acc + x
                results[k] = acc.cpu()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    for k in range(1, 4):
        torch.testing.assert_close(results[k], torch.full((4, 9), 51.0 * k))
