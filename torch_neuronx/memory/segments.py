"""Segment sources: where the caching allocator gets its device memory from.

A segment source hands out whole segments (large, aligned address ranges) and
takes them back; the allocator carves blocks out of them. On the ``cpu``
target a segment is anonymous host memory mapped with ``mmap``: page aligned,
untouched pages cost nothing, and the runtime can read and write it in place,
so :func:`block_view` gives a zero-copy ``torch.uint8`` tensor over any block
(the eager device hands those to the runtime through DLPack).

The device's capacity (``TORCH_NEURONX_DEVICE_MEMORY_BYTES``; 0 means the
host's RAM) is enforced here, so out-of-memory is reachable in tests.

With ``TORCH_NEURONX_USE_PINNED_MALLOC=1`` (TorchNeuron's driver-pinned host
memory) each segment is page-locked with ``mlock`` when mapped and unlocked
before it is unmapped: it stays resident, as memory the device transfers from
must. When the host refuses (``RLIMIT_MEMLOCK``, no ``CAP_IPC_LOCK``), one
warning names the variable and the limit, and segments are ordinary pageable
memory from then on: an allocation never fails for it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import resource
import threading
from typing import TYPE_CHECKING, Protocol

from torch_neuronx import config

if TYPE_CHECKING:
    import torch

PAGE_SIZE = mmap.PAGESIZE
PINNED_MALLOC = "TORCH_NEURONX_USE_PINNED_MALLOC"

_log = logging.getLogger("torch_neuronx.memory.segments")


class SegmentSource(Protocol):
    """What the caching allocator needs from a device's memory."""

    capacity: int  # bytes the device can hold in segments at once
    limit: int | None  # the share of it this process may map (set_per_process_memory_fraction)

    def allocate(self, nbytes: int) -> int | None:
        """Map a segment of ``nbytes``; its address, or None when the device is full."""

    def release(self, address: int, nbytes: int) -> None:
        """Give back a segment that :meth:`allocate` returned."""


