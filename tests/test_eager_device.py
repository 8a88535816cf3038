"""The eager ``neuron`` device: tensors in allocator memory, ops compiled per dispatch key, CPU fallback."""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torch_neuronx
from torch_neuronx import metrics
from torch_neuronx.runtime.tensor import NeuronTensor


def counted(name: str) -> int:
    return metrics.counter(name)


def test_factories_and_copies_live_in_allocator_memory():
    torch.neuron.synchronize()  # queued work of earlier tests holds its memory until it has run
    gc.collect()  # neuron tensors an earlier test left in reference cycles
    before = torch.neuron.memory_allocated()
    x = torch.arange(12, dtype=torch.float32).view(3, 4).to("neuron")
    assert isinstance(x, NeuronTensor) and x.device == torch.device("neuron", 0)
    assert torch.neuron.memory_allocated() >= before + 48
    assert x._data.data_ptr() == x._allocation.address  # values sit in the allocator's block
    assert torch.equal(x.cpu(), torch.arange(12, dtype=torch.float32).view(3, 4))
    y = torch.empty(5, 5, device="neuron")
    assert y.shape == (5, 5) and y.device.type == "neuron"
    del x, y
    torch.neuron.synchronize()
    gc.collect()
    assert torch.neuron.memory_allocated() == before


def test_ops_compile_once_per_dispatch_key_and_match_cpu():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    na, nb = a.to("neuron"), b.to("neuron")
    fallbacks = counted("eager_fallbacks")
    out = torch.tanh(na * nb + 1.5)
    torch.testing.assert_close(out.cpu(), torch.tanh(a * b + 1.5))
    torch.tanh(na * nb + 1.5)  # a shape run on its op family's dynamic kernel gets its own at its second call
    first = counted("eager_ops_compiled") + counted("eager_hlo_cache_hits")
    out2 = torch.tanh(na * nb + 1.5)  # same keys from now on: no new kernels
    assert counted("eager_ops_compiled") + counted("eager_hlo_cache_hits") == first
    torch.testing.assert_close(out2.cpu(), out.cpu())
    assert counted("eager_fallbacks") == fallbacks  # compiled kernels ran (new, cached, or a family's)


def test_views_alias_device_memory_and_in_place_ops_write_through():
    x = torch.zeros(2, 3).to("neuron")
    row = x[1]
    row.add_(5.0)  # in place on a view: compiled add, written back into x's memory
    assert torch.equal(x.cpu(), torch.tensor([[0.0, 0.0, 0.0], [5.0, 5.0, 5.0]]))
    t = x.t()
    assert t.shape == (3, 2) and t._allocation is x._allocation
    assert t.transpose_(0, 1) is t and t.shape == (2, 3) and t.stride() == (3, 1)  # in-place views
    t.unsqueeze_(0).as_strided_((3,), (1,), 3)
    assert (t.shape, t.stride(), t.storage_offset()) == ((3,), (1,), 3)
    torch.testing.assert_close(t.cpu(), torch.tensor([5.0, 5.0, 5.0]))


_UNDER_INFERENCE_MODE = {
    "slice": lambda w, b: w[1:3],
    "transpose": lambda w, b: w.t(),
    "view": lambda w, b: w.view(24),
    "detach": lambda w, b: w.detach(),
    "split": lambda w, b: w.split(2)[1],
    "expand": lambda w, b: b.unsqueeze(0).expand(3, 4),
    "matmul": lambda w, b: w @ w.t(),
    "pointwise": lambda w, b: w * 2,
    "write an element": lambda w, b: b.__setitem__(0, 5.0) or b,
    "write a slice in place": lambda w, b: (b[1:3].add_(1), b)[1],
    "attention": lambda w, b: torch.nn.functional.scaled_dot_product_attention(w[None], w[None], w[None]),
}


