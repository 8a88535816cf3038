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


def _lazy_model() -> nn.Module:
    return nn.Sequential(nn.LazyConv2d(3, 3), nn.LazyBatchNorm2d(), nn.Flatten(), nn.LazyLinear(4))


@pytest.mark.parametrize("how", ["moved", "built_there", "moved_twice", "deep_copied"])
def test_lazy_modules_materialize_on_neuron(how):
    """A lazy module built on ``neuron`` or moved there before its first call stays lazy, as on
    CUDA: its first call materializes its parameters and buffers on ``neuron`` with the shapes of
    that call (a move made them plain 0-element tensors, and creating one there raised torch's
    internal ``_make_subclass`` error). It then trains and loads a state dict as any module."""
    import copy

    x = torch.randn(2, 2, 6, 6)
    reference = _lazy_model()
    reference(x)
    if how == "built_there":
        with torch.device("neuron"):
            model = _lazy_model()
    else:
        model = _lazy_model().to("neuron")
        if how == "moved_twice":
            model = model.to("neuron")
        elif how == "deep_copied":
            model = copy.deepcopy(model)
    assert all(isinstance(p, nn.parameter.UninitializedParameter) and p.device.type == "neuron"
               for p in model.parameters())
    assert isinstance(model[1].running_mean, nn.parameter.UninitializedBuffer)
    model(x.to("neuron"))  # materializes
    assert [p.shape for p in model.parameters()] == [p.shape for p in reference.parameters()]
    assert all(isinstance(p, nn.Parameter) and not isinstance(p, nn.parameter.UninitializedParameter)
               and p.device.type == "neuron" for p in model.parameters())
    assert model[1].running_mean.shape == (3,) and model[1].running_mean.device.type == "neuron"
    model.load_state_dict(reference.state_dict())
    out = model(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), reference(x), atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    assert model[3].weight.grad.shape == (4, 48) and model[3].weight.grad.device.type == "neuron"


def test_uninitialized_placeholders_elsewhere_stay_torchs():
    """The placeholders' constructors are torch's off ``neuron`` (CPU, meta, default arguments)."""
    p = nn.parameter.UninitializedParameter()
    b = nn.parameter.UninitializedBuffer(persistent=False, device="meta")
    assert type(p) is nn.parameter.UninitializedParameter and p.device.type == "cpu"
    assert type(b) is nn.parameter.UninitializedBuffer and b.device.type == "meta" and b.persistent is False
    q = nn.parameter.UninitializedParameter(requires_grad=False, device="neuron", dtype=torch.float16)
    assert isinstance(q, nn.parameter.UninitializedParameter) and not q.requires_grad
    q.materialize((2, 3))
    assert q.shape == (2, 3) and q.dtype == torch.float16 and q.device.type == "neuron"
    assert isinstance(q, nn.Parameter) and not isinstance(q, nn.parameter.UninitializedParameter)


def test_moving_back_to_the_cpu_keeps_the_parameter_objects():
    """``model.to("cpu")`` of a neuron model put new Parameters in the module: an optimizer made
    before the move kept updating the old ones, and the model stopped training, silently."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = list(model.parameters())
    model(torch.randn(5, 4, device="neuron")).sum().backward()
    model.to("cpu")
    assert all(a is b for a, b in zip(model.parameters(), before))
    assert all(p.device.type == "cpu" and p.grad.device.type == "cpu" for p in model.parameters())
    weight = model[0].weight.detach().clone()
    optimizer.step()
    assert not torch.equal(model[0].weight.detach(), weight)  # the optimizer moved the module's weights
    model.double().to("neuron")
    assert all(a is b for a, b in zip(model.parameters(), before))
    assert model[0].weight.dtype == torch.float64 and model[0].weight.device.type == "neuron"


def test_a_compiled_model_whose_data_was_read_still_moves():
    """A parameter with a weak reference cannot be swapped: ``model.to("neuron")`` after a compiled
    CPU call failed with "Couldn't swap Linear.weight" once its ``.data`` had been read."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
    with torch.no_grad():
        torch.compile(model, backend="neuron")(torch.randn(3, 4))
    float(model[0].weight.data.norm())
    model.to("neuron")
    assert model[0].weight.device.type == "neuron"


def test_a_module_whose_parameters_are_weakly_referenced_moves_like_on_cuda():
    """``torch.export`` keeps weak references to a model's parameters: moving the exported module
    (or the model) to ``neuron`` raised "Couldn't swap Linear.weight" (torch refuses to swap a
    weakly referenced tensor); the parameters move in place, as CUDA's do, the weak references
    still reaching them."""
    import weakref

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    x = torch.randn(9, 6)
    expected = model(x)
    batch = torch.export.Dim("batch", min=2, max=64)
    exported = torch.export.export(model, (torch.randn(5, 6),), dynamic_shapes={"input": {0: batch}})
    watched = weakref.ref(model[0].weight)
    module = exported.module().to("neuron")
    assert watched() is model[0].weight and watched().device.type == "neuron"  # shared, moved in place
    torch.testing.assert_close(module(x.to("neuron")).cpu(), expected)
    model.to("cpu")
    torch.testing.assert_close(model(x), expected)
