"""The storage of ``neuron`` tensors: one ``torch.UntypedStorage`` per allocation, resizable to 0 and back.

FSDP2 (``torch.distributed.fsdp.fully_shard``) frees a parameter's unsharded memory between
forward and backward with ``t.untyped_storage().resize_(0)`` and allocates it again with
``resize_(nbytes)`` before copying the all-gathered values in; the tensor, and the views of it
that autograd saved, keep their identity and see the new memory. A wrapper subclass's own
storage holds no data and refuses ``resize_``, so :meth:`NeuronTensor.untyped_storage
<torch_neuronx.runtime.tensor.NeuronTensor.untyped_storage>` answers with the storage made
here instead:

- one object per :class:`~torch_neuronx.runtime.allocation.Allocation` (the tensor and its views
  share it: the same Python object, the same ``_cdata``), on ``neuron:N``, whose ``size()``,
  ``nbytes()`` and ``data_ptr()`` are the device memory's (a non-owning storage over the
  caching allocator's block, repointed with ``_swap_data_ptr_`` on every resize);
- ``resize_(n)`` (an attribute of that object: PyTorch sends a PrivateUse1 storage's resize to
  C++ hooks a Python backend cannot provide) gives the block back to the caching allocator at 0
  bytes and takes a new one otherwise, keeping the leading bytes when the storage had some (as
  CUDA's ``resize_`` does), and points every live neuron tensor over the allocation at it (a
  tensor that the new size cannot hold, and every tensor at 0 bytes, is left over host address
  space without memory: its values are gone, as on CUDA, and host reads of it raise);
- ``torch.ops.inductor.resize_storage_bytes_(t, n)`` on a neuron tensor does the same.

Queued work (``device/queued.py``) holds CPU views of the memory it reads and writes, and each
view holds the block (:class:`~torch_neuronx.runtime.allocation.Memory`); a resize repoints in place
only the neuron tensors' own inner tensors. So a block whose storage shrank to 0 goes back to
the allocator once that work has run and let go of it, and then, when ``record_stream`` marked
it, only after the marking streams' work (the allocator's deferred free).
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import memory
from torch_neuronx.memory.segments import PAGE_SIZE, HostSegmentSource
from torch_neuronx.runtime import aliases, streams
from torch_neuronx.runtime import tensor as _tensor
from torch_neuronx.runtime.allocation import Allocation, Memory, _span_bytes
from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["allocation_of", "resize", "resize_storage_bytes", "storage_of", "view_of"]


@functools.cache
def _device(index: int) -> torch.device:
    return torch.device("neuron", index)


def _raw_storage(address: int, nbytes: int, index: int) -> torch.UntypedStorage:
    """A non-owning ``neuron:index`` storage over ``nbytes`` at ``address`` (none at 0 bytes)."""
    return torch._C._construct_storage_from_data_pointer(address if nbytes else 0, _device(index), nbytes)


def storage_of(allocation: Allocation) -> torch.UntypedStorage:
    """The ``torch.UntypedStorage`` of the neuron tensors over ``allocation`` (made on first use)."""
    storage = allocation.storage
    if storage is None:
        storage = _raw_storage(allocation.address, allocation.nbytes, allocation.index)
        # Weakly: the allocation holds its storage object, which must not keep it alive in a cycle.
        storage.resize_ = functools.partial(_resize_method, weakref.ref(allocation))
        storage.cpu = functools.partial(_cpu_method, weakref.ref(allocation))
        storage.copy_ = functools.partial(_copy_method, weakref.ref(allocation), storage)
        storage._neuron_allocation = weakref.ref(allocation)  # for ``t.set_(storage, ...)``
        storage.__reduce_ex__ = functools.partial(_reduce_method, weakref.ref(allocation))  # (pickle looks it
        # up on the object)
        allocation.storage = storage
    return storage


def allocation_of(storage: Any) -> Allocation | None:
    """The device memory behind ``storage`` when it is a live neuron tensors' storage, else None."""
    ref = getattr(storage, "_neuron_allocation", None)
    return None if ref is None else ref()