def host_memory_bytes() -> int:
    """The host's physical memory: the capacity of the cpu target's device."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _libc_mapping_functions() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    libc = ctypes.CDLL(None, use_errno=True)
    mmap_fn = libc.mmap
    mmap_fn.restype = ctypes.c_void_p
    mmap_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                        ctypes.c_int, ctypes.c_long]
    munmap_fn = libc.munmap
    munmap_fn.restype = ctypes.c_int
    munmap_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return mmap_fn, munmap_fn


def _libc_locking_functions() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    libc = ctypes.CDLL(None, use_errno=True)
    functions = libc.mlock, libc.munlock
    for fn in functions:
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return functions


_pinning_refused = False  # set, process-wide, by the first mlock the host refused
_refusal_lock = threading.Lock()  # one warning even when two devices are refused at once


def _describe_limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else f"{value} bytes"


def _refuse_pinning(nbytes: int, err: int, locked: int) -> None:
    """Stop pinning, process-wide, with one warning that names the variable and the limit."""
    global _pinning_refused
    with _refusal_lock:
        if _pinning_refused:
            return
        _pinning_refused = True
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    _log.warning(
        "%s=1: mlock of a %d-byte device memory segment failed (%s: %s), %d bytes of the device's "
        "segments being locked; "
        "the page-locked memory limit RLIMIT_MEMLOCK is %s (soft) / %s (hard), the most a process "
        "without CAP_IPC_LOCK may lock. Device memory is ordinary pageable host memory "
        "from now on. To pin it, raise the limit (ulimit -l unlimited; in a container, "
        "--ulimit memlock=-1) or unset %s.",
        PINNED_MALLOC, nbytes, errno.errorcode.get(err, str(err)), os.strerror(err), locked,
        _describe_limit(soft), _describe_limit(hard), PINNED_MALLOC)


_MAP_FAILED = ctypes.c_void_p(-1).value
# MAP_NORESERVE: a reserved-but-untouched segment commits no RAM, like device memory that is
# merely reserved; pages appear when the runtime first writes them.
_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)


class HostSegmentSource:
    """Segments of anonymous, page-aligned host memory (the ``cpu`` target's device memory).

    The raw ``mmap``/``munmap`` calls go through ctypes rather than
    :class:`mmap.mmap` so a segment is a plain address, with no Python buffer
    export that would pin it. ``pinned`` (default: TORCH_NEURONX_USE_PINNED_MALLOC,
    read here, once per source) page-locks each segment; ``pinned_bytes`` counts
    the bytes locked now.
    """

    def __init__(self, capacity: int | None = None, pinned: bool | None = None) -> None:
        self.capacity = capacity if capacity else host_memory_bytes()
        self.limit: int | None = None  # set_per_process_memory_fraction's share of the capacity
        self.mapped = 0  # bytes currently handed out
        self.pinned = bool(config.get(PINNED_MALLOC)) if pinned is None else pinned
        self.pinned_bytes = 0  # bytes of segments currently page-locked
        self._locked: set[int] = set()  # addresses of the locked segments
        self._lock = threading.Lock()
        self._mmap, self._munmap = _libc_mapping_functions()
        self._mlock, self._munlock = _libc_locking_functions() if self.pinned else (None, None)

    def allocate(self, nbytes: int) -> int | None:
        """Map ``nbytes`` of host memory; None when it would exceed the capacity or mmap fails."""
        with self._lock:
            if nbytes <= 0 or self.mapped + nbytes > (self.capacity if self.limit is None else self.limit):
                return None
            address = self._mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, _MAP_FLAGS, -1, 0)
            if address is None or address == _MAP_FAILED:
                return None  # the host itself is out of address space or memory
            self.mapped += nbytes
            if self.pinned and not _pinning_refused:
                self._pin(address, nbytes)
            return address

    def _pin(self, address: int, nbytes: int) -> None:
        """Page-lock a new segment; on refusal, stop pinning (one warning), keep the segment."""
        if self._mlock(address, nbytes) == 0:
            self._locked.add(address)
            self.pinned_bytes += nbytes
            return
        err = ctypes.get_errno()
        self._munlock(address, nbytes)  # EAGAIN may leave part of the range locked
        _refuse_pinning(nbytes, err, self.pinned_bytes)

    def release(self, address: int, nbytes: int) -> None:
        """Unlock (when pinned) and unmap a segment."""
        with self._lock:
            if address in self._locked:
                self._locked.discard(address)
                self.pinned_bytes -= nbytes
                self._munlock(address, nbytes)  # munmap would too; explicit, as the variable promises
            if self._munmap(address, nbytes) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"munmap of segment {address:#x} ({nbytes} bytes) failed")
            self.mapped -= nbytes


def block_buffer(address: int, nbytes: int) -> memoryview:
    """A writable, zero-copy byte buffer over ``nbytes`` of memory at ``address``.

    The caller keeps the memory allocated for as long as the view is used.
    """
    return memoryview((ctypes.c_uint8 * nbytes).from_address(address)).cast("B")


def block_view(address: int, nbytes: int, owner: object = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A zero-copy 1-d CPU tensor of ``dtype`` (default ``torch.uint8``) over ``nbytes`` at ``address``.

    ``result.data_ptr() == address``; writes through the tensor land in the
    block. ``owner``, when given, stays referenced for as long as the tensor's
    storage lives (through any view of it): an object that frees the block when
    it dies keeps it allocated exactly while the memory is used. Without an
    owner, the caller keeps the block allocated while the tensor is used.
    ``nbytes`` must be a multiple of the dtype's size.
    """
    import torch  # imported here so `import torch_neuronx.memory` stays light

    dtype = dtype or torch.uint8
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    buffer = (ctypes.c_uint8 * nbytes).from_address(address)
    buffer.owner = owner  # the storage holds the buffer (buffer protocol), the buffer its owner
    return torch.frombuffer(buffer, dtype=dtype)
