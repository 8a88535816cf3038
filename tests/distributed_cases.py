"""Run under torchrun by tests/test_distributed.py: one named case per run (argv[1]); each rank
prints ``OK <case> rank <r>`` or ``RAISED <case> rank <r>: <error>``."""

from __future__ import annotations

import copy
import datetime
import functools
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager


def peer_dies(rank: int) -> None:
    if rank == 1:
        os._exit(0)  # gone without a word before the collective (exit 0: torchrun lets rank 0 go on)
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)
    t.cpu()


def peer_exits_with_an_error(rank: int) -> None:
    """A peer's script fails (an uncaught exception: exit status 1) while this rank waits in a
    collective: the peer waited 10 s at exit for a goodbye this rank would only say at its own
    exit, then died of SIGABRT with its agreement listener inside gloo."""
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)
    t.cpu()
    if rank == 1:
        time.sleep(0.5)
        raise SystemExit("rank 1 fails on purpose")  # past the case's `except Exception`, as a user's error
    dist.all_reduce(t)  # the same collective again: predicted, so rank 0 waits inside gloo
    t.cpu()


def peer_dies_in_ddp_training(rank: int) -> None:
    """A peer gone during DDP training: the survivor's backward raised nothing and DDP's reducer
    read the failed collective's future as gradients: a segfault (its future now fails in C++)."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4).to("neuron"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        if rank == 1 and step == 2:
            os._exit(0)
        optimizer.zero_grad()
        model(torch.randn(6, 8, device="neuron")).square().sum().backward()
        optimizer.step()
        torch.neuron.synchronize()


def state_dict_broadcast_from_rank0(rank: int) -> None:
    """FSDP2's ``set_model_state_dict(..., broadcast_from_rank0=True)`` moves the state to the group's
    first device type: an IndexError on the neuron group's empty list before."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(rank)  # each rank starts from other weights
    model = fully_shard(torch.nn.Linear(4, 6).to("neuron"))
    full = {"weight": torch.arange(24.0).reshape(6, 4), "bias": torch.arange(6.0)} if rank == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    got = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    expected = {"weight": torch.arange(24.0).reshape(6, 4), "bias": torch.arange(6.0)}
    if not all(torch.equal(got[k], v) for k, v in expected.items()):
        raise RuntimeError(f"rank {rank} restored {got}")


