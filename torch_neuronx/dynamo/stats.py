"""What each compiled graph reports: its ``graph_stats`` row and Dynamo's ``counters["neuron"]``.

TorchNeuron keeps one row per graph compiled for torch.compile (the ``graph_stats`` metric
table, ``torch_neuronx.get_dynamo_metrics()``) and counts ``compiled_graphs`` and
``graphs_with_collectives`` in ``torch._dynamo.utils.counters["neuron"]``. :func:`compiling`
times the stages of one graph's compilation (the instrumentation layer's stage spans inside it)
and records the row when the graph compiled.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from torch_neuronx import observe
from torch_neuronx.pipeline.progress import progress

_lock = threading.Lock()
_nth: Counter[tuple[str, str, str]] = Counter()  # graphs per (model, aot id, graph type)
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "_dtensor")


def is_collective(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a collective (functional or c10d ops, torch.distributed functions)."""
    if node.op != "call_function":
        return False
    return getattr(node.target, "namespace", None) in COLLECTIVE_NAMESPACES or \
        (getattr(node.target, "__module__", "") or "").startswith("torch.distributed")


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph calls a collective."""
    return any(is_collective(n) for n in gm.graph.nodes)


def _aot_id() -> str:
    """aot_autograd's id of the compilation under way (``"0"`` outside aot_autograd)."""
    try:
        from torch._functorch._aot_autograd.logging_utils import get_aot_compilation_context
        names, _, _ = get_aot_compilation_context()
    except Exception:  # torch internals moved: the id is cosmetic
        return "0"
    return names[0].split("_", 1)[0] if names else "0"


def graph_name(model: str, kind: str) -> str:
    """TorchNeuron's graph name ``{model_name}_{aot_id}_{graph_type}_{nth}``."""
    aot_id = _aot_id()
    with _lock:
        nth = _nth[(model, aot_id, kind)]
        _nth[(model, aot_id, kind)] += 1
    return f"{model}_{aot_id}_{kind}_{nth}"


def _us(stages: dict[str, Any], *names: str) -> int:
    return sum(int(stages.get(n, 0)) for n in names) // 1000


@contextlib.contextmanager
def compiling(gm: torch.fx.GraphModule, model: str, kind: str, node_count: int | None = None) -> Iterator[None]:
    """Around one graph's compilation: a progress line on a terminal, the stages' logs, and when the
    block ends normally its ``graph.compiled`` row (stage times measured inside it) and its count
    in Dynamo's counters. ``graph_node_count`` is ``gm``'s as the block starts (the pipeline
    rewrites it), or ``node_count`` (a warm start's, from the plan of the cold compile)."""
    name = graph_name(model, kind)
    nodes = node_count or len(gm.graph.nodes)
    with progress.graph(name), observe.collecting(name) as stages:
        yield
    collectives = has_collectives(gm)
    observe.record("graph.compiled", {
        "graph_id": stages.get("neff_key", ""),
        "graph_name": name,
        "model_name": model,
        "has_collectives": collectives,
        "graph_node_count": nodes,
        "timestamp": datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f"),
        "torch_neuronx_fx_passes_us": _us(stages, "pipeline.fx_passes"),
        "torch_neuronx_lower_us": _us(stages, "pipeline.lower"),
        "torch_neuronx_compile_us": _us(stages, "pipeline.neff"),
    })
    counters = torch._dynamo.utils.counters["neuron"]
    counters["compiled_graphs"] += 1
    if collectives:
        counters["graphs_with_collectives"] += 1
