"""Neuron tensors through ``torch.save``/``torch.load``, ``pickle`` and ``copy.deepcopy``.

A wrapper subclass gets torch's subclass routes by default, and both went wrong: pickling
(``torch.save`` of a neuron tensor or of a module on ``neuron``) tried to pickle the tensor's
device-memory bookkeeping ("cannot pickle '_thread.lock' object"), and ``copy.deepcopy``
cloned its storage, which for the ``neuron`` device PyTorch allocates through a C++ allocator
a Python backend does not have: the process died with SIGSEGV. Here:

- a neuron tensor pickles as its values on the host plus its device index, requires_grad and
  whether it is a parameter (:func:`reduce`); :func:`rebuild` puts it back on ``neuron:N``, or
  where ``torch.load``'s ``map_location`` sends it (torch's own ``_get_restore_location``), and
  is allowed in ``torch.load``'s default ``weights_only`` mode (registered by the device);
- ``copy.deepcopy`` is a device copy (``clone``) keeping requires_grad and the parameter flag,
  and for a tensor that is no parameter its gradient and Python attributes, as torch's
  ``Tensor.__deepcopy__`` and ``Parameter.__deepcopy__`` do (:func:`deepcopy`); pickling keeps
  the Python attributes too;
- a checkpoint of CPU tensors loaded with ``map_location="neuron"`` (which also died with
  SIGSEGV, in ``UntypedStorage(..., device="neuron")``) gets its storages copied into device
  memory (:func:`restore_storage`), and torch's rebuild then sets neuron tensors over them.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from typing import Any

import torch

from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

#: The attributes of a neuron tensor's ``__dict__`` that are the device's, not the program's.
_INTERNAL = frozenset({"_data", "_allocation", "_index", "_is_param"})


def program_attributes(t: torch.Tensor) -> dict[str, Any]:
    """The Python attributes a program set on ``t`` (``p.tensor_model_parallel = True``), which torch
    keeps through pickling (and, for a tensor that is no parameter, through ``deepcopy``)."""
    return {k: v for k, v in vars(t).items() if k not in _INTERNAL}


def rebuild(values: torch.Tensor, index: int, requires_grad: bool, is_param: bool,
            state: dict[str, Any] | None = None) -> torch.Tensor:
    """A saved neuron tensor: ``values`` on ``neuron:index`` (or ``map_location``'s device), with the
    Python attributes it had (files saved before :func:`rebuild_from_bytes` name this function)."""
    device = f"neuron:{index}"
    try:
        target = torch._utils._get_restore_location(device)
    except RuntimeError:  # a callable map_location: where it puts the values' storage
        target = _mapped_by_callable(values, device)
    t = values.to(target)
    if is_param:
        t = torch.nn.Parameter(t, requires_grad)
    elif requires_grad:
        t.requires_grad_()
    for name, value in (state or {}).items():
        setattr(t, name, value)
    return t


def _mapped_by_callable(values: torch.Tensor, device: str) -> torch.device:
    """Where ``torch.load``'s callable ``map_location`` sends a storage saved on ``device``
    (``lambda s, loc: s``: where it is, the host), as torch asks it for each storage."""
    map_location = torch.serialization._serialization_tls.map_location
    if not callable(map_location):  # (a file of the earlier format: its values were mapped already)
        return values.device
    mapped = map_location(values.untyped_storage(), device)
    if mapped is None:  # torch's default: the saved location
        return torch.device(device)
    return mapped.device


#: Set while ``torch.save`` writes its zip format (:func:`install_zip_save_marker`).
_zip_saving = threading.local()


def reduce(t: NeuronTensor) -> tuple[Any, tuple[Any, ...]]:
    """``t.__reduce_ex__``: its values read to the host (after the op that writes them), and how to
    rebuild it.

    Within ``torch.save``'s zip format the values are a host tensor, which torch writes as a storage
    record of its own and reads back before the rebuild (:func:`rebuild`). Elsewhere they are bytes
    in the pickle (:func:`rebuild_from_bytes`): ``torch.save``'s legacy format
    (``_use_new_zipfile_serialization=False``) writes a tensor's storage after the pickle and fills
    it after unpickling, so the rebuild copied uninitialized memory to the device (garbage,
    silently); and ``multiprocessing`` sent a host tensor through shared memory that its pickler
    expects the sender to keep alive (freed at once, the receiving process died unpickling it,
    "unable to resize file"). (Bytes in a zip checkpoint made it 1.5x the size, saving 4x and
    loading 20x slower, and took 5 copies of the values in host memory while saving.)
    """
    allocation = getattr(t, "_allocation", None)
    if allocation is not None and allocation.memory is None and t.numel():
        raise RuntimeError(f"cannot save a neuron tensor of shape {tuple(t.shape)} whose storage was resized "
                           "to 0 bytes (it holds no values)")
    with torch.no_grad():
        values = t.detach().cpu()
    if getattr(_zip_saving, "active", False):
        return rebuild, (values.contiguous(), t._index, t.requires_grad, bool(getattr(t, "_is_param", False)),
                         program_attributes(t))
    # (no values: None, since pickle writes an empty ``bytes`` as a call of ``builtins.bytes``, which
    # torch.load's default weights_only mode refuses: a state_dict with an empty buffer did not load)
    raw = values.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if values.numel() else None
    return rebuild_from_bytes, (raw, values.dtype, tuple(values.shape), t._index, t.requires_grad,
                                bool(getattr(t, "_is_param", False)), program_attributes(t))


#: How ``multiprocessing`` pickles a neuron tensor (a ``Process``'s arguments, a ``Queue``).
reduce_for_processes = reduce


def rebuild_from_bytes(raw: bytes | None, dtype: torch.dtype, shape: tuple[int, ...], index: int, requires_grad: bool,
                       is_param: bool, state: dict[str, Any] | None = None) -> torch.Tensor:
    """The tensor :func:`reduce` pickled."""
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return rebuild(flat.view(dtype).reshape(shape), index, requires_grad, is_param, state)


def install_legacy_map_location() -> None:
    """Let ``torch.load`` of a legacy-format file (``_use_new_zipfile_serialization=False``) tell a
    neuron tensor's rebuild where ``map_location`` sends it, as its zip-format load does (torch sets
    the location for wrapper subclasses there only: ``map_location="cpu"`` gave neuron tensors)."""
    from torch import serialization

    original = serialization._legacy_load
    if getattr(original, "_neuron_wrapped", False):
        return

    @functools.wraps(original)
    def legacy_load(f: Any, map_location: Any, pickle_module: Any, **pickle_load_args: Any) -> Any:
        state = serialization._serialization_tls
        before, state.map_location = state.map_location, map_location
        try:
            return original(f, map_location, pickle_module, **pickle_load_args)
        finally:
            state.map_location = before

    legacy_load._neuron_wrapped = True  # type: ignore[attr-defined]
    serialization._legacy_load = legacy_load


def install_zip_save_marker() -> None:
    """Mark the calls of ``torch.save``'s zip-format writer, within which :func:`reduce` pickles host
    tensors (see there)."""
    from torch import serialization

    original = serialization._save
    if getattr(original, "_neuron_wrapped", False):
        return

    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        before, _zip_saving.active = getattr(_zip_saving, "active", False), True
        try:
            return original(*args, **kwargs)
        finally:
            _zip_saving.active = before

    save._neuron_wrapped = True  # type: ignore[attr-defined]
    serialization._save = save


def register_for_processes() -> None:
    """Pickle neuron tensors for ``multiprocessing`` with :func:`reduce_for_processes`."""
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(NeuronTensor, reduce_for_processes)


def shallow_copy(t: NeuronTensor) -> torch.Tensor:
    """``copy.copy(t)``: a new leaf over ``t``'s memory with its ``requires_grad`` and Python
    attributes (a parameter's copy a parameter), as torch's rebuild over the same storage gives."""
    new = t.detach()
    if getattr(t, "_is_param", False):
        new = torch.nn.Parameter(new, t.requires_grad)
    elif t.requires_grad:
        new.requires_grad_()
    for name, value in program_attributes(t).items():
        setattr(new, name, value)
    return new


def deepcopy(t: NeuronTensor, memo: dict[int, Any]) -> torch.Tensor:
    """``copy.deepcopy(t)``: a new neuron tensor holding a device copy of ``t``'s values."""
    if id(t) in memo:
        return memo[id(t)]
    if not t.is_leaf:
        raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                           "protocol at the moment.")
    with torch.no_grad():
        new = t.clone()
    if getattr(t, "_is_param", False):  # as ``Parameter.__deepcopy__``: the values, no gradient
        new = torch.nn.Parameter(new, t.requires_grad)  # (a copied model's first backward added
        memo[id(t)] = new  # onto the source's stale gradient), no attributes
        return new
    if t.requires_grad:
        new.requires_grad_()
    memo[id(t)] = new
    if t.grad is not None:  # as ``Tensor.__deepcopy__``: the gradient and the attributes too
        new.grad = copy.deepcopy(t.grad, memo)
    for name, value in copy.deepcopy(program_attributes(t), memo).items():
        setattr(new, name, value)
    return new


