"""Run under torchrun by tests/test_distributed.py: functional collectives inside
``torch.compile(backend="neuron")``: a tensor-parallel MLP's forward and backward against the
same MLP on one CPU; the graph_stats rows say has_collectives (prints DONE per rank)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import torch_neuronx
from torch_neuronx import observe


def tensor_parallel(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Column-parallel then row-parallel linear layers: each rank holds a slice of the hidden units."""
    hidden = torch.relu(x @ w1)
    return fc.all_reduce(hidden @ w2, "sum", dist.group.WORLD) * 0.5 + 1


def main() -> None:
    dist.init_process_group("neuron")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    want = torch.relu(x @ w1) @ w2 * 0.5 + 1
    want.square().sum().backward()
    cols = 16 // size
    a = w1.detach()[:, rank * cols:(rank + 1) * cols].clone().to("neuron").requires_grad_()
    b = w2.detach()[rank * cols:(rank + 1) * cols].clone().to("neuron").requires_grad_()
    # torch's functional all_reduce all-reduces the gradient in backward too: eager on CPU tensors
    # over gloo is the reference for the gradients (the single-device ones, times the ranks)
    gloo = dist.new_group(backend="gloo")
    ca, cb = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_()
    fc.all_reduce(torch.relu(x @ ca) @ cb, "sum", gloo).mul(0.5).add(1).square().sum().backward()
    torch.testing.assert_close(ca.grad, w1.grad[:, rank * cols:(rank + 1) * cols] * size)
    compiled = torch.compile(tensor_parallel, backend="neuron")
    for _ in range(2):  # the second call runs what the first compiled
        a.grad = b.grad = None
        y = compiled(x.to("neuron"), a, b)
        torch.testing.assert_close(y.cpu(), want.detach(), rtol=1e-4, atol=1e-4)
        y.square().sum().backward()
        torch.testing.assert_close(a.grad.cpu(), ca.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.grad.cpu(), cb.grad, rtol=1e-4, atol=1e-4)
    # called with a side stream current, the graph (with its collectives) runs on the default stream
    launches = []

    def on_event(event: observe.Event) -> None:
        if event.name == "runtime.launch":
            launches.append(event.fields["stream"])
    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    with observe.listening(on_event), torch.neuron.stream(side):
        y = compiled(x.to("neuron"), a, b)
        torch.testing.assert_close(y.cpu(), want.detach(), rtol=1e-4, atol=1e-4)
    assert launches and set(launches) == {0}, launches
    rows = torch_neuronx.get_dynamo_metrics()
    assert sorted(r["graph_name"].split("_")[-2] for r in rows) == ["backward", "forward"], rows
    assert all(r["has_collectives"] and r["torch_neuronx_compile_us"] > 0 for r in rows), rows
    assert torch._dynamo.utils.counters["neuron"]["graphs_with_collectives"] == 2
    dist.destroy_process_group()
    print(f"DONE rank {rank}", flush=True)


if __name__ == "__main__":
    main()
