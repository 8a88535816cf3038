"""FX passes that legalize aot_autograd graphs for torch-mlir (and one that reshapes them
for IREE), one pass per module.

Each pass is a function ``GraphModule -> GraphModule`` whose docstring says
what it legalizes and why. :data:`PIPELINE` is the order the compile path runs
them in; a new lowering problem becomes a new pass here, not a special case in
the importer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_neuronx.compiler.passes.bool_constants import bool_constants_to_int8
from torch_neuronx.compiler.passes.collapse_views import views_merging_symbols_to_flatten
from torch_neuronx.compiler.passes.comparison_scalars import comparison_scalars_rounded
from torch_neuronx.compiler.passes.complex_to_real import complex_to_real
from torch_neuronx.compiler.passes.cond_branches import cond_to_select
from torch_neuronx.compiler.passes.constant_fold import constant_fold
from torch_neuronx.compiler.passes.degenerate_shapes import degenerate_shapes_spelled_out
from torch_neuronx.compiler.passes.empty_slices import empty_slices_to_full
from torch_neuronx.compiler.passes.expand_sizes import expand_sizes_kept
from torch_neuronx.compiler.passes.float8_saturation import float8_conversions_saturated
from torch_neuronx.compiler.passes.host_checks import checks_to_outputs
from torch_neuronx.compiler.passes.host_devices import devices_to_host
from torch_neuronx.compiler.passes.index_bounds import index_bounds_checked
from torch_neuronx.compiler.passes.inplace_temporaries import inplace_temporaries_to_functional
from torch_neuronx.compiler.passes.output_layouts import outputs_in_memory_order
from torch_neuronx.compiler.passes.pointwise_views import pointwise_views_unviewed
from torch_neuronx.compiler.passes.random_inputs import random_ops_to_inputs
from torch_neuronx.compiler.passes.scalar_batches import scalar_ops_batched
from torch_neuronx.compiler.passes.scalar_inputs import constant_sizes_as_ints, inline_scalar_inputs
from torch_neuronx.compiler.passes.scalar_operands import scalar_operands_to_tensors
from torch_neuronx.compiler.passes.squeeze_dims import squeeze_dims_to_view
from torch_neuronx.compiler.passes.zero_divisors import zero_divisors_checked

Pass = Callable[[torch.fx.GraphModule], torch.fx.GraphModule]

PIPELINE: list[Pass] = [
    inplace_temporaries_to_functional,  # first: the other passes see value semantics only
    cond_to_select,  # first: the other passes see the branches' ops (their checks gated by the branch taken)
    devices_to_host,  # first: graphs of neuron tensors name the device in their factories
    complex_to_real,  # first: the other passes and the importer see real tensors only
    degenerate_shapes_spelled_out,  # early: later passes see no zero-size tensors or dims of 0-d ones
    expand_sizes_kept,  # dynamic traces: an expand that keeps a symbolic size says so (-1)
    checks_to_outputs,  # before folding: the checks' info tensors become outputs
    index_bounds_checked,  # after checks_to_outputs (its checks follow those); before folding and scalars
    zero_divisors_checked,  # as index_bounds_checked (its checks follow those)
    random_ops_to_inputs,  # before folding: a random op is no constant
    float8_conversions_saturated,
    constant_fold,
    inline_scalar_inputs,
    constant_sizes_as_ints,  # after inlining: sizes the shape environment made constants
    scalar_operands_to_tensors,  # after inlining: inlined inputs can be such numbers
    comparison_scalars_rounded,  # after inlining: as scalar_operands_to_tensors
    squeeze_dims_to_view,
    empty_slices_to_full,
    bool_constants_to_int8,
    scalar_ops_batched,  # on the legalized graph: IREE puts every scalar op of a graph in one dispatch
    pointwise_views_unviewed,  # an optimization: on the legalized graph
    views_merging_symbols_to_flatten,  # dynamic traces: torch-mlir's view lowering mis-merges symbols
    outputs_in_memory_order,  # last: it adds the outputs' final permutes
]


def run(gm: torch.fx.GraphModule, pipeline: list[Pass] | None = None) -> torch.fx.GraphModule:
    """Apply every pass of ``pipeline`` (default :data:`PIPELINE`) in order."""
    for p in PIPELINE if pipeline is None else pipeline:
        gm = p(gm)
    gm.graph.lint()
    gm.recompile()
    return gm