@pytest.mark.parametrize("name", list(_UNDER_INFERENCE_MODE))
def test_ops_in_inference_mode_on_tensors_made_outside_it(name):
    """Every view of a neuron tensor made outside ``torch.inference_mode()`` raised "Cannot set
    version_counter for inference tensor" inside it (an evaluation loop of any Hugging Face model
    failed at its first slice of a buffer): values, inference flags and writes as the CPU's."""
    fn = _UNDER_INFERENCE_MODE[name]

    def run(device):
        torch.manual_seed(0)
        w, b = torch.randn(4, 6, device=device), torch.zeros(4, device=device)
        with torch.inference_mode():
            out = fn(w, b)
        return out, b

    (expected, b_host), (got, b_device) = run("cpu"), run("neuron")
    assert got.device.type == "neuron" and got.is_inference() == expected.is_inference()
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(b_device.cpu(), b_host)
    assert b_device._version == b_host._version  # (writes counted on the tensor made outside)


def test_inference_tensors_leave_the_device_and_alias_like_others():
    """Without autograd keys (inference mode), ``to``/``reshape`` reach the device whole."""
    with torch.inference_mode():
        x = torch.arange(6.0).reshape(2, 3).to("neuron")
        assert type(x.cpu()) is torch.Tensor and x.to("cpu").device.type == "cpu"
        assert type(x.to(torch.float64)) is NeuronTensor and x.to(torch.float64).dtype == torch.float64
        assert x.float() is x
        flat = x.reshape(6)  # a view: writes show in x
        flat[0] = 7
        assert x.cpu()[0, 0] == 7
        copied = x.t().reshape(6)  # a copy
        torch.testing.assert_close(copied.cpu(), torch.tensor([7.0, 3, 1, 4, 2, 5]))
    assert type(x.cpu()) is torch.Tensor  # and still after inference mode


