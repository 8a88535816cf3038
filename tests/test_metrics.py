"""TorchNeuron's metrics API, the graph_stats rows, and the metric tables' CSVs (issue: metric tables).

The CSV tests run a real program in a fresh process with its own caches, so the numbers the
tables hold are exactly what that program did (N cache hits, N fallbacks).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings

import pandas as pd
import pytest
import torch

import torch_neuronx
from torch_neuronx import metrics, observe
from torch_neuronx.metrics import tables

GRAPH_STATS = ["graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count", "timestamp",
               "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us", "torch_neuronx_compile_us"]


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.fixture
def enabled():
    metrics.clear_metrics()
    metrics.set_enabled(True)
    yield
    metrics.set_enabled(False)
    metrics.clear_metrics()


def test_nothing_listens_when_metrics_are_off():
    assert not metrics.is_enabled() and not observe.state.active
    a = torch.ones(4, device="neuron")
    (a + 1).cpu()
    assert not observe.state.active
    metrics.set_enabled(True)
    try:
        assert metrics.is_enabled() and observe.state.active
    finally:
        metrics.set_enabled(False)
    assert not observe.state.active


def test_a_compiled_graph_has_its_graph_stats_row_and_dynamo_counters():
    torch_neuronx.reset_dynamo_metrics()
    before = torch._dynamo.utils.counters["neuron"]["compiled_graphs"]
    model = _mlp()
    compiled = torch.compile(model, backend="neuron", options={"model_name": "mlp"})
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    rows = torch_neuronx.get_dynamo_metrics()
    assert len(rows) == 1
    row = rows[0]
    assert list(row) == GRAPH_STATS
    assert re.fullmatch(r"mlp_\d+_inference_0", row["graph_name"]), row["graph_name"]
    assert row["model_name"] == "mlp" and row["has_collectives"] is False
    assert re.fullmatch(r"[0-9a-f]{16,}", row["graph_id"])
    assert row["graph_node_count"] >= 5  # placeholders, two linears, relu, output
    assert re.fullmatch(r"\d{8}_\d{6}_\d{6}", row["timestamp"])
    assert row["torch_neuronx_lower_us"] > 0 and row["torch_neuronx_compile_us"] > 0
    assert row["torch_neuronx_fx_passes_us"] >= 0
    assert torch._dynamo.utils.counters["neuron"]["compiled_graphs"] == before + 1
    torch_neuronx.reset_dynamo_metrics()
    assert torch_neuronx.get_dynamo_metrics() == []


def test_a_training_graph_names_its_forward_and_backward():
    torch_neuronx.reset_dynamo_metrics()
    model = _mlp()
    compiled = torch.compile(model, backend="neuron", options={"model_name": "train"})
    compiled(torch.randn(4, 8)).sum().backward()
    kinds = sorted(r["graph_name"].split("_")[-2] for r in torch_neuronx.get_dynamo_metrics())
    assert kinds == ["backward", "forward"]


def test_report_blocks_and_torchneuron_cache_names():
    model = _mlp()
    with torch.no_grad():
        torch.compile(model, backend="neuron")(torch.randn(2, 8))
    counts = observe.counters()
    assert metrics.get_counter_value("CompilationCache.PersistentHits") == counts.get("neff_cache.hits_disk", 0)
    assert metrics.get_counter_value("CompilationCache.PersistentMisses") == counts.get("neff_cache.misses", 0)
    assert metrics.get_counter_value("CompilationCache.InMemoryMisses") == \
        counts.get("neff_cache.hits_disk", 0) + counts.get("neff_cache.misses", 0)
    assert "CompilationCache.InMemoryMisses" in metrics.get_counter_names()
    assert "pipeline.lower" in metrics.get_metric_names()
    total, accumulator, recent = metrics.get_metric_data("pipeline.lower")
    assert total >= 1 and accumulator > 0 and recent and all(t > 0 and v > 0 for t, v in recent)
    text = metrics.report()
    assert re.search(r"^Metric: pipeline\.lower\n  TotalSamples: \d+\n  Accumulator: .+\n  Mean: .+\n"
                     r"  Min: .+\n  Max: .+\n", text, re.M)
    assert re.search(r"^Counter: CompilationCache\.InMemoryMisses\n  Value: \d+$", text, re.M)
    only = metrics.report_filtered(counter_names=["compiled_graphs"], metric_names=[])
    assert only.startswith("Counter: compiled_graphs\n  Value: ") and "Metric:" not in only
    assert metrics.get_metric_data("no.such.metric") is None
    compilation = metrics.get_compilation_metrics()
    assert compilation["CompiledGraphs"] == counts.get("compiled_graphs", 0)
    assert compilation["PersistentMisses"] == counts.get("neff_cache.misses", 0)


def test_clear_counters_and_metrics():
    observe.count("kernel_traces")
    observe.sample("neff.size", 10)
    metrics.clear_counters()
    assert metrics.get_counter_value("kernel_traces") == 0
    assert metrics.get_metric_data("neff.size") is not None
    metrics.clear_all()
    assert metrics.get_metric_data("neff.size") is None and metrics.get_metric_data(
        "CompilationCache.NeffSize") is None


def test_enabled_metrics_count_every_eager_op_and_launch(enabled):
    a = torch.randn(16, 16, device="neuron")
    b = torch.randn(16, 16, device="neuron")
    (a + b).cpu()  # warm the kernels up first: their compiles are not the point here
    metrics.clear_metrics()
    for _ in range(5):
        c = a + b
    c.cpu()
    total, accumulator, _ = metrics.get_metric_data("eager.op")
    rows = {r["op"]: r for r in metrics.table_rows("eager_ops")}
    assert total == sum(r["calls"] for r in rows.values()) == 6 and accumulator > 0  # 5 adds, one copy
    assert rows["add.Tensor"]["calls"] == 5 and rows["add.Tensor"]["compiled"] == 5
    assert rows["_to_copy"]["calls"] == 1
    assert metrics.get_metric_data("runtime.launch").total_samples == 5
    moves = {r["kind"]: r for r in metrics.table_rows("transfers")}
    assert moves["transfer.device_to_host"]["bytes"] == 16 * 16 * 4


def test_enabled_metrics_keep_one_sample_per_compile_stage(enabled):
    """A stage (trace, lowering, compile, cache lookup) is timed whether anything listens or not;
    enabled metrics added its span's duration again (CompilationTimeSeconds exceeded the
    process's wall time)."""
    stages: dict[str, int] = {}

    def count(event: observe.Event) -> None:
        if event.kind == "span" and event.sampled:
            stages[event.name] = stages.get(event.name, 0) + 1

    metrics.clear_metrics()
    observe.subscribe(count)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.Tanh())
        x = torch.randn(3, 8)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))
        a = torch.randn(5, 13, device="neuron")
        (a.tanh() * 3).cpu()
    finally:
        observe.unsubscribe(count)
    assert stages, "no stage ran"
    for name, runs in stages.items():
        assert metrics.get_metric_data(name).total_samples == runs, name


