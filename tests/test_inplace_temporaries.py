"""The pass that turns in-place ops on a graph's own temporaries into their out-of-place forms."""

from __future__ import annotations

import torch

from torch_neuronx.compiler.passes.inplace_temporaries import inplace_temporaries_to_functional

aten = torch.ops.aten


def _graph(build) -> torch.fx.GraphModule:
    """A graph of ``x`` built by ``build(graph, x)``, which returns the outputs."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_mutations_of_temporaries_become_values_read_afterwards():
    """Clamp's backward formula (``(x >= lo).logical_and_(x <= hi)``), a chain of mutations, an
    overload whose name differs (``pow_.Scalar`` is ``pow.Tensor_Scalar``), and a read before."""
    def build(g, x):
        t = g.call_function(aten.mul.Tensor, (x, 2.0))
        before = g.call_function(aten.neg.default, (t,))
        g.call_function(aten.add_.Tensor, (t, 1.0))
        g.call_function(aten.pow_.Scalar, (t, 2.0))
        low = g.call_function(aten.ge.Scalar, (x, -0.5))
        inside = g.call_function(aten.logical_and_.default, (low, g.call_function(aten.le.Scalar, (x, 0.5))))
        return (before, t, g.call_function(aten.where.self, (low, t, x)), inside)

    gm = _graph(build)
    x = torch.randn(7)
    expected = gm(x)
    gm = inplace_temporaries_to_functional(gm)
    gm.recompile()
    assert not any(t._schema.is_mutable for t in _targets(gm))
    assert aten.pow.Tensor_Scalar in _targets(gm)
    for got, want in zip(gm(x), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_mutations_of_inputs_and_of_viewed_tensors_are_left_alone():
    def build(g, x):
        t = g.call_function(aten.mul.Tensor, (x, 2.0))
        view = g.call_function(aten.slice.Tensor, (t, 0, 0, 2))
        g.call_function(aten.add_.Tensor, (t, 1.0))
        g.call_function(aten.mul_.Tensor, (x, 3.0))
        return (t, view)

    gm = inplace_temporaries_to_functional(_graph(build))
    assert aten.add_.Tensor in _targets(gm) and aten.mul_.Tensor in _targets(gm)
