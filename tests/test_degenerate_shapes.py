"""Degenerate shapes compile to torch's values, and a lowering that aborts cannot end the process.

0-d tensors given a ``dim`` and zero-size tensors made torch-mlir's C++ abort (SIGSEGV,
``LLVM ERROR``) inside the user's process. The compile path now spells those shapes out
before lowering (``passes/degenerate_shapes.py``), and lowers in a worker process
(``compiler/lowering_worker.py``) whose death is a NeuronCompileError.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_neuronx.compiler import lower, lowering_worker
from torch_neuronx.compiler.errors import NeuronCompileError


def scalar_dims(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x.sum(dim=0, keepdim=True), x.amax(dim=0), x.amin(dim=-1, keepdim=True), x.argmax(dim=0),
            x.argmin(), x.logsumexp(dim=0), x.mean(dim=0), (x > 0).any(dim=0), (x > 0).all(dim=-1),
            x.cumsum(dim=0), x.softmax(dim=0), x.max(dim=0).values, x.sort(dim=0).values, torch.fmax(x, x))


def scalar_indexing(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Indexing ops of 0-d tensors (torch-mlir refused scatter's and index_select's ranks)."""
    return (x.scatter(0, i, s), x.scatter(-1, i, 2.5), x.scatter_add(0, i, s), torch.index_select(x, 0, i),
            x.scatter_reduce(0, i, s, "amax"), torch.gather(x, 0, i), x.index_add(0, i.reshape(1), s),
            torch.take(x, i))


def zero_size(x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    empty_index = torch.zeros(0, dtype=torch.long)
    return (x.sum(), x.sum(dim=0), x.mean(dim=0), x.prod(dim=0), x.t() @ x, x @ torch.ones(3, 0),
            torch.cat([x, k]), torch.gather(x.reshape(-1), 0, empty_index), k[empty_index], x * 2,
            x.amax(dim=1), k.reshape(-1)[empty_index].sum())


@pytest.mark.parametrize("fn, inputs", [
    (scalar_dims, (torch.tensor(-3.5),)),
    (zero_size, (torch.randn(0, 3), torch.randn(2, 3))),
    (scalar_indexing, (torch.tensor(3.0), torch.tensor(0), torch.tensor(9.0))),
], ids=["scalar-dims", "zero-size", "scalar-indexing"])
def test_degenerate_shapes_compile_to_eagers_values(fn, inputs):
    got = torch.compile(fn, backend="neuron")(*inputs)
    expected = fn(*inputs)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, equal_nan=True)


def test_indexing_ops_of_0d_tensors_run_on_the_device_without_a_fallback():
    """On the eager device they fell back to the CPU (the lowering refused the ranks)."""
    from torch_neuronx import observe

    inputs = (torch.tensor(3.0), torch.tensor(0), torch.tensor(9.0))
    before = observe.counter("eager_fallbacks")
    got = scalar_indexing(*(t.to("neuron") for t in inputs))
    for g, e in zip(got, scalar_indexing(*inputs), strict=True):
        assert g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e)
    assert observe.counter("eager_fallbacks") == before


def _raw_zero_size_gather() -> str:
    """A raw torch-dialect module whose StableHLO conversion aborts torch-mlir (LLVM ERROR)."""
    gm = make_fx(lambda x, i: torch.gather(x, 0, i))(torch.randn(0), torch.zeros(0, dtype=torch.long))
    return lower._asm(lower.import_raw(gm))


