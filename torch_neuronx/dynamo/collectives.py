"""Graphs with collectives or custom ops: the compute between them compiled, they run as they are.

A graph from ``torch.compile`` that calls functional collectives
(``_c10d_functional.all_reduce`` + ``wait_tensor``, tensor-parallel layers, DTensor) cannot
become one NEFF: the exchange is the process group's (gloo here). Nor can one calling a user's
``torch.library`` custom op (``@torch.library.custom_op``, a ``Library("ns", "DEF")`` op, or a
mutating one, which aot_autograd wraps in ``auto_functionalized``): its implementation is the
user's Python or C++ (inductor calls it as an opaque kernel; torch-mlir failed on it).
:func:`compile_split` cuts the graph with ``torch.fx.passes.split_module`` so that each such op
is a partition of its own, compiles every compute partition through the pipeline like any
graph, and leaves the opaque partitions to run as they are, in program order: a collective on
neuron tensors reaches the eager device's collective handling, which calls the group's
``neuron`` process group; a custom op runs its own implementation.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.passes.split_module import split_module

from torch_neuronx import config
from torch_neuronx.compiler.options import ResolvedOptions
from torch_neuronx.compiler.passes import random_inputs
from torch_neuronx.dynamo import stats
from torch_neuronx.pipeline.artifacts import GraphArtifacts
from torch_neuronx.pipeline.graph import build_graph
from torch_neuronx.runtime import streams
from torch_neuronx.runtime.tensor import NeuronTensor, has_neuron_kernel, wait_for_host

#: Namespaces of the ops the compile path lowers (``neuron``: its own checks and layer ops).
_LOWERED_NAMESPACES = frozenset({"aten", "prims", "neuron"})
_FUNCTIONALIZED = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)


def is_custom_op(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls an op the compile path cannot lower: a user's ``torch.library`` op
    (or a mutating one, functionalized), any op outside the namespaces it lowers."""
    if node.op != "call_function" or stats.is_collective(node):
        return False
    if node.target in _FUNCTIONALIZED:
        return True
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace not in _LOWERED_NAMESPACES


#: aten ops no lowering computes, run on the host between the compiled partitions: fractional max
#: pooling (its random samples are an input), the gradients of gamma and Dirichlet samples
#: (``Beta(a, b).rsample()`` in a loss) and of ``segment_reduce``.
_HOST_OPS = frozenset(op for name in ("fractional_max_pool2d", "fractional_max_pool3d",
                                      "fractional_max_pool2d_backward", "fractional_max_pool3d_backward",
                                      "_standard_gamma_grad", "_dirichlet_grad", "_segment_reduce_backward")
                      if (op := getattr(getattr(torch.ops.aten, name, None), "default", None)) is not None)


def _opaque(node: torch.fx.Node) -> bool:
    return (stats.is_collective(node) or is_custom_op(node) or random_inputs.drawn_on_host(node)
            or (node.op == "call_function" and node.target in _HOST_OPS))


