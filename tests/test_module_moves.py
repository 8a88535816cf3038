"""Moving modules between the CPU and ``neuron`` while autograd graphs still hold their parameters."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_neuronx  # noqa: F401


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_module_moves_while_an_output_computed_before_holds_its_parameters():
    """``ref = model(x); model.to("neuron")`` works as on CUDA: the parameters keep their identity
    (an optimizer made before the move trains them), and only a backward pass through the graph
    from before the move raises, clearly."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    identities = [id(p) for p in model.parameters()]
    x = torch.randn(3, 4)
    reference = model(x)  # its graph holds the weights it saved for backward
    model.to("neuron")
    assert [id(p) for p in model.parameters()] == identities
    assert all(p.device.type == "neuron" for p in model.parameters())
    out = model(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), reference.detach())
    before = model[0].weight.detach().cpu().clone()
    out.square().sum().backward()
    optimizer.step()
    assert not torch.equal(model[0].weight.detach().cpu(), before)  # the optimizer's parameters are the model's
    with pytest.raises(RuntimeError, match="poisoned|moved between devices"):
        reference.sum().backward()


def test_a_module_moves_back_to_the_cpu_while_a_neuron_graph_holds_it():
    model = _model().to("neuron")
    x = torch.randn(3, 4)
    kept = model(x.to("neuron"))
    model.cpu()
    assert all(p.device.type == "cpu" for p in model.parameters())
    torch.testing.assert_close(model(x), kept.detach().cpu())


def test_other_refusals_of_a_swap_stay_torchs():
    a, b = torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    held = a.sin()  # the graph holds ``a``: between two CPU tensors torch still refuses
    with pytest.raises(RuntimeError, match="use_count"):
        torch.utils.swap_tensors(a, b)
    del held
