"""Complex tensors → real ``(..., 2)`` tensors: torch-mlir cannot lower complex dtypes.

torch-mlir's StableHLO conversion legalizes only floating-point and integer
element types, so one complex multiply fails the whole graph. This pass holds
every complex tensor as a real tensor with a trailing dimension of 2 (real,
imaginary), exactly ``torch.view_as_real``'s layout, and rewrites each op that
touches a complex value into real arithmetic on that layout: products and
quotients by their textbook formulas, shape ops with their dimensions remapped
so the trailing 2 stays last, matmuls as four real matmuls.

The graph's signature changes with it. ``gm.meta["complex_inputs"]`` lists the
positions, among the graph's tensor inputs, and ``gm.meta["complex_outputs"]``
the output positions that were complex: the runtime ``view_as_real``s the
former before execution and ``view_as_complex``es the latter after. An op
without a rule raises ``NotImplementedError`` naming it; the compile path makes
that a trace-stage error under the fallback policy. Reads
``TORCH_NEURONX_COMPLEX_DECOMPOSE``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node

from torch_neuronx import config
from torch_neuronx.compiler.passes.complex_expansion import expand_emitted
from torch_neuronx.compiler.passes.complex_values import (
    REAL_OF,
    Cx,
    Emitter,
    complex_rank,
    is_complex,
    is_tensor,
    real_dim,
)

aten = torch.ops.aten

# --- rules: (emitter, schema-named arguments) → a Cx for a complex result, else a real node ---

Rule = Callable[[Emitter, dict[str, Any]], Any]


def _add(e: Emitter, a: dict[str, Any], op: Callable = aten.add.Tensor) -> Cx:
    other, alpha = a["other"], a.get("alpha", 1)
    if alpha != 1:
        other = e.pack(*e.cmul(other, alpha))
    return Cx(e(op, e.rep(a["self"]), e.rep(other)))


def _sub(e: Emitter, a: dict[str, Any]) -> Cx:
    return _add(e, a, aten.sub.Tensor)


def _rsub(e: Emitter, a: dict[str, Any]) -> Cx:
    return _add(e, {**a, "self": a["other"], "other": a["self"]}, aten.sub.Tensor)


def _mul(e: Emitter, a: dict[str, Any]) -> Cx:
    x, y = (a["self"], a["other"]) if isinstance(a["self"], Cx) else (a["other"], a["self"])
    if isinstance(x, Cx) and is_tensor(y):  # by a real tensor: scale both halves at once
        return Cx(e(aten.mul.Tensor, x.node, e(aten.unsqueeze.default, y, -1)))
    return e.pack(*e.cmul(x, y))


def _div(e: Emitter, a: dict[str, Any]) -> Cx:
    if isinstance(a["self"], Cx) and is_tensor(a["other"]):
        return Cx(e(aten.div.Tensor, a["self"].node, e(aten.unsqueeze.default, a["other"], -1)))
    return e.pack(*e.cdiv(a["self"], a["other"]))


def _sgn(e: Emitter, a: dict[str, Any]) -> Cx:
    z = a["self"]
    magnitude = e.abs(z)
    is_zero = e(aten.unsqueeze.default, e(aten.eq.Scalar, magnitude, 0), -1)
    unit = e(aten.div.Tensor, z.node, e(aten.unsqueeze.default, magnitude, -1))
    zero = e(aten.scalar_tensor.default, 0.0, dtype=REAL_OF[e.out.dtype], device=e.out.device)
    return Cx(e(aten.where.self, is_zero, zero, unit))


def _sqrt(e: Emitter, a: dict[str, Any]) -> Cx:
    """The principal root as C's ``csqrt`` computes it: ``t = sqrt((|x| + |z|) / 2)``, then
    ``(t, y / 2t)`` or ``(|y| / 2t, copysign(t, y))`` (through the angle, sqrt(-1) was 6e-17+1j)."""
    x, y = e.parts(a["self"])
    t = e(aten.sqrt.default, e.add(e.mul(e(aten.abs.default, x), 0.5), e.mul(e.abs(a["self"]), 0.5)))
    twice = e.mul(t, 2.0)
    right = e(aten.ge.Scalar, x, 0)
    re = e.pick(right, t, e(aten.div.Tensor, e(aten.abs.default, y), twice))
    im = e.pick(right, e(aten.div.Tensor, y, twice), e(aten.copysign.Tensor, t, y))
    zero = e(aten.eq.Scalar, t, 0)  # sqrt(0 + yi) with y = +-0: (0, y)
    re, im = e.pick(zero, 0.0, re), e.pick(zero, y, im)
    infinite = e(aten.isinf.default, y)  # sqrt(x + inf i) is inf + inf i, whatever x (NaN too)
    return e.pack(e.pick(infinite, float("inf"), re), e.pick(infinite, y, im))


def _parts_test(test: Any, join: Any) -> Rule:
    """``isnan``/``isinf`` of a complex tensor: ``test`` of either part."""
    return lambda e, a: e(join, *(e(test, p) for p in e.parts(a["self"])))


def _pow(e: Emitter, a: dict[str, Any]) -> Cx:
    z, p = a["self"], a["exponent"]
    if isinstance(p, complex):
        raise NotImplementedError("complex_to_real: aten.pow.Tensor_Scalar with a complex exponent")
    if p == 2:
        return e.pack(*e.cmul(z, z))
    return e.pack(*e.polar(e(aten.pow.Tensor_Scalar, e.abs(z), p), e.mul(e.angle(z), p)))


def _equal(e: Emitter, a: dict[str, Any]) -> Node:
    (ar, ai), (br, bi) = e.parts(a["self"]), e.parts(a["other"])
    if not is_tensor(ar):
        (ar, ai), (br, bi) = (br, bi), (ar, ai)

    def eq(x: Any, y: Any) -> Node:
        return e(aten.eq.Tensor if is_tensor(y) else aten.eq.Scalar, x, y)

    same = e(aten.logical_and.default, eq(ar, br), eq(ai, bi))
    return same if e.node.target in (aten.eq.Tensor, aten.eq.Scalar) else e(aten.logical_not.default, same)


def _convert(e: Emitter, x: Any, dtype: torch.dtype | None, **kwargs: Any) -> Any:
    """``_to_copy`` / ``convert_element_type`` between any of complex and real."""
    dtype = dtype or e.out.dtype
    kwargs = {k: v for k, v in kwargs.items() if v}
    if dtype in REAL_OF and isinstance(x, Cx):
        return Cx(e(aten._to_copy.default, x.node, dtype=REAL_OF[dtype], **kwargs))
    if dtype in REAL_OF:
        return e.pack(x, 0)  # pack converts to the real dtype
    return e(aten._to_copy.default, e.parts(x)[0], dtype=dtype, **kwargs)  # as torch: drops imag


_FILL = {aten.full.default: "fill_value", aten.full_like.default: "fill_value",
         aten.new_full.default: "fill_value", aten.scalar_tensor.default: "s",
         aten.zeros.default: 0, aten.zeros_like.default: 0, aten.new_zeros.default: 0,
         aten.ones.default: 1, aten.ones_like.default: 1, aten.new_ones.default: 1,
         aten.empty.memory_format: 0, aten.empty_like.default: 0, aten.new_empty.default: 0,
         aten.empty_strided.default: 0, aten.new_empty_strided.default: 0}


def _fill(e: Emitter, a: dict[str, Any]) -> Any:
    value = _FILL[e.node.target]
    value = a[value] if isinstance(value, str) else value
    if e.out.is_complex():
        return e.pack(*e.parts(value))
    return e(aten.full.default, list(e.out.shape), value, dtype=e.out.dtype, device=e.out.device)


def _same_op(*dims: str, rank_of_output: bool = False, reals: tuple[str, ...] = ("self",)) -> Rule:
    """The node's own op on real forms: ``reals`` arguments as real forms, ``dims`` remapped."""
    def rule(e: Emitter, a: dict[str, Any]) -> Cx:
        rank = e.out.dim() if rank_of_output else complex_rank(a["self"])
        a = dict(a)
        for name in reals:
            a[name] = [e.rep(t) for t in a[name]] if isinstance(a[name], list | tuple) else e.rep(a[name])
        for name in dims:
            if isinstance(a.get(name), list | tuple):
                a[name] = [real_dim(d, rank) for d in a[name]]
            elif a.get(name) is not None:
                a[name] = real_dim(a[name], rank)
        if a.get("dtype") in REAL_OF:
            a["dtype"] = REAL_OF[a["dtype"]]
        if a.get("memory_format") not in (None, torch.preserve_format):
            a["memory_format"] = torch.contiguous_format  # channels_last has no (..., 2) form
        return Cx(e.bound(e.node.target, a))
    return rule