def test_training_step_on_neuron_matches_cpu():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    neuron_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    neuron_model.load_state_dict(cpu_model.state_dict())
    neuron_model.to("neuron")
    assert all(p.device.type == "neuron" for p in neuron_model.parameters())
    x = torch.randn(4, 8)
    for model, inp in ((cpu_model, x), (neuron_model, x.to("neuron"))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            model(inp).square().mean().backward()
            opt.step()
    for p_cpu, p_neuron in zip(cpu_model.parameters(), neuron_model.parameters()):
        torch.testing.assert_close(p_neuron.cpu(), p_cpu, rtol=1e-5, atol=1e-6)


def test_unlowerable_op_falls_back_to_cpu_with_one_warning():
    x = torch.tensor([[2.0, 0.0], [0.0, 3.0]]).to("neuron")
    before = counted("eager_fallbacks")
    with pytest.warns(RuntimeWarning, match="aten.linalg_eig.default runs on the CPU"):
        values = torch.linalg.eigvals(x)  # complex results: nothing lowers it
    assert values.device.type == "neuron"
    assert torch.equal(values.cpu(), torch.tensor([2.0, 3.0], dtype=torch.complex64))
    assert counted("eager_fallbacks") == before + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.linalg.eigvals(x)


@pytest.mark.parametrize("op", [
    lambda x: torch.nonzero(x), lambda x: torch.masked_select(x, x > 0), lambda x: torch.unique(x),
    lambda x: x[x > 0], lambda x: x.view(2, 3)[x.view(2, 3)[:, 0] >= 0], lambda x: torch.argwhere(x),
    lambda x: torch.unique_consecutive(x), lambda x: torch.repeat_interleave((x > 0).long()),
], ids=["nonzero", "masked_select", "unique", "mask_index", "row_mask", "argwhere", "unique_consecutive",
        "repeat_interleave"])
def test_ops_with_data_dependent_shapes_run_on_the_host_without_a_fallback_warning(op):
    """Their result's shape depends on the values, which no kernel can have: they synchronize, as
    on CUDA, and are not fallbacks (a RuntimeWarning per op for ordinary indexing was noise)."""
    x = torch.tensor([0.0, 1.5, 0.0, 2.0, -1.0, 1.5])
    before = counted("eager_fallbacks")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = op(x.to("neuron"))
    assert out.device.type == "neuron" and torch.equal(out.cpu(), op(x))
    assert counted("eager_fallbacks") == before


@pytest.mark.parametrize("shape,mask_dims", [((4, 3), 1), ((4, 3), 2), ((2, 3, 4), 2), ((5,), 1)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_assigning_one_value_per_element_selected_by_a_mask_runs_compiled(shape, mask_dims, accumulate):
    """``x[mask] = values`` (one value per selected element): torch-mlir cannot lower a boolean
    index, and it fell back to the CPU with a warning; the mask becomes integer indices first."""
    torch.manual_seed(sum(shape) + mask_dims)
    expected = torch.randn(*shape)
    mask = torch.rand(*shape[:mask_dims]) > 0.5
    values = torch.randn(int(mask.sum()), *shape[mask_dims:])
    x = expected.to("neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x.index_put_((mask.to("neuron"),), values.to("neuron"), accumulate=accumulate)
        expected.index_put_((mask,), values, accumulate=accumulate)
        assert torch.equal(x.cpu(), expected)
        y = torch.zeros(3, 4, device="neuron")
        y[:, torch.tensor([True, False, True, False], device="neuron")] = torch.arange(6.0, device="neuron").view(3, 2)
    assert torch.equal(y.cpu(), torch.tensor([[0.0, 0, 1, 0], [2, 0, 3, 0], [4, 0, 5, 0]]))


def test_random_numbers_follow_the_host_generator():
    torch.manual_seed(7)
    a = torch.randn(5, device="neuron").cpu()
    torch.manual_seed(7)
    assert torch.equal(a, torch.randn(5))


def test_user_kernel_runs_on_neuron_tensors():
    @torch_neuronx.kernel
    def scaled_add(x, y, scale: float = 2.0):
        return x * scale + y

    a, b = torch.randn(6), torch.randn(6)
    out = scaled_add(a.to("neuron"), b.to("neuron"), scale=3.0)
    assert isinstance(out, NeuronTensor)
    torch.testing.assert_close(out.cpu(), a * 3.0 + b)


SCRIPT = """
import json, torch, torch_neuronx
from torch_neuronx import metrics
x = torch.arange(6, dtype=torch.float32).to("neuron")
y = (x * 3 - 1).cpu()
print(json.dumps({"traces": metrics.counter("kernel_traces"), "hits": metrics.counter("eager_hlo_cache_hits"),
                  "y": y.tolist()}))
"""


@pytest.mark.parametrize("hlo_cache", ["1", "0"])
def test_eager_lowerings_persist_in_the_hlo_cache(tmp_path, hlo_cache):
    env = {**os.environ, "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"),
           "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"), "TORCH_NEURONX_HLO_CACHE": hlo_cache}

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["y"] == second["y"] == [-1.0, 2.0, 5.0, 8.0, 11.0, 14.0]
    assert first["traces"] == 2  # mul and sub
    if hlo_cache == "1":
        assert second == {**second, "traces": 0, "hits": 2}
    else:
        assert second["traces"] == 2 and second["hits"] == 0
        assert not (tmp_path / "hlo").exists() or not any((tmp_path / "hlo").rglob("*.hlo"))
    if hlo_cache == "1":  # the NEFF cache off leaves the HLO cache on (its own variable, per the spec)
        env["TORCH_NEURONX_NEFF_DISABLE_CACHE"] = "1"
        assert run() == {**second, "traces": 0, "hits": 2}


@pytest.mark.parametrize("only_unimplemented", ["0", "1"])
def test_execution_errors_follow_the_fallback_policy(only_unimplemented, monkeypatch):
    """A kernel that fails when it runs (on its stream, after the op returned) falls back to the
    CPU into the op's outputs; with TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1 the error
    reaches the next synchronization instead (a host read of the result)."""
    import types

    from torch_neuronx.device import eager, fallback
    from torch_neuronx.runtime.executable import NeuronRuntimeError

    x = torch.full((3,), 2.0).to("neuron")
    (x - 0.5).cpu()  # compile aten.sub.Tensor for this dispatch key
    key = next(k for k in eager._kernels if (k[0] == "aten.sub.Tensor" and k[1][0][1] == (3,))
               or (k[0] == "dynamic" and k[1] == "aten.sub.Tensor" and len(k[2][0][1]) == 1))
    kernel = eager._kernels[key]

    class Failing:  # fault injection at the runtime boundary: the device rejects the work
        def __call__(self, tensors, outputs=None):
            raise NeuronRuntimeError("injected device fault")

        run_into = __call__

    injected = types.SimpleNamespace(compiled=Failing(), out_spec=kernel.out_spec, metas=kernel.metas,
                                     name=kernel.name, shapes=kernel.shapes, dtypes=kernel.dtypes,
                                     orders=kernel.orders, copies=kernel.copies)
    monkeypatch.setitem(eager._kernels, key, injected)
    monkeypatch.setenv("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", only_unimplemented)
    monkeypatch.setattr(fallback, "_warned", set())
    if only_unimplemented == "1":
        out = x - 0.5
        with pytest.raises(NeuronRuntimeError, match="aten.sub.Tensor failed.*injected device fault"):
            out.cpu()
    else:
        with pytest.warns(RuntimeWarning, match="execution failed: injected device fault"):
            out = x - 0.5
            assert torch.equal(out.cpu(), torch.full((3,), 1.5))


def test_runtime_refuses_tensor_subclasses_instead_of_reading_wild_memory():
    from torch_neuronx.runtime.executable import NeuronRuntimeError, _aligned_contiguous

    with pytest.raises(NeuronRuntimeError, match="plain CPU tensors, got NeuronTensor"):
        _aligned_contiguous(torch.ones(4).to("neuron"))


def test_sort_on_neuron_leaves_its_input_alone():
    x = torch.randn(3, 6)
    nx = x.to("neuron")
    values = nx.sort(dim=1).values
    assert torch.equal(nx.cpu(), x)
    torch.testing.assert_close(values.cpu(), x.sort(dim=1).values)


def test_ops_on_empty_tensors_run_compiled_not_on_the_cpu():
    """An op whose inputs have no elements still compiles (the passes' constants are typed for the
    importer) instead of falling back to the CPU with a misleading warning."""
    from torch_neuronx import metrics

    before = metrics.counter("eager_fallbacks")
    empty = torch.randn(1, 0, 3)
    assert torch.exp(empty.to("neuron")).shape == (1, 0, 3)
    a, b = torch.randn(3, 0), torch.randn(0, 4)
    assert torch.equal((a.to("neuron") @ b.to("neuron")).cpu(), torch.zeros(3, 4))
    assert torch.equal(empty.to("neuron").sum(1).cpu(), torch.zeros(1, 3))
    assert metrics.counter("eager_fallbacks") == before


def test_numpy_of_a_neuron_tensor_behaves_as_on_cuda():
    """Refused with CUDA's TypeError (torch's subclass message said nothing useful); ``force=True`` copies."""
    import numpy as np

    x = torch.randn(3)
    d = x.to("neuron")
    for convert in (d.numpy, lambda: np.asarray(d)):
        with pytest.raises(TypeError, match="can't convert neuron:0 device type tensor to numpy"):
            convert()
    assert np.array_equal(d.requires_grad_().numpy(force=True), x.numpy())


def test_a_call_the_device_rejects_is_judged_on_its_values_not_on_zeros():
    """A call whose meta check fails is confirmed on the CPU kernel: on zero-filled copies, lengths
    ``[5, 3, 1]`` of ``pack_padded_sequence`` on the device were "an element in 'lengths' that is
    <= 0". The CPU's verdict on the real values decides (here: it packs)."""
    x, lengths = torch.randn(3, 5, 2), torch.tensor([5, 3, 1])
    want = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = torch.nn.utils.rnn.pack_padded_sequence(x.to("neuron"), lengths.to("neuron"), batch_first=True)
    assert torch.equal(got.batch_sizes, want.batch_sizes)
    torch.testing.assert_close(got.data.cpu(), want.data)
    with pytest.raises(RuntimeError, match="<= 0"):  # a real zero length is still the CPU's error
        torch.nn.utils.rnn.pack_padded_sequence(x.to("neuron"), torch.tensor([5, 3, 0]).to("neuron"),
                                                batch_first=True)


def test_a_packed_sequence_runs_an_lstm_on_neuron():
    """``pack_padded_sequence`` keeps ``batch_sizes`` on the CPU, as CUDA does (PackedSequence refuses
    it anywhere else: "batch_sizes should always be on CPU")."""
    torch.manual_seed(0)
    x, lengths = torch.randn(3, 5, 4), torch.tensor([5, 3, 2])
    lstm = torch.nn.LSTM(4, 6, batch_first=True)

    def run(device):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x.to(device), lengths, batch_first=True)
        out, (h, _) = lstm.to(device)(packed)
        padded, sizes = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return padded.cpu(), h.cpu(), sizes, packed.batch_sizes.device

    want = run("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = run("neuron")
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert torch.equal(got[2], want[2]) and got[3].type == "cpu"


@pytest.mark.parametrize("write", [
    lambda t: t.add_(1), lambda t: t.mul_(2), lambda t: t.relu_(), lambda t: t.fill_(2), lambda t: t.zero_(),
    lambda t: t.fill_(torch.tensor(5.0, device=t.device)), lambda t: t.copy_(torch.ones(4, 3, device=t.device)),
], ids=["add_", "mul_", "relu_", "fill_", "zero_", "fill_tensor", "copy_"])
def test_writes_into_an_expanded_tensor_raise_or_fill_as_on_the_cpu(write):
    """CPU refuses most writes into a tensor whose elements share memory, at the call; on neuron the
    queued write failed later and poisoned the tensor (``x.expand(4, 3).add_(1)``)."""
    def run(device):
        base = torch.ones(1, 3, device=device)
        try:
            write(base.expand(4, 3))
            outcome = "ok"
        except RuntimeError as exc:
            outcome = str(exc)
        return outcome, base.cpu()

    want, got = run("cpu"), run("neuron")
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1])  # and the tensor is not poisoned