def present(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` calls a collective or a custom op (compiled in partitions around them)."""
    return any(_opaque(n) for n in gm.graph.nodes)


def _partitions(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, int]:
    """Node order cut into runs: each collective and custom op alone, the compute between them together."""
    ids: dict[torch.fx.Node, int] = {}
    current, in_compute = 0, True
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if _opaque(node):
            current += 1
            ids[node] = current
            in_compute = False
        elif node.target is operator.getitem and _opaque(node.args[0]):  # auto_functionalized's results
            ids[node] = ids[node.args[0]]
        else:
            if not in_compute:
                current += 1
                in_compute = True
            ids[node] = current
    return ids


class _CompiledPart(torch.nn.Module):
    """A compute partition run by its compiled graph (outputs unpacked as the partition returned them)."""

    def __init__(self, compiled: Callable[[list[Any]], list[Any]], single: bool) -> None:
        super().__init__()
        self.compiled, self.single = compiled, single

    def forward(self, *args: Any) -> Any:
        out = self.compiled(list(args))
        return out[0] if self.single else tuple(out)


def _own_kernel(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a user's op (directly or functionalized) that has a kernel for the
    neuron device (``register_kernel("neuron")``, ``Library.impl(..., "PrivateUse1")``)."""
    return has_neuron_kernel(node.args[0] if node.target in _FUNCTIONALIZED and node.args else node.target)


class _OnDevice(torch.nn.Module):
    """A custom op's partition called with neuron tensors over the graph's host values, so that the
    op's neuron kernel runs (its default or CPU kernel ran on them, and an op with a neuron kernel
    only failed: "Could not run ... with arguments from the 'CPU' backend"), or a random op's, so
    that it draws from the device's generator; its results handed on as the host values of their
    memory, once written."""

    def __init__(self, part: torch.nn.Module, index: int) -> None:
        super().__init__()
        self.part, self.index = part, index

    def forward(self, *args: Any) -> Any:
        wrapped = [NeuronTensor(a, None, index=self.index) if type(a) is torch.Tensor else a for a in args]
        # Without the dispatch modes of the caller: aot_autograd's first call checks custom ops'
        # aliasing with a mode that answers NotImplemented for a tensor subclass, which a
        # higher-order op (auto_functionalized) then returned as its result.
        with torch.utils._python_dispatch._disable_current_modes():
            out = self.part(*wrapped)
        leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, NeuronTensor)]
        wait_for_host(leaves)
        return pytree.tree_map_only(NeuronTensor, lambda t: t._data, out)


def _as_tuple_output(part: torch.fx.GraphModule) -> bool:
    """Make the partition return a tuple (what the pipeline compiles); whether it returned one value."""
    output = next(n for n in reversed(part.graph.nodes) if n.op == "output")
    value = output.args[0]
    if isinstance(value, tuple | list):
        return False
    output.args = ((value,),)
    part.recompile()
    return True


def _computes(part: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" for n in part.graph.nodes)


@contextlib.contextmanager
def _on_default_stream(values: Sequence[Any]) -> Iterator[None]:
    """TorchNeuron routes compiled graphs with collectives to the default stream, in order with the
    current stream's work before and after them (unless TORCH_NEURONX_ENABLE_HOST_CC=1 lets
    collectives run on other streams)."""
    if config.get("TORCH_NEURONX_ENABLE_HOST_CC"):
        yield
        return
    # aot_autograd hands the graph the neuron tensors' inner tensors: the device is the current one
    index = next((v._index for v in values if isinstance(v, NeuronTensor)), streams.current_device())
    current, default = streams.current_stream(index), streams.default_stream(index)
    if current == default:
        yield
        return
    default.wait_stream(current)
    try:
        with streams.stream(default):
            yield
    finally:
        current.wait_stream(default)


def compile_split(gm: torch.fx.GraphModule, options: ResolvedOptions, name: str) -> Callable[[list[Any]], Any]:
    """``gm`` with its compute partitions compiled: a boxed callable (aot_autograd's convention)."""
    ids = _partitions(gm)
    split = split_module(gm, None, lambda node: ids[node], keep_original_order=True)
    opaque_ids = {ids[n] for n in gm.graph.nodes if _opaque(n)}
    on_default_stream = stats.has_collectives(gm)
    device = gm.meta.get(random_inputs.DEVICE_META)
    on_device_ids = {ids[n] for n in gm.graph.nodes
                     if (is_custom_op(n) and _own_kernel(n)) or random_inputs.drawn_on_host(n)} if device else set()
    for child_name, child in list(split.named_children()):
        index = int(child_name.rsplit("_", 1)[-1])
        if index in on_device_ids:
            setattr(split, child_name, _OnDevice(child, int(device.split(":")[1])))
        if index in opaque_ids or not _computes(child):
            continue
        single = _as_tuple_output(child)
        if device is not None:
            child.meta[random_inputs.DEVICE_META] = device
        part_name = f"{name}_part{index}"
        compiled, _ = build_graph(child, options, part_name, GraphArtifacts(part_name, options.preserve_artifacts),
                                  inputs_as_outputs=True)
        setattr(split, child_name, _CompiledPart(compiled, single))

    def run(args: list[Any]) -> Any:
        values: Sequence[Any] = list(args)
        args.clear()
        with _on_default_stream(values) if on_default_stream else contextlib.nullcontext():
            out = split(*values)
        return list(out) if isinstance(out, tuple | list) else [out]

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
