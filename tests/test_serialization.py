"""Neuron tensors through torch.save/torch.load, pickle and copy.deepcopy (runtime/serialization.py).

Before: ``copy.deepcopy`` of a neuron tensor or module and ``torch.load(..., map_location="neuron")``
killed the process (SIGSEGV), ``torch.save``/``pickle`` of a neuron tensor raised "cannot pickle
'_thread.lock' object" (found by a helper porting a training script as a new user). Each runs in a
subprocess where a regression would kill it.
"""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys

import pytest
import torch

import torch_neuronx  # noqa: F401

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64)


def _values(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    return (torch.randn(3, 4) * 5).to(dtype)


def _loaded(obj: object, **kwargs: object) -> object:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **kwargs)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_save_and_load_keep_device_dtype_and_values(dtype):
    x = _values(dtype)
    back = _loaded(x.to("neuron"))  # weights_only, torch.load's default
    assert back.device == torch.device("neuron", 0) and back.dtype == dtype
    assert torch.equal(back.cpu(), x)
    on_cpu = _loaded(x.to("neuron"), map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, x)


@pytest.mark.parametrize("shape", [(0,), (0, 2), (3, 0, 4)])
def test_empty_tensors_load_in_weights_only_mode(shape):
    """An empty buffer (a zero-length cache in a state_dict) pickled as ``builtins.bytes()``, which
    torch.load's default weights_only mode refused ("Unsupported global: GLOBAL bytes")."""
    back = _loaded({"empty": torch.zeros(shape).to("neuron"), "full": torch.ones(2).to("neuron")})
    assert back["empty"].device.type == "neuron" and back["empty"].shape == shape
    assert torch.equal(back["full"].cpu(), torch.ones(2))


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy"])
def test_a_cpu_checkpoint_loads_onto_neuron_with_views_sharing_memory(zipfile):
    """(The legacy format, ``_use_new_zipfile_serialization=False``, reads each storage's bytes after
    restoring it: that copy into device memory raised "'Tensor' object has no attribute '_index'".)"""
    base = torch.arange(12.0)
    view = base[4:].view(2, 4)
    buffer = io.BytesIO()
    torch.save({"base": base, "view": view}, buffer, _use_new_zipfile_serialization=zipfile)
    buffer.seek(0)
    back = torch.load(buffer, map_location="neuron")
    assert back["base"].device.type == "neuron" and back["view"].device.type == "neuron"
    assert torch.equal(back["base"].cpu(), base) and torch.equal(back["view"].cpu(), view)
    back["base"].add_(100)  # one storage in the checkpoint: one device memory
    assert torch.equal(back["view"].cpu(), view + 100)


