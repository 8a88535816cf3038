"""Segment sources: where the caching allocator gets its device memory from.

A segment source hands out whole segments (large, aligned address ranges) and
takes them back; the allocator carves blocks out of them. On the ``cpu``
target a segment is anonymous host memory mapped with ``mmap``: page aligned,
untouched pages cost nothing, and the runtime can read and write it in place,
so :func:`block_view` gives a zero-copy ``torch.uint8`` tensor over any block
(the eager device hands those to the runtime through DLPack).

The device's capacity (``TORCH_NEURONX_DEVICE_MEMORY_BYTES``; 0 means the
host's RAM) is enforced here, so out-of-memory is reachable in tests.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

PAGE_SIZE = mmap.PAGESIZE


class SegmentSource(Protocol):
    """What the caching allocator needs from a device's memory."""

    capacity: int  # bytes the device can hold in segments at once

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


_MAP_FAILED = ctypes.c_void_p(-1).value
# MAP_NORESERVE: a reserved-but-untouched segment commits no RAM, like device memory that is
# merely reserved; pages appear when the runtime first writes them.
_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)


class HostSegmentSource:
    """Segments of anonymous, page-aligned host memory (the ``cpu`` target's device memory).

    The raw ``mmap``/``munmap`` calls go through ctypes rather than
    :class:`mmap.mmap` so a segment is a plain address, with no Python buffer
    export that would pin it.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity if capacity else host_memory_bytes()
        self.mapped = 0  # bytes currently handed out
        self._lock = threading.Lock()
        self._mmap, self._munmap = _libc_mapping_functions()

    def allocate(self, nbytes: int) -> int | None:
        """Map ``nbytes`` of host memory; None when it would exceed the capacity or mmap fails."""
        with self._lock:
            if nbytes <= 0 or self.mapped + nbytes > self.capacity:
                return None
            address = self._mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, _MAP_FLAGS, -1, 0)
            if address is None or address == _MAP_FAILED:
                return None  # the host itself is out of address space or memory
            self.mapped += nbytes
            return address

    def release(self, address: int, nbytes: int) -> None:
        """Unmap a segment."""
        with self._lock:
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