def view_of(allocation: Allocation, dtype: torch.dtype, offset: int, size: Sequence[int],
            stride: Sequence[int]) -> torch.Tensor:
    """A CPU view of ``allocation``'s memory as ``dtype`` with ``size``/``stride`` from element ``offset``
    (``set_``'s view). A view past the memory's end grows it first, keeping its bytes, as torch's
    ``set_`` grows a resizable storage (CPU's and CUDA's: it raised "out of bounds" here)."""
    span = _span_bytes(list(size), list(stride), dtype) if all(size) else 0
    if span and (offset * dtype.itemsize + span > allocation.nbytes or allocation.memory is None):
        resize(allocation, max(offset * dtype.itemsize + span, allocation.nbytes))
    if not span:
        return torch.empty(0, dtype=dtype).as_strided(list(size), list(stride), 0)
    usable = allocation.nbytes - allocation.nbytes % dtype.itemsize
    flat = memory.block_view(allocation.address, usable, owner=allocation.memory, dtype=dtype)
    return flat.as_strided(list(size), list(stride), offset)


def _resize_method(allocation_ref: weakref.ref, nbytes: Any) -> torch.UntypedStorage:
    """``UntypedStorage.resize_`` of a neuron tensors' storage: returns the storage, as torch's does."""
    allocation = allocation_ref()
    if allocation is None:
        raise RuntimeError("resize_ of the storage of neuron tensors that no longer exist: keep a tensor "
                           "over it (its storage object does not keep the device memory alive)")
    resize(allocation, nbytes)
    return allocation.storage


def _alive(allocation_ref: weakref.ref, what: str) -> Allocation:
    allocation = allocation_ref()
    if allocation is None:
        raise RuntimeError(f"{what} of the storage of neuron tensors that no longer exist: keep a tensor over it")
    return allocation


def _cpu_method(allocation_ref: weakref.ref) -> torch.UntypedStorage:
    """``UntypedStorage.cpu()``: a host copy of the device memory, after the work that writes it (torch's
    own copies the bytes through a tensor of a storage device it refuses)."""
    allocation = _alive(allocation_ref, "cpu()")
    return _host_copy(allocation, 0, allocation.nbytes).untyped_storage()


def _host_copy(allocation: Allocation, start: int, nbytes: int) -> torch.Tensor:
    """A host copy (uint8) of ``nbytes`` of the allocation's memory from ``start``, after the work
    that writes it; zeros for memory resized to 0 bytes."""
    if not nbytes or allocation.memory is None:
        return torch.zeros(nbytes if allocation.memory is not None else 0, dtype=torch.uint8)
    _wait_for_writers(allocation)
    return memory.block_view(allocation.address + start, nbytes).clone()


def _copy_method(allocation_ref: weakref.ref, storage: torch.UntypedStorage, source: Any,
                 non_blocking: bool = False) -> torch.UntypedStorage:
    """``UntypedStorage.copy_(source)`` into device memory, after all queued work of the device (a
    synchronization: queued ops may still read the old bytes)."""
    allocation = _alive(allocation_ref, "copy_")
    source = source.cpu() if source.device.type != "cpu" else source
    if source.nbytes() != allocation.nbytes:
        raise RuntimeError(f"size mismatch: copy_ of a {source.nbytes()}-byte storage into {allocation.nbytes} bytes")
    if allocation.nbytes and allocation.memory is not None:
        streams.synchronize(allocation.index)
        memory.block_view(allocation.address, allocation.nbytes).copy_(
            torch.empty(0, dtype=torch.uint8).set_(source))
    return storage


def _reduce_method(allocation_ref: weakref.ref, protocol: int) -> tuple[Any, tuple[Any, ...]]:
    """``pickle`` of a neuron tensors' storage: its bytes on the host, rebuilt on its device."""
    allocation = _alive(allocation_ref, "pickle")
    raw = _host_copy(allocation, 0, allocation.nbytes).numpy().tobytes()
    return rebuild_storage, (raw, allocation.index)  # (torch 2.13 cannot unpickle a CPU storage it
    # pickled: "UntypedStorage has no attribute 'dtype'")


def rebuild_storage(raw: bytes, index: int) -> torch.UntypedStorage:
    """A neuron storage holding the bytes ``raw`` on ``neuron:index``."""
    storage = new_storage(torch.UntypedStorage, len(raw), device=_device(index))
    if raw:
        storage.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8).untyped_storage())
    return storage


