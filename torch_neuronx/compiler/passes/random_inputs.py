"""Random ops → graph inputs drawn from torch's generator on every call.

torch-mlir lowers ``aten.rand`` and its kin to a generator with a fixed state baked
into the module: every call of a compiled graph drew the same numbers (the same
dropout mask at every training step). This pass replaces each random op whose
result has a static shape by a new trailing graph input and records how to draw it
(``gm.meta["random_inputs"]``: :func:`spec` dicts, JSON-serializable for plans);
:func:`draw` makes the values on every call with the op itself on the host, so
they come from torch's generators (``torch.manual_seed`` applies): a random op placed on
a neuron device draws from that device's generator, as the eager device does
(``runtime/random.py``), so ``torch.neuron.manual_seed`` and its RNG state govern it.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_neuronx.compiler.passes.rewrite import static_val, symbolic_unsupported

aten = torch.ops.aten

# Tensor arguments of these ops only give the result's shape and dtype (the *_like ops).
# (The functional forms of ``log_normal_``, ``cauchy_``, ``geometric_`` and ``exponential_``
# overwrite their tensor: only its shape and dtype count; torch-mlir lowers none of them.)
_LIKE = {aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
         aten.randint_like.low_dtype, aten.log_normal.default, aten.cauchy.default, aten.geometric.default,
         aten.exponential.default}
#: Random ops whose draws depend on their tensors' values (rates, concentrations), which no lowering
#: computes: a compiled graph runs them between its compiled partitions (``dynamo/collectives.py``).
VALUE_DEPENDENT = frozenset({aten.poisson.default, aten._standard_gamma.default, aten.binomial.default,
                             aten._sample_dirichlet.default})


def drawn_on_host(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a random op that neither a lowering nor this pass draws per call: one of
    :data:`VALUE_DEPENDENT`, or any other seeded op of tensors that are not just a shape (torch-mlir
    lowered such ops with a generator state baked in: the same draws on every call)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target in VALUE_DEPENDENT:
        return True
    return (torch.Tag.nondeterministic_seeded in node.target.tags and bool(node.all_input_nodes)
            and node.target not in _LIKE)


# Placement arguments: the draw happens on the host, which is where the NEFF's inputs live.
_PLACEMENT = ("device", "pin_memory", "layout", "memory_format", "generator")


def _random_op(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in node.target.tags:
        return False
    if static_val(node) is None:
        symbolic_unsupported(f"drawing {node.target} on the host")
        return False
    tensors = node.all_input_nodes
    return not tensors or node.target in _LIKE


# Markers of encoded tensors and dtypes: keys no keyword argument has (a kwargs dict holding
# ``dtype=`` must not read back as a dtype).
_LIKE_KEY, _DTYPE_KEY = "__like__", "__dtype__"


def _encode(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        val = value.meta["val"]
        return {_LIKE_KEY: [list(val.shape), str(val.dtype).removeprefix("torch.")]}
    if isinstance(value, torch.dtype):
        return {_DTYPE_KEY: str(value).removeprefix("torch.")}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    raise TypeError(f"cannot record argument {value!r} of a random op")


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and _LIKE_KEY in value:
        shape, dtype = value[_LIKE_KEY]
        return torch.empty(shape, dtype=getattr(torch, dtype))
    if isinstance(value, dict) and _DTYPE_KEY in value:
        return getattr(torch, value[_DTYPE_KEY])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value


#: ``gm.meta`` key: the neuron device (``"neuron:0"``) whose inner host tensors the graph computes
#: on (aot_autograd's graph of neuron tensors places its random ops on the host): its random ops
#: draw from that device's generator, and a custom op's neuron kernel runs on that device
#: (``dynamo/collectives.py``); absent: a host graph, the host's generator.
DEVICE_META = "random_device"


def spec(node: torch.fx.Node, device: str | None = None) -> dict[str, Any]:
    """How to draw ``node``'s value again: its op and arguments (placement dropped), and the
    device whose generator it draws from: its own when not the host, else ``device``."""
    kwargs = {k: v for k, v in node.kwargs.items() if k not in _PLACEMENT}
    recorded = {"op": node.target._schema.name, "overload": node.target._overloadname,
                "args": _encode(list(node.args)), "kwargs": _encode(kwargs)}
    placed = getattr(node.meta.get("val"), "device", None)
    if isinstance(placed, torch.device) and placed.type != "cpu":
        device = str(placed)
    if device is not None:
        recorded["device"] = device
    return recorded


def call(random_spec: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
    """The op of a recorded random op and its host arguments: what :func:`draw` calls."""
    namespace, name = random_spec["op"].split("::")
    op = getattr(getattr(getattr(torch.ops, namespace), name), random_spec["overload"])
    return op, _decode(random_spec["args"]), _decode(random_spec["kwargs"])


def draw(random_spec: dict[str, Any]) -> torch.Tensor:
    """A fresh value of a recorded random op, from the host's generator (the pipeline draws
    those of a ``"device"`` from that device's generator)."""
    op, args, kwargs = call(random_spec)
    return op(*args, **kwargs).contiguous()


def random_ops_to_inputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every static-shape random op by a trailing graph input (see the module docstring)."""
    specs: list[dict[str, Any]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    for node in list(gm.graph.nodes):
        if not _random_op(node):
            continue
        try:
            recorded = spec(node, gm.meta.get(DEVICE_META))
        except TypeError:
            continue  # an argument we cannot replay: the op stays in the graph
        # After the last input, so the new inputs trail the ones the caller passes.
        where = gm.graph.inserting_after(last) if last is not None else gm.graph.inserting_before(
            next(iter(gm.graph.nodes)))
        with where:
            placeholder = gm.graph.placeholder(f"random_{len(specs)}")
        placeholder.meta = dict(node.meta)
        last = placeholder
        node.replace_all_uses_with(placeholder)
        gm.graph.erase_node(node)
        specs.append(recorded)
    if specs:
        gm.meta["random_inputs"] = specs
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm
