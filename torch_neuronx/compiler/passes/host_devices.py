"""``device=neuron`` → ``device=cpu``: a compiled graph computes on host-side (inner) tensors.

A graph traced from ``neuron`` tensors computes on their inner tensors, but its
factory ops (``arange``, ``full``, a causal mask's ``scalar_tensor``) still name
the ``neuron`` device, and each of their results reaches the rest of the graph
through a ``_to_copy`` to the host. The whole graph runs as one NEFF, so the
device argument means nothing inside it; left in, constant folding would run
those factories as eager ``neuron`` ops, and passes that add factories or
propagate traced values would mix devices. This pass names the host instead, in
the arguments and in the traced values, and drops copies that only change the
device.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_HOST = torch.device("cpu")


def _on_host(value: object) -> object:
    if isinstance(value, torch.device) and value.type == "neuron":
        return _HOST
    return value


def _device_only_copy(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten._to_copy.default or len(node.args) != 1:
        return False
    source = node.args[0]
    before = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    after = node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    same_layout = before.dtype == after.dtype and before.shape == after.shape and before.stride() == after.stride()
    return same_layout and set(node.kwargs) <= {"dtype", "layout", "device"}


def _value_on_host(value: object) -> object:
    """A traced value on ``neuron`` as the same value on the host (same fake mode, shape, strides)."""
    mode = getattr(value, "fake_mode", None)
    if mode is None or value.device.type != "neuron":
        return value
    with mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_HOST)


def devices_to_host(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Name the host wherever the graph names ``neuron``; drop copies that only move devices."""
    for node in list(gm.graph.nodes):
        if "val" in node.meta:
            node.meta["val"] = torch.utils._pytree.tree_map(_value_on_host, node.meta["val"])
        if node.op != "call_function":
            continue
        node.args = tuple(_on_host(a) for a in node.args)
        node.kwargs = {k: _on_host(v) for k, v in node.kwargs.items()}
        if _device_only_copy(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    return gm