def ddp_powersgd_hook(rank: int) -> None:
    """PowerSGD's comm hook waits inside an all_reduce's ``then`` for the next all_reduce: completed
    on the thread that runs the collectives, that wait hung DDP at its first compressed step."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
        torch.nn.Linear(16, 4)).to("neuron"))
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                        min_compression_rate=0.5, use_error_feedback=True, warm_start=True,
                                        random_seed=0)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(4):  # host data moved in: queued work on the stream, the collectives on its worker
        g = torch.Generator().manual_seed(100 + step * 10 + rank)
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to("neuron")), y.to("neuron"))
        loss.backward()
        losses.append(loss.detach())
        optimizer.step()
    total = torch.stack([p.detach().sum() for p in model.parameters()]).sum().reshape(1)
    gathered = [torch.zeros(1, device="neuron") for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, total)
    if len({g.item() for g in gathered}) != 1:
        raise RuntimeError(f"the ranks' parameters differ after PowerSGD steps: {[g.item() for g in gathered]}")


def peer_never_arrives(rank: int) -> None:
    if rank == 1:
        time.sleep(12)  # alive, but never calls the collective
        return
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)
    t.cpu()


def monitored_barrier_peer_late(rank: int) -> None:
    """``dist.monitored_barrier``: torch's refused every backend but gloo by name. Both ranks pass
    one (with the group's timeout and with their own); then rank 1 arrives late, and rank 0's
    names it within the timeout."""
    dist.monitored_barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=4), wait_all_ranks=True)
    if rank == 1:
        time.sleep(8)  # alive, but late for the next one
        return
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)


def mismatched_shapes(rank: int) -> None:
    t = torch.ones(4 + rank, device="neuron")
    dist.all_reduce(t)
    t.cpu()


def mismatched_reduce_op(rank: int) -> None:
    """Every rank must reduce with the same op: one rank's SUM against another's MAX gave each
    rank its own op's result, silently (reduce_scatter_tensor, reduce)."""
    out = torch.empty(2, device="neuron")
    dist.reduce_scatter_tensor(out, torch.tensor([1.0, 5.0, 2.0, 7.0], device="neuron") * (rank + 1),
                               op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    out.cpu()


def mismatched_root(rank: int) -> None:
    """Each rank broadcasting from itself: the error showed bare rows ("rank 0: [4, 0, 0, 0], rank 1:
    [4, 1, 0, 0]"), leaving the user to guess that the second value is the root."""
    t = torch.ones(4, device="neuron")
    dist.broadcast(t, src=rank)
    t.cpu()


def mismatched_coalesced_op(rank: int) -> None:
    """all_reduce_coalesced with SUM on one rank and MAX on the other: summed one tensor and
    max'ed the other, silently."""
    ts = [torch.tensor([1.0, 5.0], device="neuron") * (rank + 1), torch.tensor([2.0, -1.0], device="neuron")]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    ts[0].cpu()


def mismatched_coalesced_dtype(rank: int) -> None:
    """Coalesced gathers whose second tensor's dtype differs across ranks (same element counts)."""
    dtype = torch.float32 if rank == 0 else torch.int32
    inputs = [torch.ones(2, device="neuron"), torch.ones(2, dtype=dtype, device="neuron")]
    outputs = [torch.empty(2 * dist.get_world_size(), dtype=t.dtype, device="neuron") for t in inputs]
    with _coalescing_manager(device=torch.device("neuron")):
        for out, inp in zip(outputs, inputs):
            dist.all_gather_into_tensor(out, inp)
    outputs[1].cpu()


def mismatch_then_valid(rank: int) -> None:
    """A mismatch is raised once, where the caller sees it; the next, valid collective and its
    read give their values (the rank that raised at the call got the stale error again from the
    next read)."""
    try:
        dist.all_reduce(torch.ones(4 + rank, device="neuron"))
        torch.neuron.synchronize()
    except Exception:  # noqa: BLE001  (the agreement error, on each rank at the call or the synchronization)
        pass
    else:
        raise RuntimeError("the mismatch was not raised")
    u = torch.ones(8, device="neuron")
    dist.all_reduce(u)
    if u.tolist() != [2.0] * 8:
        raise RuntimeError(f"the valid all_reduce gave {u.tolist()}")


def non_contiguous_send(rank: int) -> None:
    """A non-contiguous send or recv buffer is refused at the call (it returned, and failed later
    in the stream's worker while the peer waited out the timeout)."""
    dist.send(torch.arange(12.0, device="neuron").reshape(3, 4).t(), dst=1 - rank)


def messages_of_other_sizes(rank: int) -> None:
    """A message longer than the receive buffer killed the receiver (gloo's SIGABRT): an error
    naming both sizes, and the pair carries the next messages; a shorter one fills the buffer's
    front, as gloo's receive does; batch_isend_irecv and recv from any source still pair up."""
    peer = 1 - rank
    if rank == 0:
        dist.send(torch.arange(10.0, device="neuron"), 1)
    else:
        try:
            dist.recv(torch.zeros(5, device="neuron"), 0)
            torch.neuron.synchronize()
        except Exception as exc:  # noqa: BLE001  (the stream wraps the collective's error)
            if "sent 40 bytes, more than the receive buffer holds" not in str(exc):
                raise
        else:
            raise RuntimeError("a 40-byte message into a 20-byte buffer raised nothing")
    if rank == 0:
        dist.send(torch.arange(3.0, device="neuron"), 1)
    else:
        got = torch.full((5,), -1.0, device="neuron")
        dist.recv(got, 0)
        if got.tolist() != [0.0, 1.0, 2.0, -1.0, -1.0]:
            raise RuntimeError(f"a 3-element message into 5 elements gave {got.tolist()}")
    mine, theirs = torch.full((4,), float(rank), device="neuron"), torch.empty(4, device="neuron")
    # the receive first on both ranks: a receive waiting for its message must not hold up the send after it
    for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, theirs, peer), dist.P2POp(dist.isend, mine, peer)]):
        work.wait()
    if theirs.tolist() != [float(peer)] * 4:
        raise RuntimeError(f"batch_isend_irecv gave {theirs.tolist()}")
    if rank == 0:
        dist.send(torch.tensor([7.0], device="neuron"), 1)
    else:
        anyone = torch.empty(1, device="neuron")
        if dist.recv(anyone) != 0 or anyone.tolist() != [7.0]:
            raise RuntimeError(f"recv from any source gave {anyone.tolist()}")


def mismatched_gather(rank: int) -> None:
    out = torch.empty(4 * 2, device="neuron")
    dist.all_gather_into_tensor(out, torch.ones(4 + rank, device="neuron"))
    out.cpu()


def mismatched_later(rank: int) -> None:
    """Rank 0 repeats its collective (its check runs ahead of the data); rank 1 changes its size.
    Both raise the mismatch; the group is unusable afterwards (rank 0's data went ahead)."""
    for _ in range(3):
        t = torch.ones(4, device="neuron")
        dist.all_reduce(t)
        t.cpu()
    _later_mismatch(rank, lambda t: dist.all_reduce(t), size=4 + rank)


def mismatched_later_call(rank: int) -> None:
    """As :func:`mismatched_later`, but rank 1 calls another collective: its transport never
    joins the all_reduce rank 0 ran ahead into."""
    for _ in range(3):
        t = torch.ones(4, device="neuron")
        dist.all_reduce(t)
        t.cpu()
    _later_mismatch(rank, lambda t: dist.broadcast(t, src=0) if rank == 1 else dist.all_reduce(t), size=4)