def test_every_host_device_copy_is_a_transfer_row(enabled):
    """``x.to("neuron")`` and ``cpu.copy_(neuron)`` (a copy dispatched with a host tensor as one
    side) were not recorded: the transfers table had no host-to-device row at all."""
    a = torch.randn(4, 4).to("neuron")  # 64 B in
    b = torch.randn(8, 8).to("neuron")  # 256 B in
    torch.empty(4, 4).copy_(a)  # 64 B out
    a.cpu(), b.cpu()  # 64 + 256 B out
    moves = {r["kind"]: r for r in metrics.table_rows("transfers")}
    assert (moves["transfer.host_to_device"]["calls"], moves["transfer.host_to_device"]["bytes"]) == (2, 320)
    assert (moves["transfer.device_to_host"]["calls"], moves["transfer.device_to_host"]["bytes"]) == (3, 384)


def test_exporting_an_unknown_table_names_the_valid_ones(tmp_path):
    """It raised a bare KeyError from inside the CSV writer."""
    with pytest.raises(ValueError, match="unknown metric table.*graph_stat; valid tables: graph_stats"):
        metrics.export_tables(str(tmp_path), ["graph_stat"])
    assert os.listdir(tmp_path) == []
    assert [os.path.basename(p) for p in metrics.export_tables(str(tmp_path), "caches")] == \
        ["metric_table_caches_rank0.csv"]