def _viewable(val: torch.Tensor, size: list[Any]) -> bool:
    try:
        with unset_fake_temporarily():
            torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta").view(size)
    except RuntimeError:
        return False
    return True


def _sized(key: str) -> Rule:
    """view / reshape / expand: the real form's size is the complex size with 2 appended."""
    def rule(e: Emitter, a: dict[str, Any]) -> Cx:
        z, size = a["self"].node, [*a[key], 2]
        if e.node.target in (aten.view.default, aten._unsafe_view.default) and not _viewable(
                z.meta["val"], size):  # the real form's strides differ from the complex graph's
            z = e(aten.clone.default, z, memory_format=torch.contiguous_format)
        return Cx(e.bound(e.node.target, {**a, "self": z, key: size}))
    return rule


def _permute(e: Emitter, a: dict[str, Any]) -> Cx:
    rank = complex_rank(a["self"])
    return Cx(e(aten.permute.default, a["self"].node, [*(real_dim(d, rank) for d in a["dims"]), rank]))


def _reduce(e: Emitter, a: dict[str, Any]) -> Cx:
    z, rank = a["self"], complex_rank(a["self"])
    dims = a.get("dim") or list(range(rank))  # None or [] reduces every dimension
    if not dims:  # a 0-d complex tensor: nothing to reduce ([] would reduce the trailing 2)
        return Cx(e(aten.clone.default, z.node))
    op = aten.sum.dim_IntList if e.node.target in (aten.sum.dim_IntList, aten.sum.default) else aten.mean.dim
    dtype = REAL_OF.get(a.get("dtype"), a.get("dtype"))
    return Cx(e(op, z.node, [real_dim(d, rank) for d in dims], a.get("keepdim", False), dtype=dtype))