def test_a_transformer_encoder_in_eval_with_a_padding_mask_runs_its_dense_path():
    """torch sends ``nn.TransformerEncoder`` in eval with a padding mask down its nested-tensor fast
    path on PrivateUse1 devices, and neuron tensors cannot be nested ("NestedTensorImpl doesn't
    support sizes"). On neuron the mask check answers "not left aligned": the dense path runs, equal
    to the CPU's dense path everywhere and to its nested path on every real token."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    nested = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    dense = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    dense.load_state_dict(nested.state_dict())
    x, pad = torch.randn(2, 5, 16), torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want_nested, want_dense = nested(x, src_key_padding_mask=pad), dense(x, src_key_padding_mask=pad)
        got = nested.to("neuron")(x.to("neuron"), src_key_padding_mask=pad.to("neuron")).cpu()
        torch.testing.assert_close(got, want_dense, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[~pad], want_nested[~pad], rtol=1e-5, atol=1e-5)
        unchecked = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True, mask_check=False).eval()
        with pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
            unchecked.to("neuron")(x.to("neuron"), src_key_padding_mask=pad.to("neuron"))


def test_formatting_and_repr_read_as_torchs():
    """``f"{loss:.3f}"`` of a 0-d neuron tensor (a TypeError before), and a repr that shows
    autograd's part (``requires_grad=True``, ``grad_fn=<...>``) as torch's does."""
    x = torch.tensor([1.5, 2.0], device="neuron", requires_grad=True)
    loss = (x * 2).sum()
    assert f"{loss:.3f}" == "7.000" and f"{loss:>6.1f}" == "   7.0" and f"{loss}" == "7.0"
    assert repr(x) == "tensor([1.5000, 2.0000], device='neuron:0', requires_grad=True)"
    assert repr(x * 2) == "tensor([3., 4.], device='neuron:0', grad_fn=<MulBackward0>)"
    assert f"{x.detach()}" == "tensor([1.5000, 2.0000], device='neuron:0')"
    weight = torch.nn.Linear(2, 1).to("neuron").weight  # a parameter prints as torch's do
    assert repr(weight).startswith("Parameter containing:\ntensor([[") and repr(weight).endswith(
        "device='neuron:0', requires_grad=True)")
    assert repr(weight.detach()).startswith("tensor([[")
    # the device where torch puts it for an accelerator: before size= and dtype=
    assert repr(torch.ones(2, dtype=torch.float16, device="neuron")) == \
        "tensor([1., 1.], device='neuron:0', dtype=torch.float16)"
    assert repr(torch.tensor(2.5, dtype=torch.float64, device="neuron")) == \
        "tensor(2.5000, device='neuron:0', dtype=torch.float64)"
    assert repr(torch.empty(0, 3, dtype=torch.int32, device="neuron")) == \
        "tensor([], device='neuron:0', size=(0, 3), dtype=torch.int32)"


@pytest.mark.parametrize("update", [
    lambda t: t.pow_(2), lambda t: t.__ipow__(3), lambda t: t.double().float_power_(2),
    lambda t: t.ldexp_(torch.tensor([1, 2], device=t.device)),
], ids=["pow_", "ipow", "float_power_", "ldexp_"])
def test_in_place_ops_whose_functional_twin_has_another_overload_name(update):
    """``pow_.Scalar`` is ``pow.Tensor_Scalar`` (``pow.Scalar`` takes a number as self): the in-place
    ops failed with a schema error."""
    host = torch.tensor([1.5, -2.0])
    want = update(host.clone())
    got = update(host.to("neuron"))
    torch.testing.assert_close(got.cpu(), want)


def test_tensor_constructors_read_zero_dim_neuron_tensors_as_cuda_does():
    """``torch.tensor([a, b])`` of 0-d neuron tensors reads each value with Python dispatch
    excluded: it failed with an internal assertion of PyTorch's; queued values are waited for."""
    x = torch.arange(6, dtype=torch.float32, device="neuron")
    a, b = x.sum(), x.max()  # queued work: the constructor must wait for it
    i = torch.tensor(3, device="neuron")
    assert torch.equal(torch.tensor([a, b]), torch.tensor([15.0, 5.0]))
    assert torch.equal(torch.tensor([a, 1.0]), torch.tensor([15.0, 1.0]))
    assert torch.equal(torch.as_tensor([i, i]), torch.tensor([3, 3]))
    assert torch.equal(torch.Tensor([a, b]), torch.tensor([15.0, 5.0]))
    nested = torch.tensor([[a], [b]], device="neuron")
    assert nested.device.type == "neuron" and torch.equal(nested.cpu(), torch.tensor([[15.0], [5.0]]))
    with pytest.raises(ValueError, match="only one element tensors"):
        torch.tensor([x, x])


