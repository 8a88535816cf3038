"""User kernels (``@torch_neuronx.kernel``) and the NKI trace cache, with real processes and the real compiler.

In-process tests point NKI_TRACE_CACHE_URL at a fresh directory each; the
cross-process tests run small scripts in subprocesses that report the
process's counters (``kernel_traces``, ``kernel_trace_cache_hits`` / ``_misses``)
and whether torch-mlir was ever imported (it is not, when every trace hits).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_neuronx
from torch_neuronx import metrics
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.kernels import trace_cache


@pytest.fixture(autouse=True)
def _private_trace_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NKI_TRACE_CACHE_URL", str(tmp_path / "trace_cache"))


def _traces() -> int:
    return metrics.counter("kernel_traces")


@torch_neuronx.kernel
def _gated(x: torch.Tensor, y: torch.Tensor, scale: float = 1.0, mode: str = "add", steps: int = 1):
    out = torch.zeros_like(x)
    out[0] = x[0] * scale  # in-place on an intermediate: functionalized away
    for _ in range(steps):
        out = out + y.sin() if mode == "add" else out * y
    return {"out": out, "total": x.sum()}, steps


def test_eager_call_matches_the_python_function():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for kwargs in ({}, {"scale": 2.5, "mode": "mul", "steps": 3}):
        got, expected = _gated(x, y, **kwargs), _gated.fn(x, y, **kwargs)
        assert got[1] == expected[1]
        for name in ("out", "total"):
            assert got[0][name].device.type == "cpu"
            torch.testing.assert_close(got[0][name], expected[0][name])


def test_each_signature_is_traced_once():
    @torch_neuronx.kernel
    def double(x, times: int = 2):
        return x * times

    start = _traces()
    double(torch.ones(2, 3))
    double(torch.ones(5))  # a new shape
    assert _traces() == start + 2
    double(torch.full((2, 3), 7.0))
    double(torch.ones(5), 2)  # the default passed positionally: the same signature
    assert _traces() == start + 2
    torch.testing.assert_close(double(torch.ones(5), times=3), torch.full((5,), 3.0))
    assert _traces() == start + 3


def test_kernel_inside_torch_compile_matches_eager():
    def model(x, y):
        a, steps = _gated(x.relu(), y, scale=3.0, mode="mul", steps=2)
        return a["out"].sum(0) + a["total"] * steps

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    start = _traces()
    got = torch.compile(model, backend="neuron")(x, y)
    assert _traces() == start  # the body was traced into the Dynamo graph, not as a kernel
    torch.testing.assert_close(got, model(x, y))


def test_branching_on_tensor_values_asks_for_a_declared_argument():
    @torch_neuronx.kernel
    def branchy(x):
        return x + 1 if x.sum() > 0 else x - 1

    with pytest.raises(NeuronCompileError, match="declared|int/float/bool/str"):
        branchy(torch.ones(3))


def test_mutating_an_input_is_rejected():
    @torch_neuronx.kernel
    def bump(x):
        x.add_(1)
        return x * 2

    with pytest.raises(NeuronCompileError, match="mutates its input"):
        bump(torch.ones(3))


def test_argument_that_is_neither_tensor_nor_declared_is_rejected():
    @torch_neuronx.kernel
    def ident(x, opts):
        return x

    with pytest.raises(TypeError, match="neither a tensor nor a declared argument"):
        ident(torch.ones(2), object())


def test_trace_cache_location_accepts_paths_and_file_urls(monkeypatch):
    monkeypatch.setenv("NKI_TRACE_CACHE_URL", "file:///srv/traces")
    assert trace_cache.directory() == "/srv/traces"
    monkeypatch.setenv("NKI_TRACE_CACHE_URL", "~/traces")
    assert trace_cache.directory() == os.path.expanduser("~/traces")


def test_unsupported_trace_cache_url_warns_once_and_uses_the_default(monkeypatch):
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch_neuronx.kernels")
    logger.addHandler(handler)
    monkeypatch.setenv("NKI_TRACE_CACHE_URL", "s3://bucket/tnx-test-traces")
    try:
        assert trace_cache.directory() == f"/var/tmp/nki-trace-cache-uid{os.getuid()}/"
        assert trace_cache.directory() == f"/var/tmp/nki-trace-cache-uid{os.getuid()}/"
    finally:
        logger.removeHandler(handler)
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "s3://bucket/tnx-test-traces" in records[0].getMessage()
    monkeypatch.delenv("NKI_TRACE_CACHE_URL")
    assert trace_cache.directory() == f"/var/tmp/nki-trace-cache-uid{os.getuid()}/"


# -- across processes ---------------------------------------------------------

_KERNEL_SOURCE = textwrap.dedent("""\
    import torch_neuronx


    @torch_neuronx.kernel
    def kern(x, scale: float = 1.0):
        return x * scale + 1
""")

_RUNNER = textwrap.dedent("""\
    import importlib, json, sys
    import torch
    from torch_neuronx import metrics
    mod = importlib.import_module(sys.argv[1])
    x = torch.arange(12.0).reshape(3, 4)
    for scale in json.loads(sys.argv[2]):
        assert torch.equal(mod.kern(x, scale=scale), mod.kern.fn(x, scale=scale))
    print(json.dumps({**metrics.counters(), "torch_mlir": "torch_mlir" in sys.modules}))
