"""Complex tensors through the compile path: the complex_to_real pass and torch.compile end to end.

Pass-level tests run aot_autograd's forward and backward graphs through
``complex_to_real`` and execute the rewritten graphs eagerly on
``view_as_real`` inputs: that pins the arithmetic without compiling. The
end-to-end tests compile through torch-mlir and IREE (about a second each).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._functorch.aot_autograd import aot_function
from torch.fx.experimental.proxy_tensor import make_fx

from torch_neuronx import metrics
from torch_neuronx.compiler import decompositions, lower
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.passes.complex_to_real import complex_to_real

C64, C128 = torch.complex64, torch.complex128


@pytest.fixture(autouse=True)
def _decompose(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_COMPLEX_DECOMPOSE", "1")
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1")


def _c(*shape, dtype=C64, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _r(*shape, grad=False):
    return torch.randn(*shape).requires_grad_(grad)


def _assert_all_real(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        assert node.op == "output" or val is not None, f"{node.format_node()} has no meta val"
        assert not any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals), node.format_node()


def _through_pass(fn, graphs=None):
    """``fn`` traced by aot_autograd, each graph rewritten by complex_to_real and run eagerly."""
    def compiler(gm, example_inputs):
        gm = complex_to_real(gm)
        _assert_all_real(gm)
        if graphs is not None:
            graphs.append(gm)
        complex_inputs = gm.meta.get("complex_inputs", [])
        complex_outputs = gm.meta.get("complex_outputs", [])

        def run(args):
            args = [torch.view_as_real(a.resolve_conj()) if i in complex_inputs else a
                    for i, a in enumerate(args)]
            outs = list(gm(*args))
            return [torch.view_as_complex(o.contiguous()) if i in complex_outputs else o
                    for i, o in enumerate(outs)]

        run._boxed_call = True
        return run

    return aot_function(fn, compiler, compiler, decompositions=decompositions.table())


def _flat(out):
    return list(out) if isinstance(out, list | tuple) else [out]


def _loss(outs):
    return sum((o.abs() if o.is_complex() else o).sum() for o in outs if o.dtype.is_floating_point or
               o.is_complex())


def _assert_matches_eager(fn, inputs, compiled):
    """Outputs, and gradients of every input that requires grad, equal eager's."""
    eager_in = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    compiled_in = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    want, got = _flat(fn(*eager_in)), _flat(compiled(*compiled_in))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    if any(x.requires_grad for x in inputs):
        _loss(want).backward()
        _loss(got).backward()
        for e, c in zip(eager_in, compiled_in, strict=True):
            if e.requires_grad:
                torch.testing.assert_close(c.grad, e.grad, rtol=1e-4, atol=1e-5)


