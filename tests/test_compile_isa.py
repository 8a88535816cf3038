"""The cpu target compiled for another CPU than the host's (TORCH_NEURONX_TARGET_CPU): what
bench/compile.py --isa avx2 uses to emulate an AVX2-only host on an AVX-512 one."""

from __future__ import annotations

import json

import pytest
import torch

from torch_neuronx.cache import keys
from torch_neuronx.compiler import CompileOptions, targets

_CPU_FLAG = "--iree-llvmcpu-target-cpu="


def _cpu_flags(flags) -> list[str]:
    return [f for f in flags if f.startswith(_CPU_FLAG)]


def test_the_cpu_target_names_the_chosen_cpu_in_its_flags_and_cache_key(monkeypatch):
    host = CompileOptions().resolve()
    monkeypatch.setenv("TORCH_NEURONX_TARGET_CPU", "x86-64-v3")
    avx2 = CompileOptions().resolve()
    assert _cpu_flags(host.compiler_flags()) == [_CPU_FLAG + "host"]
    assert _cpu_flags(avx2.compiler_flags()) == [_CPU_FLAG + "x86-64-v3"]
    # Every other flag is the same; the host's identity is keyed only where code is built for it.
    assert [f for f in avx2.compiler_flags() if not f.startswith(_CPU_FLAG)] == \
        [f for f in host.compiler_flags() if not f.startswith(_CPU_FLAG)]
    assert host.host_cpu is not None and avx2.host_cpu is None
    hlo = "module { func.func @main() { return } }"
    assert keys.neff_key(hlo, host.compiler_config(), "v") != keys.neff_key(hlo, avx2.compiler_config(), "v")
    monkeypatch.setenv("TORCH_NEURONX_TARGET_CPU", "host")
    assert targets.resolve("cpu") is targets.resolve()  # the default target, unchanged


@pytest.fixture
def private_caches(tmp_path, monkeypatch):
    """Empty NEFF and HLO caches and a preserved artifact tree: every compile here really runs."""
    for name in ("NEFF_CACHE_DIR", "NEFF_LOCAL_CACHE_DIR", "HLO_CACHE_DIR", "DEBUG_DIR"):
        monkeypatch.setenv(f"TORCH_NEURONX_{name}", str(tmp_path / name.lower()))
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    return tmp_path / "debug_dir"


def _compiled_cpus(debug_dir) -> list[str]:
    """The CPU of each NEFF the driver compiled (its work directories' metadata)."""
    cpus = []
    for metadata in sorted(debug_dir.glob("neuronx-cc/*/metadata.txt")):
        cpus += [f.removeprefix(_CPU_FLAG) for f in _cpu_flags(json.loads(metadata.read_text())["flags"])]
    return sorted(cpus)


def test_an_avx2_neff_computes_the_graph_and_never_serves_the_host(private_caches, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 8)).eval()
    x = torch.randn(16, 24)
    with torch.no_grad():
        expected = model(x)
        monkeypatch.setenv("TORCH_NEURONX_TARGET_CPU", "x86-64-v3")
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), expected)
        assert _compiled_cpus(private_caches) == ["x86-64-v3"]
        monkeypatch.delenv("TORCH_NEURONX_TARGET_CPU")
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), expected)
    assert _compiled_cpus(private_caches) == ["host", "x86-64-v3"]  # a miss, not the AVX2 NEFF