def test_a_request_of_zero_rows_through_a_transformer_layer_compiles():
    """A serving batch of 0 rows: the fast path's attention split its heads with
    ``view(batch, -1, heads, head_dim)``, whose -1 a batch of 0 leaves undetermined."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0).eval()
    x, padding = torch.randn(0, 5, 8), torch.zeros(0, 5, dtype=torch.bool)
    with torch.no_grad():
        got = torch.compile(lambda x, m: layer(x, src_key_padding_mask=m), backend="neuron")(x, padding)
    assert got.shape == (0, 5, 8)


def test_an_aborting_lowering_is_an_error_and_the_next_graph_lowers():
    with pytest.raises(NeuronCompileError, match="lowering process (was killed by SIG|exited)") as info:
        lowering_worker.to_stablehlo(_raw_zero_size_gather())
    assert info.value.stage == "lowering"
    assert "Failed to infer result type" in str(info.value)  # the worker's last words, kept
    gm = make_fx(lambda x: x + 1)(torch.randn(3))
    assert "stablehlo.add" in lowering_worker.to_stablehlo(lower._asm(lower.import_raw(gm)))


def test_a_lowering_past_its_timeout_is_stopped(monkeypatch):
    gm = make_fx(lambda x: x * 3)(torch.randn(3))
    raw = lower._asm(lower.import_raw(gm))
    read = lowering_worker.config.get  # (a millisecond: the variable takes whole seconds, at least 1)
    with monkeypatch.context() as patched:
        patched.setattr(lowering_worker.config, "get",
                        lambda name: 0.001 if name == "TORCH_NEURONX_LOWERING_TIMEOUT" else read(name))
        with pytest.raises(NeuronCompileError, match="TORCH_NEURONX_LOWERING_TIMEOUT"):
            lowering_worker.to_stablehlo(raw)
    assert "stablehlo.multiply" in lowering_worker.to_stablehlo(raw)


def test_copy_forms_of_views_and_nan_ignoring_extremes_compile():
    # view_copy & co reached torch-mlir whole ("failed to legalize torch.constant.int"); fmax and
    # fmin failed to lower with a 0-d operand (decompositions/copies.py).
    def fn(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.view_copy(x, (4, 6)), torch.permute_copy(x, (2, 0, 1)), *torch.unbind_copy(x, 1),
                torch.as_strided_copy(x, (3, 2), (1, 4)), torch.narrow_copy(x, 2, 1, 2),
                torch.fmax(x, s), torch.fmin(s, x))

    x = torch.randn(2, 3, 4)
    x[0, 0, 0] = float("nan")
    s = torch.tensor(float("nan"))
    for got, expected in zip(torch.compile(fn, backend="neuron")(x, s), fn(x, s), strict=True):
        torch.testing.assert_close(got, expected, equal_nan=True)
    torch.testing.assert_close(torch.compile(torch.fmax, backend="neuron")(x, torch.tensor(0.5)),
                               torch.fmax(x, torch.tensor(0.5)), equal_nan=True)


def test_linear_algebra_of_empty_matrices_compiles():
    # The unrolled decompositions reduced over zero-size dims at trace time; they now decline
    # empty inputs, whose results the degenerate_shapes pass computes from the shapes alone.
    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inverse, info = torch.linalg.inv_ex(a)
        return inverse, info, torch.linalg.det(a), torch.linalg.det(b), torch.cholesky_inverse(b)

    a, b = torch.randn(0, 0), torch.randn(2, 0, 0)
    for got, expected in zip(torch.compile(fn, backend="neuron")(a, b), fn(a, b), strict=True):
        torch.testing.assert_close(got, expected)


def test_training_on_an_empty_batch_gives_zero_gradients_compiled_and_on_the_device():
    """A convolution's weight gradient over an empty batch was a convolution with 0 channels (a
    shape error); on the device, an empty gradient with the strides of an expanded tensor (0, 0)
    was refused by the runtime ("Unsupported strided tensor") and fell back to the CPU."""
    import warnings

    import torch.nn.functional as F

    w0, x0 = torch.randn(4, 3, 3, 3), torch.randn(0, 3, 5, 5)
    compiled = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="neuron")
    w = w0.clone().requires_grad_()
    compiled(x0, w).sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = w0.to("neuron").requires_grad_()
        F.conv2d(x0.to("neuron"), w, padding=1).sum().backward()
        x = torch.randn(0, 5, device="neuron", requires_grad=True)
        (x * 2).sum().backward()
    assert torch.equal(w.grad.cpu(), torch.zeros_like(w0)) and x.grad.shape == (0, 5)


def test_channels_last_backwards_on_the_device_allocate_without_a_kernel():
    """``new_empty_strided`` (every channels-last backward) had a kernel that failed to lower and
    ran on the CPU with a warning; it is an allocation."""
    import copy
    import warnings

    torch.manual_seed(0)
    for module in (torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(3, 3, 3, bias=False)):
        x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
        expected = x.clone().requires_grad_()
        module(expected).square().sum().backward()
        device = copy.deepcopy(module).to("neuron")
        got = x.to("neuron").requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            device(got).square().sum().backward()
        torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=1e-5, atol=1e-5)
        assert got.grad.stride() == expected.grad.stride()


def test_scatters_with_no_indices_compile_to_their_operand():
    """An embedding's backward over an empty batch (an adding scatter of no values) made IREE's
    compiler die with SIGFPE; the scatter writes nothing, so it is its operand."""
    import torch.nn.functional as F

    w = torch.randn(5, 4, requires_grad=True)
    torch.compile(lambda i, w: F.embedding(i, w), backend="neuron")(torch.zeros(0, 3, dtype=torch.long),
                                                                     w).sum().backward()
    assert torch.equal(w.grad, torch.zeros(5, 4))

    def scatters(x, index, src):
        return x.scatter_add(0, index, src), x.index_add(0, index[:, 0], src), x.index_put((index[:, 0],), src)
    args = torch.randn(3, 2), torch.zeros(0, 2, dtype=torch.long), torch.randn(0, 2)
    for got, expected in zip(torch.compile(scatters, backend="neuron")(*args), scatters(*args)):
        assert torch.equal(got, expected)
