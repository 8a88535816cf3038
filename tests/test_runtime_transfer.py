"""NEFFs of a runtime device whose memory is not the host's (the ``cuda`` target on a GPU).

Each input is copied into device-local memory and each result copied back (``runtime/transfer.py``)
instead of passing host tensors through DLPack, which a GPU driver cannot read (and whose
results, in GPU memory, a CPU tensor must not alias). The copying route is exercised here on the
CPU driver, where both routes run: they must agree. ``bench/cuda_target.py`` runs the same route
on a real GPU.
"""

from __future__ import annotations

import glob

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.format import neff
from torch_neuronx.runtime import executable, transfer

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
           torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64)


def _hal():
    return executable.device("local-sync").hal


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_a_tensor_survives_the_round_trip_with_dlpacks_element_type(dtype):
    t = (torch.randn(3, 5) * 4).to(dtype)
    (view,) = transfer.to_device(_hal(), [t])
    dlpack = _hal().from_dlpack_capsule(torch.utils.dlpack.to_dlpack(t))
    assert int(view.element_type) == int(dlpack.element_type)
    (back,) = transfer.to_host(_hal(), [view])
    assert back.dtype == dtype and torch.equal(back, t)


def test_many_at_once_empty_non_contiguous_and_given_outputs():
    source = torch.arange(15.0).reshape(3, 5)
    # The same memory more than once, and tensors sharing a page (a GPU driver refuses to
    # register a page twice: nothing is registered).
    tensors = [torch.empty(0, 3), source, source.t(), source, source[1:], torch.tensor(7, dtype=torch.int64),
               torch.ones(2, 2)[:, 1]]
    back = transfer.to_host(_hal(), transfer.to_device(_hal(), tensors))
    assert [b.shape for b in back] == [t.shape for t in tensors]
    assert all(torch.equal(b, t) for b, t in zip(back, tensors))
    out = torch.empty(5, 3).t()  # a non-contiguous destination of the right shape
    (written,) = transfer.to_host(_hal(), transfer.to_device(_hal(), [source]), [out])
    assert written is out and torch.equal(out, source)


def test_a_dtype_without_an_element_type_is_a_clear_error():
    with pytest.raises(Exception, match="cannot be copied"):
        transfer.to_device(_hal(), [torch.zeros(2, dtype=torch.uint16)])


def test_only_the_local_drivers_share_host_memory():
    assert transfer.host_memory("local-sync") and transfer.host_memory("local-task")
    assert not transfer.host_memory("cuda") and not transfer.host_memory("hip")


def _inputs(header):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(tuple(i["shape"]), generator=g).to(getattr(torch, i["dtype"]))
            for i in header.signature["inputs"]]


def _run(exe, header, inputs):
    if header.signature.get("output_storage"):
        outputs = [torch.full(tuple(o["shape"]), float("nan")).to(getattr(torch, o["dtype"]))
                   for o in header.signature["outputs"]]
        exe.run_into(inputs, outputs)
        return outputs
    return exe(inputs)


def test_copying_calls_agree_with_dlpack_calls(tmp_path, monkeypatch):
    """A graph with resident parameters, a bfloat16 graph and eager kernels (output storage)."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        torch.compile(model, backend="neuron")(torch.randn(3, 8))
        torch.compile(lambda a: (a.to(torch.bfloat16) * 3).softmax(-1), backend="neuron")(torch.randn(4, 6))
    x = torch.randn(5, 7, device="neuron")
    ((x * 1.5).exp().sum(0)).cpu()
    paths = glob.glob(str(tmp_path / "**" / "*.neff"), recursive=True)
    headers = [neff.load(p).header for p in paths]
    assert any(h.signature.get("resident") for h in headers)
    assert any(h.signature.get("output_storage") for h in headers)
    for path in paths:
        module = neff.load(path)
        if any(isinstance(d, str) for i in module.header.signature["inputs"] for d in i["shape"]):
            continue  # a dynamic kernel (an earlier test of this process ran the op at another shape)
        inputs = _inputs(module.header)
        want = _run(executable.Executable(module, "local-sync"), module.header, inputs)
        with monkeypatch.context() as m:
            m.setattr(transfer, "host_memory", lambda driver: False)
            copying = executable.Executable(module, "local-sync")
        assert not copying._host_memory
        for _ in range(2):  # the second call reuses the bound parameters
            got = _run(copying, module.header, inputs)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g, w), module.header.metadata.get("graph")