def _getitem(storage: torch.UntypedStorage, idx: Any) -> Any:
    """``storage[i]`` (a byte) and ``storage[i:j]`` (a storage over the same device memory) of a
    neuron tensors' storage (torch's own set a CPU tensor to it, which it refuses); other storages
    as torch has them."""
    allocation = allocation_of(storage)
    if allocation is None:
        return _base_getitem(storage, idx)
    if isinstance(idx, slice):
        start, stop, step = idx.indices(allocation.nbytes)
        if step != 1:
            raise RuntimeError(f"Trying to slice with a step of {step}, but only a step of 1 is supported")
        if allocation.memory is None:
            raise RuntimeError("slicing a neuron storage whose memory was freed (resized to 0 bytes)")
        view = _raw_storage(allocation.address + start, max(stop - start, 0), allocation.index)
        view._neuron_owner = allocation  # the memory lives while the slice does
        view.cpu = lambda: _host_copy(allocation, start, max(stop - start, 0)).untyped_storage()
        return view
    i = int(idx)
    if not -allocation.nbytes <= i < allocation.nbytes:
        raise IndexError(f"index {i} out of range for storage of size {allocation.nbytes}")
    _wait_for_writers(allocation)
    return int(memory.block_view(allocation.address + i % allocation.nbytes, 1)[0])


def new_storage(cls: type, *args: Any, device: Any = None, **kwargs: Any) -> torch.UntypedStorage:
    """``torch.UntypedStorage(nbytes, device="neuron")`` (installed by the device as the class's
    ``__new__``): device memory of ``nbytes`` in a storage that keeps it (PyTorch would allocate
    it through a C++ allocator a Python backend has not got: the process died with SIGSEGV).
    Other devices go to PyTorch's constructor."""
    if device is None or torch.device(device).type != "neuron":
        return _base_new(cls, *args, **kwargs) if device is None else _base_new(cls, *args, device=device, **kwargs)
    if kwargs or len(args) > 1 or (args and not isinstance(args[0], int)):
        raise TypeError("a neuron UntypedStorage is made from a size in bytes: torch.UntypedStorage(n, "
                        "device='neuron'); copy other contents in with copy_()")
    nbytes = args[0] if args else 0
    index = torch.device(device).index or 0
    data, allocation = _tensor.allocate([nbytes], None, torch.uint8, index)
    holder = NeuronTensor(data, allocation, index=index)
    storage = storage_of(allocation)
    storage._holder = holder  # the memory lives while the storage does (a cycle the collector frees)
    return storage


_base_new = torch._C.StorageBase.__new__
_base_getitem = torch.UntypedStorage.__getitem__


def install_constructor() -> None:
    """Route ``torch.UntypedStorage(..., device="neuron")`` to :func:`new_storage`, and indexing
    of neuron storages to :func:`_getitem`."""
    torch.UntypedStorage.__new__ = new_storage
    torch.UntypedStorage.__getitem__ = _getitem


