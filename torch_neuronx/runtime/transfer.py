"""Moving tensors to and from a runtime device whose memory is not this process's (a GPU).

NEFFs of the local drivers (``local-sync``, ``local-task``) read and write host memory, so
:class:`~torch_neuronx.runtime.executable.Executable` passes them tensors through DLPack
without a copy. A GPU driver (``cuda``) cannot use a host tensor's memory, and a result it
returns lives in device memory, which a CPU tensor must not alias: each input is copied into
device-local memory before the call and each result copied back into a fresh CPU tensor
after it (IREE's queue copies, waited on here), as ``torch.Tensor.cuda()`` and ``.cpu()`` do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from torch_neuronx.runtime.errors import NeuronRuntimeError

_HOST_DRIVERS = frozenset({"local-sync", "local-task"})
#: How long one copy may take before it counts as hung (seconds).
COPY_TIMEOUT_S = 600


def host_memory(driver: str) -> bool:
    """Whether ``driver``'s NEFFs read and write host memory (tensors pass without a copy)."""
    return driver in _HOST_DRIVERS


@functools.cache
def _element_types() -> dict[torch.dtype, int]:
    import iree.runtime as rt

    e = rt.HalElementType
    table = {torch.float32: e.FLOAT_32, torch.float64: e.FLOAT_64, torch.float16: e.FLOAT_16,
             torch.bfloat16: e.BFLOAT_16, torch.int8: e.SINT_8, torch.int16: e.SINT_16,
             torch.int32: e.SINT_32, torch.int64: e.SINT_64, torch.uint8: e.UINT_8,
             torch.bool: e.BOOL_8, torch.complex64: e.COMPLEX_64, torch.complex128: e.COMPLEX_128,
             torch.float8_e4m3fn: e.FLOAT_8_E4M3_FN, torch.float8_e5m2: e.FLOAT_8_E5M2}
    return {dtype: int(kind) for dtype, kind in table.items()}


@functools.cache
def _dtypes() -> dict[int, torch.dtype]:
    return {kind: dtype for dtype, kind in _element_types().items()}


def element_type(dtype: torch.dtype) -> int:
    """The IREE element type of ``dtype`` (the one DLPack import gives it)."""
    try:
        return _element_types()[dtype]
    except KeyError:
        raise NeuronRuntimeError(f"tensors of dtype {dtype} cannot be copied to a GPU runtime device") from None


def _bytes(t: torch.Tensor) -> object:
    """``t``'s values as a flat NumPy byte array over its memory (``t`` contiguous)."""
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else torch.empty(0, dtype=torch.uint8).numpy()


def _copy_all(hal: object, pairs: list[tuple[object, object]], what: str) -> None:
    """Copy each ``(source, target)`` HAL buffer pair in order on ``hal``'s queue; wait once for all."""
    import iree.runtime as rt

    if not pairs:
        return
    try:
        fences = []
        for source, target in pairs:  # each its own semaphore: none waits for a value not yet signalled
            semaphore = hal.create_semaphore(0)
            fences.append(rt.HalFence.create_at(semaphore, 1))
            hal.queue_copy(source, target, wait_semaphores=rt.HalFence.create_at(semaphore, 0),
                           signal_semaphores=fences[-1])
        done = rt.HalFence.join(fences).wait(timeout=COPY_TIMEOUT_S * 10**9)
    except Exception as exc:
        raise NeuronRuntimeError(f"copying {what} failed: {exc}") from exc
    if done is False:
        raise NeuronRuntimeError(f"copying {what} did not finish within {COPY_TIMEOUT_S} s")


def empty_on_device(hal: object, shape: tuple[int, ...], dtype: torch.dtype) -> object:
    """An uninitialized device-local buffer view of ``shape`` and ``dtype`` (a result's storage)."""
    import iree.runtime as rt

    kind = element_type(dtype)
    size = max(1, torch.Size(shape).numel() * dtype.itemsize)
    try:
        buffer = hal.allocator.allocate_buffer(memory_type=rt.MemoryType.DEVICE_LOCAL,
                                               allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=size)
    except Exception as exc:
        raise NeuronRuntimeError(f"allocating {size} bytes of device memory failed: {exc}") from exc
    return rt.HalBufferView(buffer, list(shape), kind)


def to_device(hal: object, tensors: Sequence[torch.Tensor]) -> list[object]:
    """Buffer views in ``hal``'s device-local memory holding copies of CPU ``tensors``.

    Host memory is never registered with the device (``cuMemHostRegister`` refuses a page
    registered twice, and small tensors share pages): each tensor is written by the HAL's own
    host-to-device transfer.
    """
    import iree.runtime as rt

    views = []
    for t in tensors:
        source = t.detach().resolve_neg().resolve_conj().contiguous()
        kind = element_type(source.dtype)
        try:
            buffer = hal.allocator.allocate_buffer_copy(
                memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=hal,
                buffer=_bytes(source) if source.numel() else torch.zeros(1, dtype=torch.uint8).numpy())
        except Exception as exc:
            raise NeuronRuntimeError(f"copying a {tuple(t.shape)} {t.dtype} input to the device failed: {exc}") from exc
        views.append(rt.HalBufferView(buffer, list(source.shape), kind))
    return views


def _host_tensor(view: object) -> torch.Tensor:
    kind = int(view.element_type)
    dtype = _dtypes().get(kind)
    if dtype is None:
        raise NeuronRuntimeError(f"a NEFF result of IREE element type {kind:#x} has no torch dtype")
    return torch.empty(tuple(view.shape), dtype=dtype)


def to_host(hal: object, views: Sequence[object], outs: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Copy device buffer ``views`` into ``outs`` (each of its view's shape and dtype) or into new
    CPU tensors; the tensors written. Each goes through a host staging buffer of the device's
    allocator (all copies queued, one wait), then into the tensor's memory."""
    import iree.runtime as rt

    outs = list(outs) if outs is not None else [_host_tensor(v) for v in views]
    pairs, staged = [], []
    for view, out in zip(views, outs):
        if not out.numel():
            continue
        size = out.numel() * out.element_size()
        try:
            staging = hal.allocator.allocate_buffer(
                memory_type=int(rt.MemoryType.HOST_LOCAL) | int(rt.MemoryType.DEVICE_VISIBLE),
                allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET) | int(rt.BufferUsage.MAPPING_SCOPED),
                allocation_size=size)
        except Exception as exc:
            raise NeuronRuntimeError(f"allocating {size} bytes of staging memory failed: {exc}") from exc
        pairs.append((view.get_buffer(), staging))
        staged.append((staging, out, size))
    _copy_all(hal, pairs, f"{len(pairs)} results to the host")
    for staging, out, size in staged:
        values = torch.from_numpy(staging.map().asarray([size], _uint8())).view(out.dtype).view(out.shape)
        out.copy_(values)
    return outs


@functools.cache
def _uint8() -> object:
    import numpy

    return numpy.dtype(numpy.uint8)