def _later_mismatch(rank: int, call: Any, size: int) -> None:
    t = torch.ones(size, device="neuron")
    start = time.monotonic()
    try:  # (a small collective on idle streams raises at the call; a queued one at the host read)
        call(t)
        t.cpu()
    except Exception as exc:
        # rank 0's data ran ahead (inline, in the transport) and waited for a peer that never
        # joins: it raised only at the group's timeout, though the verdict came at once
        elapsed = time.monotonic() - start
        # rank 1 stays alive until rank 0 raised too (a peer that exits frees rank 0 anyway)
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.set("mismatch seen", "1")
        else:
            store.wait(["mismatch seen"], datetime.timedelta(seconds=90))
        try:
            later = torch.ones(4, device="neuron")
            dist.all_reduce(later)
            later.cpu()
        except Exception as again:
            raise RuntimeError(f"AFTER {elapsed:.1f} s: {exc} THEN {again}") from exc
        raise


def mismatched_pattern(rank: int) -> None:
    """all_reduce and all_gather alternate (each rank predicts its rows, so nothing is exchanged);
    then rank 0 keeps the pattern and rank 1 breaks it: both raise, neither hangs."""
    out = torch.empty(8, device="neuron")
    for _ in range(3):
        t = torch.ones(4, device="neuron")
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t)
        out.cpu()
    t = torch.ones(4, device="neuron")
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.all_gather_into_tensor(out, t)
    out.cpu()
    t.cpu()


def mismatched_barrier(rank: int) -> None:
    """Rank 0 calls all_reduce while rank 1 is in a barrier: both raise at once (the barrier was not
    checked: both waited out the group's timeout, then blamed a peer that never arrived)."""
    t = torch.ones(4, device="neuron")
    dist.barrier()  # in step first
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.barrier()
    t.cpu()


def mismatched_after_queued(rank: int) -> None:
    """Twenty queued all_reduces (no host read between them, every row predicted), then rank 1
    changes its size: both raise the mismatch, and the twenty are right."""
    t = torch.ones(4, device="neuron")
    for _ in range(20):
        dist.all_reduce(t)
    assert t.cpu().tolist() == [2.0 ** 20] * 4, t.cpu()
    for _ in range(20):
        dist.all_reduce(t)
    odd = torch.ones(4 + rank, device="neuron")
    dist.all_reduce(odd)
    odd.cpu()


def one_rank_changes_and_agrees(rank: int) -> None:
    """all_to_all_single where rank 1 changes only what it keeps for itself: rank 0's row is the
    same as before (it goes ahead), rank 1's is new (it waits); they agree, and the data moves."""
    for keep in (1, 1, 1, 3, 3):
        splits = [2, 2] if rank == 0 else [2, keep]
        received = [2, 2] if rank == 0 else [2, keep]
        x = torch.arange(sum(splits), dtype=torch.float32, device="neuron") + 100 * rank
        out = torch.empty(sum(received), device="neuron")
        dist.all_to_all_single(out, x, received, splits)
        want = torch.cat([torch.arange(2, dtype=torch.float32) + 2 * rank,
                          torch.arange(received[1], dtype=torch.float32) + 100 + 2 * (rank == 1)])
        assert torch.equal(out.cpu(), want), (keep, out.cpu(), want)


def bad_reduce_scatter(rank: int) -> None:
    out = torch.empty(3, device="neuron")
    dist.reduce_scatter_tensor(out, torch.ones(2, 4, device="neuron"))  # 8 elements for 2 outputs of 3


def host_cc_overlap(rank: int) -> None:
    """A collective in flight on a side stream while compute proceeds on the default stream:
    rank 1 holds back its part; rank 0's default stream finishes its compute meanwhile."""
    x = torch.randn(64, 64, device="neuron")
    (x @ x * 0.01).cpu()  # compiled before the clock starts
    side = torch.neuron.Stream()
    t = torch.ones(1 << 16, device="neuron")
    side.wait_stream(torch.neuron.current_stream())
    if rank == 1:
        time.sleep(5)
    with torch.neuron.stream(side):
        work = dist.all_reduce(t, async_op=True)
    start = time.perf_counter()
    y = x
    for _ in range(20):
        y = y @ x * 0.01
    torch.neuron.current_stream().synchronize()
    compute_s = time.perf_counter() - start
    done_during_compute = work.is_completed()
    work.wait()
    side.synchronize()
    assert torch.equal(t.cpu(), torch.full((1 << 16,), 2.0)), t
    if rank == 0:
        print(f"COMPUTE {compute_s:.3f} s, collective completed by then: {done_during_compute}", flush=True)