#: Storages restored into device memory by :func:`restore_storage`, held until torch's rebuild
#: sets a tensor over them (a storage object does not keep its device memory alive).
pending: dict[int, NeuronTensor | weakref.ref] = {}


def restore_storage(storage: Any, location: str) -> torch.UntypedStorage | None:
    """``torch.serialization``'s deserializer for ``neuron`` locations: the host storage ``storage``
    copied into device memory, as the storage of a neuron tensor; None for other locations."""
    if not location.startswith("neuron"):
        return None
    from torch_neuronx.runtime import storage as storages

    index = torch.device(location).index or 0
    host = torch.empty(0, dtype=torch.uint8).set_(storage.untyped() if hasattr(storage, "untyped") else storage)
    holder = from_cpu(host, index=index)
    restored = storages.storage_of(holder._allocation)
    pending[restored._cdata] = holder
    return restored


def restored_holder(dst: torch.Tensor) -> NeuronTensor:
    """The neuron tensor holding the device memory of ``dst``, a plain tensor over a storage
    :func:`restore_storage` made: a legacy-format ``torch.load`` (``_use_new_zipfile_serialization=
    False``) restores each storage first and then reads the file's bytes into it through such a
    tensor (``_copy_from``, which then writes with :func:`write_restored`)."""
    address = dst.untyped_storage().data_ptr()
    for entry in list(pending.values()):  # (torch's rebuild may have set tensors over it already)
        found = entry if isinstance(entry, NeuronTensor) else entry()
        if found is not None and found._data.untyped_storage().data_ptr() == address:
            return found
    raise RuntimeError(f"cannot copy into a {dst.device} tensor that no neuron tensor holds "
                       f"(shape {tuple(dst.shape)}, {dst.dtype})")