def test_a_modules_state_dict_and_the_module_itself_round_trip():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("neuron")
    state = _loaded(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("neuron")
    fresh.load_state_dict(state)
    x = torch.randn(5, 4)
    torch.testing.assert_close(fresh(x.to("neuron")).cpu(), model(x.to("neuron")).cpu())
    whole = _loaded(model, weights_only=False)
    assert all(isinstance(p, torch.nn.Parameter) and p.device.type == "neuron" for p in whole.parameters())
    torch.testing.assert_close(whole(x.to("neuron")).cpu(), model(x.to("neuron")).cpu())


def test_pickle_and_deepcopy_give_independent_device_copies():
    x = torch.randn(3, 4, requires_grad=True).to("neuron").detach().requires_grad_()
    x.grad = torch.ones(3, 4).to("neuron")
    for copied in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert copied.device.type == "neuron" and copied.requires_grad
        assert torch.equal(copied.detach().cpu(), x.detach().cpu())
    deep = copy.deepcopy(x)
    assert torch.equal(deep.grad.cpu(), torch.ones(3, 4))
    with torch.no_grad():
        deep.add_(1)
    assert not torch.equal(deep.detach().cpu(), x.detach().cpu())  # independent memory
    model = torch.nn.Linear(4, 2).to("neuron")
    twin = copy.deepcopy(model)
    assert isinstance(twin.weight, torch.nn.Parameter) and twin.weight.device.type == "neuron"
    assert torch.equal(twin.weight.detach().cpu(), model.weight.detach().cpu())
    with torch.no_grad():
        twin.weight.zero_()
    assert model.weight.detach().cpu().abs().sum() > 0


def test_none_of_it_kills_the_process():
    code = ("import copy, io, torch, torch_neuronx\n"
            "m = torch.nn.Linear(4, 2).to('neuron'); copy.deepcopy(m)\n"
            "b = io.BytesIO(); torch.save(torch.randn(3), b); b.seek(0)\n"
            "print(torch.load(b, map_location='neuron').device)\n"
            "print(torch.UntypedStorage(8, device='neuron').device)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["neuron:0", "neuron:0"]


def test_neuron_storages_are_made_copied_and_read():
    """``torch.UntypedStorage(n, device="neuron")`` killed the process (SIGSEGV: a C++ allocator a
    Python backend has not got); ``storage.cpu()`` and ``storage.to(device="neuron")`` raised."""
    made = torch.UntypedStorage(12, device="neuron")
    assert made.device == torch.device("neuron", 0) and made.nbytes() == 12
    assert torch.UntypedStorage(12).device.type == "cpu"  # other devices: PyTorch's constructor
    values = torch.tensor([1.0, 2.0, 3.0])
    moved = values.untyped_storage().to(device="neuron")
    assert moved.device.type == "neuron"
    assert torch.equal(torch.empty(0).set_(moved.cpu()), values)
    y = (torch.zeros(3).to("neuron") + 1) * 2  # queued work writes it first
    assert torch.equal(torch.empty(0).set_(y.untyped_storage().cpu()), torch.full((3,), 2.0))
    y.untyped_storage().copy_(values.untyped_storage())
    assert torch.equal(y.cpu(), values)
    with pytest.raises(TypeError, match="made from a size in bytes"):
        torch.UntypedStorage([1, 2], device="neuron")


def test_neuron_storages_index_slice_and_pickle():
    """``storage[i]`` and ``storage[i:j]`` of a neuron tensor's storage raised ("Attempted to set
    the storage of a tensor on device cpu to a storage on ... neuron:0"), ``pickle`` of it raised
    an AttributeError; a slice shares the memory, a pickled copy does not."""
    x = (torch.arange(6.0).to("neuron") + 1) * 1  # queued work writes it first
    storage = x.untyped_storage()
    raw = torch.arange(1.0, 7.0).untyped_storage()
    assert [storage[i] for i in (0, 5, -1)] == [raw[i] for i in (0, 5, -1)]
    part = storage[8:16]
    assert part.device == storage.device and part.nbytes() == 8
    assert torch.equal(torch.empty(0).set_(part.cpu()), torch.tensor([3.0, 4.0]))
    x.add_(10)
    assert torch.equal(torch.empty(0).set_(part.cpu()), torch.tensor([13.0, 14.0]))  # shares the memory
    with pytest.raises(IndexError):
        storage[24]
    with pytest.raises(RuntimeError, match="only a step of 1"):
        storage[0:8:2]
    copied = pickle.loads(pickle.dumps(storage))
    assert copied.device == storage.device and copied.nbytes() == 24
    x.add_(1)
    assert torch.equal(torch.empty(0).set_(copied.cpu()), torch.arange(11.0, 17.0))
    assert raw[1:3].nbytes() == 2 and raw[4] == 0  # CPU storages as torch has them


def test_a_callable_map_location_decides_where_neuron_tensors_go():
    """``map_location=lambda s, loc: s`` (torch's documented way to load onto the CPU) kept neuron
    tensors on ``neuron``, and a function moving storages to a device was ignored for them."""
    x = torch.arange(3.0, device="neuron")
    on_host = _loaded({"x": x}, map_location=lambda storage, location: storage)["x"]
    assert on_host.device == torch.device("cpu") and torch.equal(on_host, x.cpu())
    moved = _loaded({"x": x.cpu()}, map_location=lambda storage, location: storage.to(device="neuron"))["x"]
    assert moved.device == torch.device("neuron", 0) and torch.equal(moved.cpu(), x.cpu())
    back = _loaded({"x": x}, map_location=lambda storage, location: storage.to(device="neuron"))["x"]
    assert back.device == torch.device("neuron", 0) and torch.equal(back.cpu(), x.cpu())


def _double_in_child(tensors: list, queue: object) -> None:
    queue.put([(str(t.device), t.dtype, t.requires_grad, (t * 2).detach()) for t in tensors])


def test_neuron_tensors_cross_spawned_processes_both_ways():
    """A neuron tensor in a spawned ``Process``'s arguments killed the child while unpickling
    ("unable to resize file": the host copy's shared memory was freed before it read it); the
    child's neuron results come back through a ``Queue``."""
    import torch.multiprocessing as mp

    sent = [torch.arange(4.0, device="neuron"), torch.ones(2, 3, dtype=torch.bfloat16, device="neuron").t(),
            torch.tensor(True, device="neuron"), torch.empty(0, 2, device="neuron"),
            torch.full((3,), 2.0, device="neuron", requires_grad=True)]
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_double_in_child, args=(sent, queue))
    child.start()
    try:
        got = queue.get(timeout=240)
    finally:
        child.join(60)
    assert child.exitcode == 0
    for original, (device, dtype, requires_grad, doubled) in zip(sent, got):
        assert (device, dtype, requires_grad) == (str(original.device), original.dtype, original.requires_grad)
        assert doubled.device == original.device and doubled.shape == original.shape
        torch.testing.assert_close(doubled.cpu(), (original.detach() * 2).cpu())


def _trained_copy(device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1).to(device)
    model(torch.ones(1, 2, device=device)).sum().backward()
    return model, copy.deepcopy(model)


def test_deepcopy_follows_torchs_parameter_and_tensor_rules():
    """A deep-copied parameter got the source's gradient (torch's ``Parameter.__deepcopy__`` copies
    the values only): a copied model's first backward added onto it. A tensor that is no parameter
    keeps its gradient and Python attributes, as torch's ``Tensor.__deepcopy__`` does."""
    for device in ("cpu", "neuron"):
        model, copied = _trained_copy(device)
        assert copied.weight.grad is None and model.weight.grad is not None
        copied(torch.ones(1, 2, device=device)).sum().backward()
        assert copied.weight.grad.cpu().tolist() == [[1.0, 1.0]]
    for device in ("cpu", "neuron"):
        t = torch.ones(2, device=device, requires_grad=True)
        (t * 3).sum().backward()
        t.tag = {"shard": 1}
        p = torch.nn.Parameter(torch.ones(2, device=device))
        p.tag = "kept?"
        t2, p2 = copy.deepcopy(t), copy.deepcopy(p)
        assert t2.grad.cpu().tolist() == [3.0, 3.0] and t2.tag == {"shard": 1} and t2.tag is not t.tag
        assert not hasattr(p2, "tag") and p2.requires_grad  # (torch drops a parameter's attributes here)


def test_copy_copy_shares_memory_as_torchs_shallow_copy_does():
    """``copy.copy`` of a neuron tensor or parameter made an independent copy (pickled through the
    host), where torch's shares the storage: a write through either reaches both."""
    for device in ("cpu", "neuron"):
        t = torch.arange(4.0, device=device)
        t.tag = "kept"
        c = copy.copy(t)
        c[0] = 9.0
        p = torch.nn.Parameter(torch.arange(3.0, device=device))
        q = copy.copy(p)
        with torch.no_grad():
            q[1] = 7.0
        assert t.cpu().tolist() == [9.0, 1.0, 2.0, 3.0] and c.tag == "kept" and c.is_leaf, device
        assert p.cpu().tolist() == [0.0, 7.0, 2.0] and isinstance(q, torch.nn.Parameter) and q.requires_grad


@pytest.mark.parametrize("how", ["pickle", "torch.save", "torch.save legacy"])
def test_python_attributes_of_tensors_and_parameters_survive_saving(how):
    """``p.tensor_model_parallel = True`` (Megatron's marks, sharding and weight-decay tags) was
    dropped by pickling and torch.save of neuron tensors; torch keeps them."""
    t = torch.arange(3.0, device="neuron")
    t.tag = "activations"
    p = torch.nn.Parameter(torch.ones(2, device="neuron"))
    p.tensor_model_parallel = True
    if how == "pickle":
        t2, p2 = pickle.loads(pickle.dumps((t, p)))
    else:
        buffer = io.BytesIO()
        torch.save((t, p), buffer, _use_new_zipfile_serialization=how == "torch.save")
        buffer.seek(0)
        t2, p2 = torch.load(buffer, weights_only=False)
    assert t2.tag == "activations" and p2.tensor_model_parallel is True and isinstance(p2, torch.nn.Parameter)
    assert t2.device.type == "neuron" and t2.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("map_location", [None, "cpu", "neuron", "callable"])
def test_the_legacy_format_round_trips_values_to_where_map_location_says(map_location):
    """``torch.save(..., _use_new_zipfile_serialization=False)`` writes storages after the pickle and
    fills them after unpickling: the rebuild copied uninitialized memory to the device (garbage,
    silently), and ``map_location="cpu"`` left the tensors on ``neuron``."""
    state = {"weight": torch.randn(4, 3).to("neuron"), "steps": torch.tensor([7, 8]).to("neuron"),
             "mask": torch.tensor([True, False]).to("neuron"), "half": torch.randn(5).half().to("neuron")}
    location = (lambda s, where: s) if map_location == "callable" else map_location
    buffer = io.BytesIO()
    torch.save(state, buffer, _use_new_zipfile_serialization=False)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location=location)
    expected_device = "neuron" if map_location in (None, "neuron") else "cpu"
    for name, value in loaded.items():
        assert value.device.type == expected_device, name
        assert torch.equal(value.cpu(), state[name].cpu()), name