class _Counting:
    """Stands in for a process group's transport (gloo) and counts the calls of each method."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, {}

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return method(*args, **kwargs)
        return counted


def split_and_buckets(rank: int) -> None:
    """NEURON_USE_SPLIT_* and COLLECTIVE_BUCKETSIZE_IN_MB: the same results, in the documented
    number of transport calls (the test runs this with the variables set several ways)."""
    from torch_neuronx.distributed import options
    options.SPLIT_CHUNK_BYTES = 1024  # 256 floats a step, so a 1000-float slice takes 4
    pg = dist.group.WORLD
    size = dist.get_world_size()
    counting = pg._transport = _Counting(pg._transport)

    def calls(name: str) -> int:
        return counting.calls.get(name, 0)
    report = {}
    for where, stream in (("default", torch.neuron.default_stream()), ("side", torch.neuron.Stream())):
        with torch.neuron.stream(stream):
            x = torch.arange(1000, dtype=torch.float32, device="neuron") + rank * 1000
            out = torch.empty(1000 * size, device="neuron")
            before = calls("_allgather_base") + calls("allgather")
            dist.all_gather_into_tensor(out, x)
            assert torch.equal(out.cpu(), torch.arange(1000 * size, dtype=torch.float32)), where
            report[f"gather_{where}"] = calls("_allgather_base") + calls("allgather") - before
            full = torch.arange(1000 * size, dtype=torch.float32, device="neuron")
            part = torch.empty(1000, device="neuron")
            before = calls("allreduce")
            dist.reduce_scatter_tensor(part, full)
            want = torch.arange(1000 * rank, 1000 * (rank + 1), dtype=torch.float32) * size
            assert torch.equal(part.cpu(), want), where
            report[f"scatter_{where}"] = calls("allreduce") - before
        stream.synchronize()
    big = torch.ones(600_000, device="neuron")  # 2.4 MB
    before = calls("allreduce")
    dist.all_reduce(big)
    assert torch.equal(big.cpu(), torch.full((600_000,), float(size)))
    report["big_all_reduce"] = calls("allreduce") - before
    small = [torch.full((10,), float(i)).to("neuron") for i in range(100)]  # (no kernel per value of i)
    before = calls("allreduce")
    dist.all_reduce_coalesced(small)
    for i, t in enumerate(small):
        assert torch.equal(t.cpu(), torch.full((10,), float(i * size)))
    report["coalesced_100"] = calls("allreduce") - before
    print("CALLS " + " ".join(f"{k}={v}" for k, v in sorted(report.items())), flush=True)


def collective_metrics(rank: int) -> None:
    """With the transfers table enabled, each collective is counted with its bytes (and the profiler
    sees it: the same span)."""
    for _ in range(3):
        t = torch.ones(256, device="neuron")
        dist.all_reduce(t)
    out = torch.empty(512, device="neuron")
    dist.all_gather_into_tensor(out, torch.ones(256, device="neuron"))
    out.cpu()


def small_collectives_run_inline(rank: int) -> None:
    """A small collective issued while its streams are idle has run when it returns (in the
    issuing thread); one issued behind queued work, or a large one, is queued; all are right."""
    from torch_neuronx.distributed import work as work_module
    t = torch.full((4,), float(rank + 1), device="neuron")
    t.cpu()  # the stream is idle now
    # (the group's own method, as a call without async_op reaches it: async_op=True ones are queued)
    work = dist.distributed_c10d._get_default_group().allreduce([t])
    if not (work.is_completed() and torch.neuron.current_stream().query()):
        raise RuntimeError("a small collective on idle streams was queued")
    big = torch.ones(work_module.INLINE_BYTES // 4 + 1, device="neuron")
    dist.all_reduce(big)
    behind = torch.ones(64, 64, device="neuron") * (rank + 1)  # (a multiply queued before it)
    dist.all_reduce(behind)
    if t.tolist() != [3.0] * 4 or big[:3].tolist() != [2.0] * 3 or behind[0, :2].tolist() != [3.0, 3.0]:
        raise RuntimeError(f"wrong values: {t.tolist()} {big[:3].tolist()} {behind[0, :2].tolist()}")


def groups_closed_in_opposite_orders(rank: int) -> None:
    """At exit every group's agreement listeners wait for their peers' goodbyes. Ranks that closed
    their groups one by one in different orders waited for each other (10 s a group, then the
    interpreter aborted on a listener still inside gloo): goodbyes go out on every group first."""
    from torch_neuronx.distributed import agreements
    groups = [dist.new_group(ranks=[0, 1]) for _ in range(3)]
    for group in [None, *groups]:
        t = torch.ones(4, device="neuron")
        dist.all_reduce(t, group=group)
        t.cpu()
    opened = sorted(agreements._open, key=id)
    agreements._open = opened if rank == 0 else opened[::-1]
    start = time.monotonic()
    agreements._close_all()
    took = time.monotonic() - start
    alive = [t.name for t in __import__("threading").enumerate() if "agreement" in t.name]
    if took > 5 or alive:
        raise RuntimeError(f"closing took {took:.1f} s; still alive: {alive}")


def found_by_new_users(rank: int) -> None:
    """Defects a new user found (wrong values first), each checked against what NCCL/gloo give:
    a reduce leaves non-root tensors as they were (gloo used them as scratch: partial sums, NaN
    for a zero PREMUL_SUM factor); scatter into a non-contiguous view (gloo wrote it as if it
    were contiguous); all_to_all_single with one side's splits only, on the padding path
    (NEURON_USE_NKI_ALLTOALLV=0 in this run: its output was never written); an empty
    reduce_scatter off the default stream; recv from any source; reduce_scatter_tensor into a
    non-contiguous output (an internal view error); AVG of bools (all False)."""
    size = dist.get_world_size()
    mine = torch.tensor([1.0, 2.0, 3.0, 4.0], device="neuron") * (rank + 1)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist._make_nccl_premul_sum(0.0)):
        x = mine.clone()
        dist.reduce(x, dst=0, op=op)
        if rank != 0 and x.tolist() != mine.tolist():
            raise RuntimeError(f"reduce {op} changed a non-root tensor: {x.tolist()}")
    expected_sum = sum(range(1, size + 1))
    x = mine.clone()
    dist.reduce(x, dst=0)
    if rank == 0 and x.tolist() != [v * expected_sum for v in (1.0, 2.0, 3.0, 4.0)]:
        raise RuntimeError(f"reduce onto the root gave {x.tolist()}")
    base = torch.zeros(2, 4, device="neuron")
    out = base[:, ::2]
    sources = [torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="neuron") * (k + 1) for k in range(size)]
    dist.scatter(out, sources if rank == 0 else None, src=0)
    if out.tolist() != (torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (rank + 1)).tolist() or base[:, 1].tolist() != [0, 0]:
        raise RuntimeError(f"scatter into a strided view gave {base.tolist()}")
    inp = torch.arange(2.0 * size, device="neuron") + 100 * rank
    for outs, ins in (([], [2] * size), ([2] * size, [])):
        got = torch.full((2 * size,), -1.0, device="neuron")
        dist.all_to_all_single(got, inp, output_split_sizes=outs or None, input_split_sizes=ins or None)
        want = [float(2 * rank + i + 100 * r) for r in range(size) for i in range(2)]
        if got.tolist() != want:
            raise RuntimeError(f"all_to_all_single({outs}, {ins}) gave {got.tolist()}, not {want}")
    with torch.neuron.stream(torch.neuron.Stream()):
        empty = torch.empty(0, device="neuron")
        dist.reduce_scatter_tensor(empty, torch.empty(0, device="neuron"))
    torch.neuron.synchronize()
    if rank == 1:
        dist.send(torch.ones(2, device="neuron") * 7, dst=0)
    elif rank == 0:
        got = torch.zeros(2, device="neuron")
        source = dist.recv(got)
        if source != 1 or got.tolist() != [7.0, 7.0]:
            raise RuntimeError(f"recv from any source: {source}, {got.tolist()}")
    big = torch.zeros(2, 3, device="neuron")  # reduce_scatter_tensor into a transposed view
    dist.reduce_scatter_tensor(big.t(), torch.ones(size * 3, 2, device="neuron"))
    if big.tolist() != [[float(size)] * 3] * 2:
        raise RuntimeError(f"reduce_scatter_tensor into a transposed view gave {big.tolist()}")
    flags = torch.tensor([True, rank == 0, False, True], device="neuron")
    try:  # an average of booleans: refused on every rank, as gloo refuses it (it came back all False)
        dist.all_reduce(flags, op=dist.ReduceOp.AVG)
    except ValueError as exc:
        if "bool" not in str(exc):
            raise
    else:
        raise RuntimeError(f"all_reduce AVG of bools gave {flags.tolist()}")
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t)  # the group still works
    if t.tolist() != [float(size)] * 3:
        raise RuntimeError(f"all_reduce after a refused call gave {t.tolist()}")


def point_to_point_orders(rank: int) -> None:
    """Send and receive orders that gloo completes, each deadlocked until the group's timeout: the
    streams waited for a send's completion (the peer's receive) from the moment it was issued, and
    the next receive waited for that stream. Also: after ``wait()``, the work's future is complete."""
    size, peer = dist.get_world_size(), 1 - rank
    x = torch.arange(4.0, device="neuron") + 10 * rank
    z = torch.empty(4, device="neuron")
    sent = dist.isend(x, peer)
    y = torch.ones(3, device="neuron") * 3  # any op between the isend and the receive
    dist.recv(z, peer)
    sent.wait()
    if z.tolist() != (torch.arange(4.0) + 10 * peer).tolist() or y.tolist() != [3.0] * 3:
        raise RuntimeError(f"isend, an op, recv gave {z.tolist()}, {y.tolist()}")
    a = torch.full((2,), 1.0 + rank, device="neuron")
    first = dist.isend(a, peer)
    b = a * 2 + 1  # the second payload computed between the sends
    second = dist.isend(b, peer)
    got_a, got_b = torch.empty(2, device="neuron"), torch.empty(2, device="neuron")
    dist.recv(got_a, peer)
    dist.recv(got_b, peer)
    first.wait()
    second.wait()
    if got_a.tolist() != [1.0 + peer] * 2 or got_b.tolist() != [3.0 + 2 * peer] * 2:
        raise RuntimeError(f"two isends with a computed payload gave {got_a.tolist()}, {got_b.tolist()}")
    ring_in = torch.empty(3, device="neuron")
    receiving = dist.irecv(ring_in, (rank - 1) % size)  # the receive first on every rank
    sending = dist.isend(torch.full((3,), float(rank), device="neuron") + 0, (rank + 1) % size)
    receiving.wait()
    sending.wait()
    if ring_in.tolist() != [float((rank - 1) % size)] * 3:
        raise RuntimeError(f"irecv then isend around the ring gave {ring_in.tolist()}")
    tagged = [torch.empty(1, device="neuron") for _ in range(2)]
    works = [dist.isend(torch.tensor([float(tag)], device="neuron"), peer, tag=tag) for tag in (1, 2)]
    for tag in (2, 1):  # received in the other order than sent, matched by tag
        dist.recv(tagged[tag - 1], peer, tag=tag)
    for work in works:
        work.wait()
    if [t.item() for t in tagged] != [1.0, 2.0]:
        raise RuntimeError(f"receives matched by tag gave {[t.item() for t in tagged]}")
    # blocking sends of tags 1 then 2; the receives posted for tag 2 first (each tag's receives
    # are posted in order, other tags' do not wait behind them, as gloo matches by tag)
    if rank == 0:
        for tag in (1, 2):
            dist.send(torch.tensor([float(tag)], device="neuron"), 1, tag=tag)
    else:
        second, first = torch.empty(1, device="neuron"), torch.empty(1, device="neuron")
        works = [dist.irecv(second, 0, tag=2), dist.irecv(first, 0, tag=1)]
        for work in works:
            work.wait()
        if (first.item(), second.item()) != (1.0, 2.0):
            raise RuntimeError(f"irecv of tag 2, then of tag 1, gave {first.item()}, {second.item()}")
    for n in (4, 1 << 21):  # inline and queued
        t = torch.ones(n, device="neuron")
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        future = work.get_future()
        future.wait()
        if not future.done() or future.value()[0][:2].tolist() != [float(size)] * 2:
            raise RuntimeError(f"the future after wait(): done={future.done()}")
    t = torch.ones(4, device="neuron")
    torch.neuron.synchronize()  # idle streams: the small all_reduce runs inline, ended when wait() returns
    work = dist.distributed_c10d._get_default_group().allreduce([t])  # (as a call without async_op)
    work.wait()
    if not work.get_future().done():
        raise RuntimeError("an inline all_reduce's future was not complete after wait()")


