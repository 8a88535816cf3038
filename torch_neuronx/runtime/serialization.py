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
- ``copy.deepcopy`` is a device copy (``clone``) keeping requires_grad, the gradient and the
  parameter flag (:func:`deepcopy`);
- a checkpoint of CPU tensors loaded with ``map_location="neuron"`` (which also died with
  SIGSEGV, in ``UntypedStorage(..., device="neuron")``) gets its storages copied into device
  memory (:func:`restore_storage`), and torch's rebuild then sets neuron tensors over them.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch

from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu


def rebuild(values: torch.Tensor, index: int, requires_grad: bool, is_param: bool) -> torch.Tensor:
    """The tensor :func:`reduce` saved: ``values`` on ``neuron:index`` (or ``map_location``'s device)."""
    device = f"neuron:{index}"
    try:
        target = torch._utils._get_restore_location(device)
    except RuntimeError:  # a callable map_location: it mapped the values' storage already (as the
        target = values.device  # host's, "cpu"): where it put them (``lambda s, loc: s``: the CPU)
    t = values.to(target)
    if is_param:
        return torch.nn.Parameter(t, requires_grad)
    return t.requires_grad_() if requires_grad else t


def reduce(t: NeuronTensor) -> tuple[Any, tuple[Any, ...]]:
    """``t.__reduce_ex__``: its values read to the host (after the op that writes them) and how to
    rebuild it."""
    allocation = getattr(t, "_allocation", None)
    if allocation is not None and allocation.memory is None and t.numel():
        raise RuntimeError(f"cannot save a neuron tensor of shape {tuple(t.shape)} whose storage was resized "
                           "to 0 bytes (it holds no values)")
    with torch.no_grad():
        values = t.detach().cpu()
    return rebuild, (values, t._index, t.requires_grad, bool(getattr(t, "_is_param", False)))


def reduce_for_processes(t: NeuronTensor) -> tuple[Any, tuple[Any, ...]]:
    """How ``multiprocessing`` pickles a neuron tensor (a ``Process``'s arguments, a ``Queue``): its
    values as bytes in the message. (Pickled as for ``torch.save``, the host copy went through
    shared memory that torch's pickler expects the sender to keep alive: freed at once, the
    receiving process died unpickling it, "unable to resize file".)"""
    _, (values, index, requires_grad, is_param) = reduce(t)
    raw = values.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return rebuild_from_bytes, (raw, values.dtype, tuple(values.shape), index, requires_grad, is_param)


def rebuild_from_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...], index: int, requires_grad: bool,
                       is_param: bool) -> torch.Tensor:
    """The tensor :func:`reduce_for_processes` sent."""
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return rebuild(flat.view(dtype).reshape(shape), index, requires_grad, is_param)


def register_for_processes() -> None:
    """Pickle neuron tensors for ``multiprocessing`` with :func:`reduce_for_processes`."""
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(NeuronTensor, reduce_for_processes)


def deepcopy(t: NeuronTensor, memo: dict[int, Any]) -> torch.Tensor:
    """``copy.deepcopy(t)``: a new neuron tensor holding a device copy of ``t``'s values."""
    if id(t) in memo:
        return memo[id(t)]
    if not t.is_leaf:
        raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                           "protocol at the moment.")
    with torch.no_grad():
        new = t.clone()
    if getattr(t, "_is_param", False):
        new = torch.nn.Parameter(new, t.requires_grad)
    elif t.requires_grad:
        new.requires_grad_()
    if t.grad is not None:
        new.grad = copy.deepcopy(t.grad, memo)
    memo[id(t)] = new
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
