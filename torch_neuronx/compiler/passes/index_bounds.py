"""Index operands → wrapped, clamped into their dimension, and checked on the host after the call.

torch-mlir lowers ``aten.index``, ``gather``, ``scatter`` and their kin to StableHLO
gathers and scatters that take an index as an offset: a negative index read memory
before the tensor (``x[torch.tensor([-1])]`` returned ``9.1e-44``), an index past the
end read or wrote memory after it. torch wraps negative indices where the op allows
them (``index``, ``index_put``, ``take``, ``put``, ``index_fill``) and raises for an
index out of range. This pass rewrites every index operand ``i`` of such an op over a
dimension of size ``n``:

- wrapped: ``where(i < 0, i + n, i)`` where the op takes negative indices;
- clamped: ``clamp(wrapped, 0, n - 1)``, so no index reaches outside the tensor;
- checked: ``stack([amin(i), amax(i)])`` becomes a trailing graph output and a recorded
  check (``gm.meta["host_checks"]``, ``kind: "index"``): after every call the host
  raises :class:`IndexOutOfRangeError` (an IndexError and a RuntimeError, with torch's
  message) when the range was exceeded. The
  results of such a call are never returned, so the clamped values are never seen.

Ops whose index torch checks but whose decomposition hides it (``index_add`` and
``index_copy`` become ``index_put``, which wraps negatives) mark the index with
:data:`BOUNDS` in their decomposition (``decompositions/indexing.py``); the pass
expands those the same way. A symbolic size (an eager op's dynamic-shape kernel) is computed in
the graph and checked from there: the check's output holds it after the index's extremes.
"""

from __future__ import annotations

import ast
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_true

from torch_neuronx.compiler.decompositions.indexing import BOUNDS
from torch_neuronx.compiler.passes.rewrite import append_checks, call_before, example

aten = torch.ops.aten

# op -> (how to find its index operands, whether negative indices wrap, message kind)
_SELF_DIM = "self_dim"  # args: (self, dim, index, ...)
_INDICES = "indices"  # args: (self, [index per leading dim or None], ...)
_FLAT = "flat"  # args: (self, index, ...): an index into self flattened
_WEIGHT = "weight"  # args: (weight, indices, ...): rows of weight

_OPS: dict[Any, tuple[str, bool, str]] = {
    aten.index.Tensor: (_INDICES, True, "bounds"),
    aten._unsafe_index.Tensor: (_INDICES, True, "bounds"),
    aten.index_put.default: (_INDICES, True, "bounds"),
    aten._unsafe_index_put.default: (_INDICES, True, "bounds"),
    aten.put.default: (_FLAT, True, "bounds"),
    aten.gather.default: (_SELF_DIM, False, "bounds"),
    aten.scatter.src: (_SELF_DIM, False, "bounds"),
    aten.scatter.value: (_SELF_DIM, False, "bounds"),
    aten.scatter.reduce: (_SELF_DIM, False, "bounds"),
    aten.scatter.value_reduce: (_SELF_DIM, False, "bounds"),
    aten.scatter_add.default: (_SELF_DIM, False, "bounds"),
    aten.scatter_reduce.two: (_SELF_DIM, False, "bounds"),
    aten.index_select.default: (_SELF_DIM, False, "in_self"),
    aten.index_add.default: (_SELF_DIM, False, "bounds"),
    aten.index_copy.default: (_SELF_DIM, False, "bounds"),
    aten.index_fill.int_Scalar: (_SELF_DIM, True, "bounds"),
    aten.index_fill.int_Tensor: (_SELF_DIM, True, "bounds"),
    aten.embedding.default: (_WEIGHT, False, "in_self"),
}


class IndexOutOfRangeError(IndexError, RuntimeError):
    """An index outside its dimension, found by a host check after a call.

    Both an IndexError and a RuntimeError: torch raises one or the other depending on the op
    and the dimension (``index_select`` over dim 0 raises IndexError, over dim 1 RuntimeError),
    and code written against either keeps catching it.
    """

    neuron_input_error = True  # bad input: eager raises it, never falls back to the CPU


def _is_index(node: Any) -> bool:
    val = example(node)
    return (isinstance(node, torch.fx.Node) and isinstance(val, torch.Tensor)
            and val.dtype in (torch.int64, torch.int32) and guard_or_true(val.numel() != 0))