def async_orders_across_groups(rank: int) -> None:
    """Async collectives of two groups over the same ranks, issued in opposite orders on the two
    ranks (legal: each group sees one order), on neuron tensors and small CPU ones: both ranks
    waited for the group timeout (the first held the stream or thread the other needed). A CPU
    collective with async_op=True returns at once, and ``wait(timeout)`` keeps its timeout."""
    first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
    for device in ("neuron", "cpu"):
        a = torch.ones(4, device=device) * (rank + 1)
        b = torch.ones(4, device=device) * (rank + 10)
        pairs = [(a, first), (b, second)]
        works = [dist.all_reduce(t, group=g, async_op=True) for t, g in (pairs if rank == 0 else pairs[::-1])]
        for work in works:
            work.wait()
        if a.tolist() != [3.0] * 4 or b.tolist() != [21.0] * 4:
            raise RuntimeError(f"{device}: async all_reduces in opposite orders gave {a.tolist()}, {b.tolist()}")
    late = torch.ones(4)
    if rank == 1:
        time.sleep(3)
    start = time.monotonic()
    work = dist.all_reduce(late, async_op=True)
    returned = time.monotonic() - start
    if rank == 0:
        if returned > 1.5:
            raise RuntimeError(f"a CPU all_reduce with async_op=True returned after {returned:.1f} s")
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.5))
        except Exception as exc:  # noqa: BLE001
            if "timed out" not in str(exc):
                raise
        else:
            raise RuntimeError("wait(timeout=0.5 s) on a collective a peer joins 3 s late returned")
    work.wait()
    if late.tolist() != [2.0] * 4:
        raise RuntimeError(f"the late all_reduce gave {late.tolist()}")


