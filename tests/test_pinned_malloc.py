"""TORCH_NEURONX_USE_PINNED_MALLOC: the caching allocator's segments page-locked with mlock.

The tests with the variable set run a child process (the variable is read when a device's
allocator is built, and a refused mlock stops pinning for the rest of the process) and read
the kernel's own count of the child's locked memory, ``VmLck`` in ``/proc/self/status``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

VARIABLE = "TORCH_NEURONX_USE_PINNED_MALLOC"
MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB  # kSmallSegmentSize: what a small allocation maps
WARNING = f"{VARIABLE}=1: mlock of a"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mlock and /proc are Linux's")

_PRELUDE = textwrap.dedent("""
    import json


    def locked_bytes():
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmLck:"))
        return int(line.split()[1]) * 1024


    def pinned_stat(field="current"):
        from torch_neuronx import memory

        return memory.memory_stats(0)[f"pinned_bytes.{field}"]
""")

_LOCK_A_SEGMENT = _PRELUDE + textwrap.dedent("""
    from torch_neuronx import memory

    before = locked_bytes()
    address = memory.caching_allocator_alloc(4096)  # the small pool: one new 2 MiB segment
    memory.block_buffer(address, 4096)[:] = bytes(range(256)) * 16
    during, stat = locked_bytes(), pinned_stat()
    memory.caching_allocator_delete(address)
    memory.empty_cache()
    print(json.dumps({"before": before, "during": during, "after": locked_bytes(), "stat": stat,
                      "stat_after": pinned_stat(), "peak": pinned_stat("peak")}))
""")

# Root holds CAP_IPC_LOCK, which lets mlock ignore RLIMIT_MEMLOCK: the child gives the
# capability up (capset, through ctypes) and then lowers the limit, so the kernel really refuses.
_REFUSED = _PRELUDE + textwrap.dedent("""
    import ctypes
    import resource

    CAP_IPC_LOCK = 14
    LINUX_CAPABILITY_VERSION_3 = 0x20080522


    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]


    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(LINUX_CAPABILITY_VERSION_3, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & ~(1 << CAP_IPC_LOCK))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    limit = locked_bytes() + 3 * 1024 * 1024  # room for one 2 MiB segment, not for a 64 MiB one
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))

    import torch
    from torch_neuronx import memory

    small = memory.caching_allocator_alloc(4096)  # a 2 MiB segment: within the limit, locked
    locked_small = locked_bytes()
    medium = memory.caching_allocator_alloc(3 * 1024 * 1024)  # a 64 MiB segment: refused
    large = memory.caching_allocator_alloc(80 * 1024 * 1024)  # its own segment: not locked either
    for address, size in ((small, 4096), (medium, 3 * 1024 * 1024), (large, 80 * 1024 * 1024)):
        view = memory.block_view(address, size)
        view.fill_(7)
        assert int(view.sum()) == 7 * size
    x = torch.arange(100_000, dtype=torch.float32)
    on_device = x.to("neuron")
    assert torch.equal(on_device.cpu(), x)
    print(json.dumps({"locked_small": locked_small, "locked_end": locked_bytes(), "stat": pinned_stat(),
                      "limit": limit, "reserved": memory.memory_reserved(0)}))