def resize_storage_bytes(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """``torch.ops.inductor.resize_storage_bytes_(t, new_size)`` of a neuron tensor ``t``."""
    bound = dict(zip(("variable", "new_size"), args), **kwargs)
    t = bound["variable"]
    if not isinstance(t, NeuronTensor) or t._allocation is None:
        raise RuntimeError("resize_storage_bytes_: expected a neuron tensor with device memory")
    resize(t._allocation, bound["new_size"])


def resize(allocation: Allocation, nbytes: Any) -> None:
    """Resize the storage ``allocation`` to ``nbytes`` bytes (see the module docstring)."""
    if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__"):
        raise TypeError(f"resize_ expects an int, but got {type(nbytes).__name__}")
    nbytes = operator.index(nbytes)
    if nbytes < 0:
        raise RuntimeError(f"resize_ of a neuron storage: the size must be at least 0 bytes, got {nbytes}")
    if nbytes == allocation.nbytes:
        return
    keep = min(allocation.nbytes, nbytes) if allocation.memory is not None else 0
    if keep:
        _wait_for_writers(allocation)  # the leading bytes are copied on the host: after their writers
    new = Memory(memory.device_allocator(allocation.index), nbytes, allocation.index) if nbytes else None
    if keep:
        memory.block_view(new.address, keep).copy_(memory.block_view(allocation.address, keep))
    _install(allocation, new, nbytes)


def _wait_for_writers(allocation: Allocation) -> None:
    """Wait for the queued work that writes the allocation's memory (before the host reads it)."""
    host_view = next(iter(allocation.inner_tensors()), None)
    if host_view is not None:
        # The eager device's host read takes a neuron tensor: one over the same memory will do.
        _tensor._host_read(NeuronTensor(host_view, allocation, index=allocation.index))


def _install(allocation: Allocation, new: Memory | None, nbytes: int) -> None:
    """Make ``new`` (None: no memory) the allocation's memory and point its tensors and storage at it.

    The old block goes back to the allocator when the last CPU view of it goes (queued work's).
    """
    allocation.memory = new
    allocation.address = new.address if new is not None else 0
    allocation.nbytes = nbytes
    # ``writer`` and ``error`` stay: ops queued before the resize still wait for (or fail with) the op
    # that writes the old memory, and a later write of the new memory replaces ``writer``.
    host = memory.block_view(new.address, nbytes, owner=new).untyped_storage() if new is not None else None
    with torch.inference_mode():  # inner tensors made in inference mode are inference tensors
        for inner in allocation.inner_tensors():
            _repoint(inner, host, nbytes)
    # The tensors' versions stayed (:func:`_repoint`) and the new memory may sit at the old address:
    # resident parameters bound from them bind again (FSDP2 frees and regathers its parameters).
    aliases.state.epoch += 1
    if allocation.storage is not None:
        _point(allocation.storage, allocation.address, nbytes, allocation.index)


def _repoint(inner: torch.Tensor, host: torch.UntypedStorage | None, nbytes: int) -> None:
    """Set ``inner`` (same sizes, strides, offset) over ``host``, the new memory's CPU storage, in
    place: queued work holds inner tensors of its own over the old memory, which it keeps.

    Without memory for it (0 bytes, or fewer than it spans) it goes over host address space that
    holds no memory (:func:`_no_memory`): its shape stays, host reads of it are refused
    (``wait_for_host``), and nothing it could be given to crashes.
    """
    size, stride, offset = inner.shape, inner.stride(), inner.storage_offset()
    elements = offset + (sum((s - 1) * st for s, st in zip(size, stride)) + 1 if inner.numel() else 0)
    needed = elements * inner.dtype.itemsize
    if host is None or needed > nbytes:
        host = _no_memory(needed)
    tracked = not inner.is_inference()  # (inference tensors have no version counter)
    version = inner._version if tracked else 0
    inner.set_(host, offset, size, stride)
    if tracked:
        # A storage resize is no write to the tensor: its version stays, as for torch's own devices.
        # Compiled graphs save inner tensors for their backward, so a bump here was a "modified by
        # an inplace operation" error there (FSDP2 frees and regathers its unsharded parameters).
        torch._C._autograd._unsafe_set_version_counter((inner,), (version,))


class _Reservation:
    """Host address space with no memory behind it (``MAP_NORESERVE``): what tensors over a storage
    resized to 0 bytes point at. Unused pages cost nothing; a misplaced write commits a page."""

    _source: HostSegmentSource | None = None

    def __init__(self, nbytes: int) -> None:
        if _Reservation._source is None:
            _Reservation._source = HostSegmentSource(1 << 46, pinned=False)
        self.nbytes = -(-nbytes // PAGE_SIZE) * PAGE_SIZE
        address = _Reservation._source.allocate(self.nbytes)
        if address is None:
            raise MemoryError(f"cannot reserve {self.nbytes} bytes of host address space")
        self.address = address
        self.storage = memory.block_view(address, self.nbytes, owner=self).untyped_storage()

    def __del__(self) -> None:
        try:
            _Reservation._source.release(self.address, self.nbytes)
        except Exception:  # interpreter shutdown
            pass


_reservation: _Reservation | None = None


def _no_memory(nbytes: int) -> torch.UntypedStorage:
    """A CPU storage of at least ``nbytes`` over the shared reservation (grown by doubling)."""
    global _reservation
    if _reservation is None or _reservation.nbytes < nbytes:
        _reservation = _Reservation(max(nbytes, 2 * _reservation.nbytes if _reservation else 1 << 20))
    return _reservation.storage


def _point(storage: torch.UntypedStorage, address: int, nbytes: int, index: int) -> None:
    """Make the storage object's data pointer and size ``address`` and ``nbytes`` (in place: its
    identity is what the tensors share)."""
    if storage.nbytes():
        storage._swap_data_ptr_(_raw_storage(0, 0, index))
    if nbytes:
        storage._swap_data_ptr_(_raw_storage(address, nbytes, index))
