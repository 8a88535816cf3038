"""Warm starts: a Dynamo inference graph compiled once is rebuilt later without aot_autograd.

On a cold compile of an inference graph whose aot_autograd metadata is plain
(no input mutations, no outputs aliasing inputs or intermediates, inputs
passed through one-to-one), the backend stores a *plan* in the HLO cache under
a key of the Dynamo graph itself: the StableHLO, the output template and
metadata. A later process that traces the same Dynamo graph finds the plan and
goes straight to the NEFF cache and the runtime: no aot_autograd trace, no FX
passes, no torch-mlir. Training graphs always go through aot_autograd (its
autograd.Function wrapper is the backward).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import config
from torch_neuronx.cache import store
from torch_neuronx.compiler import hlo
from torch_neuronx.compiler.options import ResolvedOptions
from torch_neuronx.pipeline.plan import Plan
from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["PLAN_VERSION", "Plan", "dynamo_key", "load", "plain_inference", "save"]

_log = logging.getLogger("torch_neuronx.dynamo.plans")
_PLAIN = (torch.Tensor, torch.nn.Parameter, torch._subclasses.fake_tensor.FakeTensor)

PLAN_VERSION = 10  # 9: plans hold the graph's node count; 10: random inputs name their device


def _tensor_spec(t: torch.Tensor) -> str:
    # The type tells parameters (kept resident by the runtime) from other inputs.
    return f"{type(t).__name__}:{tuple(t.shape)}:{t.stride()}:{t.dtype}:{t.requires_grad}"


def dynamo_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: ResolvedOptions) -> str | None:
    """The plan key of a Dynamo graph, or None when the graph cannot use a plan (training, symbolic)."""
    if config.get("TORCH_NEURONX_NEFF_DISABLE_CACHE"):
        return None
    if any(type(a) not in _PLAIN for a in example_inputs):
        return None  # symbolic sizes, or tensor subclasses (neuron tensors) that need aot_autograd's wrapping
    if torch.is_grad_enabled() and any(a.requires_grad for a in example_inputs):
        return None  # a training graph: aot_autograd builds its backward
    h = hashlib.sha256()
    h.update(f"plan {PLAN_VERSION} {hlo.graph_key(gm)}".encode())
    h.update(json.dumps(options.compiler_config(), sort_keys=True).encode())
    h.update(f"complex_decompose={options.complex_decompose}".encode())
    h.update(hlo.global_state().encode())
    for a in example_inputs:
        h.update(_tensor_spec(a).encode())
    return "plan-" + h.hexdigest()


def plain_inference(example_inputs: Sequence[Any], graph_inputs: Sequence[Any]) -> bool:
    """Whether aot_autograd's metadata for the graph being compiled allows running it from a plan."""
    if any(type(t) not in _PLAIN and type(t) is not NeuronTensor for t in example_inputs):
        return False  # other tensor subclasses need aot_autograd's wrapper (a neuron tensor's inner
        # tensor is the graph input at its position; the backend unwraps it)
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return False
    from torch._functorch._aot_autograd.schemas import OutputType, PlainTensorMeta

    if meta.num_intermediate_bases or meta.tokens:
        return False
    if any(not isinstance(m, int | PlainTensorMeta) for m in meta.subclass_inp_meta or ()):
        return False  # tensor subclasses need aot_autograd's wrapping
    if any(i.mutates_data or i.mutates_metadata for i in meta.input_info):
        return False
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return False
    tensors = [t for t in graph_inputs if isinstance(t, torch.Tensor)]
    if len(tensors) != len(example_inputs):
        return False  # aot_autograd deduplicated or added inputs
    return all(tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype for a, b in zip(tensors, example_inputs))


def load(key: str) -> Plan | None:
    """The stored plan for ``key``, or None."""
    text = store.hlo_cache().get(key)
    if text is None:
        return None
    try:
        return Plan(**json.loads(text))
    except (TypeError, ValueError) as exc:
        _log.warning("ignoring a malformed warm-start plan %s: %s", key, exc)
        return None


def save(key: str, plan: Plan) -> None:
    """Store ``plan`` under ``key`` (best effort: a plan that cannot be serialized is skipped)."""
    try:
        text = json.dumps(dataclasses.asdict(plan))
    except (TypeError, ValueError):
        _log.debug("plan for %s holds non-JSON constants; not stored", plan.graph_name)
        return
    store.hlo_cache().put(key, text)
