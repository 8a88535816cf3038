"""One eager kernel per op family: dimensions of size 2 and up are dynamic.

An op family's first two shapes get kernels for their shapes; its third shape gets the family's
kernel traced with symbolic sizes once per *dynamic key* (op, ranks, which sizes are 0 or 1 or
equal to an int argument, which sizes are equal to each other, dtypes, other arguments),
lowered to linalg-on-tensors and compiled once; that kernel serves every later size. Ops whose
trace depends on a size keep one kernel per shape. Every result is compared with the CPU's, at
sizes the kernel was not traced with. A shape that comes back gets a kernel of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401  (registers the neuron device)
from torch_neuronx import config, metrics
from torch_neuronx.pipeline.shapes import ShapeFunction


def _compiles() -> int:
    return metrics.counter("eager_ops_compiled")


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-5)


def _block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
    """A transformer-ish mix: linear, activation, softmax, layer norm, reductions, a loss, cat."""
    h = F.gelu(F.linear(x, w, b))
    p = torch.softmax(h * 0.5 + 1, dim=-1)
    n = F.layer_norm(h, (h.shape[-1],))
    loss = F.cross_entropy(h, labels)
    return [h, p, n, n.sum(0), p.mean(), loss, torch.cat([h, n], 0), torch.where(h > 0, h, n)]


def test_index_ops_check_their_bounds_at_every_size():
    """Index checks of a dynamic kernel read the indexed size from the call, not the trace."""
    for rows in (5, 9, 14):
        table, picks = torch.randn(rows, 6), torch.tensor([0, rows - 1, -rows, 2])
        _close(table.to("neuron")[picks.to("neuron")], table[picks])
        _close(F.embedding((picks % rows).to("neuron"), table.to("neuron")), F.embedding(picks % rows, table))
        with pytest.raises(IndexError, match=f"index {rows} is out of bounds for dimension 0 with size {rows}"):
            table.to("neuron")[torch.tensor([1, rows]).to("neuron")].cpu()
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(torch.tensor([rows]).to("neuron"), table.to("neuron")).cpu()
        grown = torch.zeros(rows, 6).index_add(0, torch.tensor([1, 1, rows - 1]), torch.ones(3, 6))
        on = torch.zeros(rows, 6).to("neuron").index_add(0, torch.tensor([1, 1, rows - 1]).to("neuron"),
                                                           torch.ones(3, 6).to("neuron"))
        _close(on, grown)


def test_one_kernel_serves_every_batch_size():
    torch.manual_seed(0)
    w, b = torch.randn(24, 40), torch.randn(24)
    for step, batch in enumerate((3, 7, 12, 29, 17)):
        x, labels = torch.randn(batch, 40), torch.randint(0, 24, (batch,))
        on_device = [t.to("neuron") for t in (x, w, b, labels)]
        before = _compiles()
        for actual, expected in zip(_block(*on_device), _block(x, w, b, labels)):
            _close(actual, expected)
        if step > 2:  # the third batch size compiled the dynamic kernels the others need
            assert _compiles() == before, f"batch {batch} compiled {_compiles() - before} new kernels"


def _signs(x: torch.Tensor) -> list[torch.Tensor]:
    return [torch.signbit(x), torch.copysign(torch.ones_like(x), x), x.sin(), torch.atan2(x, x - 1),
            torch.remainder(x, 0.7)]


def test_sign_bit_ops_get_one_kernel_and_keep_nan_and_zero_signs():
    """``signbit``/``copysign`` (and ``sin``, ``atan2``, ``remainder`` through them) bitcast
    floats to integers; their dynamic kernels lower (the bitcast was a linalg lowering failure,
    then a decomposition that read every NaN as positive: x86's default NaN is negative)."""
    for step, rows in enumerate((3, 4, 6, 9, 13)):
        x = torch.randn(rows, 8)
        x[0, :6] = torch.tensor([0.0, -0.0, 1.0, -1.0, float("nan"), -float("nan")])
        before = _compiles()
        results = list(zip(_signs(x.to("neuron")), _signs(x)))
        for actual, expected in results:
            torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-5, equal_nan=True)
        (bits, expected_bits), (ones, expected_ones) = results[:2]  # the sign bits themselves, NaNs' too
        assert torch.equal(bits.cpu(), expected_bits) and torch.equal(ones.cpu(), expected_ones)
        if step > 2:
            assert _compiles() == before, f"{rows} rows compiled {_compiles() - before} new kernels"


