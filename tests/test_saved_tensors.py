"""What a training forward hands to its backward: inputs come back as themselves, not copies.

aot_autograd's forward graphs return the tensors the backward needs. With the
min-cut partitioner (as inductor uses) those include the step's input and the
weights themselves rather than transposed copies, and a graph output that is a
graph input comes back as that very tensor instead of a NEFF buffer copied on
every call.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from compare import compiled_graphs
from torch.fx.experimental.proxy_tensor import make_fx

from torch_neuronx.compiler.options import CompileOptions
from torch_neuronx.dynamo.graph import compile_graph
from torch_neuronx.pipeline.artifacts import GraphArtifacts
from torch_neuronx.pipeline.graph import CompiledGraph, build_graph


def _graph_with_inputs_as_outputs() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    return make_fx(lambda x, w: (torch.tanh(x @ w), x, w))(x, w), [x, w]


def test_aot_graph_outputs_that_are_inputs_are_those_tensors():
    gm, inputs = _graph_with_inputs_as_outputs()
    compiled = compile_graph(gm, inputs, options=CompileOptions().resolve(), model="saved_inputs", kind="forward")
    out = compiled(list(inputs))
    assert out[1] is inputs[0] and out[2] is inputs[1]
    torch.testing.assert_close(out[0], torch.tanh(inputs[0] @ inputs[1]))
    assert len(compiled._neff.header.signature["outputs"]) == 1  # the NEFF computes only the product


def test_other_graphs_return_new_tensors_for_their_inputs():
    """Kernels (and any graph outside aot_autograd) keep fresh outputs: no aliasing of inputs."""
    gm, inputs = _graph_with_inputs_as_outputs()
    compiled, _ = build_graph(gm, CompileOptions().resolve(), "fresh_outputs", GraphArtifacts("fresh_outputs"))
    out = compiled(list(inputs))
    assert out[1] is not inputs[0] and out[1].data_ptr() != inputs[0].data_ptr()
    torch.testing.assert_close(out[1], inputs[0])
    out[1].add_(1)
    assert not torch.equal(out[1], inputs[0])


def _forward_graph(name: str) -> CompiledGraph:
    return next(g for g in compiled_graphs() if g.name == f"{name}_forward")


def test_training_forward_saves_the_weights_themselves():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron", options={"model_name": "saved_weights"})
    x = torch.randn(5, 16)
    compiled(x).square().sum().backward()
    reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)

    forward = _forward_graph("saved_weights")
    returned_inputs = {slot[1] for slot in forward._template if slot is not None and slot[0] == "input"}
    assert len(returned_inputs) >= 2  # the input x and the second weight, at least
    # No output of the NEFF is a transposed weight: the backward transposes them itself.
    shapes = [tuple(o["shape"]) for o in forward._neff.header.signature["outputs"]]
    assert (16, 32) not in shapes and (32, 8) not in shapes