def write_restored(holder: NeuronTensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` into the memory of ``holder`` (see :func:`restored_holder`)."""
    memory = torch.empty(0, dtype=torch.uint8).set_(holder._data.untyped_storage()).view(dst.dtype)
    memory.as_strided(dst.shape, dst.stride(), dst.storage_offset()).copy_(src)
    return dst


def storage_to_neuron(storage: torch.UntypedStorage, device: Any = None, non_blocking: bool = False
                      ) -> torch.UntypedStorage:
    """``UntypedStorage.neuron()``: the storage in device memory (``torch.load``'s CUDA idiom
    ``map_location=lambda s, loc: s.cuda()`` spelled for neuron); a neuron storage of that device as it is."""
    index = 0 if device is None else torch.device("neuron", device).index if isinstance(device, int) \
        else torch.device(device).index or 0
    if storage.device.type == "neuron" and (storage.device.index or 0) == index:
        return storage
    if storage.device.type != "cpu":
        storage = storage.cpu()
    return restore_storage(storage, f"neuron:{index}")


def set_from_restored(t: NeuronTensor, storage: Any, offset: int, size: Any, stride: Any) -> bool:
    """``t.set_(storage, offset, size, stride)`` for a storage :func:`restore_storage` made (torch's
    rebuild of a loaded tensor): ``t`` becomes a view of that device memory, as every other tensor
    of the checkpoint over the same storage. False for other storages."""
    key = getattr(storage, "_cdata", None)
    entry = pending.get(key)
    if entry is None:
        return False
    if isinstance(entry, NeuronTensor):  # the first tensor over it: from now on it holds the memory
        block, allocation = entry._data, entry._allocation
        pending[key] = weakref.ref(t)
    else:
        first = entry()
        if first is None:
            del pending[key]
            return False
        allocation = first._allocation
        block = torch.empty(0, dtype=torch.uint8).set_(first._data.untyped_storage())
    from torch_neuronx.runtime.tensor import rebind

    rebind(t, block.view(t.dtype).as_strided(list(size), list(stride), offset), allocation)
    return True