def test_eager_kernels_under_keys_from_the_graph_not_the_hlo(monkeypatch, tmp_path):
    """With TORCH_NEURONX_NEFF_KEY_FROM_HLO=0 an eager op's two NEFFs (writing into given output
    storage, and plain) had one key: the second got the first's NEFF, failed ("expected 3 arguments
    but passed 2") and the op fell back to the CPU with a warning."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_KEY_FROM_HLO", "0")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("TORCH_NEURONX_HLO_CACHE", "0")
    x = torch.randn(13, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.cat([x.to("neuron"), x.to("neuron") * 2], 1).cpu()
    assert torch.equal(got, torch.cat([x, x * 2], 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_in_eval_runs_compiled_forward_and_backward(dtype):
    """A BatchNorm in ``eval()`` (every ResNet or MobileNet served on the device) ran on the CPU
    at every call: torch-mlir could not lower ``native_batch_norm``'s empty saved statistics."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(8).eval().to(dtype)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.uniform_(), bn.bias.uniform_()
    device = copy.deepcopy(bn).to("neuron")
    x = torch.randn(2, 8, 4, 4, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.inference_mode():
            torch.testing.assert_close(device(x.to("neuron")).cpu(), bn(x), rtol=1e-5, atol=1e-5)
        got = x.to("neuron").requires_grad_()
        device(got).square().sum().backward()
    expected = x.clone().requires_grad_()
    bn(expected).square().sum().backward()
    torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=1e-4, atol=1e-4)