def sync_batch_norm(rank: int) -> None:
    """nn.SyncBatchNorm on neuron (its statistics kernels are CUDA-only in ATen): each rank's half
    of a batch through conv + SyncBatchNorm, forward and backward, two steps, in float32 and
    bfloat16, against BatchNorm over the whole batch on the CPU (outputs, the input's and the
    parameters' gradients summed over ranks, running statistics)."""
    size = dist.get_world_size()
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        torch.manual_seed(0)
        reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(reference)).to("neuron", dtype)
        # (the reference in float32 over the same values: CPU bfloat16 sums are the coarser ones)
        for step in range(2):
            x = torch.randn(4 * size, 3, 6, 6, dtype=dtype)
            mine = x[4 * rank:4 * (rank + 1)].to("neuron").requires_grad_()
            whole = x.float().requires_grad_()
            out = model(mine)
            (out.float() * torch.arange(out.numel()).reshape(out.shape).to("neuron") / out.numel()).sum().backward()
            expected = reference(whole)
            (expected.float() * torch.arange(expected[:4].numel()).reshape(expected[:4].shape).repeat(size, 1, 1, 1)
             / expected[:4].numel()).sum().backward()
            check = functools.partial(torch.testing.assert_close, atol=tol, rtol=tol)
            check(out.cpu().float(), expected[4 * rank:4 * (rank + 1)].detach(), msg=f"{dtype} step {step} output")
            check(mine.grad.cpu().float(), whole.grad[4 * rank:4 * (rank + 1)], msg=f"{dtype} step {step} input grad")
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                summed = p.grad.clone()
                dist.all_reduce(summed)
                check(summed.cpu().float(), q.grad, msg=f"{dtype} step {step} {name} grad")
                p.grad, q.grad = None, None
            for name in ("running_mean", "running_var"):
                check(getattr(model[1], name).cpu().float(), getattr(reference[1], name), msg=f"{dtype} {name}")


