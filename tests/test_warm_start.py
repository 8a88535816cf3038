"""Warm starts across processes: no compiler invocation, no re-tracing, benign edits still hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from models import GPTBlock
from torch_neuronx import metrics
from torch_neuronx.compiler import driver

def forward(model, x):
    {body}

torch.manual_seed(0)
model = GPTBlock().eval()
x = torch.randn(2, 8, 64)
with torch.no_grad():
    out = torch.compile(lambda t: forward(model, t), backend="neuron")(x)
    ref = forward(model, x)
train = torch.nn.Linear(8, 4)
loss = torch.compile(train, backend="neuron")(torch.randn(3, 8)).sum()
loss.backward()
print(json.dumps({{"invocations": driver.invocations, "plans": metrics.counter("warm_start_plans"),
                  "err": (out - ref).abs().max().item(), "grad": train.weight.grad.abs().sum().item()}}))
"""

ORIGINAL = """hidden = model(x)  # the block
    return hidden * 2 + 1"""

# Renamed locals, different comments, the same computation on moved lines.
EDITED = """# doubled, then shifted
    doubled = model(x) * 2

    return doubled + 1  # done"""


def run(tmp_path, body: str, **env) -> dict:
    script = tmp_path / f"script_{abs(hash(body))}.py"
    tests = os.path.dirname(os.path.abspath(__file__))
    script.write_text(textwrap.dedent(SCRIPT).format(tests=tests, body=body))
    environment = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
                   "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"), **env}
    out = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing_and_skips_tracing(tmp_path):
    cold = run(tmp_path, ORIGINAL)
    assert cold["invocations"] == 3  # inference block, forward and backward of the linear layer
    warm = run(tmp_path, ORIGINAL)
    assert warm["invocations"] == 0
    assert warm["plans"] == 1  # the inference graph ran from its plan, without aot_autograd
    assert warm["err"] < 1e-4 and cold["err"] < 1e-4
    assert warm["grad"] == pytest.approx(cold["grad"])


def test_benign_source_edits_hit_the_same_neff(tmp_path):
    run(tmp_path, ORIGINAL)
    edited = run(tmp_path, EDITED)
    assert edited["invocations"] == 0
    assert edited["err"] < 1e-4


def test_key_from_base_graph_when_hlo_keys_are_off(tmp_path):
    run(tmp_path, ORIGINAL, TORCH_NEURONX_NEFF_KEY_FROM_HLO="0")
    sidecars = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "neff") for f in files
                if f.endswith(".json") and not d.split(os.sep)[-1].startswith(".")]
    kinds = {json.load(open(p)).get("kind") for p in sidecars if "components" in json.load(open(p))}
    assert kinds == {"base"}
    assert run(tmp_path, ORIGINAL, TORCH_NEURONX_NEFF_KEY_FROM_HLO="0")["invocations"] == 0


CONCURRENT = """
import json, sys, time, torch
sys.path.insert(0, {tests!r})
from models import MLP
from torch_neuronx.compiler import driver
while time.time() < {start}:
    time.sleep(0.005)
torch.manual_seed(0)
model = MLP()
with torch.no_grad():
    out = torch.compile(model, backend="neuron")(torch.ones(4, 64))
print(json.dumps({{"invocations": driver.invocations, "sum": out.sum().item()}}))
"""


def test_processes_compiling_one_graph_at_once_compile_it_once(tmp_path):
    import time

    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
           "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"),
           "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": str(tmp_path / "locks")}
    code = CONCURRENT.format(tests=tests, start=time.time() + 8)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["invocations"] for r in results) == 1
    assert len({r["sum"] for r in results}) == 1


def test_warm_start_artifacts_carry_this_runs_model_name(tmp_path):
    code = """
import sys, torch
from torch_neuronx.compiler import CompileOptions
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
with torch.no_grad():
    torch.compile(model, backend="neuron", options=CompileOptions(model_name=sys.argv[1]))(torch.ones(2, 8))
"""
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
           "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"), "TORCH_NEURONX_DEBUG_DIR": str(tmp_path / "debug"),
           "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS": "1"}
    for name in ("first", "second"):
        subprocess.run([sys.executable, "-c", code, name], env=env, check=True, capture_output=True, timeout=300)
    names = {f.split("_inference")[0] for _, _, files in os.walk(tmp_path / "debug" / "torch_neuronx")
             for f in files if f.endswith(".stablehlo.mlir")}
    assert names == {"first", "second"}


_RANDOM = """
import json, torch
from torch_neuronx import metrics
f = torch.compile(lambda x: torch.rand(3) + torch.randn(3) + x, backend="neuron")
x = torch.zeros(3)
with torch.no_grad():
    torch.manual_seed(1)
    got = [f(x).tolist(), f(x).tolist()]
    torch.manual_seed(1)
    expected = [(torch.rand(3) + torch.randn(3)).tolist() for _ in range(2)]
print(json.dumps({"plans": metrics.counter("warm_start_plans"), "got": got, "expected": expected}))
"""


