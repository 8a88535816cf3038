"""Zero-size tensors and dims of 0-d tensors → shapes torch-mlir lowers (it crashed on both).

torch-mlir's StableHLO conversion aborts the process on some degenerate shapes (now in
a worker process, see ``compiler/lowering_worker.py``, but the graph still failed):
``x.sum(dim=0)`` of a 0-d ``x`` (SIGSEGV), a gather with zero indices (``Failed to
infer result type(s)``), and ``any``, ``argmax``, ``fmax`` and others on such shapes
raised. torch gives them ordinary meanings, which this pass spells out:

- an op whose result has no elements computes nothing: it becomes a ``full`` of its shape;
- an op whose tensor inputs all have no elements (``sum`` of an empty tensor, a product
  with an empty inner dimension) has a result fixed by its shapes alone: it is computed
  here, on empty host tensors, and becomes a constant;
- an empty tensor among ``cat``'s inputs contributes nothing and is dropped;
- a scatter with no indices or no values (``index_put``, ``scatter_add``, ``index_add`` ...) is
  its operand;
- ``as_strided`` of a 0-d tensor reads its storage as the one-element view's;
- an op given a ``dim`` of a 0-d tensor (torch reads dims 0 and -1 of a scalar as its one
  element) runs on the tensor unsqueezed to shape ``[1]`` with dim 0, and its results are
  squeezed (or viewed) back to their traced shapes.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from torch_neuronx.compiler.decompositions import indexing
from torch_neuronx.compiler.errors import InvalidIndexError, InvalidInputError
from torch_neuronx.compiler.passes.rewrite import call_before, example

aten = torch.ops.aten
#: Unsigned dtypes and the signed ones of their widths.
_SIGNED = {torch.uint8: torch.int8, torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and all(isinstance(d, int) for d in value.shape)


def _empty(value: Any) -> bool:
    return _tensor(value) and value.numel() == 0


def _constant(gm: torch.fx.GraphModule, node: torch.fx.Node, value: torch.Tensor) -> torch.fx.Node:
    """A node computing the host tensor ``value`` (a ``full`` when it holds one value)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # ``value`` is real; aot_autograd runs the passes under its fake mode
        flat = value.reshape(-1)
        uniform = flat.numel() == 0 or bool((flat == flat[0]).all()) or bool(flat.isnan().all())
        fill = flat[0].item() if flat.numel() else 0
    device = node.meta["val"].device
    if uniform and value.numel() == 0 and value.dtype in _SIGNED:
        # torch-mlir has no literal of an unsigned type (batch norm's empty uint8 reserve): the
        # signed tensor of its width, reinterpreted.
        signed = call_before(gm, node, aten.full.default, list(value.shape), 0, dtype=_SIGNED[value.dtype],
                             device=device)
        return call_before(gm, node, aten.view.dtype, signed, value.dtype)
    if uniform:
        return call_before(gm, node, aten.full.default, list(value.shape), fill, dtype=value.dtype, device=device)
    name = f"_degenerate_constant_{len([n for n in gm.graph.nodes if n.op == 'get_attr'])}"
    gm.register_buffer(name, value.contiguous())
    with gm.graph.inserting_before(node):
        attr = gm.graph.get_attr(name)
    attr.meta["val"] = node.meta["val"]
    return attr


def _fixed_by_shapes(node: torch.fx.Node) -> torch.Tensor | None:
    """The value of ``node`` when all its tensor inputs are empty (computed on empty host tensors);
    for an item of a multi-output op, that item of the op's value."""
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and _tensor(node.meta.get("val")):
        source = node.args[0]
        if source.op != "call_function" or not isinstance(source.target, torch._ops.OpOverload):
            return None
        value = _evaluated(source)
        item = value[node.args[1]] if isinstance(value, list | tuple) else None
        return item if isinstance(item, torch.Tensor) and item.shape == node.meta["val"].shape else None
    if not isinstance(node.target, torch._ops.OpOverload) or not _tensor(node.meta.get("val")):
        return None
    out = _evaluated(node)
    return out if isinstance(out, torch.Tensor) and out.shape == node.meta["val"].shape else None


