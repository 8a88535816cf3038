"""The ``neuron`` c10d backend under torchrun (gloo on loopback): every collective and dtype, the
backend strings, failures that must be errors on every rank (never a hang, never an abort), and
the distributed variables."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(script: str, *args: str, nproc: int = 2, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """``script`` (under tests/) on ``nproc`` local ranks; its output, whatever the exit status."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", os.path.join(HERE, script), *args],
                          capture_output=True, text=True, timeout=timeout, env=environment)


def _both_ranks_ok(case: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``case`` of distributed_cases.py on two ranks; assert both printed OK."""
    proc = torchrun("distributed_cases.py", case, timeout=240, **env)
    outcomes = _outcomes(proc)
    assert all(outcomes.get(r, "").startswith("OK") for r in (0, 1)), (outcomes, proc.stderr[-3000:])
    return proc


def _done(proc: subprocess.CompletedProcess, nproc: int) -> None:
    # (torchrun interleaves the ranks' output: two ranks' lines may share one line)
    ranks = sorted(int(m) for m in re.findall(r"DONE rank (\d+)", proc.stdout))
    assert proc.returncode == 0 and ranks == list(range(nproc)), proc.stdout[-2000:] + proc.stderr[-4000:]


def test_every_collective_and_dtype_on_two_ranks():
    _done(torchrun("distributed_collectives.py"), 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # four ranks on two cores: CI's slow step
@pytest.mark.timeout(480)  # past its nodes' own 400 s
def test_every_collective_on_two_nodes_of_two_processes():
    """Four ranks as two hosts would run them: two torchrun invocations (``--nnodes=2 --node_rank``)
    meeting at one rendezvous on 127.0.0.1 (README: the same command on real hosts)."""
    port = _free_port()
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                               "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}",
                               os.path.join(HERE, "distributed_collectives.py")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
             for node in (0, 1)]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=400))
    finally:
        for node in nodes:
            node.kill()
    ranks = sorted(int(m) for out, _ in outputs for m in re.findall(r"DONE rank (\d+)", out))
    assert ranks == [0, 1, 2, 3] and all(n.returncode == 0 for n in nodes), \
        "\n".join(out[-1500:] + err[-3000:] for out, err in outputs)


@pytest.mark.parametrize("backend", ["none", pytest.param("cpu:gloo,neuron:neuron", marks=pytest.mark.slow)])
def test_backend_strings_and_the_padding_all_to_all(backend):
    """``init_process_group()`` with no backend, and the mixed string; all_to_all_v's padding path."""
    _done(torchrun("distributed_collectives.py", backend, NEURON_USE_NKI_ALLTOALLV="0"), 2)


def _outcomes(proc: subprocess.CompletedProcess) -> dict[int, str]:
    assert "SIGABRT" not in proc.stderr and "core dumped" not in proc.stderr, proc.stderr[-3000:]
    # one outcome per rank, even where torchrun's interleaving put two on one line
    found = {int(m.group(2)): m.group(1) for m in re.finditer(
        r"((?:OK|RAISED) \S+ rank (\d+).*?)(?=(?:OK|RAISED|DONE|COMPUTE|CALLS) |\n|$)", proc.stdout)}
    return found


#: Mismatches every rank sees before any data moves: every rank raises, none aborts, and the
#: process can make a new group and go on, so they run one after another in one job.
_SURVIVABLE = {
    "mismatched_shapes": {0: "disagree on the tensor sizes", 1: "disagree on the tensor sizes"},
    "mismatched_later": {0: "disagree on the tensor sizes", 1: "disagree on the tensor sizes"},
    "mismatched_pattern": {0: "disagree on the collective called", 1: "disagree on the collective called"},
    "mismatched_after_queued": {0: "disagree on the tensor sizes", 1: "disagree on the tensor sizes"},
    "mismatched_barrier": {0: "disagree on the collective called", 1: "disagree on the collective called"},
    "bad_reduce_scatter": {0: "input of 8 elements for 2 outputs of 3", 1: "input of 8 elements"},
    "mismatched_reduce_op": {0: "roots or reduce ops", 1: "roots or reduce ops"},
    "mismatched_root": {0: "differ at value 2); a broadcast row holds each tensor's element count, then the root",
                        1: "then the root rank (src)"},
    "mismatched_coalesced_op": {0: "roots or reduce ops", 1: "roots or reduce ops"},
    "mismatched_coalesced_dtype": {0: "dtypes, roots", 1: "dtypes, roots"},
    "non_contiguous_send": {0: "non-contiguous tensor", 1: "non-contiguous tensor"},
}


def test_mismatches_are_errors_on_every_rank_and_the_process_goes_on():
    proc = torchrun("distributed_cases.py", ",".join(_SURVIVABLE), PG_TIMEOUT="5", timeout=240)
    assert "SIGABRT" not in proc.stderr and "core dumped" not in proc.stderr, proc.stderr[-3000:]
    _done(proc, 2)
    assert " (again) rank " not in proc.stdout, proc.stdout[-3000:]  # each error raised once
    destroyed = [float(s) for s in re.findall(r"DESTROYED \S+ rank \d in ([\d.]+) s", proc.stdout)]
    # the peer of a rank that ran ahead closes its connections: no wait for the 20 s timeout
    assert len(destroyed) == 2 * len(_SURVIVABLE) and max(destroyed) < 10, proc.stdout[-3000:]
    for case, expect in _SURVIVABLE.items():
        for rank, text in expect.items():
            found = re.search(rf"RAISED {case} rank {rank}: (.*?)(?=(?:OK|RAISED|DONE) |\n|$)", proc.stdout)
            assert found and text in found.group(1), (case, rank, proc.stdout[-3000:], proc.stderr[-3000:])


def test_a_process_that_ran_ahead_into_a_failed_collective_exits_cleanly():
    for _ in range(2):  # (the crash came when the transport's timeout fell after the exit: most runs)
        _done(torchrun("distributed_cases.py", "ran_ahead_then_exit", PG_TIMEOUT="3", timeout=240), 2)


@pytest.mark.parametrize("case, expect", [
    ("mismatched_gather", {1: "output of 8 elements for 2 inputs of 5", 0: "CollectiveError"}),
    ("peer_dies", {0: "by peer"}),  # gloo: "Connection closed by peer" or "... reset by peer"
    ("peer_exits_with_an_error", {0: "all_reduce on process group '0' failed"}),
    ("peer_never_arrives", {0: "did not complete within 5 s"}),
    ("monitored_barrier_peer_late", {0: "Ranks 1 failed to pass monitoredBarrier in 2000 ms"}),
    ("peer_dies_in_ddp_training", {0: "all_reduce on process group"}),
])
def test_failures_are_errors_on_every_rank_never_hangs_or_aborts(case, expect):
    # (a peer that exits: the survivor's group timeout must outlast the exiting rank's 10 s wait)
    proc = torchrun("distributed_cases.py", case, PG_TIMEOUT="60" if case == "peer_exits_with_an_error" else "5",
                    timeout=240)
    assert "still waits for its peer" not in proc.stderr, proc.stderr[-3000:]
    outcomes = _outcomes(proc)
    for rank, text in expect.items():
        assert rank in outcomes and outcomes[rank].startswith("RAISED") and text in outcomes[rank], \
            (rank, outcomes, proc.stderr[-3000:])


def test_small_collectives_on_idle_streams_run_in_the_issuing_thread():
    _both_ranks_ok("small_collectives_run_inline")


def test_a_caught_mismatch_does_not_resurface_at_the_next_valid_collective():
    _both_ranks_ok("mismatch_then_valid")


def test_defects_found_by_new_users_stay_fixed():
    """Non-root reduce buffers kept, strided scatter outputs, one-sided all_to_all splits on the
    padding path, an empty reduce_scatter off the default stream, recv from any source."""
    _both_ranks_ok("found_by_new_users", NEURON_USE_NKI_ALLTOALLV="0")


def test_point_to_point_messages_longer_or_shorter_than_the_buffer():
    _both_ranks_ok("messages_of_other_sizes")


def test_send_and_receive_orders_that_gloo_completes():
    _both_ranks_ok("point_to_point_orders")


@pytest.mark.slow  # (CI time: DDP's default hook runs in the fast suite)
def test_ddp_with_the_powersgd_comm_hook():
    _both_ranks_ok("ddp_powersgd_hook")


def test_fsdp_state_dict_broadcast_from_rank0():
    _both_ranks_ok("state_dict_broadcast_from_rank0")


def test_a_group_bound_to_a_device_splits():
    _both_ranks_ok("device_id_bound")


def test_async_collectives_of_two_groups_in_opposite_orders():
    _both_ranks_ok("async_orders_across_groups")


def test_sync_batch_norm_matches_batch_norm_over_the_whole_batch():
    _both_ranks_ok("sync_batch_norm")


def test_init_again_after_destroy():
    _both_ranks_ok("reinit_after_destroy")


def test_coalescing_manager_future_values_and_strided_gathers():
    _both_ranks_ok("coalescing_and_futures")


def test_ranks_that_close_their_groups_in_opposite_orders_exit_at_once():
    proc = _both_ranks_ok("groups_closed_in_opposite_orders")
    assert proc.returncode == 0 and "still waits" not in proc.stderr, proc.stderr[-3000:]


def test_a_rank_whose_row_changed_waits_for_peers_that_went_ahead():
    """The agreement check runs ahead of the data on a rank that repeats a collective; a rank whose
    arguments changed waits for the verdict; when they agree, nothing hangs and the data is right."""
    proc = torchrun("distributed_cases.py", "one_rank_changes_and_agrees", PG_TIMEOUT="5", timeout=240)
    outcomes = _outcomes(proc)
    assert all(outcomes.get(r, "").startswith("OK") for r in (0, 1)), (outcomes, proc.stderr[-3000:])


@pytest.mark.parametrize("case", ["mismatched_later", "mismatched_later_call"])
def test_a_mismatch_after_repeated_collectives_leaves_the_group_unusable(case):
    """Rank 0 went ahead into the data of a collective rank 1 refused: both raise the mismatch, and
    the group's later collectives fail at once (its transport is out of step), never hang: the rank
    that went ahead raises when the verdict comes, not at the group's timeout (60 s here)."""
    proc = torchrun("distributed_cases.py", case, PG_TIMEOUT="60", timeout=240)
    outcomes = _outcomes(proc)
    for rank in (0, 1):
        assert "THEN" in outcomes.get(rank, "") and "unusable" in outcomes[rank], (outcomes, proc.stderr[-3000:])
        waited = float(re.search(r"AFTER ([0-9.]+) s", outcomes[rank]).group(1))
        assert waited < 30, (rank, outcomes[rank])


@pytest.mark.parametrize("env, calls", [
    ({}, "big_all_reduce=1 coalesced_100=1 gather_default=4 gather_side=1 scatter_default=4 scatter_side=1"),
    ({"NEURON_USE_SPLIT_ALLGATHER": "0", "NEURON_USE_SPLIT_REDUCE_SCATTER": "1", "COLLECTIVE_BUCKETSIZE_IN_MB": "1"},
     "big_all_reduce=3 coalesced_100=1 gather_default=1 gather_side=1 scatter_default=4 scatter_side=4"),
    pytest.param({"NEURON_USE_SPLIT_ALLGATHER": "yes", "NEURON_USE_SPLIT_REDUCE_SCATTER": "true"},  # only "1"
                 "big_all_reduce=1 coalesced_100=1 gather_default=1 gather_side=1 scatter_default=1 scatter_side=1",
                 marks=pytest.mark.slow),
])
def test_split_collectives_and_buckets_follow_the_documented_rules(env, calls):
    """Unset: split on the default stream only; set: only ``1`` enables. Buckets of at most
    COLLECTIVE_BUCKETSIZE_IN_MB; many small tensors in one bucket. Results identical every way."""
    proc = torchrun("distributed_cases.py", "split_and_buckets", timeout=240, **env)
    assert proc.stdout.count(f"CALLS {calls}") == 2, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("host_cc, overlaps", [("1", True), ("0", False)])
def test_host_collectives_overlap_compute_only_when_enabled(host_cc, overlaps):
    """A collective issued on a side stream waits for a late peer. With TORCH_NEURONX_ENABLE_HOST_CC=1
    the default stream's compute completes meanwhile; without it the collective is ordered on the
    default stream too, so that compute waits for it."""
    proc = torchrun("distributed_cases.py", "host_cc_overlap", TORCH_NEURONX_ENABLE_HOST_CC=host_cc, timeout=240)
    outcomes = _outcomes(proc)
    assert all(outcomes.get(r, "").startswith("OK") for r in (0, 1)), proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"collective completed by then: {not overlaps}" in proc.stdout, proc.stdout[-2000:]


_INIT_ONE = ("import datetime, torch, torch_neuronx, torch.distributed as dist\n"
             "dist.init_process_group('neuron', init_method='tcp://127.0.0.1:0', rank=0, world_size=1,\n"
             "                        timeout=datetime.timedelta(seconds=20))\n"
             "t = torch.ones(2, device='neuron'); dist.all_reduce(t); print('VALUE', t.cpu().tolist())\n")


@pytest.mark.parametrize("env, message", [
    ({"TORCH_NEURONX_ENABLE_STREAMS": "2"}, "TORCH_NEURONX_ENABLE_STREAMS"),
    ({"TORCH_NEURONX_ENABLE_HOST_CC": "1", "TORCH_NEURONX_ENABLE_STREAMS": "0"},
     "TORCH_NEURONX_ENABLE_HOST_CC=1 requires TORCH_NEURONX_ENABLE_STREAMS=1"),
    ({"COLLECTIVE_BUCKETSIZE_IN_MB": "0"}, "COLLECTIVE_BUCKETSIZE_IN_MB must be at least 1"),
])
def test_impossible_settings_are_clear_errors(env, message):
    proc = subprocess.run([sys.executable, "-c", _INIT_ONE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-3000:]


def test_one_rank_group_in_process_works_with_streams_off():
    proc = subprocess.run([sys.executable, "-c", _INIT_ONE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCH_NEURONX_ENABLE_STREAMS": "0"})
    assert proc.returncode == 0 and "VALUE [1.0, 1.0]" in proc.stdout, proc.stderr[-3000:]


def test_collectives_are_counted_in_the_metric_tables(tmp_path):
    proc = torchrun("distributed_cases.py", "collective_metrics", timeout=240,
                    TORCH_NEURONX_ENABLED_METRIC_TABLES="transfers", TORCH_NEURONX_METRICS_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pandas as pd
    for rank in (0, 1):
        rows = pd.read_csv(tmp_path / f"metric_table_transfers_rank{rank}.csv").set_index("kind")
        assert rows.loc["collective.all_reduce", "calls"] == 3
        assert rows.loc["collective.all_reduce", "bytes"] == 3 * 256 * 4
        assert rows.loc["collective.all_gather", "calls"] == 1
        assert rows.loc["collective.all_gather", "bytes"] == (256 + 512) * 4


def test_compiled_graphs_with_functional_collectives():
    """A tensor-parallel MLP under torch.compile: compute partitions compiled, collectives on the
    transport, forward and backward equal to one CPU's, graph_stats rows with has_collectives."""
    _done(torchrun("distributed_compiled.py", timeout=300), 2)