def _addmm(e: Emitter, a: dict[str, Any]) -> Cx:
    re, im = e.cmul_parts(e.cmul(a["mat1"], a["mat2"], aten.mm.default), e.parts(a["alpha"]))
    bias_re, bias_im = e.cmul(a["self"], a["beta"])
    return e.pack(e.add(bias_re, re), e.add(bias_im, im))


def _t(e: Emitter, a: dict[str, Any]) -> Cx:
    z = a["self"]
    return Cx(e(aten.transpose.int, z.node, 0, 1) if complex_rank(z) == 2 else e(aten.alias.default, z.node))


_RULES: dict[Any, Rule] = {
    # arithmetic
    aten.add.Tensor: _add, aten.add.Scalar: _add,
    aten.sub.Tensor: _sub, aten.sub.Scalar: _sub, aten.rsub.Tensor: _rsub, aten.rsub.Scalar: _rsub,
    aten.mul.Tensor: _mul, aten.mul.Scalar: _mul,
    aten.div.Tensor: _div, aten.div.Scalar: _div,
    aten.reciprocal.default: lambda e, a: e.pack(*e.cdiv(1, a["self"])),
    aten.neg.default: lambda e, a: Cx(e(aten.neg.default, a["self"].node)),
    aten.conj_physical.default: lambda e, a: e.pack(e.parts(a["self"])[0], e.neg(e.parts(a["self"])[1])),
    aten.abs.default: lambda e, a: e.abs(a["self"]),
    aten.angle.default: lambda e, a: e.angle(a["self"]),
    aten.sgn.default: _sgn,
    aten.exp.default: lambda e, a: e.pack(*e.polar(e(aten.exp.default, e.parts(a["self"])[0]),
                                                   e.parts(a["self"])[1])),
    aten.log.default: lambda e, a: e.pack(e(aten.log.default, e.abs(a["self"])), e.angle(a["self"])),
    aten.sqrt.default: _sqrt,
    aten.isnan.default: _parts_test(aten.isnan.default, aten.logical_or.default),
    aten.isinf.default: _parts_test(aten.isinf.default, aten.logical_or.default),
    aten.pow.Tensor_Scalar: _pow,
    aten.eq.Tensor: _equal, aten.eq.Scalar: _equal, aten.ne.Tensor: _equal, aten.ne.Scalar: _equal,
    # complex ↔ real
    aten.complex.default: lambda e, a: e.pack(a["real"], a["imag"]),
    aten.polar.default: lambda e, a: e.pack(*e.polar(a["abs"], a["angle"])),
    aten.view_as_real.default: lambda e, a: a["self"].node,
    aten.view_as_complex.default: lambda e, a: Cx(a["self"]),
    aten.real.default: lambda e, a: e.parts(a["self"])[0],
    aten.imag.default: lambda e, a: e.parts(a["self"])[1],
    aten._to_copy.default: lambda e, a: _convert(e, a["self"], a["dtype"], layout=a["layout"],
                                                 device=a["device"], non_blocking=a["non_blocking"]),
    torch.ops.prims.convert_element_type.default: lambda e, a: _convert(e, a["a"], a["dtype"]),
    # copy(self, src): src broadcast to self's shape and dtype (functionalized ``copy_``)
    aten.copy.default: lambda e, a: (e.pack(*e.parts(a["src"])) if e.out.is_complex()
                                     else e(aten.copy.default, a["self"], e.parts(a["src"])[0])),
    # the real form is always physical: no conjugate or negative bit to resolve
    aten.resolve_conj.default: lambda e, a: a["self"], aten.resolve_neg.default: lambda e, a: a["self"],
    # products and reductions
    aten.mm.default: lambda e, a: e.pack(*e.cmul(a["self"], a["mat2"], aten.mm.default)),
    aten.bmm.default: lambda e, a: e.pack(*e.cmul(a["self"], a["mat2"], aten.bmm.default)),
    aten.matmul.default: lambda e, a: e.pack(*e.cmul(a["self"], a["other"], aten.matmul.default)),
    aten.addmm.default: _addmm,
    aten.sum.dim_IntList: _reduce, aten.sum.default: _reduce, aten.mean.dim: _reduce,
    aten.mean.default: _reduce,
    aten.cumsum.default: _same_op("dim"),
    # shape ops
    aten.view.default: _sized("size"), aten._unsafe_view.default: _sized("size"),
    aten.reshape.default: _sized("shape"), aten.expand.default: _sized("size"),
    aten.permute.default: _permute,
    aten.t.default: _t,
    aten.transpose.int: _same_op("dim0", "dim1"),
    aten.unsqueeze.default: _same_op("dim", rank_of_output=True),
    aten.squeeze.default: _same_op(),  # squeezes size-1 dims only: never the trailing 2
    aten.squeeze.dim: _same_op("dim"), aten.squeeze.dims: _same_op("dim"),
    aten.slice.Tensor: _same_op("dim"), aten.select.int: _same_op("dim"),
    aten.index_select.default: _same_op("dim"),
    aten.index.Tensor: _same_op(),  # indices address leading dimensions only
    aten.index_put.default: _same_op(reals=("self", "values")),
    aten.flip.default: _same_op("dims"),
    aten.split.Tensor: _same_op("dim"), aten.split_with_sizes.default: _same_op("dim"),
    aten.unbind.int: _same_op("dim"),
    operator.getitem: lambda e, a: Cx(e(operator.getitem, a["self"].node, a["index"])),
    aten.cat.default: _same_op("dim", rank_of_output=True, reals=("tensors",)),
    aten.slice_scatter.default: _same_op("dim", rank_of_output=True, reals=("self", "src")),
    aten.select_scatter.default: _same_op("dim", rank_of_output=True, reals=("self", "src")),
    aten.where.self: lambda e, a: Cx(e(aten.where.self, e(aten.unsqueeze.default, a["condition"], -1),
                                        e.rep(a["self"]), e.rep(a["other"]))),
    aten.constant_pad_nd.default: lambda e, a: e.pack(*(
        e(aten.constant_pad_nd.default, part, a["pad"], value)
        for part, value in zip(e.parts(a["self"]), e.parts(a["value"]), strict=True))),
    **{op: _same_op() for op in (aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
                                 aten.detach.default)},
    **{op: _fill for op in _FILL},
}
for _op in (aten._conj.default, aten._conj_physical.default, aten.conj.default):
    _RULES[_op] = _RULES[aten.conj_physical.default]