def _evaluated(node: torch.fx.Node) -> Any:
    """``node``'s op run on empty host tensors when all its tensor inputs are empty, else None."""
    inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if not inputs or not all(_empty(a.meta["val"]) for a in inputs):
        return None
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return None

    def real(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            val = value.meta["val"]
            return torch.empty(val.shape, dtype=val.dtype) if isinstance(val, torch.Tensor) else val
        if isinstance(value, list | tuple):
            return type(value)(real(v) for v in value)
        return value

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily():
            return node.target(*real(list(node.args)), **{k: real(v) for k, v in node.kwargs.items()})
    except Exception:
        return None


def _dim_argument(node: torch.fx.Node) -> tuple[str, int, Any] | None:
    """("arg" or "kwarg", position or name, value) of a ``dim`` given to an op of a 0-d first input."""
    if not isinstance(node.target, torch._ops.OpOverload) or not node.args:
        return None
    first = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not (isinstance(first, torch.Tensor) and first.dim() == 0):
        return None
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.name not in ("dim", "dimension"):  # unfold calls it dimension
            continue
        if position < len(node.args):
            value = node.args[position]
        elif argument.name in node.kwargs:
            value = node.kwargs[argument.name]
        else:
            return None
        if value is None or value == [] or value == ():
            return None
        return ("arg", position, value) if position < len(node.args) else ("kwarg", argument.name, value)
    return None


def _one_element(gm: torch.fx.GraphModule, node: torch.fx.Node, where: tuple[str, Any, Any]) -> None:
    """Run ``node`` on its 0-d input viewed as ``[1]`` with dim 0; view its results back."""
    kind, slot, value = where
    zero = [0] * len(value) if isinstance(value, list | tuple) else 0
    # unsqueeze and squeeze rather than views: the pointwise_views pass moves views through
    # pointwise ops, and would make the 0-d operands around them one-element ones.
    viewed = call_before(gm, node, aten.unsqueeze.default, node.args[0], 0)
    args, kwargs = [viewed, *node.args[1:]], dict(node.kwargs)
    if kind == "arg":
        args[slot] = zero
    else:
        kwargs[slot] = zero
    try:
        new = call_before(gm, node, node.target, *args, **kwargs)
    except Exception:  # the op does not take that form either: leave it for the lowering to report
        gm.graph.erase_node(viewed)
        return
    traced = node.meta["val"]
    if isinstance(traced, torch.Tensor):
        node.replace_all_uses_with(_view_back(gm, node, new, traced))
    else:
        for user in list(node.users):
            index = user.args[1]
            with gm.graph.inserting_before(user):
                item = gm.graph.call_function(user.target, (new, index))
            item.meta["val"] = new.meta["val"][index]
            user.replace_all_uses_with(_view_back(gm, user, item, user.meta["val"]))
            gm.graph.erase_node(user)
    gm.graph.erase_node(node)


def _view_back(gm: torch.fx.GraphModule, before: torch.fx.Node, new: torch.fx.Node, traced: Any) -> torch.fx.Node:
    value = new.meta["val"]
    if not (isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor)) or value.shape == traced.shape:
        return new
    if traced.dim() == 0 and tuple(value.shape) == (1,):
        return call_before(gm, before, aten.squeeze.dim, new, 0)
    return call_before(gm, before, aten.view.default, new, list(traced.shape))


#: Ops writing values at indices into (a copy of) their first argument: position of the index
#: tensors, and of the values (None: a scalar value), in their arguments.
_SCATTERS = {
    aten.index_put.default: (1, 2), aten._unsafe_index_put.default: (1, 2),
    aten.scatter.src: (2, 3), aten.scatter.value: (2, None), aten.scatter_add.default: (2, 3),
    aten.scatter_reduce.two: (2, 3), aten.index_add.default: (2, 3), aten.index_copy.default: (2, 3),
    aten.index_fill.int_Scalar: (2, None),
}