def reinit_after_destroy(rank: int) -> None:
    """destroy_process_group, then init_process_group again, three times (a new group each time):
    the second or third init hung past the group's timeout in the transports' connection setup,
    most runs (torchrun's store kept the previous groups' addresses under the same names); and
    destroy_process_group lets the collectives this rank queued run first."""
    for i in range(3):
        dist.destroy_process_group()
        dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=20))
        size = dist.get_world_size()
        t = torch.ones(3, device="neuron") * (rank + i)
        dist.all_reduce(t)
        group = dist.new_group(list(range(size)))
        dist.all_reduce(t, group=group)
        want = float(size * sum(r + i for r in range(size)))
        if t.tolist() != [want] * 3:
            raise RuntimeError(f"incarnation {i}: {t.tolist()}, not {want}")
    # A script's usual end: every rank all-reduces a metric only rank 0 reads, then destroys the
    # group. The others' collectives, queued on their streams, ran after their destroy had closed
    # the transport: rank 0's failed ("rank 1 left the group", connection reset), 1 trial in 3.
    failures = []
    for i in range(8):
        dist.destroy_process_group()
        dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=20))
        metric = torch.full((4,), float(rank + 1), device="neuron")
        try:
            for _ in range(3):
                dist.all_reduce(metric)
            if rank == 0 and metric.tolist() != [float(size ** 2 * sum(range(1, size + 1)))] * 4:
                failures.append(f"trial {i}: the metric is {metric.tolist()}")
        except Exception as exc:  # noqa: BLE001 - every trial's outcome is reported
            failures.append(f"trial {i}: {type(exc).__name__}: {exc}")
    if failures:
        raise RuntimeError("; ".join(failures))


