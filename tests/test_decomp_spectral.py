"""torch.fft through the spectral decompositions: DFT matrix products, compiled against eager.

The decompositions of ``aten._fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c`` are checked
three ways: called directly (eager, real arithmetic vs. pocketfft, every norm and
odd/even sizes), through aot_autograd + ``complex_to_real`` run eagerly (the
graphs hold no op the pass lacks a rule for, forward and backward), and compiled
end to end through torch-mlir and IREE. Compiled checks are batched into a few
graphs: each compile costs seconds.
"""

from __future__ import annotations

import pytest
import torch
from torch._functorch.aot_autograd import aot_function

from torch_neuronx import metrics
from torch_neuronx.compiler import decompositions
from torch_neuronx.compiler.decompositions import spectral
from torch_neuronx.compiler.passes.complex_to_real import complex_to_real

aten = torch.ops.aten
fft = torch.fft
C64, C128 = torch.complex64, torch.complex128
FFT_OPS = {aten._fft_r2c.default, aten._fft_c2r.default, aten._fft_c2c.default}
NORMS = ("backward", "forward", "ortho")


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_COMPLEX_DECOMPOSE", "1")
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1")


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _c(*shape, dtype=C64):
    return torch.randn(*shape, dtype=dtype)


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def _assert_close(got, want, rtol=1e-5, atol=1e-4):
    """Equal up to ``rtol`` and ``atol`` times the larger of 1 and ``want``'s scale."""
    got, want = list(got), list(want)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        scale = max(1.0, w.abs().max().item())
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol * scale, msg=lambda m, i=i: f"output {i}: {m}")


def _check(fn, inputs, compiled, rtol=1e-5, atol=1e-4):
    """``compiled`` matches ``fn``: outputs, and gradients of every input under random upstream weights."""
    eager_in = [x.clone().requires_grad_() for x in inputs]
    compiled_in = [x.clone().requires_grad_() for x in inputs]
    want, got = fn(*eager_in), compiled(*compiled_in)
    _assert_close(got, want, rtol, atol)
    weights = [torch.randn_like(_as_real(w)) for w in want]
    grads_want = torch.autograd.grad(sum((_as_real(w) * u).sum() for w, u in zip(want, weights)), eager_in)
    grads_got = torch.autograd.grad(sum((_as_real(g) * u).sum() for g, u in zip(got, weights)), compiled_in)
    _assert_close(grads_got, grads_want, rtol, atol)


# -- the decompositions themselves, eagerly -----------------------------------------------------


