"""Run under torchrun by tests/test_distributed.py: every collective on neuron tensors, checked
against what the ranks' inputs make (each rank prints DONE at the end)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]


def value(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return (torch.arange(n) + rank) % 2 == 0
    return (torch.arange(n) + 10 * rank + 1).to(dtype)


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got} want {want}")


def reductions(rank: int, size: int, dev: str) -> None:
    for dtype in DTYPES:
        inputs = [value(r, 6, dtype) for r in range(size)]
        t = inputs[rank].to(dev)
        if dtype == torch.bool:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            check(t, torch.stack(inputs).any(0), f"all_reduce MAX {dtype}")
            continue
        dist.all_reduce(t)
        check(t, torch.stack(inputs).sum(0).to(dtype), f"all_reduce SUM {dtype}")
        for op, fn in ((dist.ReduceOp.MIN, lambda s: s.min(0).values), (dist.ReduceOp.MAX, lambda s: s.max(0).values)):
            t = inputs[rank].to(dev)
            dist.all_reduce(t, op=op)
            check(t, fn(torch.stack(inputs)), f"all_reduce {op} {dtype}")
        small = [(torch.arange(6) + r) % 3 + 1 for r in range(size)]  # products exact in every dtype
        t = small[rank].to(dtype).to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        check(t, torch.stack(small).prod(0).to(dtype), f"all_reduce PRODUCT {dtype}")
    f = torch.tensor([1.0, 2.0, 3.0]).to(dev) * (rank + 1)
    dist.all_reduce(f, op=dist.ReduceOp.AVG)
    check(f, torch.tensor([1.0, 2.0, 3.0]) * sum(range(1, size + 1)) / size, "AVG")
    p = torch.ones(4, device=dev) * (rank + 1)
    dist.all_reduce(p, op=dist._make_nccl_premul_sum(0.5))
    check(p, torch.ones(4) * 0.5 * sum(range(1, size + 1)), "PREMUL_SUM")
    b = torch.ones(4, dtype=torch.int64, device=dev) * (rank + 1) * 4
    dist.all_reduce(b, op=dist.ReduceOp.BOR)
    want = torch.zeros(4, dtype=torch.int64)
    for r in range(size):
        want |= (r + 1) * 4
    check(b, want, "BOR")


def rooted(rank: int, size: int, dev: str) -> None:
    t = value(rank, 5, torch.float32).to(dev)
    dist.broadcast(t, src=size - 1)
    check(t, value(size - 1, 5, torch.float32), "broadcast")
    t = value(rank, 5, torch.float32).to(dev)
    dist.reduce(t, dst=0)
    if rank == 0:
        check(t, sum(value(r, 5, torch.float32) for r in range(size)), "reduce")
    t = value(rank, 3, torch.int64).to(dev)
    gathered = [torch.empty(3, dtype=torch.int64, device=dev) for _ in range(size)] if rank == 0 else None
    dist.gather(t, gathered, dst=0)
    if rank == 0:
        for r in range(size):
            check(gathered[r], value(r, 3, torch.int64), "gather")
    out = torch.empty(3, dtype=torch.int64, device=dev)
    scatter = [value(r, 3, torch.int64).to(dev) * 2 for r in range(size)] if rank == 1 else None
    dist.scatter(out, scatter, src=1)
    check(out, value(rank, 3, torch.int64) * 2, "scatter")


def gathers(rank: int, size: int, dev: str) -> None:
    for dtype in DTYPES:
        t = value(rank, 4, dtype).to(dev)
        out = torch.empty(4 * size, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, t)
        check(out, torch.cat([value(r, 4, dtype) for r in range(size)]), f"all_gather_into_tensor {dtype}")
        stacked = torch.empty(size, 4, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(stacked, t)
        check(stacked, torch.stack([value(r, 4, dtype) for r in range(size)]), f"all_gather stacked {dtype}")
        outs = [torch.empty(4, dtype=dtype, device=dev) for _ in range(size)]
        dist.all_gather(outs, t)
        for r in range(size):
            check(outs[r], value(r, 4, dtype), f"all_gather list {dtype}")
    # uneven list all_gather: rank r contributes r + 1 elements
    t = value(rank, rank + 1, torch.float32).to(dev)
    outs = [torch.empty(r + 1, device=dev) for r in range(size)]
    dist.all_gather(outs, t)
    for r in range(size):
        check(outs[r], value(r, r + 1, torch.float32), "uneven all_gather")
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    assert objects == [{"rank": r, "text": "x" * r} for r in range(size)], objects


def scatters(rank: int, size: int, dev: str) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        inputs = [value(r, 3 * size, dtype) for r in range(size)]
        out = torch.empty(3, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, inputs[rank].to(dev))
        check(out, torch.stack(inputs).sum(0).to(dtype)[3 * rank:3 * rank + 3], f"reduce_scatter_tensor {dtype}")
        stacked = inputs[rank].view(size, 3).to(dev)
        out2 = torch.empty(3, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out2, stacked)
        check(out2, torch.stack(inputs).sum(0).to(dtype)[3 * rank:3 * rank + 3], f"stacked reduce_scatter {dtype}")
        lists = [inputs[rank][3 * r:3 * r + 3].to(dev) for r in range(size)]
        out3 = torch.empty(3, dtype=dtype, device=dev)
        dist.reduce_scatter(out3, lists)
        check(out3, torch.stack(inputs).sum(0).to(dtype)[3 * rank:3 * rank + 3], f"reduce_scatter list {dtype}")


def all_to_all(rank: int, size: int, dev: str, generator: torch.Generator) -> None:
    # every rank draws every rank's splits from one seed, so all agree; zeros included
    splits = torch.randint(0, 4, (size, size), generator=generator)
    send = splits[rank].tolist()
    recv = splits[:, rank].tolist()
    inp = torch.cat([torch.full((n, 2), float(100 * rank + r)) for r, n in enumerate(send)]) if sum(send) else \
        torch.empty(0, 2)
    out = torch.empty(sum(recv), 2, device=dev)
    dist.all_to_all_single(out, inp.to(dev), output_split_sizes=recv, input_split_sizes=send)
    want = torch.cat([torch.full((n, 2), float(100 * r + rank)) for r, n in enumerate(recv)]) if sum(recv) else \
        torch.empty(0, 2)
    check(out, want, f"all_to_all_single {send} {recv}")
    even = torch.arange(size * 2, dtype=torch.float32) + 10 * rank
    out = torch.empty(size * 2, device=dev)
    dist.all_to_all_single(out, even.to(dev))
    check(out, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 10 * r for r in range(size)]),
          "even all_to_all_single")
    outs = [torch.empty(1, device=dev) for _ in range(size)]
    dist.all_to_all(outs, [torch.tensor([float(10 * rank + r)], device=dev) for r in range(size)])
    for r in range(size):
        check(outs[r], torch.tensor([float(10 * r + rank)]), "all_to_all list")


def point_to_point(rank: int, size: int, dev: str) -> None:
    peer = (rank + 1) % size
    left = (rank - 1) % size
    send = torch.full((3,), float(rank), device=dev)
    recv = torch.empty(3, device=dev)
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    check(recv, torch.full((3,), float(left)), "batch_isend_irecv")
    if rank == 0:
        dist.send(torch.ones(2, device=dev) * 7, dst=1)
    elif rank == 1:
        t = torch.empty(2, device=dev)
        dist.recv(t, src=0)
        check(t, torch.ones(2) * 7, "send/recv")
    dist.barrier()


def asynchronous(rank: int, size: int, dev: str) -> None:
    t = torch.ones(8, device=dev) * (rank + 1)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    check(t, torch.ones(8) * sum(range(1, size + 1)), "async all_reduce")
    value_ = fut.wait()
    assert isinstance(value_[0], torch.Tensor) and value_[0].device.type == "neuron", value_
    many = [torch.ones(3, device=dev) * (rank + 1) for _ in range(5)]
    dist.all_reduce_coalesced(many)
    for m in many:
        check(m, torch.ones(3) * sum(range(1, size + 1)), "all_reduce_coalesced")


def groups(rank: int, size: int, dev: str) -> None:
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])
    if rank % 2 == 0:
        t = torch.ones(2, device=dev)
        dist.all_reduce(t, group=evens)
        check(t, torch.ones(2) * len(range(0, size, 2)), "new_group")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("neuron", (size,))
    t = torch.ones(2, device=dev) * rank
    dist.all_reduce(t, group=mesh.get_group())
    check(t, torch.ones(2) * sum(range(size)), "DeviceMesh")


def main() -> None:
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ.get("HANG_DUMP_S", "240")), exit=True)
    backend = sys.argv[1] if len(sys.argv) > 1 else "neuron"
    dist.init_process_group(None if backend == "none" else backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    dev = "neuron"
    generator = torch.Generator().manual_seed(1234)
    for part in (reductions, rooted, gathers, scatters, point_to_point, asynchronous, groups):
        part(rank, size, dev)
        if os.environ.get("VERBOSE"):
            print(f"rank {rank}: {part.__name__} passed", flush=True)
    for _ in range(3):
        all_to_all(rank, size, dev, generator)
    torch.neuron.synchronize()
    dist.destroy_process_group()
    print(f"DONE rank {rank} {os.environ.get('NEURON_USE_NKI_ALLTOALLV', '')}", flush=True)


if __name__ == "__main__":
    main()