def test_sorts_along_long_dimensions_run_torchs_cpu_kernel():
    """IREE sorts by comparing every pair (``torch.sort`` of 100k elements took 5.5 s): from
    ``HOST_SORT_LENGTH`` elements on, the sort family runs torch's CPU kernel over the device
    memory, no kernel traced, with the CPU's values and indices."""
    from torch_neuronx import observe
    from torch_neuronx.device.long_sorts import HOST_SORT_LENGTH

    torch.manual_seed(0)
    x = torch.randn(2, HOST_SORT_LENGTH + 5)
    device = x.to("neuron")
    traces = observe.counter("kernel_traces")
    calls = {
        "sort": lambda t: torch.sort(t, dim=1, descending=True),
        "stable_argsort": lambda t: torch.argsort(t, dim=-1, stable=True),
        "topk": lambda t: torch.topk(t, 7),
        "kthvalue": lambda t: torch.kthvalue(t, 100, 1),
        "median": lambda t: torch.median(t, 1),
        "median_all": lambda t: torch.median(t),
    }
    for name, call in calls.items():
        for got, expected in zip(torch.utils._pytree.tree_leaves(call(device)),
                                 torch.utils._pytree.tree_leaves(call(x))):
            assert torch.equal(got.cpu(), expected), name
    assert observe.counter("kernel_traces") == traces