""")


def _run(code: str) -> tuple[dict, str]:
    """Run ``code`` in a child with the variable set; its last stdout line (JSON) and its stderr."""
    env = {**os.environ, VARIABLE: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_pinned_malloc_locks_each_segment_while_mapped_and_counts_it():
    result, stderr = _run(_LOCK_A_SEGMENT)
    assert result["during"] - result["before"] == SMALL_SEGMENT  # the kernel's count of locked memory
    assert result["stat"] == SMALL_SEGMENT
    assert result["after"] == result["before"]  # unlocked (and unmapped) by empty_cache
    assert result["stat_after"] == 0 and result["peak"] == SMALL_SEGMENT
    assert WARNING not in stderr


def test_segments_are_not_locked_without_the_variable(monkeypatch):
    from torch_neuronx.memory.allocator import CachingAllocator
    from torch_neuronx.memory.allocator_config import parse
    from torch_neuronx.memory.segments import HostSegmentSource

    monkeypatch.delenv(VARIABLE, raising=False)
    allocator = CachingAllocator(0, parse(""), HostSegmentSource(1 << 30))  # reads the variable
    before = _locked_bytes()
    address = allocator.malloc(4096)
    try:
        assert _locked_bytes() == before
        stats = allocator.memory_stats()
        assert stats["reserved_bytes.all.current"] == SMALL_SEGMENT
        assert stats["pinned_bytes.current"] == stats["pinned_bytes.peak"] == 0
    finally:
        allocator.free(address)
        allocator.empty_cache()


def _locked_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmLck:"))
    return int(line.split()[1]) * 1024


def test_refused_mlock_warns_once_and_allocations_keep_working():
    result, stderr = _run(_REFUSED)
    warnings = [line for line in stderr.splitlines() if WARNING in line]
    assert len(warnings) == 1, stderr[-4000:]
    assert "RLIMIT_MEMLOCK" in warnings[0] and f"{result['limit']} bytes (soft)" in warnings[0]
    # The segment locked before the refusal stays locked; later ones are ordinary memory.
    assert result["stat"] == SMALL_SEGMENT
    assert result["locked_end"] == result["locked_small"]
    assert result["reserved"] >= SMALL_SEGMENT + 64 * MiB + 80 * MiB


def test_pin_memory_and_pinned_data_loaders_work_where_neuron_is_the_accelerator():
    """Autoloaded at ``import torch``, neuron is the accelerator; PyTorch then pins host memory
    through the accelerator's hooks, which a Python backend cannot provide: ``pin_memory()`` and
    ``DataLoader(pin_memory=True)`` raised NotImplementedError in any program of the environment."""
    script = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        assert torch.accelerator.current_accelerator().type == "neuron"
        pinned = torch.arange(6.0).pin_memory()
        assert pinned.is_pinned() and not torch.arange(6.0).is_pinned()
        assert torch.equal(pinned, torch.arange(6.0))
        loader = DataLoader(TensorDataset(torch.arange(8.0).reshape(4, 2)), batch_size=2, pin_memory=True)
        batches = [batch for (batch,) in loader]
        assert all(b.is_pinned() for b in batches) and torch.equal(torch.cat(batches), torch.arange(8.0).reshape(4, 2))
        print("ok", pinned.to("neuron", non_blocking=True).device)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok neuron:0" in done.stdout


def test_pinning_a_neuron_tensor_is_refused_as_cuda_refuses_its_own():
    """``n.pin_memory()`` ran on the CPU with a fallback warning and returned ``n`` unpinned."""
    import torch

    n = torch.arange(3.0, device="neuron")
    with pytest.raises(RuntimeError, match=r"cannot pin 'torch.neuron.FloatTensor' only dense CPU tensors"):
        n.pin_memory()
    assert not n.is_pinned()


def _native_hooks_missing() -> str | None:
    from torch_neuronx.device import native

    return None if native.library() is not None else f"no native hooks: {native.failure()}"


@pytest.mark.skipif(_native_hooks_missing() is not None, reason=str(_native_hooks_missing()))
def test_factories_with_pin_memory_give_pinned_memory_through_the_native_hooks():
    """``pin_memory=True`` factories ask the accelerator's C++ hooks for a pinned allocator, which only
    the native hooks (``device/native.py``) provide: they raised "getPinnedMemoryAllocator". Each
    block is pinned while it lives and given back when its last tensor dies."""
    script = textwrap.dedent("""
        import gc, torch
        from torch_neuronx.device import native
        assert native.failure() is None, native.failure()
        before = native.pinned_bytes()
        made = [torch.empty(10, pin_memory=True), torch.zeros(3, 4, pin_memory=True),
                torch.tensor([1.5, 2.5], pin_memory=True), torch.ones(5, dtype=torch.int64, pin_memory=True),
                torch.empty_like(torch.ones(7), pin_memory=True), torch.arange(6.0).pin_memory()]
        assert all(t.is_pinned() for t in made)
        assert not torch.ones(3).is_pinned() and not made[1][1:].clone().is_pinned()
        assert made[1][1:].is_pinned()  # a view of pinned memory
        assert torch.equal(made[2], torch.tensor([1.5, 2.5])) and made[3].sum().item() == 5
        on_device = made[2].to("neuron", non_blocking=True)
        back = torch.empty(2, pin_memory=True)
        back.copy_(on_device * 2, non_blocking=True)
        torch.neuron.synchronize()
        assert torch.equal(back, torch.tensor([3.0, 5.0]))
        during = native.pinned_bytes()
        assert during[0] >= before[0] + 10 * 4 + 12 * 4 + 2 * 4 + 5 * 8 + 7 * 4 + 6 * 4, (before, during)
        del made, back, on_device
        gc.collect()
        assert native.pinned_bytes() == before, (before, native.pinned_bytes())
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout


def test_without_a_compiler_the_python_hooks_serve_and_pin_memory_still_works(tmp_path):
    """No C++ compiler and no built library: the device registers with the Python hooks (a clear
    reason from ``native.failure()``), and ``Tensor.pin_memory()`` works through ``device/pinned.py``."""
    script = textwrap.dedent("""
        import torch
        from torch_neuronx.device import native
        assert "no C++ compiler" in native.failure(), native.failure()
        pinned = torch.arange(4.0).pin_memory()
        assert pinned.is_pinned() and torch.equal(pinned.to("neuron").cpu(), torch.arange(4.0))
        print("ok", torch.randn(2, device="neuron").device)
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PATH": os.path.dirname(sys.executable)}
    env.pop("CXX", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok neuron:0" in done.stdout
