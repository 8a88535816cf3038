"""Keys of the HLO cache: an FX graph already lowered by any process is not lowered again.

The cache lookup itself is the pipeline's (``pipeline/lowering.py``). The graph
key covers everything the lowering reads: the graph's code, the shape/dtype/stride
of every placeholder, the contents of tensor constants, and the versions of
torch, torch-mlir and this lowering. On a hit the torch-mlir importer is not
even imported.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

_log = logging.getLogger("torch_neuronx.compiler.hlo")

#: Bump when a change to passes or lowering changes the HLO for the same graph. (Edits to
#: the files in :data:`_LOWERING_SOURCES` change every key by themselves.)
LOWERING_VERSION = 4
# The code that decides what a graph lowers to: decompositions run when aot_autograd traces
# (so they shape the FX graph a plan or HLO entry stands for), passes and lowering after it.
_LOWERING_SOURCES = ("decompositions", "lower.py", "torch_to_stablehlo.py", "stablehlo_fixups.py",
                     "stablehlo_conv_fixups.py", "stablehlo_scatter_fixups.py", "stablehlo_ir.py",
                     "linalg_fixups.py", "passes")


def sources_digest() -> str:
    """A digest of this package's lowering code, so a changed decomposition never hits old entries."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in _LOWERING_SOURCES:
        path = os.path.join(root, name)
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".py")) \
            if os.path.isdir(path) else [path]
        for file in files:
            with open(file, "rb") as f:
                h.update(os.path.relpath(file, root).encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


@functools.cache
def lowering_versions() -> str:
    """torch, torch-mlir and this package's lowering (version and sources): part of every lowering key."""
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "none"

    return (f"torch {torch.__version__} torch-mlir {version('torch-mlir')} "
            f"lowering {LOWERING_VERSION} {sources_digest()}")


def _placeholder_spec(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return f"{node.name}:{tuple(val.shape)}:{val.stride()}:{val.dtype}"
    return f"{node.name}:{val!r}"


def global_state() -> str:
    """The process state that changes what a graph's code computes, which Dynamo guards on within
    a process but its graph's code does not show: the default dtype (``torch.ones(3)`` in a
    graph), autocast (``x @ w`` in bfloat16), deterministic algorithms, float32 matmul precision.
    A lowering or plan made under other state was served: a float32 result where float64 or
    bfloat16 was due."""
    autocast = []
    for device in ("cpu", "neuron", "cuda"):
        try:
            enabled = torch.is_autocast_enabled(device)
        except RuntimeError:  # a device type this torch does not know
            continue
        autocast.append(f"{device}:{enabled}:{torch.get_autocast_dtype(device) if enabled else ''}")
    return (f"default_dtype={torch.get_default_dtype()} autocast={','.join(autocast)} "
            f"cache={torch.is_autocast_cache_enabled()} deterministic={torch.are_deterministic_algorithms_enabled()} "
            f"matmul={torch.get_float32_matmul_precision()}")


def graph_key(gm: torch.fx.GraphModule) -> str:
    """A digest of everything that determines ``gm``'s lowering (the process state included: the
    lowering traces the graph again, where ``torch.full((4,), 0.1)`` takes the default dtype)."""
    h = hashlib.sha256()
    h.update(lowering_versions().encode())
    h.update(global_state().encode())
    _update(h, gm)
    return "graph-" + h.hexdigest()


#: Where the functions a graph may call are defined whose code its own code stands for (by name).
_LIBRARIES = ("torch", "operator", "_operator", "math", "builtins", "einops")


def _update(h: Any, gm: torch.fx.GraphModule) -> None:
    """Add ``gm``'s code, placeholders, constants and subgraphs to ``h``.

    A graph's code names what it calls: the bodies of higher-order ops (``torch.cond``'s
    branches, a checkpointed region, ``wrap``) are subgraphs, added by their own code; a user's
    function called whole (``torch.compiler.allow_in_graph``) or a module called opaquely is
    known only by name, so such a graph gets a key of its own that no other graph or process
    shares (two closures of one factory, or a function edited between runs, were served one
    plan: the first one's results).
    """
    h.update(gm.code.encode())
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            h.update(_placeholder_spec(node).encode())
        elif node.op in ("get_attr", "call_module"):
            value = functools.reduce(getattr, str(node.target).split("."), gm)
            if isinstance(value, torch.Tensor):
                h.update(f"{node.target}:{tuple(value.shape)}:{value.dtype}".encode())
                # aot_autograd calls compilers under its fake mode; constants are real tensors.
                with unset_fake_temporarily():
                    h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            elif isinstance(value, torch.fx.GraphModule):
                h.update(f"{node.target}:subgraph".encode())
                _update(h, value)
            elif isinstance(value, torch.nn.Module):
                h.update(f"{node.target}:{secrets.token_hex(16)}".encode())
        elif node.op == "call_function" and not _from_a_library(node.target):
            h.update(f"{node.target}:{secrets.token_hex(16)}".encode())


def _from_a_library(target: Any) -> bool:
    """Whether ``target`` is an op or a function of torch (or Python's own): the same name, the same code."""
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket | torch._ops.HigherOrderOperator):
        return True
    module = getattr(target, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES
