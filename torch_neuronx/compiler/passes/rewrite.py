"""Small FX-graph helpers the passes share."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torch_neuronx.compiler.errors import NotDynamic

_dynamic_trace = contextvars.ContextVar("neuron_dynamic_trace", default=False)

#: Metadata of a node copied out of a ``torch.cond`` branch (``passes/cond_branches.py``): the
#: conditions ``((predicate node, polarity), ...)`` under which its branch is taken. Nodes that
#: :func:`call_before` inserts before such a node inherit it; :func:`append_checks` gates the host
#: checks of those nodes by it.
GATE = "neuron_cond_gate"


@contextlib.contextmanager
def dynamic_trace() -> Iterator[None]:
    """Passes run inside this block transform a dynamic-shape kernel: a pass that cannot handle a
    symbolic size there must say so (:func:`symbolic_unsupported`), not leave the node alone."""
    token = _dynamic_trace.set(True)
    try:
        yield
    finally:
        _dynamic_trace.reset(token)


def symbolic_unsupported(what: str) -> None:
    """A pass meets a symbolic size it cannot handle: inside :func:`dynamic_trace` the trace fails
    (:class:`NotDynamic`: the op gets a kernel per shape), elsewhere the pass leaves the node as it is."""
    if _dynamic_trace.get():
        raise NotDynamic(f"{what} needs concrete sizes")


def static_val(node: torch.fx.Node) -> torch.Tensor | None:
    """``node``'s example tensor when its shape is static, else None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or any(not isinstance(d, int) for d in val.shape):
        return None
    return val


def replace_with_call(gm: torch.fx.GraphModule, node: torch.fx.Node, target: Any, args: tuple,
                      kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
    """Insert ``target(*args, **kwargs)`` before ``node`` (same metadata), reroute ``node``'s
    users to it and erase ``node`` when nothing else uses it."""
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(target, args, kwargs or {})
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    if not node.users:
        gm.graph.erase_node(node)
    return new


def example(value: Any) -> Any:
    """The example value of a node argument: a node's ``meta["val"]`` (lists element-wise), else itself."""
    if isinstance(value, torch.fx.Node):
        return value.meta.get("val")
    if isinstance(value, list | tuple):
        return type(value)(example(v) for v in value)
    return value


def call_before(gm: torch.fx.GraphModule, before: torch.fx.Node, target: Any, *args: Any,
                **kwargs: Any) -> torch.fx.Node:
    """Insert ``target(*args, **kwargs)`` before ``before``, its example value computed from its arguments'."""
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(target, args, kwargs)
    # Under the graph's fake mode: an op with no tensor argument (``full``) would otherwise give a
    # real tensor, which torch-mlir's importer cannot type (make_fx graphs run passes outside it).
    with _fake_mode(gm):
        node.meta["val"] = target(*example(list(args)), **{k: example(v) for k, v in kwargs.items()})
    if GATE in before.meta:
        node.meta[GATE] = before.meta[GATE]
    return node


def _fake_mode(gm: torch.fx.GraphModule) -> Any:
    """The fake mode of ``gm``'s example values (a no-op context when it has none)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    return mode if mode is not None else contextlib.nullcontext()


def append_checks(gm: torch.fx.GraphModule, checks: Sequence[tuple[torch.fx.Node, dict[str, Any]]]) -> None:
    """Append each check's node as a trailing graph output and record the check
    (``gm.meta["host_checks"]``, read by ``host_checks.run_checks`` after each call).

    A check of a node in a ``torch.cond`` branch (:data:`GATE`) is gated: it holds only when
    that branch is taken (an error count multiplied by the condition; an index range with the
    condition appended and the check marked ``gated``)."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    nodes, recorded = [], []
    for node, check in checks:
        if node.meta.get(GATE):
            node, check = _gated(gm, output, node, check)
        nodes.append(node)
        recorded.append(check)
    output.args = (tuple(output.args[0]) + tuple(nodes),)
    gm.meta["host_checks"] = list(gm.meta.get("host_checks", ())) + recorded


def _gated(gm: torch.fx.GraphModule, output: torch.fx.Node, node: torch.fx.Node,
           check: dict[str, Any]) -> tuple[torch.fx.Node, dict[str, Any]]:
    """``node``'s check value, holding only when its ``torch.cond`` branch is taken."""
    taken = None
    for pred, polarity in node.meta[GATE]:
        term = pred if polarity else call_before(gm, output, torch.ops.aten.logical_not.default, pred)
        taken = term if taken is None else call_before(gm, output, torch.ops.aten.logical_and.default, taken, term)
    dtype = example(node).dtype
    flag = call_before(gm, output, torch.ops.aten._to_copy.default, taken, dtype=dtype)
    if check.get("kind") == "index":  # (low, high[, size]) + (taken,)
        flag = call_before(gm, output, torch.ops.aten.reshape.default, flag, [1])
        return call_before(gm, output, torch.ops.aten.cat.default, [node, flag]), {**check, "gated": True}
    return call_before(gm, output, torch.ops.aten.mul.Tensor, node, flag), check  # error counts: 0 when not taken