def test_fills_write_their_target_in_place_without_a_second_copy_of_it():
    """``zero_()``/``fill_(number)`` (and so ``torch.zeros``/``ones``/``full``) computed the values
    into new memory and copied them: the peak was twice the target. They are torch's CPU fill
    over the target's memory now, queued on the stream; views, expanded and complex targets and
    torch's overflow error as on the CPU."""
    x = torch.empty(512, 512, device="neuron")
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    x.fill_(3.5)
    x.zero_()
    y = torch.ones(512, 512, device="neuron")
    z = torch.full((512, 512), 7, dtype=torch.int32, device="neuron")
    torch.neuron.synchronize()
    assert torch.neuron.max_memory_allocated() - base == torch.neuron.memory_allocated() - base
    assert x.sum().item() == 0 and y.sum().item() == 512 * 512 and z.sum().item() == 7 * 512 * 512
    host, dev = torch.zeros(4, 4), torch.zeros(4, 4, device="neuron")
    for t in (host, dev):
        t.t()[1].fill_(1.5)
        t[2].fill_(True)
        t[:, 3].zero_()
        torch.zeros(3, device=t.device).expand(4, 3).fill_(2)
    torch.testing.assert_close(dev.cpu(), host)
    c = torch.zeros(2, dtype=torch.complex64, device="neuron")
    c.fill_(1 + 2j)
    torch.testing.assert_close(c.conj().cpu(), torch.full((2,), 1 - 2j))
    with pytest.raises(RuntimeError, match="cannot be converted to type int8_t without overflow"):
        torch.zeros(2, dtype=torch.int8, device="neuron").fill_(300)


def test_set_forms_and_is_set_to_follow_the_cpu():
    """``t.set_(storage)`` and ``t.set_()`` raised a device error naming "cpu" or "meta";
    ``t.set_(tensor)`` left ``t``'s storage empty (so ``is_set_to`` was False, even for a tensor and
    itself). Each form now views the memory it names, as on the CPU."""
    for device in ("cpu", "neuron"):
        x = torch.arange(6.0, device=device)
        whole = torch.empty(0, device=device).set_(x.untyped_storage())
        part = torch.empty(0, device=device).set_(x[2:].view(2, 2))
        part.add_(1)
        assert torch.empty(3, device=device).set_().shape == (0,)
        assert x.is_set_to(x) and part.is_set_to(x[2:].view(2, 2)) and not part.is_set_to(x)
        assert whole.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        del x
        if device == "cpu":
            expected = (whole.tolist(), part.tolist())
    assert (whole.cpu().tolist(), part.cpu().tolist()) == expected