def device_id_bound(rank: int) -> None:
    """init_process_group(device_id=neuron:0) (main() passes it for this case) failed: "No backend
    type associated with device type neuron"; then the group was unbound (bound_device_id None),
    so split_group refused to split it; a bound DeviceMesh splits it too."""
    size = dist.get_world_size()
    if dist.group.WORLD.bound_device_id != torch.device("neuron", 0):
        raise RuntimeError(f"bound_device_id is {dist.group.WORLD.bound_device_id}")
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t)
    sub = dist.new_group(list(range(size)))
    dist.all_reduce(t, group=sub)
    if t.tolist() != [float(size ** 2)] * 3:
        raise RuntimeError(f"all_reduce in a device-bound group gave {t.tolist()}")
    alone = dist.split_group(split_ranks=[[r] for r in range(size)])
    both = dist.split_group(split_ranks=[list(range(size))])
    x = torch.full((2,), float(rank + 1), device="neuron")
    dist.all_reduce(x, group=alone)
    y = x.clone()
    dist.all_reduce(y, group=both)
    if x.tolist() != [float(rank + 1)] * 2 or y.tolist() != [float(size * (size + 1) // 2)] * 2:
        raise RuntimeError(f"all_reduce in split groups gave {x.tolist()}, {y.tolist()}")
    if dist.get_process_group_ranks(alone) != [rank] or alone.bound_device_id != torch.device("neuron", 0):
        raise RuntimeError(f"the split group's ranks {dist.get_process_group_ranks(alone)}")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("neuron", (size,))
    z = torch.ones(2, device="neuron")
    dist.all_reduce(z, group=mesh.get_group())
    if z.tolist() != [float(size)] * 2:
        raise RuntimeError(f"all_reduce over a bound DeviceMesh gave {z.tolist()}")
    # A compiled function of a DTensor that returns a DTensor: the mesh passes through the graph
    # (an opaque input aot_autograd returns to rebuild the output), which the backend refused.
    from torch.distributed.tensor import Shard, distribute_tensor
    whole = torch.arange(24.0).reshape(6, 4)
    sharded = distribute_tensor(whole, mesh, [Shard(0)])
    with torch.no_grad():
        doubled = torch.compile(lambda a: (a * 2).sum(1), backend="neuron")(sharded)
    if not torch.equal(doubled.full_tensor().cpu(), (whole * 2).sum(1)):
        raise RuntimeError(f"a compiled DTensor function gave {doubled.full_tensor().cpu()}")


def coalescing_and_futures(rank: int) -> None:
    """_coalescing_manager(device=neuron) raised "No backend type associated with device type
    neuron"; an all_gather's future held [[t0, t1]] where NCCL's and gloo's hold [t0, t1];
    all_gather_into_tensor into a transposed output was refused (reduce_scatter_tensor's is taken)."""
    size = dist.get_world_size()
    a, b = torch.ones(4, device="neuron"), torch.full((2,), 2.0, device="neuron")
    with _coalescing_manager(device=torch.device("neuron")):
        dist.all_reduce(a)
        dist.all_reduce(b)
    if a.tolist() != [float(size)] * 4 or b.tolist() != [2.0 * size] * 2:
        raise RuntimeError(f"coalesced all_reduce gave {a.tolist()}, {b.tolist()}")
    with _coalescing_manager(device=torch.device("neuron"), async_ops=True) as manager:
        dist.all_reduce(a)
        dist.broadcast(b, src=0)
    manager.wait()
    if a.tolist() != [float(size ** 2)] * 4:
        raise RuntimeError(f"async coalesced all_reduce gave {a.tolist()}")
    outs = [torch.empty(2, device="neuron") for _ in range(size)]
    work = dist.all_gather(outs, torch.full((2,), float(rank), device="neuron"), async_op=True)
    value = work.get_future().wait()
    if not all(isinstance(v, torch.Tensor) for v in value) or [v.tolist() for v in value] != \
            [[float(r)] * 2 for r in range(size)]:
        raise RuntimeError(f"all_gather's future holds {value}")
    big = torch.zeros(3, 2 * size, device="neuron")
    dist.all_gather_into_tensor(big.t(), torch.full((2, 3), float(rank), device="neuron"))
    want = torch.cat([torch.full((2, 3), float(r)) for r in range(size)]).t()
    if big.tolist() != want.tolist():
        raise RuntimeError(f"all_gather_into_tensor into a transposed view gave {big.tolist()}")


def ran_ahead_then_exit(rank: int) -> None:
    """A caught mismatch that a rank ran ahead into, then an ordinary exit without
    destroy_process_group: the transport failed the abandoned work after the interpreter had gone
    and the process died of SIGABRT or SIGSEGV at exit."""
    try:
        mismatched_later(rank)
    except Exception as exc:  # noqa: BLE001 - what a user's script catches
        print(f"CAUGHT rank {rank}: {type(exc).__name__}", flush=True)
    print(f"DONE rank {rank}", flush=True)
    sys.exit(0)


def _print_raised(case: str, rank: int, exc: BaseException) -> None:
    """The line the tests read for a case that raised on ``rank``."""
    print(f"RAISED {case} rank {rank}: {type(exc).__name__}: {exc}".replace("\n", " ")[:600], flush=True)


def _store_barrier(name: str) -> None:
    """Wait (at most 60 s) until every rank got here, through the store (the group may be broken)."""
    store = dist.distributed_c10d._get_default_store()
    store.add(name, 1)
    deadline = time.monotonic() + 60
    while int(store.add(name, 0)) < dist.get_world_size():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ranks did not all reach {name!r} within 60 s")
        time.sleep(0.01)


def _arrive_together() -> None:
    """Wait (at most 120 s) on torchrun's store until every rank got here: the cases' groups have
    timeouts of a few seconds, which their rendezvous must not spend on a rank still importing
    torch (under a loaded suite one rank started more than 5 s after the other)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    store.add("distributed_cases arrived", 1)
    deadline = time.monotonic() + 120
    while int(store.add("distributed_cases arrived", 0)) < int(os.environ["WORLD_SIZE"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the ranks did not all start within 120 s")
        time.sleep(0.01)


def main() -> None:
    import faulthandler
    faulthandler.dump_traceback_later(200, exit=True)
    case = sys.argv[1]
    _arrive_together()
    bound = {"device_id": torch.device("neuron", 0)} if case == "device_id_bound" else {}
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "10"))),
                            **bound)
    # Every rank's init has returned before a case starts: a peer that dies at once (peer_dies)
    # otherwise closed its connections while the other rank's init still set its group up.
    _store_barrier("initialized")
    rank = dist.get_rank()
    if "," in case:  # mismatches every rank catches, one after another, each on a new group
        for name in case.split(","):
            try:
                globals()[name](rank)
                print(f"OK {name} rank {rank}", flush=True)
            except Exception as exc:
                _print_raised(name, rank, exc)
            try:  # an error raised to the caller once is never raised again by a later read
                torch.neuron.synchronize()
            except Exception as exc:
                _print_raised(f"{name} (again)", rank, exc)
            _store_barrier(f"after {name}")  # every rank saw its outcome before a group goes away
            start = time.monotonic()
            dist.destroy_process_group()  # a group that failed an agreement check refuses more work
            # (prompt, though a rank's transport still holds a collective its peer never joined)
            print(f"DESTROYED {name} rank {rank} in {time.monotonic() - start:.1f} s", flush=True)
            # (the peer may still be tearing its last group down: a longer rendezvous than PG_TIMEOUT)
            dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=20))
        print(f"DONE rank {rank}", flush=True)
        dist.destroy_process_group()
        return
    try:
        globals()[case](rank)
    except Exception as exc:  # the test reads what each rank saw
        _print_raised(case, rank, exc)
        # What a normal exit does first (atexit): the agreement messages still queued (a verdict
        # that a rank which ran ahead waits for) go out before the connections close.
        from torch_neuronx.distributed import agreements
        for group in list(agreements._open):
            group.close(timeout_s=2.0)
        os._exit(0)
    print(f"OK {case} rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