# Each case: fn and its inputs; inputs made with grad=True also check aot_autograd's backward graph.
CASES = {
    "mul_abs_real_imag": (lambda a, b: (a * b).abs() + (a * b).real - a.imag, _c(3, 4, grad=True),
                          _c(3, 4, grad=True)),
    "mul_by_real_tensor_and_scalars": (lambda a, x: a * x + x * (2 - 1j) + 3 * a - a * 1.5j,
                                       _c(3, 4, grad=True), _r(4, grad=True)),
    "add_sub_alpha_broadcast": (lambda a, b, x: torch.add(a, b, alpha=2) - torch.sub(x, a, alpha=0.5) + 1j,
                                _c(3, 4, grad=True), _c(4, grad=True), _r(3, 1, grad=True)),
    "div": (lambda a, b, x: a / b + x / a - (1 + 2j) / a + a / x + a / (2 - 1j), _c(3, 4, grad=True),
            _c(3, 4, grad=True), _r(4, grad=True)),
    "neg_conj_angle_exp_log_sqrt": (lambda a: (-a.conj() + a.conj_physical()).exp() + a.log() + a.sqrt()
                                    + a.angle(), _c(5, grad=True)),
    "sgn_reciprocal_pow": (lambda a: a.sgn() + a.reciprocal() + a ** 2 + a ** 0.5, _c(5, grad=True)),
    "complex_polar_view_as": (lambda x, y: torch.complex(x, y) * torch.polar(y.abs(), x)
                              + torch.view_as_complex(torch.stack([y, x], -1)),
                              _r(4, grad=True), _r(4, grad=True)),
    "view_as_real_select": (lambda a: torch.view_as_real(a)[..., 1] * 2 + a.real, _c(3, 2, grad=True)),
    "dtype_conversions": (lambda a, x: ((a.to(C128) * 2).to(C64) + x.to(C64), a.to(torch.float32)),
                          _c(3, grad=True), _r(3, grad=True)),
    "sum_mean_cumsum": (lambda a: (a.sum(1), a.mean(), a.sum(), a.sum(0, keepdim=True), a.cumsum(1)),
                        _c(3, 4, grad=True)),
    "shape_ops": (lambda a: (a.t().reshape(12).unsqueeze(0).expand(2, 12), a.permute(1, 0)[1:3, -1],
                             a.unsqueeze(-1).transpose(0, 2).squeeze(), a.flip(0).select(1, 2)),
                  _c(3, 4, grad=True)),
    "cat_split_unbind_pad": (lambda a, x: (torch.cat([a, x, a.conj()], -1), a.unbind(0)[1] + a.split(2)[0][1],
                                           torch.nn.functional.pad(a, (1, 2))),
                             _c(3, 4, grad=True), _r(3, 2, grad=True)),
    "indexing": (lambda a, i: a[i] + a.index_select(0, i), _c(3, 2, grad=True), torch.tensor([2, 0, 1])),
    "where_and_constants": (lambda a: torch.where(a.abs() > 1, a, torch.zeros_like(a))
                            + torch.full((3,), 1 + 1j) + torch.ones(3, dtype=C64), _c(3, grad=True)),
    "matmul_mm_bmm_addmm": (lambda a, b, c, d: (a @ b, torch.bmm(c, d), torch.addmm(a @ b, a, b, beta=2,
                                                                                      alpha=1j)),
                            _c(3, 4, grad=True), _c(4, 2, grad=True), _c(2, 3, 4, grad=True),
                            _c(2, 4, 5, grad=True)),
    "complex128": (lambda a, b: (a * b).abs() + (a @ b.t()).real.sum(), _c(3, 3, dtype=C128, grad=True),
                   _c(3, 3, dtype=C128, grad=True)),
    "equality": (lambda a, b: (a == b, a != a), _c(3), _c(3)),
    "complex_constant": (lambda a: a * torch.tensor([1 + 2j, 3 - 1j, 0.5j]), _c(2, 3, grad=True)),
}


@pytest.mark.filterwarnings("ignore:Casting complex values to real:UserWarning")
@pytest.mark.parametrize("case", sorted(CASES))
def test_rewritten_graphs_match_eager_forward_and_backward(case):
    fn, *inputs = CASES[case]
    _assert_matches_eager(fn, inputs, _through_pass(fn))


def test_signature_records_complex_positions_among_tensor_inputs():
    gm = make_fx(lambda x, a, b: (x * 2, a * b, torch.view_as_real(a), b), tracing_mode="fake")(
        _r(3), _c(3), _c(3))
    gm = complex_to_real(gm)
    assert gm.meta["complex_inputs"] == [1, 2]
    assert gm.meta["complex_outputs"] == [1, 3]
    placeholders = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    assert [tuple(v.shape) for v in placeholders] == [(3,), (3, 2), (3, 2)]
    assert all(v.dtype == torch.float32 for v in placeholders)


def test_rewritten_graph_lowers_to_stablehlo():
    graphs = []
    fn, *inputs = CASES["neg_conj_angle_exp_log_sqrt"]
    _through_pass(fn, graphs)(*inputs).abs().sum().backward()
    for gm in graphs:
        assert "complex" not in lower.lower(gm).stablehlo


def test_real_graph_is_left_alone():
    gm = make_fx(lambda x: x * 2)(_r(3))
    code = gm.code
    assert complex_to_real(gm) is gm and gm.code == code and "complex_inputs" not in gm.meta


def test_unsupported_op_raises_not_implemented_and_leaves_graph_unchanged():
    gm = make_fx(lambda a: (a * 2).sin(), tracing_mode="fake")(_c(3))
    code = gm.code
    with pytest.raises(NotImplementedError, match=r"aten\.sin\.default"):
        complex_to_real(gm)
    assert gm.code == code
    assert next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].is_complex()