""")

_NO_WHEEL = "belongs to no installed wheel"


def _run(path: str, cache: str, scales: list[float], module: str = "tnx_user_kernel",
         **env: str) -> tuple[dict, str]:
    """Run the kernel of ``module`` (found on ``path``) once per scale in a new process."""
    full_env = {**os.environ, "PYTHONPATH": path, "NKI_TRACE_CACHE_URL": cache, **env}
    done = subprocess.run([sys.executable, "-c", _RUNNER, module, json.dumps(scales)], env=full_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counters = json.loads(done.stdout.strip().splitlines()[-1])
    return counters, done.stderr


def _entries(cache: str) -> dict[str, bytes]:
    found = {}
    for directory, _, files in os.walk(cache):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                found[os.path.join(directory, name)] = f.read()
    return found


@pytest.fixture(scope="module")
def primed(tmp_path_factory):
    """A kernel module outside any wheel, and a trace cache one process filled for scale 2.0."""
    root = tmp_path_factory.mktemp("primed")
    src = root / "src"
    src.mkdir()
    (src / "tnx_user_kernel.py").write_text(_KERNEL_SOURCE)
    cache = str(root / "cache")
    counters, stderr = _run(str(src), cache, [2.0, 2.0])
    return {"src": src, "cache": cache, "counters": counters, "stderr": stderr}


@pytest.fixture
def primed_copy(primed, tmp_path):
    """The primed module and cache, copied so a test may change them."""
    shutil.copytree(primed["src"], tmp_path / "src")
    shutil.copytree(primed["cache"], tmp_path / "cache")
    return str(tmp_path / "src"), str(tmp_path / "cache")


def test_first_process_traces_and_stores(primed):
    assert primed["counters"]["kernel_traces"] == 1
    assert primed["counters"]["kernel_trace_cache_misses"] == 1
    assert len(_entries(primed["cache"])) == 1


def test_kernel_file_outside_any_wheel_warns_once(primed):
    assert primed["stderr"].count(_NO_WHEEL) == 1
    assert "tnx_user_kernel.py" in primed["stderr"]


def test_second_process_hits_and_a_changed_declared_argument_misses(primed_copy):
    src, cache = primed_copy
    counters, _ = _run(src, cache, [2.0, 3.0])
    assert counters["kernel_trace_cache_hits"] == 1
    assert counters["kernel_trace_cache_misses"] == 1
    assert counters["kernel_traces"] == 1  # scale 3.0 only


def test_hit_neither_traces_nor_lowers(primed_copy):
    src, cache = primed_copy
    counters, _ = _run(src, cache, [2.0])
    # (the NEFF cache's own counts, kept per cache kind, are the NEFF's business, not the trace's)
    assert {k: v for k, v in counters.items() if "_cache." not in k} == {"kernel_trace_cache_hits": 1,
                                                                        "torch_mlir": False}
    assert not any(k.startswith(("hlo_cache.", "trace_cache.")) and k.endswith(("misses", "compiles"))
                   for k, v in counters.items() if v)


def test_edited_kernel_source_misses(primed_copy):
    src, cache = primed_copy
    module = os.path.join(src, "tnx_user_kernel.py")
    with open(module, "w") as f:
        f.write(_KERNEL_SOURCE.replace("x * scale + 1", "x * scale + 2"))
    counters, _ = _run(src, cache, [2.0])  # the runner checks the new body's result
    assert counters["kernel_trace_cache_misses"] == 1
    assert counters["kernel_traces"] == 1


def test_corrupt_entry_is_removed_and_retraced(primed_copy):
    src, cache = primed_copy
    (path, data), = _entries(cache).items()
    with open(path, "wb") as f:
        f.write(data.replace(b"stablehlo", b"stablehlX", 1))
    counters, stderr = _run(src, cache, [2.0])
    assert counters["kernel_traces"] == 1
    assert "corrupt" in stderr
    assert _entries(cache) == {path: data}  # traced again and rewritten whole


def test_disabled_trace_cache_neither_reads_nor_writes(primed_copy):
    src, cache = primed_copy
    before = _entries(cache)
    counters, _ = _run(src, cache, [2.0, 5.0], NKI_ENABLE_TRACE_CACHE="0")
    assert counters["kernel_traces"] == 2
    assert "kernel_trace_cache_hits" not in counters and "kernel_trace_cache_misses" not in counters
    assert _entries(cache) == before


def test_wheel_version_bump_misses(tmp_path):
    site = tmp_path / "site"
    (site / "tnx_fakepkg").mkdir(parents=True)
    (site / "tnx_fakepkg" / "__init__.py").write_text(_KERNEL_SOURCE)
    info = site / "tnx_fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tnx-fakepkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("tnx_fakepkg/__init__.py,,\ntnx_fakepkg-1.0.dist-info/METADATA,,\n"
                                 "tnx_fakepkg-1.0.dist-info/RECORD,,\n")
    cache = str(tmp_path / "cache")

    counters, stderr = _run(str(site), cache, [2.0], module="tnx_fakepkg")
    assert counters["kernel_traces"] == 1 and _NO_WHEEL not in stderr
    counters, _ = _run(str(site), cache, [2.0], module="tnx_fakepkg")
    assert counters.get("kernel_trace_cache_hits") == 1 and "kernel_traces" not in counters
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tnx-fakepkg\nVersion: 1.1\n")
    counters, _ = _run(str(site), cache, [2.0], module="tnx_fakepkg")
    assert counters["kernel_trace_cache_misses"] == 1 and counters["kernel_traces"] == 1