def _guard(gm: torch.fx.GraphModule, before: torch.fx.Node, index: torch.fx.Node, size: Any,
           negative: bool, check: dict[str, Any] | None, checks: list[tuple[torch.fx.Node, dict]]) -> torch.fx.Node:
    """The safe form of ``index`` for a dimension of ``size``; its range check appended to ``checks``.

    ``size`` is an int, or (a dynamic-shape kernel) the node of a symbolic size: the size then
    becomes a 0-d tensor of the graph, the third value of the check's output (the host reads
    it there), and wrapping and clamping use it.
    """
    if not _static(size):
        return _symbolic_guard(gm, before, index, size, negative, check, checks)
    if check is not None:
        checks.append((_extremes(gm, before, index, []), {**check, "size": int(size)}))
    safe = index
    if negative:
        below = call_before(gm, before, aten.lt.Scalar, index, 0)
        shifted = call_before(gm, before, aten.add.Tensor, index, size)
        safe = call_before(gm, before, aten.where.self, below, shifted, index)
    return call_before(gm, before, aten.clamp.default, safe, 0, max(int(size) - 1, 0))


def _extremes(gm: torch.fx.GraphModule, before: torch.fx.Node, index: torch.fx.Node,
              extra: list[torch.fx.Node]) -> torch.fx.Node:
    """``stack([amin(index), amax(index), *extra])``: what the host check reads."""
    dims = list(range(example(index).dim()))
    low = call_before(gm, before, aten.amin.default, index, dims)
    high = call_before(gm, before, aten.amax.default, index, dims)
    return call_before(gm, before, aten.stack.default, [low, high, *extra])


def _symbolic_guard(gm: torch.fx.GraphModule, before: torch.fx.Node, index: torch.fx.Node, size: torch.fx.Node,
                    negative: bool, check: dict[str, Any] | None,
                    checks: list[tuple[torch.fx.Node, dict]]) -> torch.fx.Node:
    val = example(index)
    with val.fake_mode:  # a tensor made from a symbolic size stays symbolic (no guard fixes it)
        bound = call_before(gm, before, aten.scalar_tensor.default, size, dtype=val.dtype)
        if check is not None:
            checks.append((_extremes(gm, before, index, [bound]), {**check, "size": None}))
        safe = index
        if negative:
            below = call_before(gm, before, aten.lt.Scalar, index, 0)
            shifted = call_before(gm, before, aten.add.Tensor, index, bound)
            safe = call_before(gm, before, aten.where.self, below, shifted, index)
        last = call_before(gm, before, aten.sub.Tensor, bound, 1)
        return call_before(gm, before, aten.clamp_min.default, call_before(gm, before, aten.minimum.default,
                                                                             safe, last), 0)


def _size_node(gm: torch.fx.GraphModule, node: torch.fx.Node, form: str, inner: int | None) -> torch.fx.Node:
    """A node computing the symbolic size an index operand of ``node`` indexes into."""
    source = node.args[0]
    if form == _FLAT:
        return call_before(gm, node, aten.sym_numel.default, source)
    rank = example(source).dim()
    dim = inner if form == _INDICES else 0 if form == _WEIGHT else node.args[1] % max(rank, 1)
    return call_before(gm, node, aten.sym_size.int, source, dim)


def _operands(node: torch.fx.Node, form: str) -> list[tuple[int, int | None, Any]]:
    """(argument position, position inside a list argument or None, dimension size) of each index."""
    source = example(node.args[0])
    if form == _INDICES:
        return [(1, k, source.shape[k]) for k, i in enumerate(node.args[1]) if _is_index(i)]
    if form == _FLAT:
        return [(1, None, source.numel())] if _is_index(node.args[1]) else []
    if form == _WEIGHT:
        return [(1, None, source.shape[0])] if _is_index(node.args[1]) else []
    dim = node.args[1]
    size = source.shape[dim] if source.dim() else 1
    return [(2, None, size)] if _is_index(node.args[2]) else []


def _static(size: Any) -> bool:
    return isinstance(size, int)