_CHECKED_ELSEWHERE = indexing.BOUNDS


def _refuse_indices_into_empty_dims(node: torch.fx.Node) -> None:
    """torch's error for a scatter of indices into a dimension of size 0 (any index is out of
    bounds there): the empty result became an empty constant, and the write passed silently."""
    if node.target not in (aten.index_put.default, aten._unsafe_index_put.default, aten.index_fill.int_Scalar,
                           aten.scatter.src, aten.scatter.value, aten.scatter_add.default, aten.scatter_reduce.two):
        return
    shape = example(node.args[0]).shape
    if node.target in (aten.index_put.default, aten._unsafe_index_put.default):
        for dim, index in enumerate(node.args[1]):
            value = example(index) if isinstance(index, torch.fx.Node) else None
            if value is not None and index.target is _CHECKED_ELSEWHERE:
                continue  # index_add's and index_copy's index: their own checks apply (none here)
            if value is not None and value.dtype not in (torch.bool, torch.uint8) and value.numel() \
                    and dim < len(shape) and shape[dim] == 0:
                raise InvalidIndexError("index is out of bounds for dimension with size 0")
        return
    dim = node.args[1] % max(len(shape), 1)
    index = example(node.args[2])
    if index.numel() and len(shape) and shape[dim] == 0:
        raise InvalidInputError(f"index is out of bounds for dimension {dim} with size 0")


def _writes_nothing(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a scatter whose indices or values have no elements (an embedding's
    backward over an empty batch: IREE's compiler died with SIGFPE on the empty scatter)."""
    where = _SCATTERS.get(node.target)
    if where is None or len(node.args) <= max(p for p in where if p is not None):
        return False
    indices, values = node.args[where[0]], node.args[where[1]] if where[1] is not None else None
    indices = indices if isinstance(indices, list | tuple) else [indices]
    if any(isinstance(i, torch.fx.Node) and _empty(example(i)) for i in indices):
        return True
    return isinstance(values, torch.fx.Node) and _empty(example(values))


def degenerate_shapes_spelled_out(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Apply the rewrites of the module docstring to every op of ``gm``."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        if node.target is operator.getitem:  # an item of a multi-output op: empty, or fixed by shapes
            fixed = torch.empty(val.shape, dtype=val.dtype) if _empty(val) else _fixed_by_shapes(node)
            if fixed is not None:
                node.replace_all_uses_with(_constant(gm, node, fixed))
                gm.graph.erase_node(node)
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        if _empty(val):
            _refuse_indices_into_empty_dims(node)
        if _empty(val) and torch.Tag.nondeterministic_seeded not in node.target.tags:
            node.replace_all_uses_with(_constant(gm, node, torch.empty(val.shape, dtype=val.dtype)))
            gm.graph.erase_node(node)
            continue
        fixed = _fixed_by_shapes(node)
        if fixed is not None:
            node.replace_all_uses_with(_constant(gm, node, fixed))
            gm.graph.erase_node(node)
            continue
        if _writes_nothing(node):  # a scatter with no indices or no values: its operand as it is
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            continue
        if node.target is aten.cat.default and any(_empty(example(t)) for t in node.args[0]):
            kept = [t for t in node.args[0] if not _empty(example(t))]
            node.args = (kept, *node.args[1:])
            continue
        if node.target is aten.as_strided.default and example(node.args[0]).dim() == 0:
            node.args = (call_before(gm, node, aten.unsqueeze.default, node.args[0], 0), *node.args[1:])
            continue  # strides over a scalar's storage: the same over its one-element view
        where = _dim_argument(node)
        if where is not None:
            _one_element(gm, node, where)
    gm.graph.eliminate_dead_code()
    return gm
