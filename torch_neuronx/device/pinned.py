"""``Tensor.pin_memory()`` and ``is_pinned()`` while ``neuron`` is the process's accelerator.

Once PrivateUse1 is the accelerator (no CUDA here), PyTorch pins host memory with
the accelerator's pinned-memory allocator, which only C++ hooks can provide: every
``pin_memory()`` raised, so ``DataLoader(pin_memory=True)`` failed in any program
of an environment where this package is installed (it loads at ``import torch``).
Host memory is what the device reads on the cpu target, so pinning is a copy into
fresh host memory that ``is_pinned()`` then reports as pinned. These CPU kernels
are registered only when neuron is the accelerator; a CUDA host keeps CUDA's.
"""

from __future__ import annotations

import threading
import weakref

import torch

_lock = threading.Lock()
_pinned: dict[int, int] = {}  # storage address -> bytes, while the pinned tensor's storage lives
_library = None


def pin_memory(self: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """A copy of ``self`` in fresh host memory, reported as pinned by :func:`is_pinned`."""
    out = torch.empty_like(self, memory_format=torch.preserve_format)
    out.copy_(self)
    address = out.untyped_storage().data_ptr()
    if address:
        with _lock:
            _pinned[address] = out.untyped_storage().nbytes()
        weakref.finalize(out, _forget, address)
    return out


def _forget(address: int) -> None:
    with _lock:
        _pinned.pop(address, None)


def is_pinned(self: torch.Tensor, device: torch.device | None = None) -> bool:
    """Whether ``self`` lies in memory :func:`pin_memory` made."""
    address = self.untyped_storage().data_ptr()
    with _lock:
        return address in _pinned


def install() -> None:
    """Register the CPU kernels when neuron is the accelerator (idempotent)."""
    global _library
    if _library is not None:
        return
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "neuron":
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("_pin_memory", pin_memory, "CPU")
    _library.impl("is_pinned", is_pinned, "CPU")