def test_decompose_off_leaves_complex_ops_in_place(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_COMPLEX_DECOMPOSE", "0")
    gm = make_fx(lambda a, b: a * b, tracing_mode="fake")(_c(3), _c(3))
    complex_to_real(gm)
    assert any(n.meta["val"].is_complex() for n in gm.graph.nodes if n.op == "call_function")
    assert "complex_inputs" not in gm.meta


# -- torch.compile end to end ------------------------------------------------------------


def _compiled(fn):
    return torch.compile(fn, backend="neuron")


def _inner_compile_error(err):
    while err is not None and not isinstance(err, NeuronCompileError):
        err = getattr(err, "inner_exception", None) or err.__cause__
    return err


def test_compiled_multiply_abs_real_imag_matches_eager():
    def model(a, b, x):
        z = a * b
        return z.abs() + z.real * x - z.imag

    before = metrics.counter("compiled_graphs")
    inputs = (_c(3, 4), _c(3, 4), _r(3, 4))
    torch.testing.assert_close(_compiled(model)(*inputs), model(*inputs))
    assert metrics.counter("compiled_graphs") == before + 1


def test_compiled_complex_outputs_and_matmul_match_eager():
    def model(a, b):
        product = a @ b
        return product, (product * 1j).exp().conj(), product.angle()

    a, b = _c(3, 4), _c(4, 5)
    got, want = _compiled(model)(a, b), model(a, b)
    assert [g.dtype for g in got] == [C64, C64, torch.float32]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_compiled_backward_through_complex_parameter():
    b = _c(3, 4)

    def loss(a):
        return (a * b).abs().sum()

    _assert_matches_eager(loss, [_c(3, 4, grad=True)], _compiled(loss))


def test_compiled_shape_specialized_graphs_with_complex_constant():
    def model(a):
        return (a * torch.tensor([1 + 2j, 3 - 1j, 0.5j])).sum(0) + a.view(-1, 3).mean(0), a.shape[0] * a

    compiled = torch.compile(model, backend="neuron", dynamic=True)
    for rows in (2, 5):  # symbolic sizes are graph inputs before the complex tensor
        a = _c(rows, 3)
        for got, want in zip(compiled(a), model(a), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_compiled_unsupported_op_is_a_trace_error_naming_it():
    with pytest.raises(Exception) as info:
        _compiled(lambda a: (a * 2).sin())(_c(3))
    err = _inner_compile_error(info.value)
    assert err is not None and err.stage == "trace"
    assert "aten.sin.default" in str(err)


def test_compiled_with_decompose_off_fails_at_lowering(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_COMPLEX_DECOMPOSE", "0")
    with pytest.raises(Exception) as info:
        _compiled(lambda a, b: (a * b).abs())(_c(3), _c(3))
    err = _inner_compile_error(info.value)
    assert err is not None and err.stage in ("import", "lowering")


def test_compiled_with_decompose_off_falls_back_to_eager(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_COMPLEX_DECOMPOSE", "0")
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    a, b = _c(3), _c(3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = torch.compile(lambda a, b: (a * b).abs(), backend="neuron",
                            options={"model_name": "complex_fallback"})(a, b)
    torch.testing.assert_close(out, (a * b).abs())
    assert any(issubclass(w.category, RuntimeWarning) and "falling back" in str(w.message) for w in record)


def test_complex_abs_keeps_huge_and_tiny_moduli_eager_and_compiled():
    """sqrt(re**2 + im**2) overflowed from |z| ~ 1.8e19 (inf) and underflowed below 1e-19 (0)."""
    z = torch.tensor([1e30 + 1e30j, 1e-30 + 1e-30j, 3e20 + 4e20j, 3 + 4j, 0j, complex("inf") + 1j,
                      complex(1, float("-inf")), complex("nan")], dtype=torch.complex64)
    torch.testing.assert_close(z.to("neuron").abs().cpu(), z.abs(), equal_nan=True)
    torch.testing.assert_close(torch.compile(torch.abs, backend="neuron")(z), z.abs(), equal_nan=True)


def test_complex_cumsum_of_a_0d_tensor_is_its_value():
    """Split into its real pair, a 0-d complex's cumsum summed its real part into its imaginary part."""
    x = torch.tensor(1 + 2j)
    assert torch.equal(torch.cumsum(x.to("neuron"), 0).cpu(), x)


def test_cpu_fallbacks_of_complex_composites_conjugate():
    """A CPU fallback runs below the Python key, where torch had the Conjugate key off: linalg_pinv's
    own ``vh.mH`` was multiplied unconjugated (a pseudo-inverse 1.8 off), lstsq's residuals negative."""
    torch.manual_seed(0)
    a, b = torch.randn(4, 3, dtype=torch.complex64), torch.randn(4, 3, dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (they run on the CPU)
        torch.testing.assert_close(torch.linalg.pinv(a.to("neuron")).cpu(), torch.linalg.pinv(a))
        got = torch.linalg.lstsq(a.to("neuron"), b.to("neuron"), driver="gelsd")
    want = torch.linalg.lstsq(a, b, driver="gelsd")
    torch.testing.assert_close(got.solution.cpu(), want.solution)
    torch.testing.assert_close(got.residuals.cpu(), want.residuals)


def _both(fn, *args):
    """``fn`` on the eager device and compiled, each on neuron copies of ``args``, as CPU tensors."""
    on = [a.to("neuron") for a in args]
    return fn(*on).cpu(), torch.compile(fn, backend="neuron")(*on).cpu()


def test_polar_and_complex_exp_keep_accuracy_at_large_angles():
    """Emitted after the trace, their sin/cos were IREE's own, whose float32 reduction lost 1e-4 at
    an angle of 4096 (a Llama ``freqs_cis``) and 1.4e-3 at 5e4; the CPU's error is 4e-8."""
    angles = torch.tensor([1.0, 100.0, 1000.0, 4095.0, 1e4, 5e4, -3e4])
    truth = torch.polar(torch.ones(7, dtype=torch.float64), angles.double())
    for fn in (lambda t: torch.polar(torch.ones_like(t), t), lambda t: torch.exp(1j * t)):
        for got in _both(fn, angles):
            assert (got.cdouble() - truth).abs().max() < 2e-7


def test_complex_division_scales_and_keeps_torchs_special_values():
    """``a * conj(b) / |b|**2`` overflowed from |b| ~ 1.8e19 and vanished below 1e-19; a zero
    divisor gave NaN where torch gives infinities. Now c10's division, bit for bit on random values."""
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([3e30 + 4e30j, 1 + 1j, 1 + 1j, -1 + 0j, 1 + 1j, 1 + 1j, 0j, complex(inf, 0), 2 - 3j],
                     dtype=torch.complex64)
    b = torch.tensor([1e30 + 1e30j, 1e20 + 0j, 3e-20 + 4e-20j, 1e-20 + 0j, 0j, complex(inf, 0), 0j, 1 + 1j,
                      complex(nan, 0)], dtype=torch.complex64)
    for got in _both(torch.div, a, b):
        torch.testing.assert_close(got, a / b, equal_nan=True, rtol=1e-6, atol=0)
    for got in _both(torch.reciprocal, b[:4]):
        torch.testing.assert_close(got, b[:4].reciprocal(), rtol=1e-6, atol=0)
        assert torch.equal(torch.signbit(got.imag), torch.signbit(b[:4].reciprocal().imag))
    torch.manual_seed(0)
    x, y = torch.randn(500, dtype=torch.complex64), torch.randn(500, dtype=torch.complex64)
    for got in _both(torch.div, x, y):
        assert torch.equal(got, x / y)


def test_complex_sqrt_isnan_nan_to_num_and_complex128_log_compile():
    """sqrt went through the angle (sqrt(-1) was 6e-17+1j); complex isnan/isinf had no rule and
    nan_to_num failed torch's decomposition; complex128 log and angle called an atan2 symbol IREE's
    float64 code lacks ("iree exited with status 1")."""
    inf, nan = float("inf"), float("nan")
    z = torch.tensor([-1 + 0j, 4 + 0j, 2 + 3j, -2 - 3j, 0j, complex(-0.0, -0.0), complex(1e30, 1e30),
                      complex(-inf, 1), complex(inf, -1), complex(1, inf), complex(nan, inf), complex(nan, 1),
                      complex(-5, -0.0)], dtype=torch.complex64)
    for got in _both(torch.sqrt, z):
        torch.testing.assert_close(got, torch.sqrt(z), equal_nan=True)
        assert torch.equal(torch.signbit(got.imag), torch.signbit(torch.sqrt(z).imag))
    for fn in (torch.isnan, torch.isinf, torch.isfinite, torch.nan_to_num):
        for got in _both(fn, z):
            torch.testing.assert_close(got, fn(z), equal_nan=True)
    wide = torch.tensor([-1 - 0j, 2 + 3j, 1e-3 - 7j], dtype=torch.complex128)
    for fn in (torch.log, torch.sqrt, torch.angle):
        for got in _both(fn, wide):
            torch.testing.assert_close(got, fn(wide))
