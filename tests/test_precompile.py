"""TORCH_CACHING_PRECOMPILE: the neuron backend's result in PyTorch's Dynamo precompile cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, torch
if os.environ.get("BREAK_INSTALL"):  # a saved frame torch's install fails on with another error than RuntimeError
    from torch._dynamo import package
    def broken(*args, **kwargs):
        raise AttributeError("'_Missing' object has no attribute '__closure__'")
    package.CompilePackage._install_global = broken
from torch._dynamo.utils import counters
from torch_neuronx import metrics
from torch_neuronx.compiler import driver

def f(x, w):
    return torch.relu(x @ w) * 2

compiled = torch.compile(f, backend="neuron")
for rows in os.environ.get("ROWS", "4").split(","):
    x, w = torch.randn(int(rows), 8), torch.randn(8, 3)
    out = compiled(x, w)
print(json.dumps({"err": (out - f(x, w)).abs().max().item(), "restores": metrics.counter("precompile_restores"),
                  "dynamo_hits": counters["dynamo_cache"]["dynamo_cache_hit"], "invocations": driver.invocations}))
"""


def run(tmp_path, **env) -> dict:
    inherited = {k: v for k, v in os.environ.items() if k not in ("RANK", "TORCH_CACHING_PRECOMPILE")}
    environment = {**inherited, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                   "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
                   "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"), **env}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", [pytest.param("1", marks=pytest.mark.slow), "true"])  # CI time: one spelling
def test_second_process_installs_the_backend_result_without_tracing(tmp_path, value):
    first = run(tmp_path, TORCH_CACHING_PRECOMPILE=value)
    assert first["restores"] == 0 and first["invocations"] == 1
    assert os.listdir(tmp_path / "inductor" / "dynamo")
    second = run(tmp_path, TORCH_CACHING_PRECOMPILE=value)
    assert second["dynamo_hits"] == 1
    assert second["restores"] == 1  # our artifact was deserialized, the frame was not traced
    assert second["invocations"] == 0
    assert second["err"] < 1e-5


def test_a_restored_frame_recompiles_for_a_new_shape(tmp_path):
    """The recompile of a restored frame took the global name the restored guards had installed
    ('__builtins_dict___0' already exists in scope): a new shape failed in every later process."""
    run(tmp_path, TORCH_CACHING_PRECOMPILE="1")
    second = run(tmp_path, TORCH_CACHING_PRECOMPILE="1", ROWS="4,6")
    assert second["restores"] == 1 and second["err"] < 1e-5
    third = run(tmp_path, TORCH_CACHING_PRECOMPILE="1", ROWS="6,4,5")
    assert third["err"] < 1e-5


def test_a_frame_that_saw_two_batch_sizes_is_restored_with_its_dynamic_graph(tmp_path):
    """A serving process's frame sees a second batch size (Dynamo compiles a graph with dynamic
    sizes): torch found no backend result for that graph at exit ("Backend not found") and saved
    nothing, so every later process traced again. Both graphs are restored; the dynamic one
    compiles at its calls, from the NEFF cache."""
    dynamic = {"TORCH_CACHING_PRECOMPILE": "1", "TORCH_NEURONX_DYNAMO_DYNAMIC_SHAPES": "1"}
    first = run(tmp_path, ROWS="4,6", **dynamic)
    assert first["restores"] == 0
    second = run(tmp_path, ROWS="4,6,9", **dynamic)  # 9: served by the dynamic NEFF, from the cache
    assert second["dynamo_hits"] == 1 and second["restores"] == 2
    assert second["invocations"] == 0 and second["err"] < 1e-5


def test_a_saved_frame_that_cannot_be_installed_is_traced_again(tmp_path):
    """A Hugging Face model's saved frame failed inside torch's install with an AttributeError,
    which torch.compile let through: the serving process died before its first call (and torch's
    own fallback for a RuntimeError asserts). Now a warning, and the frame is traced again."""
    run(tmp_path, TORCH_CACHING_PRECOMPILE="1")
    second = run(tmp_path, TORCH_CACHING_PRECOMPILE="1", BREAK_INSTALL="1")
    assert second["restores"] == 0 and second["err"] < 1e-5


def test_entries_are_split_per_rank(tmp_path):
    run(tmp_path, TORCH_CACHING_PRECOMPILE="1", RANK="1")
    assert os.listdir(tmp_path / "inductor" / "dynamo") == ["rank1"]
    assert os.listdir(tmp_path / "inductor" / "dynamo" / "rank1")


def test_off_by_default(tmp_path):
    run(tmp_path)
    assert run(tmp_path)["restores"] == 0
    assert not (tmp_path / "inductor" / "dynamo").exists()