def test_plans_of_graphs_with_random_ops_draw_fresh_values(tmp_path):
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
           "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo")}
    for plans in (0, 1):  # cold, then from the plan the cold run stored
        out = subprocess.run([sys.executable, "-c", _RANDOM], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["plans"] == plans
        assert [pytest.approx(e) for e in result["expected"]] == result["got"]
        assert result["got"][0] != result["got"][1]


_STATE = """
import sys, torch
mode = sys.argv[1]
if mode == "float64":
    torch.set_default_dtype(torch.float64)
x, w = torch.randn(4, 8, dtype=torch.float32), torch.randn(8, 3, dtype=torch.float32)
f = torch.compile(lambda a, b: a @ b + torch.ones(3), backend="neuron")
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
    out = f(x, w)
    expected = x @ w + torch.ones(3)
assert out.dtype == expected.dtype, (mode, out.dtype, expected.dtype)
print(mode, out.dtype)
"""


def test_a_plan_made_under_another_default_dtype_or_autocast_is_not_served(tmp_path):
    """The warm-start plan key held the graph's code and inputs, not the global state Dynamo
    guards on in a process: after a float32 run, a process with float64 as the default dtype
    (or under bfloat16 autocast) got the float32 plan's results, and the other way round."""
    script = tmp_path / "state.py"
    script.write_text(_STATE)
    environment = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
                   "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo")}
    for mode in ("plain", "float64", "autocast", "plain"):
        out = subprocess.run([sys.executable, str(script), mode], env=environment, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]


_ROW = """
import json, torch, torch_neuronx
from torch_neuronx import metrics
torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="neuron")(torch.randn(5))
rows = torch_neuronx.get_dynamo_metrics()
print(json.dumps({"nodes": [r["graph_node_count"] for r in rows], "plans": metrics.counter("warm_start_plans")}))
"""


def test_a_warm_start_reports_the_cold_compiles_node_count(tmp_path):
    """graph_stats' graph_node_count of one graph was 57 cold (after the passes rewrote it) and 5 on
    a warm start (Dynamo's graph): both are now the graph as the pipeline received it."""
    script = tmp_path / "row.py"
    script.write_text(_ROW)
    environment = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
                   "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo")}
    results = []
    for _ in range(2):
        out = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = results
    assert warm["plans"] == 1 and cold["plans"] == 0
    assert cold["nodes"] == warm["nodes"] and cold["nodes"][0] > 0


def test_a_lowering_made_under_another_default_dtype_is_not_served(tmp_path, monkeypatch):
    """The lowering (HLO) cache key held the graph's code, not the default dtype its trace reads:
    after a float32 call, Dynamo's recompile under float64 got the float32 lowering back
    (``x.sum() + torch.full((4,), 0.1)`` was float32 3.0999999, not float64 3.1)."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("TORCH_NEURONX_HLO_CACHE_DIR", str(tmp_path / "hlo"))
    f = torch.compile(lambda x: x.sum() + torch.full((4,), 0.1), backend="neuron")
    x = torch.ones(3)
    assert f(x).dtype == torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out, expected = f(x), x.sum() + torch.full((4,), 0.1)
    finally:
        torch.set_default_dtype(before)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected)


def _cond_doubling(x):
    return torch.cond(x.sum() > 0, lambda a: a * 2, lambda a: a * 3, (x,))


def _cond_quintupling(x):  # the same outer graph; only the taken branch's body differs
    return torch.cond(x.sum() > 0, lambda a: a * 5, lambda a: a * 3, (x,))


def _checkpoint_of(scale):
    return lambda x: torch.utils.checkpoint.checkpoint(lambda a: (a * scale).sin(), x, use_reentrant=False)


def _allowed_closure(k):
    @torch.compiler.allow_in_graph
    def helper(a):
        return a * k
    return helper


def _calling_allowed_closures():  # (two functions of their own: Dynamo shares one code object's graphs)
    twice, five_times = _allowed_closure(2.0), _allowed_closure(5.0)
    return lambda x: twice(x) + 1, lambda x: five_times(x) + 1


@pytest.mark.parametrize("make", [
    lambda: (_cond_doubling, _cond_quintupling),
    lambda: (_checkpoint_of(2.0), _checkpoint_of(3.0)),
    _calling_allowed_closures,
], ids=["cond branches", "checkpointed bodies", "allow_in_graph closures"])
def test_graphs_that_differ_only_in_what_their_code_names_never_share_a_plan(make):
    """A graph's plan key hashed its code, which names the bodies of higher-order ops and a
    function called whole only by name: two such graphs were served one plan, the second
    function returning the first one's results (in one process, and across processes after an
    edit of the body)."""
    x = torch.rand(4) + 0.1
    with torch.no_grad():
        for fn in make():
            torch.testing.assert_close(torch.compile(fn, backend="neuron")(x), fn(x))