@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 2, 7, 8])
def test_decompositions_match_aten_ops(n, normalization):
    x, z = _r(3, n, 4), _c(3, n, 4)
    half = _c(3, 4, n // 2 + 1)  # Hermitian half along the last dim, DC/Nyquist imag nonzero
    cases = [
        (spectral.fft_c2c, aten._fft_c2c, (z, [1], normalization, True)),
        (spectral.fft_c2c, aten._fft_c2c, (z, [1, 0], normalization, False)),
        (spectral.fft_c2c, aten._fft_c2c, (z, [2], normalization, True)),  # torch passes dims >= 0
        (spectral.fft_r2c, aten._fft_r2c, (x, [1], normalization, True)),
        (spectral.fft_r2c, aten._fft_r2c, (x, [1], normalization, False)),
        (spectral.fft_r2c, aten._fft_r2c, (x, [2, 1], normalization, True)),
        (spectral.fft_c2r, aten._fft_c2r, (half, [2], normalization, n)),
        (spectral.fft_c2r, aten._fft_c2r, (half, [0, 2], normalization, n)),
    ]
    for mine, op, args in cases:
        _assert_close([mine(*args)], [op(*args)], rtol=1e-5, atol=1e-5)


def test_c2r_ignores_imaginary_parts_of_dc_and_nyquist():
    half = _c(2, 5)
    real_ends = half.clone()
    real_ends[:, 0] = half[:, 0].real
    real_ends[:, -1] = half[:, -1].real
    out = spectral.fft_c2r(half, [1], 2, 8)
    torch.testing.assert_close(out, spectral.fft_c2r(real_ends, [1], 2, 8))
    torch.testing.assert_close(out, torch.fft.irfft(half), rtol=1e-5, atol=1e-6)


def test_float64_tables_are_accurate():
    z = _c(2, 96, dtype=C128)
    torch.testing.assert_close(spectral.fft_c2c(z, [1], 0, True), aten._fft_c2c(z, [1], 0, True),
                               rtol=1e-12, atol=1e-12)
    # an inverse real transform's scale not exact in float32 (1/100, 1/sqrt(8)): its weights were
    # float32, and float64 irfft was 1e-7 off
    half = _c(2, 51, dtype=C128)
    for normalization in (0, 1, 2):
        torch.testing.assert_close(spectral.fft_c2r(half, [1], normalization, 100),
                                   aten._fft_c2r(half, [1], normalization, 100), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(spectral.fft_c2r(half[:, :5], [1], 2, 8), aten._fft_c2r(half[:, :5], [1], 2, 8),
                               rtol=1e-12, atol=1e-12)


# -- aot_autograd graphs through complex_to_real, run eagerly -------------------------------------


def _through_pass(fn):
    """``fn`` traced by aot_autograd with the decompositions, each graph made real and run eagerly."""
    def compiler(gm, example_inputs):
        assert not any(n.target in FFT_OPS for n in gm.graph.nodes), gm.code
        gm = complex_to_real(gm)
        assert not any(isinstance(v := n.meta.get("val"), torch.Tensor) and v.is_complex()
                       for n in gm.graph.nodes), gm.code
        complex_inputs = gm.meta.get("complex_inputs", [])
        complex_outputs = gm.meta.get("complex_outputs", [])

        def run(args):
            args = [torch.view_as_real(a.resolve_conj()) if i in complex_inputs else a
                    for i, a in enumerate(args)]
            return [torch.view_as_complex(o.contiguous()) if i in complex_outputs else o
                    for i, o in enumerate(gm(*args))]

        run._boxed_call = True
        return run

    return aot_function(fn, compiler, compiler, decompositions=decompositions.table())


def _all_functions(x, x3, z, z3):
    """Every torch.fft function, with padding and trimming, the norms taking turns."""
    b, f, o = NORMS
    return (fft.fft(x, norm=b), fft.fft(x, n=11, dim=0, norm=f), fft.ifft(z, n=4, norm=o),
            fft.rfft(x, norm=f), fft.rfft(x, n=5, dim=0, norm=o), fft.irfft(z, norm=b),
            fft.irfft(z, n=7, norm=f), fft.hfft(z, norm=o), fft.ihfft(x, norm=b),
            fft.fft2(z, norm=f), fft.ifft2(x, s=(3, 9), norm=o), fft.rfft2(x, norm=b),
            fft.irfft2(z, s=(5, 6), norm=o), fft.fftn(x3, norm=b), fft.ifftn(z3, dim=(0, 2), norm=f),
            fft.rfftn(x3, norm=o), fft.irfftn(z3, norm=f), fft.hfft2(z, norm=b), fft.ihfft2(x, norm=f),
            fft.ihfft(x, n=10, norm=o), fft.hfft(z, n=6, norm=f))


@pytest.mark.filterwarnings("ignore:Casting complex values to real:UserWarning")
def test_graphs_through_complex_to_real_match_eager():
    inputs = [_r(6, 8), _r(3, 4, 5), _c(6, 5), _c(3, 4, 5)]
    _check(_all_functions, inputs, _through_pass(_all_functions), rtol=1e-5, atol=1e-5)


# -- compiled end to end ------------------------------------------------------------------------


def _compiled(fn):
    return torch.compile(fn, backend="neuron")


def test_compiled_real_input_transforms_forward_and_backward():
    def fn(x, x3):
        return (fft.fft(x, n=10, norm="ortho"), fft.fft(x, n=5), fft.rfft(x), fft.rfft(x, n=7, dim=0, norm="forward"),
                fft.ihfft(x), fft.fft2(x), fft.rfft2(x, s=(5, 6)), fft.rfftn(x3, norm="ortho"),
                fft.ifftn(x3, dim=(0, 2)))

    before = metrics.counter("fallback_graphs")
    _check(fn, [_r(6, 8), _r(3, 4, 5)], _compiled(fn))
    assert metrics.counter("fallback_graphs") == before


def test_compiled_complex_input_transforms_forward_and_backward():
    def fn(z, z3):
        return (fft.fft(z, dim=0), fft.ifft(z, n=9, norm="ortho"), fft.irfft(z), fft.irfft(z, n=9, norm="forward"),
                fft.hfft(z), fft.ifft2(z, s=(4, 7)), fft.irfft2(z, norm="ortho"), fft.fftn(z3), fft.irfftn(z3))

    _check(fn, [_c(6, 5), _c(3, 4, 5)], _compiled(fn))


class SpectralFilter(torch.nn.Module):
    """A Fourier-layer (FNO-style) block: rfft, a learned complex filter on the low modes, irfft."""

    def __init__(self, channels: int = 3, modes: int = 5) -> None:
        super().__init__()
        self.modes = modes
        self.weight = torch.nn.Parameter(torch.randn(channels, modes, dtype=C64) / channels)
        self.mix = torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        spectrum = fft.rfft(x, norm="ortho")
        filtered = torch.zeros_like(spectrum)  # slice assignment: FNO's usual pattern
        filtered[..., :self.modes] = spectrum[..., :self.modes] * self.weight
        y = fft.irfft(filtered, n=n, norm="ortho")
        return torch.relu(self.mix(y.transpose(-1, -2)).transpose(-1, -2) + x)


def test_compiled_training_with_complex_parameter_matches_eager():
    torch.manual_seed(0)
    eager = SpectralFilter()
    compiled_model = SpectralFilter()
    compiled_model.load_state_dict(eager.state_dict())
    x = _r(4, 3, 16)
    compiled = _compiled(compiled_model)
    before = metrics.counter("fallback_graphs")
    for model in (eager, compiled):
        model(x).square().mean().backward()
    assert metrics.counter("fallback_graphs") == before
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        assert p_compiled.grad is not None, name
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_256_points_within_float32_tolerance():
    def fn(x, z):
        return fft.fft(x), fft.rfft(x, norm="ortho"), fft.irfft(z), fft.ifft(z, norm="forward")

    x, z = _r(4, 256), _c(4, 129)
    _assert_close(_compiled(fn)(x, z), fn(x, z), rtol=1e-5, atol=1e-5)


def test_compiled_float64_transforms():
    def fn(x, z):
        return fft.rfft(x), fft.irfft(z), fft.fft(z, norm="ortho")

    x, z = _r(3, 64, dtype=torch.float64), _c(3, 33, dtype=C128)
    _assert_close(_compiled(fn)(x, z), fn(x, z), rtol=1e-10, atol=1e-10)


def test_fftfreq_and_rfftfreq_compile_to_atens_values():
    """A spectral derivative's ``fftfreq`` failed to lower (torch-mlir has no lowering of the factory)."""
    def frequencies(x):
        return (torch.fft.fftfreq(7, 0.1) * x, torch.fft.rfftfreq(100, 1e-3, dtype=torch.float64),
                torch.fft.fftfreq(8, dtype=torch.float64))

    x = torch.tensor(2.0)
    for got, expected in zip(_compiled(frequencies)(x), frequencies(x), strict=True):
        assert torch.equal(got, expected), (got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tables_built_in_the_graph_equal_the_literal_ones(dtype, monkeypatch):
    """A table past LITERAL_ELEMENTS is gathered in the graph from its n values (as a literal, a
    4096-point transform's table ran the process out of memory while compiling): the very values
    of the literal table, for every builder and normalization; and compiled, torch's results."""
    complex_dtype = torch.complex64 if dtype == torch.float32 else C128
    z, x = _c(2, 12, dtype=complex_dtype), _r(2, 12, dtype=dtype)
    half = _c(2, 7, dtype=complex_dtype)
    cases = [(spectral.fft_c2c, (z, [1], 1, True)), (spectral.fft_c2c, (z, [1], 2, False)),
             (spectral.fft_r2c, (x, [1], 0, True)), (spectral.fft_r2c, (x, [1], 1, False)),
             (spectral.fft_c2r, (half, [1], 2, 12)), (spectral.fft_c2r, (half, [1], 0, 13))]
    literal = [fn(*args) for fn, args in cases]
    monkeypatch.setattr(spectral, "LITERAL_ELEMENTS", 16)
    for (fn, args), want in zip(cases, literal):
        assert torch.equal(fn(*args), want), fn.__name__

    def transforms(x, z):
        return fft.fft(z), fft.rfft(x, norm="ortho"), fft.irfft(z[:, :7])

    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    _assert_close(_compiled(transforms)(x, z), transforms(x, z), rtol=tolerance, atol=tolerance)