def test_results_of_compiled_graphs_are_not_uploads(enabled):
    """Every output of a compiled graph on neuron tensors (the forward's result, each gradient
    of the backward graph) was counted as a host-to-device transfer: 35 "uploads" for 5 steps
    that uploaded 10 tensors."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("neuron")
    forward = torch.compile(model, backend="neuron")

    def step():
        x, y = torch.randn(8, 16).to("neuron"), torch.randn(8, 4).to("neuron")
        torch.nn.functional.mse_loss(forward(x), y).backward()

    step()
    torch.neuron.synchronize()
    metrics.clear_metrics()
    for _ in range(3):
        step()
    torch.neuron.synchronize()
    moves = {r["kind"]: r for r in metrics.table_rows("transfers")}
    uploads = moves["transfer.host_to_device"]
    assert (uploads["calls"], uploads["bytes"]) == (6, 3 * (8 * 16 + 8 * 4) * 4)


def test_fallbacks_are_counted_per_op(enabled):
    a = torch.randn(6, device="neuron")
    square = torch.randn(2, 2, device="neuron")
    before = metrics.get_counter_value("aten::linalg_eig")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            torch.linalg.eigvals(square)  # complex results: no neuron kernel
            torch.nonzero(a)  # a data-dependent shape: on the host, not a fallback
    assert metrics.get_counter_value("aten::linalg_eig") == before + 3
    rows = {r["op"]: r for r in metrics.table_rows("eager_ops")}
    assert rows["linalg_eig"]["fallback"] == 3
    assert rows["nonzero"]["fallback"] == 0 and rows["nonzero"]["other"] == 3


def test_memory_rows_follow_the_allocator(enabled):
    keep = [torch.empty(1 << 16, device="neuron") for _ in range(3)]
    rows = metrics.table_rows("memory")
    assert rows and all(r["allocated_bytes"] <= r["reserved_bytes"] for r in rows)
    assert rows[-1]["peak_allocated_bytes"] >= 3 * (1 << 18)
    del keep
    torch.neuron.synchronize()
    # The frees right after a peak fall within one sampling interval: the last row still says
    # what is allocated now (it kept showing the freed memory).
    assert metrics.table_rows("memory")[-1]["allocated_bytes"] == torch.neuron.memory_allocated()


def test_unknown_tables_are_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="graph_stats"):
        metrics.enable_tables(["graph_stat"])
    valid, unknown = tables.parse_names(" graph_stats, ,eager_ops,nope ")
    assert valid == ["graph_stats", "eager_ops"] and unknown == ["nope"]


_PROGRAM = textwrap.dedent("""
    import warnings
    import torch
    import torch_neuronx
    from torch_neuronx import metrics

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for _ in range(2):  # a second torch.compile of the same graph: one in-memory NEFF cache hit
            torch.compile(model, backend="neuron")(torch.randn(4, 8))
            torch._dynamo.reset()
    a = torch.randn(6, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            torch.linalg.eigvals(a[:4].view(2, 2))
    if {explicit!r}:
        print("EXPORTED", metrics.export_tables({explicit!r}))
""")


def _run(tmp_path, tables_value: str, explicit: str | None = None, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": tables_value,
                   "TORCH_NEURONX_METRICS_DIR": str(tmp_path / "metrics"),
                   "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
                   "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo"), **env}
    environment.pop("RANK", None)
    environment.update(env)
    proc = subprocess.run([sys.executable, "-c", _PROGRAM.format(explicit=explicit)], capture_output=True,
                          text=True, timeout=300, env=environment)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_tables_are_written_at_exit_with_exactly_what_the_program_did(tmp_path):
    _run(tmp_path, "graph_stats,eager_ops,caches,memory,transfers")
    directory = tmp_path / "metrics"
    assert sorted(os.listdir(directory)) == sorted(f"metric_table_{n}_rank0.csv" for n in
                                                   ("graph_stats", "eager_ops", "caches", "memory", "transfers"))
    graphs = pd.read_csv(directory / "metric_table_graph_stats_rank0.csv")
    assert list(graphs.columns) == GRAPH_STATS and len(graphs) == 2
    assert graphs["graph_id"].nunique() == 1  # the same graph twice: one NEFF key
    caches = pd.read_csv(directory / "metric_table_caches_rank0.csv").set_index("cache")
    assert caches.loc["neff", "misses"] == 1 and caches.loc["neff", "compiles"] == 1
    assert caches.loc["neff", "hits_memory"] == 1 and caches.loc["neff", "hits_disk"] == 0
    assert caches.loc["neff", "bytes_written"] > 0
    ops = pd.read_csv(directory / "metric_table_eager_ops_rank0.csv").set_index("op")
    assert ops.loc["linalg_eig", "calls"] == 3 and ops.loc["linalg_eig", "fallback"] == 3
    assert (ops["mean_us"] > 0).all()
    memory = pd.read_csv(directory / "metric_table_memory_rank0.csv")
    assert len(memory) >= 1 and (memory["allocated_bytes"] <= memory["reserved_bytes"]).all()
    transfers = pd.read_csv(directory / "metric_table_transfers_rank0.csv")
    assert list(transfers.columns) == ["kind", "calls", "bytes", "total_us", "mean_us"]


def test_explicit_export_per_rank_and_unknown_names_reported_at_import(tmp_path):
    proc = _run(tmp_path, "graph_stats,grpah_stats", explicit=str(tmp_path / "now"), RANK="3")
    assert "grpah_stats" in proc.stderr and "valid tables: graph_stats, eager_ops" in proc.stderr
    assert os.listdir(tmp_path / "now") == ["metric_table_graph_stats_rank3.csv"]
    assert os.listdir(tmp_path / "metrics") == ["metric_table_graph_stats_rank3.csv"]  # and at exit
    # Readable as the other artifacts: the umask's mode (the test runs under 022 or stricter).
    umask = os.umask(0)
    os.umask(umask)
    for directory in ("now", "metrics"):
        mode = os.stat(tmp_path / directory / "metric_table_graph_stats_rank3.csv").st_mode & 0o777
        assert mode == 0o666 & ~umask, oct(mode)


@pytest.mark.parametrize("handler", ["default", "user"])
def test_tables_are_written_when_the_process_is_terminated(tmp_path, handler):
    """SIGTERM (torchrun stopping the other workers after a failure, a scheduler's preemption)
    skips atexit: the run ended with no table at all. Now they are written first, then the
    process ends as it would have (killed by the signal, or the user's own handler runs)."""
    program = ("import os, signal, sys, time, torch, torch_neuronx\n"
               + ("signal.signal(signal.SIGTERM, lambda *a: (print('USER'), sys.exit(7)))\n"
                  if handler == "user" else "")
               + "(torch.ones(3, device='neuron') * 2).cpu()\n"
               "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "eager_ops,memory",
                               "TORCH_NEURONX_METRICS_DIR": str(tmp_path)})
    if handler == "user":
        assert proc.returncode == 7 and "USER" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode == -15, proc.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["metric_table_eager_ops_rank0.csv", "metric_table_memory_rank0.csv"]
    ops = pd.read_csv(tmp_path / "metric_table_eager_ops_rank0.csv").set_index("op")
    assert ops.loc["mul.Tensor", "calls"] == 1


@pytest.mark.parametrize("held", ["collector", "events", "directories", "twice"])
def test_a_sigterm_inside_bookkeeping_still_writes_the_tables_and_ends(tmp_path, held):
    """The handler runs in the main thread wherever the signal lands: inside an op's bookkeeping
    it waited forever on a lock its own thread held, and so did a second SIGTERM mid-handler."""
    hold = {"collector": "from torch_neuronx.metrics.collector import collector as c; lock = c._lock",
            "events": "from torch_neuronx.observe import events; lock = events._lock",
            "directories": "from torch_neuronx.config import directories; lock = directories._lock",
            "twice": "import threading; lock = threading.Lock()"}[held]
    program = ("import os, signal, time, torch, torch_neuronx\n"
               "(torch.ones(3, device='neuron') * 2).cpu()\n"
               f"{hold}\n"
               "from torch_neuronx import process\n"
               + ("process.at_termination(lambda: os.kill(os.getpid(), signal.SIGTERM))\n" if held == "twice" else "")
               + "with lock:\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "eager_ops,transfers",
                               "TORCH_NEURONX_METRICS_DIR": str(tmp_path)})
    assert proc.returncode == -15, proc.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["metric_table_eager_ops_rank0.csv", "metric_table_transfers_rank0.csv"]


_SPAWNED = """
import os, socket, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, port):
    import torch_neuronx
    dist.init_process_group("neuron", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(4, device="neuron") * (rank + 1)
    dist.all_reduce(t)
    t.cpu()
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port,), nprocs=2)
"""


def test_ranks_started_without_rank_in_the_environment_keep_their_tables_apart(tmp_path):
    """``mp.spawn`` with an explicit ``rank=``: after ``destroy_process_group()`` every rank wrote its
    tables at exit as rank 0's, over each other's."""
    script = tmp_path / "spawned.py"
    script.write_text(_SPAWNED)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          env={**env, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "transfers",
                               "TORCH_NEURONX_METRICS_DIR": str(tmp_path / "metrics")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "metrics")) == ["metric_table_transfers_rank0.csv",
                                                        "metric_table_transfers_rank1.csv"]