def test_a_file_saved_by_the_earlier_format_still_loads():
    """Files written before tensors were pickled as bytes name ``serialization.rebuild``."""
    from torch_neuronx.runtime import serialization

    class Earlier:
        def __reduce_ex__(self, protocol):
            return serialization.rebuild, (torch.arange(4.0), 0, True, False)

    buffer = io.BytesIO()
    torch.save({"w": Earlier()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)["w"]
    assert loaded.device.type == "neuron" and loaded.requires_grad and loaded.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_distributed_checkpoints_async_save_stages_neuron_tensors(tmp_path):
    """``torch.distributed.checkpoint.async_save`` of a neuron state_dict failed while staging it
    ("cannot pickle '_thread.lock' object": DCP deep-copies a tensor subclass's ``__dict__``, where a
    neuron tensor holds its device memory); staged as its host copy, it saves and loads back."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to("neuron")
    model[0].weight.tensor_model_parallel = True  # a program's attribute, kept by the staging
    state = {"model": model.state_dict()}
    dcp.async_save(state, checkpoint_id=str(tmp_path), no_dist=True).result()
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to("neuron")
    loaded = {"model": fresh.state_dict()}
    dcp.load(loaded, checkpoint_id=str(tmp_path), no_dist=True)
    fresh.load_state_dict(loaded["model"])
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert a.device.type == "neuron" and torch.equal(a.cpu(), b.cpu())


def test_a_zip_checkpoint_stores_raw_values_as_torchs_own_does(tmp_path):
    """Values were pickled as bytes: the file was 1.5x a CPU checkpoint's, saving 4x and loading 20x
    slower, saving 128 MiB took 700 MiB of host memory. Now a storage record per tensor, read back
    (mmap too) before the rebuild puts it on neuron."""
    values = torch.randn(1 << 18)
    torch.save({"w": values}, tmp_path / "cpu.pt")
    torch.save({"w": values.to("neuron")}, tmp_path / "neuron.pt")
    assert (tmp_path / "neuron.pt").stat().st_size <= (tmp_path / "cpu.pt").stat().st_size + 4096
    for kwargs in ({}, {"mmap": True}, {"map_location": "cpu"}, {"map_location": "neuron"}):
        back = torch.load(tmp_path / "neuron.pt", **kwargs)["w"]
        assert back.device.type == kwargs.get("map_location", "neuron") and torch.equal(back.cpu(), values), kwargs


def test_storages_move_to_neuron_as_cuda_storages_do():
    """``map_location=lambda s, loc: s.cuda()`` had no neuron spelling: ``UntypedStorage.neuron()``."""
    base = torch.arange(6.0)
    back = _loaded({"base": base, "view": base[2:]}, map_location=lambda s, loc: s.neuron())
    assert back["base"].device == torch.device("neuron", 0) and torch.equal(back["view"].cpu(), base[2:])
    back["base"].add_(10)
    assert torch.equal(back["view"].cpu(), base[2:] + 10)
    moved = torch.arange(3.0).untyped_storage().neuron()
    assert moved.device.type == "neuron" and moved.nbytes() == 12 and moved.neuron() is moved