def index_bounds_checked(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Wrap, clamp and check every index operand of the ops in :data:`_OPS` and every :data:`BOUNDS` mark."""
    checks: list[tuple[torch.fx.Node, dict[str, Any]]] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is BOUNDS:
            index, size, negative, op_name, message = node.args
            check = {"kind": "index", "op": op_name, "dim": 0, "negative": negative, "message": message}
            safe = _guard(gm, node, index, size, negative, check, checks)
            node.replace_all_uses_with(safe)
            gm.graph.erase_node(node)
            continue
        rule = _OPS.get(node.target)
        if rule is None or not isinstance(example(node.args[0]), torch.Tensor):
            continue
        form, negative, message = rule
        args = list(node.args)
        for position, inner, size in _operands(node, form):
            if not _static(size):
                size = _size_node(gm, node, form, inner)
            index = args[position][inner] if inner is not None else args[position]
            dim = inner if inner is not None else (args[1] if form == _SELF_DIM else 0)
            check = {
                "kind": "index", "op": node.target._schema.name.split("::")[1], "dim": int(dim),
                "negative": negative, "message": message}
            safe = _guard(gm, node, index, size, negative, check, checks)
            if inner is not None:
                replaced = list(args[position])
                replaced[inner] = safe
                args[position] = replaced
            else:
                args[position] = safe
        node.args = tuple(args)
    if checks:
        append_checks(gm, checks)
    return gm


def raise_out_of_range(check: dict[str, Any], extremes: torch.Tensor) -> None:
    """Raise torch's error when the index range ``extremes`` (min, max) leaves ``check``'s dimension."""
    values = [int(v) for v in extremes.tolist()]
    if check.get("gated") and not values[-1]:  # in a torch.cond branch not taken
        return
    low, high = values[:2]
    size = check["size"] if check.get("size") is not None else values[2]  # symbolic: computed in the graph
    floor = -size if check["negative"] else 0
    if floor <= low and high < size:
        return
    bad = low if low < floor else high
    if check["message"] == "one_hot":  # torch's own messages, raised as a RuntimeError
        raise IndexOutOfRangeError("Class values must be non-negative." if low < 0
                                   else "Class values must be smaller than num_classes.")
    if check["message"] == "multinomial":  # codes of sampling.py's checks, not indices
        raise IndexOutOfRangeError("probability tensor contains either `inf`, `nan` or element < 0" if high == 2
                                   else "invalid multinomial distribution (sum of probabilities <= 0)")
    if check["message"] == "masked_scatter":  # a code of scatter.py's check, not an index
        raise IndexOutOfRangeError("Number of elements of source < number of ones in mask (masked_scatter on neuron)")
    if check["message"].startswith("masked_index_put:"):  # a code of scatter.py's count check: count + 1
        _, shape, rest = check["message"].split(":")
        raise IndexOutOfRangeError(f"shape mismatch: value tensor of shape {shape} cannot be broadcast to indexing "
                                   f"result of shape {[high - 1, *ast.literal_eval(rest)]} (index_put on neuron)")
    if check["message"] == "repeat_interleave":  # a code of indexing.py's check, not an index
        raise IndexOutOfRangeError("repeats can not be negative" if high in (1, 3)
                                   else "allocated size does not match required size (repeat_interleave on neuron)")
    if check["message"] == "embedding_bag":  # a code of scatter.py's offsets check, not an index
        reason = ("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                  "position 0" if high & 1 else "offsets[-1] can not be greater than input's length"
                  if high & 2 else "offsets of embedding_bag must not decrease")
        raise IndexOutOfRangeError(f"{reason} (embedding_bag on neuron)")
    if check["message"] == "nll_loss":  # a class index: torch's own message
        raise IndexOutOfRangeError(f"Target {bad} is out of bounds.")
    if check["message"] == "segment_reduce":  # a code of segments.py's lengths check, not an index
        raise IndexOutOfRangeError("lengths contains negative value!" if high & 1 else
                                   "Expected segment_length >= 0 to be true, but got false." if high & 4 else
                                   "segment_reduce(): Expected all rows of lengths along axis to sum to "
                                   "data.size(lengths.dim()-1) when !unsafe.")
    if check["message"] == "binary_cross_entropy":  # a code of indexing.py's range check, not an index
        raise IndexOutOfRangeError("all elements of input should be between 0 and 1")
    if check["message"] == "histc":  # a code of scatter.py's range check, not an index
        raise IndexOutOfRangeError("torch.histc: range of the input's values is not finite (it holds inf or "
                                   "NaN; histc on neuron)")
    if check["message"].startswith("max_unpool:"):  # indices into the output volume (pooling.py)
        raise IndexOutOfRangeError(f"Found an invalid max index: {bad} (output volumes are of size "
                                   f"{check['message'].split(':', 1)[1]}) ({check['op']} on neuron)")
    dim = int(check["message"].split(":")[1]) if check["message"].startswith("bounds:") else check["dim"]
    if check["message"] == "in_self":
        message = "index out of range in self"
    else:
        message = f"index {bad} is out of bounds for dimension {dim} with size {size}"
    raise IndexOutOfRangeError(f"{message} ({check['op']} on neuron)")