def test_no_table_no_files_and_no_listener(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import torch, torch_neuronx\n"
                           "from torch_neuronx import observe\n"
                           "a = torch.ones(3, device='neuron'); (a * 2).cpu()\n"
                           "print(observe.state.active)"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "",
                               "TORCH_NEURONX_METRICS_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
    assert os.listdir(tmp_path) == []


def test_every_table_and_column_is_documented():
    text = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                             "metric-tables.md")).read()
    for name, table in tables.TABLES.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert all(f"`{column}`" in row for column in table.columns), (name, table.columns)


def test_each_torchrun_rank_writes_its_own_tables(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text("import torch, torch_neuronx\n"
                      "a = torch.ones(4, device='neuron'); (a * 2).cpu()\n")
    env = {**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "eager_ops,caches",
           "TORCH_NEURONX_METRICS_DIR": str(tmp_path / "metrics"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "metrics")) == [f"metric_table_{t}_rank{r}.csv" for t in ("caches", "eager_ops")
                                                        for r in (0, 1)]
    for rank in (0, 1):
        ops = pd.read_csv(tmp_path / "metrics" / f"metric_table_eager_ops_rank{rank}.csv").set_index("op")
        assert ops.loc["mul.Tensor", "calls"] == 1


def test_with_nothing_listening_hot_paths_only_check_the_flag(monkeypatch):
    """Warm eager ops, transfers both ways, a compiled call, allocations: no span or event is even built."""
    model = _mlp()
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(4, 8)
    a = torch.randn(8, 8).to("neuron")
    with torch.no_grad():
        compiled(x)
    ((a + a) * 2).sum().item()
    calls = []
    for name in ("span", "emit"):
        original = getattr(observe, name)
        monkeypatch.setattr(observe, name, lambda *args, _o=original, **kw: calls.append(args[0]) or _o(*args, **kw))
    assert not observe.state.active
    for _ in range(3):
        b = torch.randn(8, 8).to("neuron")
        ((a + b) * 2).sum().item()
        (a - b).cpu()
        with torch.no_grad():
            compiled(x)
    assert calls == []