def _bounded(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    return [x.clamp(-1, 1), x.clamp(min=0.5), x.clamp(max=0.5), x.clamp(y - 1, y + 1), torch.maximum(x, y),
            torch.minimum(y, x), F.hardtanh(x), F.relu6(x), F.hardsigmoid(x), x.clamp_min(y)]


def test_clamps_maxima_and_minima_keep_nan_on_the_dynamic_kernel():
    """torch-mlir's linalg lowering (dynamic kernels) selected the bound or the other operand for a
    NaN (``clamp(NaN, -1, 1)`` was -1); the CPU check of a new dynamic kernel saw no NaN."""
    for step, rows in enumerate((3, 4, 6, 9, 13)):
        x, y = torch.randn(rows, 5) * 3, torch.randn(rows, 5)
        if step > 2:  # NaN only once the dynamic kernels were made (and checked) without it
            x[0, 0], y[1, 1], x[2, 2], y[2, 2] = (float("nan"),) * 4
        for actual, expected in zip(_bounded(x.to("neuron"), y.to("neuron")), _bounded(x, y), strict=True):
            torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_the_check_of_a_dynamic_kernel_with_a_device_argument_runs_no_op_on_the_cpu():
    """The check of a new dynamic kernel computed the CPU reference of ``new_zeros(..., device=...)``
    (autograd's index backward calls it) on the device, then warned that ``allclose`` ran on the CPU."""
    before = metrics.counter("eager_fallbacks")
    for rows in (3, 4, 6, 9):
        x = torch.randn(rows, 1).to("neuron")
        made = [torch.ops.aten.new_zeros.default(x, [12, 2, 1], device=x.device),
                torch.ops.aten.new_full.default(x, [3, 5], 2.5, device=x.device)]
        assert [t.device.type for t in made] == ["neuron", "neuron"]
        assert torch.equal(made[0].cpu(), torch.zeros(12, 2, 1))
        assert torch.equal(made[1].cpu(), torch.full((3, 5), 2.5))
    assert metrics.counter("eager_fallbacks") == before


def test_batch_norm_trains_over_changing_batch_sizes():
    """A CNN epoch's last, smaller batch: the third batch size of ``native_batch_norm_backward`` made
    its dynamic kernel, whose check against the CPU crashed the process (SIGSEGV in the runtime)."""
    torch.manual_seed(0)
    on_device, on_cpu = torch.nn.BatchNorm2d(16).to("neuron"), torch.nn.BatchNorm2d(16)
    for batch in (64, 32, 24):
        x = torch.randn(batch, 16, 4, 4)
        xd, xc = x.to("neuron").requires_grad_(), x.clone().requires_grad_()
        on_device(xd).square().sum().backward()
        on_cpu(xc).square().sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(on_device.weight.grad.cpu(), on_cpu.weight.grad, rtol=1e-4, atol=1e-4)


def test_negative_integral_powers_of_zero_are_infinite_on_the_dynamic_kernel():
    """``0 ** -1`` and ``0 ** -2`` were -inf on the dynamic kernel (torch-mlir's linalg lowering)."""
    special = torch.tensor([0.0, -0.0, 1e-30, 2.0, -2.0, float("inf")])
    for exponent in (-1.0, -2.0):
        for step, shape in enumerate(((2, 4), (3, 5), (4, 6), (6, 9))):
            x = torch.rand(shape) + 1
            if step > 2:  # the dynamic kernel was made (and checked) without them
                x.view(-1)[:6] = special
            got, expected = (x.to("neuron") ** exponent).cpu(), x ** exponent
            torch.testing.assert_close(got, expected)
            assert torch.equal(got.signbit(), expected.signbit())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_inverse_hyperbolic_functions_keep_their_range_on_the_dynamic_kernel(dtype):
    """torch-mlir's linalg forms overflowed past 1.8e19 and lost the sign: ``asinh(-inf)`` was NaN,
    ``asinh(-1e30)`` and ``acosh(-1e30)`` inf, INT_MIN -inf."""
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    special = torch.tensor([info.min, info.max, -1.0, 0.5, 2.0, 1.0]).to(dtype)
    if dtype.is_floating_point:
        special = torch.cat([special, torch.tensor([-float("inf"), float("inf"), -1e30, 1e30]).to(dtype)])
    for op in (torch.asinh, torch.acosh):
        for step, rows in enumerate((2, 3, 4, 6)):
            x = (torch.rand(rows, special.numel()) * 4 + 1).to(dtype)
            if step > 2:  # the dynamic kernel was made (and checked) without them
                x[0] = special
            torch.testing.assert_close(op(x.to("neuron")).cpu(), op(x), equal_nan=True, rtol=2e-3, atol=1e-5)


def test_equal_sizes_pick_their_own_kernel():
    """A kernel traced where two sizes were equal (a square product) must not serve a call
    where they differ, nor the other way round."""
    for m, k, n in ((5, 7, 5), (5, 7, 9), (4, 4, 4), (6, 3, 8), (8, 3, 8)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        _close(a.to("neuron") @ b.to("neuron"), a @ b)
        _close(torch.cat([a.to("neuron"), a.to("neuron")], 1), torch.cat([a, a], 1))


def test_dimensions_of_size_one_broadcast():
    for left, right in (((6, 1), (6, 5)), ((6, 5), (6, 5)), ((1, 5), (6, 5)), ((7, 1), (7, 9)), ((1, 1), (3, 4))):
        a, b = torch.randn(left), torch.randn(right)
        _close(a.to("neuron") + b.to("neuron"), a + b)
        _close(b.to("neuron") * a.to("neuron"), b * a)


def test_sizes_equal_to_int_arguments_stay_static():
    """``layer_norm(x, (64,))``, ``sum(x, [2])``: a size that an int argument names is part of the key."""
    for shape in ((3, 5, 4), (2, 9, 4), (6, 4, 2), (4, 2, 4)):
        x = torch.randn(shape)
        _close(F.layer_norm(x.to("neuron"), (shape[-1],)), F.layer_norm(x, (shape[-1],)))
        _close(x.to("neuron").sum([2]), x.sum([2]))
        _close(x.to("neuron").narrow(1, 0, 2).exp(), x.narrow(1, 0, 2).exp())


def test_strided_inputs_run_on_the_contiguous_kernel():
    for rows, cols in ((4, 6), (9, 3), (5, 5)):
        a = torch.randn(cols, rows)
        b = torch.randn(rows, cols)
        on_a, on_b = a.to("neuron"), b.to("neuron")
        _close(on_a.t() * on_b, a.t() * b)
        _close(on_a.t() @ on_a, a.t() @ a)
        _close(on_b[:, ::2] + 1, b[:, ::2] + 1)
        _close(on_a.t().reshape(-1), a.t().reshape(-1))


def test_ops_that_depend_on_sizes_keep_a_kernel_per_shape():
    w = torch.randn(4, 3, 3, 3)
    for size in (8, 11, 16):
        x = torch.randn(2, 3, size, size + 1)
        _close(F.conv2d(x.to("neuron"), w.to("neuron"), padding=1, stride=2), F.conv2d(x, w, padding=1, stride=2))
        _close(F.max_pool2d(x.to("neuron"), 2), F.max_pool2d(x, 2))
        _close(x.to("neuron").view(2, -1).sum(1), x.view(2, -1).sum(1))


def test_a_training_loop_with_changing_batch_sizes_stops_compiling():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    reference.load_state_dict(model.state_dict())
    model.to("neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    from torch_neuronx.device import eager

    new_ops = []
    for step, batch in enumerate((5, 9, 3, 13, 7, 21)):
        known = set(eager._kernels)
        x, y = torch.randn(batch, 16), torch.randint(0, 10, (batch,))
        for net, opt, xs, ys in ((model, optimizer, x.to("neuron"), y.to("neuron")), (reference, ref_optimizer, x, y)):
            opt.zero_grad()
            loss = F.cross_entropy(net(xs), ys)
            loss.backward()
            opt.step()
            if net is model:
                device_loss = loss.item()
        assert device_loss == pytest.approx(loss.item(), rel=1e-4, abs=1e-5), f"step {step}"
        new_ops.append({key[1] if key[0] == "dynamic" else key[0] for key in set(eager._kernels) - known})
    for step, ops in enumerate(new_ops[3:], 3):  # the third batch size made the dynamic kernels
        assert not ops, f"step {step} compiled kernels for {sorted(ops)}"


def test_with_dynamic_shapes_off_each_shape_compiles():
    for dynamic, expected in ((False, 4), (True, 3)):  # on: two shapes' own kernels, then the dynamic one
        with config.override(TORCH_NEURONX_EAGER_DYNAMIC_SHAPES=dynamic):
            before = _compiles()
            for rows in (17, 19, 21, 23):
                x = torch.randn(rows, 5 if dynamic else 6)
                _close(torch.sinh(x.to("neuron")), torch.sinh(x))
            assert _compiles() == before + expected, f"dynamic shapes {'on' if dynamic else 'off'}"


FIRST = """
import torch, torch.nn.functional as F, torch_neuronx
w = torch.randn(3, 2, 3, 3)
for rows, cols in ((5, 12), (6, 7), (8, 3)):  # the third shape compiles the dynamic kernels
    x = torch.randn(rows, cols)
    (torch.sigmoid(x.to("neuron")) @ x.t().to("neuron")).cpu()
    F.conv2d(torch.randn(1, 2, rows + 1, rows + 1).to("neuron"), w.to("neuron")).cpu()
"""
SECOND = """
import json, torch, torch.nn.functional as F, torch_neuronx
from torch_neuronx import metrics
x, w = torch.randn(9, 30), torch.randn(3, 2, 3, 3)
got = (torch.sigmoid(x.to("neuron")) @ x.t().to("neuron")).cpu()
conv = F.conv2d(torch.randn(1, 2, 7, 7).to("neuron"), w.to("neuron")).cpu()
print(json.dumps({"close": torch.allclose(got, torch.sigmoid(x) @ x.t(), atol=1e-5),
                  "traces": metrics.counter("kernel_traces"), "hits": metrics.counter("eager_hlo_cache_hits")}))
"""


def test_a_process_serves_other_sizes_from_the_kernels_another_stored(tmp_path):
    """Dynamic kernels, and the knowledge that an op needs a kernel per shape, are shared through
    the HLO cache: the second process runs new sizes without tracing anything."""
    env = {**os.environ, "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"),
           "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    for script in (FIRST, SECOND):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"close": True, "traces": 0, "hits": 3}


def test_shape_functions_evaluate_arithmetic_of_input_sizes_only():
    spec = ShapeFunction([{"shape": ["s3", 4]}, {"shape": ["s3", "s8"]}],
                         [{"shape": ["s3*s8", "(s8 + 1) // 2", "max(1, s8 + ((-1)*s3))", 7]}])
    assert spec([torch.empty(5, 4), torch.empty(5, 9)]) == ((45, 5, 4, 7),)
    for bad in ("__import__('os').getpid()", "s3.bit_length()", "s9 + 1", "s3 / 2", "[s3][0]"):
        with pytest.raises((ValueError, SyntaxError)):
            ShapeFunction([{"shape": ["s3"]}], [{"shape": [bad]}])


SLOW_COMPILE = """
import json, torch, torch_neuronx
from torch_neuronx import metrics
from torch_neuronx.device import kernels
from torch_neuronx.pipeline import trace
trace.DYNAMIC_COMPILE_SECONDS = 0.001  # every dynamic compile runs past its limit
close = []
for rows in (6, 8, 11):  # the third shape tries the dynamic kernel
    x = torch.rand(rows, 9) + 0.5
    close.append(torch.allclose(torch.special.i1e(x.to("neuron")).cpu(), torch.special.i1e(x), atol=1e-6))
print(json.dumps({"close": all(close),
                  "marked": sum(k is kernels.STATIC for k in kernels.registry.values()),
                  "compiles": metrics.counter("eager_ops_compiled")}))
"""


def test_a_dynamic_compile_past_its_time_limit_leaves_the_op_a_kernel_per_shape(tmp_path):
    env = {**os.environ, "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"),
           "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    out = subprocess.run([sys.executable, "-c", SLOW_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"close": True, "marked": 1, "compiles": 3}


def test_a_shape_that_keeps_coming_back_gets_a_kernel_of_its_own(monkeypatch):
    """A shape run on its family's dynamic kernel gets a kernel of its shapes (faster code) once it
    has kept coming back for PROMOTE_AFTER_S, once, as a large share of its family's calls (with
    random sequence lengths every length came back and compiled, for epochs); a burst of calls of
    a new shape (a training step's repeated layers with this step's sequence length) does not:
    every step compiled again.
    Results stay the CPU's throughout."""
    from torch_neuronx.device import choice

    for shape in ((12, 13), (9, 14)):  # the family's first shapes: kernels of their own
        first = torch.randn(shape)
        _close(torch.erfc(first.to("neuron")), torch.erfc(first))
    before = metrics.counter("eager_shapes_promoted")
    for rows in (10, 11, 12):  # a new length each "step", used many times within it
        x = torch.randn(rows, 11)
        for _ in range(6):
            _close(torch.erfc(x.to("neuron")), torch.erfc(x))
    assert metrics.counter("eager_shapes_promoted") == before
    monkeypatch.setattr(choice, "PROMOTE_AFTER_S", 0.0)  # a shape in use long enough (its plan ends too)
    for _ in range(4):  # shapes that come back rarely: each a small share of the family's calls
        for rows in range(14, 26):
            x = torch.randn(rows, 11)
            _close(torch.erfc(x.to("neuron")), torch.erfc(x))
    assert metrics.counter("eager_shapes_promoted") == before
    x = torch.randn(13, 11)
    for _ in range(10):  # a shape that makes most of the family's calls
        _close(torch.erfc(x.to("neuron")), torch.erfc(x))
    assert metrics.counter("eager_shapes_promoted") == before + 1


def test_bad_input_on_a_dynamic_kernels_first_call_gives_no_verdict():
    """An out-of-range index on the call that makes a family's dynamic kernel raises torch's error,
    and does not condemn the kernel: the next shape uses it."""
    from torch_neuronx.device import eager, kernels

    for rows in (4, 6):  # the family's own-shape kernels
        t, i = torch.randn(rows, 5), torch.tensor([0, rows - 1, 1])
        _close(t.to("neuron").index_select(0, i.to("neuron")), t.index_select(0, i))
    with pytest.raises(IndexError):
        torch.randn(8, 5).to("neuron").index_select(0, torch.tensor([0, 8, 1]).to("neuron")).cpu()
    t, i = torch.randn(9, 5), torch.tensor([1, 8, 0])
    _close(t.to("neuron").index_select(0, i.to("neuron")), t.index_select(0, i))
    family = [k for k in eager._kernels if k[0] == "dynamic" and k[1] == "aten.index_select.default"]
    assert family and all(isinstance(eager._kernels[k], kernels.Kernel) for k in family)


def test_long_rows_of_softmax_keep_kernels_per_shape():
    """A softmax's dynamic-shape kernel took time quadratic in a long row (2 x 1e5: 25 s, 2 x 1e6:
    not back in minutes, the third shape of an eager softmax): rows past ``LONG_ROW`` get kernels
    of their own."""
    from torch_neuronx.device import choice

    n = choice.LONG_ROW + 10
    for length in (n, n + 1, n + 2):
        x = torch.rand(2, length)
        torch.testing.assert_close(x.to("neuron").softmax(-1).cpu(), x.softmax(-1))
    keys = [key for sig, key in choice._seen.items()
            if sig[0] is torch.ops.aten._softmax.default and sig[3] == (2, n + 2)]
    assert keys and all(key[0] != "dynamic" for key in keys)


def test_cat_onto_an_empty_cache_takes_the_families_kernel():
    """transformers' DynamicCache concatenates an empty cache onto each step's keys: a call with an
    empty tensor keeps a kernel per shape, so every new sequence length compiled one more ``cat``.
    Empty operands are dropped (after torch's checks, and keeping its promoted dtype)."""
    for length in (3, 4, 5):  # the family's first shapes, and its dynamic kernel
        torch.cat([torch.empty(2, 4, 0, 8, device="neuron"), torch.randn(2, 4, length, 8, device="neuron")], -2)
    before = _compiles()
    for length in (6, 9, 13, 21):
        keys = torch.randn(2, 4, length, 8)
        got = torch.cat([torch.empty(2, 4, 0, 8, device="neuron"), keys.to("neuron")], -2)
        assert torch.equal(got.cpu(), keys)
    assert _compiles() - before <= 1  # (at most the kernel a returning shape earns)
    wide = torch.cat([torch.empty(0, 3, dtype=torch.float64, device="neuron"), torch.ones(2, 3, device="neuron")])
    assert wide.dtype == torch.float64 and torch.equal(wide.cpu(), torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([torch.empty(2, 0, 3, device="neuron"), torch.randn(2, 5, 4, device="neuron")], 1)