# --- the pass ---

def _bind(target: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Schema argument name → value, defaults filled in."""
    if target is operator.getitem:
        return {"self": args[0], "index": args[1]}
    bound: dict[str, Any] = {}
    for i, arg in enumerate(target._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _fake_mode(gm: torch.fx.GraphModule) -> Any:
    """The FakeTensor mode of ``gm``'s meta vals, re-deriving them in one mode when they have none."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    vals = [n.meta.get("val") for n in gm.graph.nodes]
    try:
        mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    except AssertionError:  # several modes (make_fx in real mode makes one per value)
        mode = None
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        inputs = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        with mode:
            inputs = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                      if isinstance(v, torch.Tensor) else v for v in inputs]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    return mode


def complex_to_real(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite every complex tensor of ``gm`` into its real ``(..., 2)`` form (see the module docstring).

    Does nothing when ``TORCH_NEURONX_COMPLEX_DECOMPOSE`` is off or no value is complex. The
    rewrite builds a new graph and swaps it in only when every op had a rule, so a failure
    leaves ``gm`` as it was (the fallback policy may still run it eagerly).
    """
    if not config.get("TORCH_NEURONX_COMPLEX_DECOMPOSE"):
        return gm
    if not any(is_complex(n.meta.get("val")) for n in gm.graph.nodes):
        return gm
    fake_mode = _fake_mode(gm)
    graph = torch.fx.Graph(tracer_cls=gm.graph._tracer_cls)
    graph._codegen = gm.graph._codegen
    e = Emitter(graph, fake_mode)
    env: dict[Node, Node | Cx] = {}  # node of gm → its value in the new graph
    constants: dict[str, torch.Tensor] = {}  # complex constants' real forms, set on success
    complex_inputs: list[int] = []
    tensor_inputs = 0
    copied: set[Node] = set()  # nodes of the new graph that are gm's own (the others the rules emitted)
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        if node.op in ("placeholder", "get_attr"):
            new = env[node] = graph.node_copy(node, lambda n: env[n])  # copies the meta dict too
            copied.add(new)
            constant = getattr(gm, node.target) if node.op == "get_attr" else None
            if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
                tensor_inputs += 1
            if not (is_complex(node.meta.get("val")) or is_complex(constant)):
                continue
            if node.op == "placeholder":
                complex_inputs.append(tensor_inputs - 1)
                with fake_mode:
                    new.meta["val"] = torch.view_as_real(node.meta["val"].resolve_conj())
            else:
                with unset_fake_temporarily():  # aot_autograd calls compilers under its fake mode
                    constants[node.target] = torch.view_as_real(constant.resolve_conj()).clone()
                new.meta["val"] = fake_mode.from_tensor(constants[node.target], static_shapes=True)
            new.meta.pop("tensor_meta", None)
            env[node] = Cx(new)
            continue
        if not any(isinstance(env[n], Cx) for n in node.all_input_nodes) and \
                not is_complex(node.meta.get("val")):
            env[node] = graph.node_copy(node, lambda n: env[n])
            copied.add(env[node])
            continue
        rule = _RULES.get(node.target)
        if rule is None:
            raise NotImplementedError(
                f"complex_to_real: no real decomposition of {node.target} on complex tensors "
                f"(node {node.name}); avoid the op on complex values, or set "
                "TORCH_NEURONX_COMPLEX_DECOMPOSE=0 to leave complex ops to the compiler and fallback policy")
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        e.node = node
        env[node] = e.finish(rule(e, _bind(node.target, tuple(args), dict(kwargs))))

    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    flat = list(values) if isinstance(values, list | tuple) else [values]
    complex_outputs = [i for i, v in enumerate(flat) if isinstance(v, Node) and isinstance(env[v], Cx)]
    flat = [torch.fx.node.map_arg(v, lambda n: env[n].node if isinstance(env[n], Cx) else env[n])
            for v in flat]
    new_output = graph.output(type(values)(flat) if isinstance(values, list | tuple) else flat[0],
                              type_expr=output.type)
    new_output.meta = dict(output.meta)
    expand_emitted(graph, set(graph.nodes) - copied, fake_mode)

    for name, tensor in constants.items():
        setattr(gm, name, tensor)
    gm.graph = graph
    gm.meta["complex_inputs"] = complex_inputs
    gm.meta["complex_outputs"] = complex_outputs
    gm.graph.lint()
    gm.recompile()
    return gm
