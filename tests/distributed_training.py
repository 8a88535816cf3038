"""Run under torchrun by tests/test_distributed_training.py: a tiny MLP trained for a few steps with
DDP or FSDP2 (``fully_shard``) on ``neuron``, eager or under ``torch.compile(backend="neuron")``,
against the same MLP trained in one process on the CPU on the whole batch (each rank trains on
its own shard of one seeded global batch). FSDP2 also shows its reshard freeing device memory
between forward and backward. Each rank prints DONE at the end.

Usage: ``distributed_training.py {ddp,ddp_device_ids,ddp_buckets,ddp_unused,fsdp2} {eager,compiled,compiled_inside}``
(``compiled_inside``: DDP of the compiled module, ``DDP(torch.compile(model))``; ``ddp_unused``: an MLP
with a layer its forward never uses, trained by DDP with ``find_unused_parameters=True`` and then
with ``static_graph=True``, whose reducers keep their used-parameter map in pinned host memory).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

STEPS, BATCH, SIZES = 3, 8, (16, 32, 32, 4)
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
ADAM_EPS = 1e-8
UNUSED = False  # ddp_unused: the MLP has a layer its forward never uses


class Block(nn.Module):
    """16 → 32 → 32: two layers, the unit a transformer recipe gives ``fully_shard``."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.hidden = (nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:3]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(torch.relu(self.first(x))))


class MLP(nn.Module):
    """16 → 32 → 32 → 4. A class of this file, not ``nn.Sequential``: Dynamo compiles the forward of
    a module that DDP's (untraceable) forward calls as a frame of its own, and never a frame of
    torch.nn's files."""

    def __init__(self) -> None:
        super().__init__()
        self.block, self.last = Block(), nn.Linear(SIZES[2], SIZES[3])
        if UNUSED:
            self.unused = nn.Linear(SIZES[3], SIZES[3])  # never called: DDP must not wait for its gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.block(x))


def mlp() -> MLP:
    """The MLP with the same initial values in every process."""
    torch.manual_seed(0)
    return MLP()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch of each step (CPU tensors), the same in every process."""
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, SIZES[0], generator=generator), torch.randn(BATCH, SIZES[-1], generator=generator))
            for _ in range(STEPS)]


def optimizer(params: object) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, eps=ADAM_EPS)


def reference() -> dict[str, torch.Tensor]:
    """The parameters after training in this process on the CPU, on the whole batch."""
    model = mlp()
    opt = optimizer(model.parameters())
    for x, y in batches():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def shard(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    rows = BATCH // size
    return t[rank * rows:(rank + 1) * rows]


def train(model: nn.Module, rank: int, size: int, between: Callable[[], None] = lambda: None) -> None:
    """``STEPS`` steps on this rank's shards; ``between`` runs between each forward and backward."""
    opt = optimizer(model.parameters())
    for x, y in batches():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(shard(x, rank, size).to("neuron")), shard(y, rank, size).to("neuron"))
        between()
        loss.backward()
        opt.step()


def compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name, value in got.items():
        torch.testing.assert_close(value.cpu(), want[name], **TOLERANCE, msg=lambda m, name=name: f"{what} {name}: {m}")


def maybe_compiled(model: nn.Module, how: str) -> nn.Module:
    return torch.compile(model, backend="neuron") if how == "compiled" else model


def check_compiled(how: str) -> None:
    """Compiled: the neuron backend compiled forward and backward graphs, none fell back to eager."""
    if how not in ("compiled", "compiled_inside"):
        return
    import torch_neuronx

    rows = torch_neuronx.get_dynamo_metrics()
    kinds = {r["graph_name"].split("_")[-2] for r in rows}
    print("GRAPHS", [r["graph_name"] for r in rows], flush=True)
    assert {"forward", "backward"} <= kinds, rows
    assert torch_neuronx.observe.counter("fallback_graphs") == 0


def ddp_unused(rank: int, size: int) -> None:
    """DDP with ``find_unused_parameters=True``, then with ``static_graph=True``, each from the same
    initial MLP: both match the CPU, and the unused layer keeps its initial values."""
    from torch.nn.parallel import DistributedDataParallel

    want = reference()
    for options in ({"find_unused_parameters": True}, {"static_graph": True}):
        module = mlp().to("neuron")
        initial = module.unused.weight.detach().cpu()
        train(DistributedDataParallel(module, **options), rank, size)
        compare(module.state_dict(), want, f"ddp {options}")
        assert torch.equal(module.unused.weight.cpu(), initial)


