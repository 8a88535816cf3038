"""The native part of the neuron backend: PrivateUse1 hooks in C++ (``native_hooks.cpp``).

torch 2.13's Python hook interface for a PrivateUse1 backend answers availability questions
only; a pinned-memory allocator must come from C++. Without one, every request for pinned host
memory once neuron is the accelerator raised torch's "getPinnedMemoryAllocator" error:
``torch.empty(..., pin_memory=True)`` and DDP with ``find_unused_parameters`` or
``static_graph``. :func:`register_hooks` builds the hooks into a shared library (one C++ file,
about 3 s with the compiler of the machine, once per source and torch version), loads it with
ctypes and makes them torch's hooks. Where no compiler is found or the build fails, it answers
False and the Python hooks serve (``Tensor.pin_memory()`` still works through
``device/pinned.py``; factories with ``pin_memory=True`` raise torch's error).

The library lives in ``$XDG_CACHE_HOME/torch_neuronx/native`` (``~/.cache`` by default, a
temporary directory when that is not writable), named by a digest of its source, the torch
version and the compiler's flags, and is written under a temporary name and renamed into place:
a build killed half-way is never loaded, and processes that build at once each rename a whole file.
``python -m torch_neuronx.device.native`` builds it ahead (``make`` does).
"""

from __future__ import annotations

import ctypes
import getpass
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from torch_neuronx import config

__all__ = ["NativeBuildError", "build", "failure", "library", "library_path", "pinned_bytes", "register_hooks"]

_log = logging.getLogger("torch_neuronx.device")
_SOURCE = os.path.join(os.path.dirname(__file__), "native_hooks.cpp")
_BUILD_TIMEOUT_S = 300
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None  # why the library could not be built or loaded, once tried


class NativeBuildError(RuntimeError):
    """The native hooks could not be built (no compiler, or it failed)."""


def _compiler() -> str:
    for name in (config.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name) or name
    raise NativeBuildError("no C++ compiler found (set CXX, or install g++)")


def _command(compiler: str, output: str) -> list[str]:
    import torch

    root = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [compiler, "-O2", "-std=c++20", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-isystem", os.path.join(root, "include"), _SOURCE, "-o", output,
            "-L", os.path.join(root, "lib"), "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{os.path.join(root, 'lib')}"]


def _cache_directory() -> str:
    base = config.get("XDG_CACHE_HOME")
    for candidate in (os.path.join(base, "torch_neuronx", "native"),
                      os.path.join(tempfile.gettempdir(), f"torch_neuronx-native-{getpass.getuser()}")):
        try:
            os.makedirs(candidate, exist_ok=True)
        except OSError:
            continue
        # (a directory of another user's, in a shared temporary directory, could hand out their library)
        if os.access(candidate, os.W_OK | os.X_OK) and os.stat(candidate).st_uid == os.getuid():
            return candidate
    raise NativeBuildError("no writable directory for the native hooks (tried ~/.cache and the temp directory)")


def library_path() -> str:
    """Where the library of this source, torch version and flags is (built or not)."""
    import torch

    digest = hashlib.sha256()
    with open(_SOURCE, "rb") as f:
        digest.update(f.read())
    digest.update(" ".join(_command("c++", "")).encode())  # (a built library serves without a compiler)
    digest.update(torch.__version__.encode())
    return os.path.join(_cache_directory(), f"libtorch_neuronx_hooks-{digest.hexdigest()[:16]}.so")


def build() -> str:
    """Build the library if it is not built yet; its path. :class:`NativeBuildError` on failure."""
    path = library_path()
    if os.path.exists(path):
        return path
    partial = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"
    command = _command(_compiler(), partial)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise NativeBuildError(f"the compiler did not finish within {_BUILD_TIMEOUT_S} s") from exc
    except OSError as exc:
        raise NativeBuildError(f"the compiler could not run: {exc}") from exc
    try:
        if done.returncode != 0:
            raise NativeBuildError(f"the compiler failed (status {done.returncode}): {done.stderr.strip()[-2000:]}")
        os.replace(partial, path)  # whole or not at all
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


def library() -> ctypes.CDLL | None:
    """The loaded library, built first when needed; None when it cannot be (the reason is logged once)."""
    global _library, _failure
    with _lock:
        if _library is not None or _failure is not None:
            return _library
        try:
            lib = ctypes.CDLL(build())
            lib.torch_neuronx_register_hooks.restype = ctypes.c_int
            lib.torch_neuronx_pinned_bytes.restype = ctypes.c_int64
            lib.torch_neuronx_pinned_blocks.restype = ctypes.c_int64
        except (NativeBuildError, OSError, AttributeError) as exc:
            _failure = str(exc)
            _log.info("the neuron backend's native hooks are not available (%s): pinned-memory factories "
                      "(pin_memory=True) and DDP's find_unused_parameters/static_graph need them", exc)
            return None
        _library = lib
        return lib


def register_hooks() -> bool:
    """Make the native hooks torch's PrivateUse1 hooks; False when they cannot be built or loaded,
    or torch already has hooks (the caller then registers the Python ones)."""
    lib = library()
    return lib is not None and lib.torch_neuronx_register_hooks() == 0


def pinned_bytes() -> tuple[int, int]:
    """(bytes, blocks) of pinned host memory the native allocator holds now; (0, 0) without it."""
    lib = _library
    if lib is None:
        return 0, 0
    return int(lib.torch_neuronx_pinned_bytes()), int(lib.torch_neuronx_pinned_blocks())


def failure() -> str | None:
    """Why the native hooks are not in use, once tried; None when they are (or were not tried)."""
    return _failure


if __name__ == "__main__":
    try:
        print(build())
    except NativeBuildError as exc:
        print(f"torch_neuronx: the native hooks were not built: {exc}", file=sys.stderr)
        sys.exit(0 if "--optional" in sys.argv else 1)