def ddp(rank: int, size: int, how: str, device_ids: bool, buckets: bool = False) -> None:
    """``buckets``: an MLP of 1.5 MB, past DDP's first bucket (1 MiB), so that Dynamo's DDPOptimizer
    compiles the graph in pieces split at the buckets (each piece's first call, made while
    compiling, gives fake outputs)."""
    from torch.nn.parallel import DistributedDataParallel

    module = mlp().to("neuron")
    inner = torch.compile(module, backend="neuron") if how == "compiled_inside" else module
    wrapped = DistributedDataParallel(inner, device_ids=[torch.neuron.current_device()] if device_ids else None)
    train(maybe_compiled(wrapped, how), rank, size)
    check_compiled(how)
    if buckets and how == "compiled":
        import torch_neuronx

        forwards = [r for r in torch_neuronx.get_dynamo_metrics() if r["graph_name"].split("_")[-2] == "forward"]
        assert len(forwards) >= 2, forwards  # the graph was split
    compare(module.state_dict(), reference(), f"ddp {how}")


def allocated() -> int:
    """The device's allocated bytes once queued work let go of the blocks it held."""
    torch.neuron.synchronize()
    return torch.neuron.memory_allocated()


def watch_reshard(layer: nn.Module, freed: list[int]) -> None:
    """Append to ``freed`` the bytes FSDP2's post-forward hook of ``layer`` gives back (its reshard):
    our hooks run just before and just after it."""
    before: list[int] = []
    layer.register_forward_hook(lambda *_: before.append(allocated()), prepend=True)
    layer.register_forward_hook(lambda *_: freed.append(before.pop() - allocated()))


def fsdp2(rank: int, size: int, how: str) -> None:
    """Eager: each Linear its own ``fully_shard`` unit, of a model built on the CPU (``fully_shard``
    moves it to the mesh's device: "incompatible tensor type" before). Compiled: the block of the
    first two one unit (the usual recipe: its backward failed "modified by an inplace operation"),
    the last its own."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = mlp() if how == "eager" else mlp().to("neuron")
    mesh = init_device_mesh("neuron", (size,))
    units = [model.block, model.last] if how == "compiled" else [model.block.first, model.block.hidden, model.last]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    drops: list[list[int]] = [[] for _ in units]  # bytes freed by each unit's reshard after its forward
    for i, unit in enumerate(units):
        watch_reshard(unit, drops[i])

    def after_forward() -> None:
        for unit in units:
            for p in unit._get_fsdp_state()._fsdp_param_group.fsdp_params:
                assert p._unsharded_param.untyped_storage().size() == 0, f"{p._param_fqn} not resharded"

    train(maybe_compiled(model, how), rank, size, after_forward)
    check_compiled(how)
    for unit, freed in zip(units, drops):
        # the DTensors' global sizes
        unsharded = sum(p.numel() * p.element_size() for p in unit.parameters())
        assert len(freed) == STEPS and all(f >= unsharded for f in freed), (unit, freed, unsharded)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    compare(full, reference(), f"fsdp2 {how}")
    print(f"MEMORY rank {rank}: bytes freed by each unit's reshard after forward {drops}", flush=True)


def main() -> None:
    global SIZES, TOLERANCE, ADAM_EPS, UNUSED
    mode, how = sys.argv[1], sys.argv[2]
    UNUSED = mode == "ddp_unused"
    if mode == "ddp_buckets":
        SIZES = (16, 600, 600, 4)
        # 600-wide sums in another order: gradients of about 1e-8 differ in their last bits, which
        # AdamW's first steps scale to whole updates with its default eps (measured 5e-5 on one
        # CPU, 1.1e-3 on another); with eps 1e-4 such gradients move nothing, a lost bucket's
        # (about 1e-2) still a whole update
        ADAM_EPS = 1e-4
        TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}
    dist.init_process_group("neuron")
    rank, size = dist.get_rank(), dist.get_world_size()
    if mode == "fsdp2":
        fsdp2(rank, size, how)
    elif mode == "ddp_unused":
        ddp_unused(rank, size)
    else:
        ddp(rank, size, how, device_ids=mode == "ddp_device_ids", buckets=mode == "ddp_buckets")
    dist.destroy_process_group()
    print(f"DONE rank {rank}", flush=True)


if __name__ == "__main__":
    main()
