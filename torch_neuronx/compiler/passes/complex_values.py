"""Complex values during the complex-to-real rewrite: the ``(..., 2)`` form and the emitter of real ops.

A complex value of the graph being rewritten (:mod:`.complex_to_real`) is a :class:`Cx`: a
node of the new graph holding it as a real tensor with a trailing dimension of 2 (real,
imaginary). :class:`Emitter` adds real ops to the new graph, computing their fake values as it
goes, and provides complex arithmetic on ``Cx`` values (products, quotients, magnitude, angle).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

aten = torch.ops.aten

REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32,
            torch.complex128: torch.float64}


@dataclasses.dataclass(frozen=True)
class Cx:
    """A complex value of the new graph: ``node`` holds it as a real ``(..., 2)`` tensor."""

    node: Node


def is_complex(val: Any) -> bool:
    """Whether a value (a fake tensor, or a list of them) is complex."""
    if isinstance(val, torch.Tensor):
        return val.is_complex()
    if isinstance(val, list | tuple):
        return any(is_complex(v) for v in val)
    return False


def is_num(x: Any) -> bool:
    """A Python number (complex included)."""
    return isinstance(x, bool | int | float | complex)


def is_tensor(x: Any) -> bool:
    """A node of the new graph holding a real tensor."""
    return isinstance(x, Node) and isinstance(x.meta.get("val"), torch.Tensor)


def real_dim(d: int, rank: int) -> int:
    """Dimension ``d`` of a complex tensor of ``rank`` as a dimension of its real form."""
    return d + rank if d < 0 else d


def complex_rank(x: Cx) -> int:
    """The rank of the complex tensor ``x`` stands for (its real form has one more dimension)."""
    return x.node.meta["val"].dim() - 1


class Emitter:
    """Appends ATen nodes to the new graph, each with its FakeTensor ``meta["val"]``.

    Complex arithmetic works on *parts*: the real and imaginary halves, each a
    real tensor node or a Python number (the imaginary part of a real operand is
    the number 0). Numbers fold, so real operands cost no extra ops.
    """

    def __init__(self, graph: torch.fx.Graph, fake_mode: Any) -> None:
        self.graph = graph
        self.fake_mode = fake_mode
        self.node: Node  # the node of the old graph being rewritten
        self._parts: dict[Node, tuple[Node, Node]] = {}

    def __call__(self, target: Callable, *args: Any, **kwargs: Any) -> Node:
        fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            val = target(*fake_args, **fake_kwargs)
        new = self.graph.call_function(target, args, kwargs)
        new.meta["val"] = val
        if "stack_trace" in self.node.meta:
            new.meta["stack_trace"] = self.node.meta["stack_trace"]
        return new

    def bound(self, target: Any, arguments: dict[str, Any]) -> Node:
        """Emit ``target`` from schema-named arguments (the inverse of :func:`_bind`)."""
        args, kwargs = [], {}
        for arg in target._schema.arguments:
            if arg.name in arguments:
                if arg.kwarg_only:
                    kwargs[arg.name] = arguments[arg.name]
                else:
                    args.append(arguments[arg.name])
        return self(target, *args, **kwargs)

    @property
    def out(self) -> Any:
        """The FakeTensor the node being rewritten promised."""
        return self.node.meta["val"]

    def parts(self, x: Any) -> tuple[Any, Any]:
        """(real, imaginary) of an operand: a complex value, a real tensor or a scalar."""
        if isinstance(x, Cx):
            if x.node not in self._parts:
                self._parts[x.node] = (self(aten.select.int, x.node, -1, 0),
                                       self(aten.select.int, x.node, -1, 1))
            return self._parts[x.node]
        if isinstance(x, Node) and not is_tensor(x):
            x = concrete(x)
        if isinstance(x, complex):
            return x.real, x.imag
        return (int(x) if isinstance(x, bool) else x), 0

    def pack(self, re: Any, im: Any) -> Cx:
        """The real form of two parts, shaped like the node being rewritten."""
        shape, dtype = list(self.out.shape), REAL_OF[self.out.dtype]
        halves = []
        for part in (re, im):
            if not isinstance(part, Node):
                part = self(aten.full.default, shape, part, dtype=dtype, device=self.out.device)
            if part.meta["val"].dtype != dtype:
                part = self(aten._to_copy.default, part, dtype=dtype)
            if list(part.meta["val"].shape) != shape:
                part = self(aten.expand.default, part, shape)
            halves.append(self(aten.unsqueeze.default, part, -1))
        return Cx(self(aten.cat.default, halves, -1))

    def rep(self, x: Any) -> Node:
        """The real form of any operand; real tensors and scalars get a zero imaginary part."""
        if isinstance(x, Cx):
            return x.node
        dtype = REAL_OF.get(self.out.dtype, self.out.dtype)
        if is_tensor(x):
            if x.meta["val"].dtype != dtype:
                x = self(aten._to_copy.default, x, dtype=dtype)
            return self(aten.constant_pad_nd.default, self(aten.unsqueeze.default, x, -1), [0, 1], 0.0)
        return self(aten.cat.default, [self(aten.full.default, [1], p, dtype=dtype, device=self.out.device)
                                       for p in self.parts(x)])

    def finish(self, result: Any) -> Any:
        """``result`` in the dtype the node promised; a wrong shape is a bug in a rule."""
        if not isinstance(self.out, torch.Tensor):
            return result
        out = result.node if isinstance(result, Cx) else result
        shape = [*self.out.shape, 2] if self.out.is_complex() else list(self.out.shape)
        dtype = REAL_OF.get(self.out.dtype, self.out.dtype)
        if list(out.meta["val"].shape) != shape:
            raise RuntimeError(f"complex_to_real: the rule for {self.node.target} made shape "
                               f"{list(out.meta['val'].shape)}, expected {shape} (node {self.node.name})")
        if out.meta["val"].dtype != dtype:
            out = self(aten._to_copy.default, out, dtype=dtype)
        return Cx(out) if isinstance(result, Cx) else out

    # -- arithmetic on parts --

    def add(self, x: Any, y: Any) -> Any:
        if is_num(x) and is_num(y):
            return x + y
        if is_num(x):
            x, y = y, x
        return x if is_num(y) and y == 0 else self(aten.add.Tensor, x, y)

    def neg(self, x: Any) -> Any:
        return -x if is_num(x) else self(aten.neg.default, x)

    def sub(self, x: Any, y: Any) -> Any:
        if is_num(y):
            return self.add(x, -y)
        return self(aten.rsub.Scalar, y, x) if is_num(x) else self(aten.sub.Tensor, x, y)  # 0 - 0 is +0

    def mul(self, x: Any, y: Any, op: Callable = aten.mul.Tensor) -> Any:
        if is_num(x) and is_num(y):
            return x * y
        if (is_num(x) and x == 0) or (is_num(y) and y == 0):
            return 0
        if is_num(x):  # only ever with op = mul: matmul operands are tensors or a folded 0
            x, y = y, x
        return x if is_num(y) and y == 1 else self(op, x, y)

    def div(self, x: Any, y: Any) -> Any:
        if is_num(x) and is_num(y):
            return x / y if y != 0 else math.nan if x == 0 else math.copysign(math.inf, x)
        if is_num(y):
            return x if y == 1 else self(aten.div.Tensor, x, y)
        if is_num(x):
            return 0 if x == 0 else self.mul(self(aten.reciprocal.default, y), x)
        return self(aten.div.Tensor, x, y)

    def cmul(self, a: Any, b: Any, op: Callable = aten.mul.Tensor) -> tuple[Any, Any]:
        """a ⋅ b for any bilinear ``op`` (``mul``, ``mm``, ``bmm``, ``matmul``), as parts."""
        return self.cmul_parts(self.parts(a), self.parts(b), op)

    def cmul_parts(self, a: tuple[Any, Any], b: tuple[Any, Any],
                   op: Callable = aten.mul.Tensor) -> tuple[Any, Any]:
        (ar, ai), (br, bi) = a, b
        return (self.sub(self.mul(ar, br, op), self.mul(ai, bi, op)),
                self.add(self.mul(ar, bi, op), self.mul(ai, br, op)))

    def cdiv(self, a: Any, b: Any) -> tuple[Any, Any]:
        """a / b as torch computes it (c10's complex division, Smith's: the divisor's smaller part over
        its larger; a zero divisor divides each part by 0). ``a * conj(b) / |b|**2`` overflowed from
        |b| ~ 1.8e19 and vanished below 1e-19: (3e30+4e30j)/(1e30+1e30j) was NaN, (1+1j)/1e20 0."""
        (ar, ai), (br, bi) = self.parts(a), self.parts(b)
        if is_num(bi) and bi == 0:
            return self.div(ar, br), self.div(ai, br)
        if is_num(br) and is_num(bi):  # a number: its branch is known here
            quotient = complex(1.0, 0.0) / complex(br, bi) if (br, bi) != (0, 0) else None
            if quotient is None:
                return self.div(ar, 0.0), self.div(ai, 0.0)
            return self.cmul_parts((ar, ai), (quotient.real, quotient.imag))
        x, y = self(aten.abs.default, br), self(aten.abs.default, bi)
        wide = self(aten.ge.Tensor, x, y)  # |c| >= |d|
        big, small = self.pick(wide, br, bi), self.pick(wide, bi, br)
        ratio = self(aten.div.Tensor, small, big)
        scale = self(aten.reciprocal.default, self.add(big, self.mul(small, ratio)))
        # |c| >= |d|: re = (a + b r) s, im = (b - a r) s; else re = (a r + b) s, im = (b r - a) s
        re = self.mul(self.add(self.pick(wide, ar, ai), self.mul(self.pick(wide, ai, ar), ratio)), scale)
        im = self.mul(self.pick(wide, self.sub(ai, self.mul(ar, ratio)), self.sub(self.mul(ai, ratio), ar)), scale)
        zero = self(aten.logical_and.default, self(aten.eq.Scalar, x, 0), self(aten.eq.Scalar, y, 0))
        return self.pick(zero, self._over_zero(ar, x), re), self.pick(zero, self._over_zero(ai, y), im)

    def _over_zero(self, numerator: Any, zero: Node) -> Any:
        """``numerator / zero`` where ``zero`` is +0: an infinity of its sign, or NaN for 0."""
        if is_num(numerator):
            return math.copysign(math.inf, numerator) if numerator != 0 else math.nan
        return self(aten.div.Tensor, numerator, zero)

    def pick(self, condition: Node, x: Any, y: Any) -> Any:
        """``where(condition, x, y)`` of parts that may be numbers."""
        if is_num(x) and is_num(y):
            return x if x == y else self(aten.where.Scalar, condition, x, y)
        if is_num(x):
            return self(aten.where.ScalarSelf, condition, x, y)
        if is_num(y):
            return self(aten.where.ScalarOther, condition, x, y)
        return self(aten.where.self, condition, x, y)

    def abs(self, a: Cx) -> Node:
        """The modulus without overflow or underflow (hypot's way): the larger part's magnitude
        times sqrt(1 + ratio**2); sqrt(re**2 + im**2) was inf from |z| ~ 1.8e19 and 0 below 1e-19."""
        re, im = self.parts(a)
        if is_num(re) or is_num(im):
            return self(aten.sqrt.default, self.add(self.mul(re, re), self.mul(im, im)))
        x, y = self(aten.abs.default, re), self(aten.abs.default, im)
        big, small = self(aten.maximum.default, x, y), self(aten.minimum.default, x, y)
        ratio = self(aten.div.Tensor, small, self(aten.where.ScalarSelf, self(aten.eq.Scalar, big, 0), 1.0, big))
        size = self.mul(big, self(aten.sqrt.default, self(aten.add.Scalar, self.mul(ratio, ratio), 1)))
        infinite = self(aten.logical_or.default, self(aten.isinf.default, re), self(aten.isinf.default, im))
        return self(aten.where.ScalarSelf, infinite, float("inf"), size)

    def angle(self, a: Cx) -> Node:
        """``atan2(im, re)`` with IEEE's zeros and double infinities (IREE's atan2 gives NaN there:
        the angle of 0j, every zero bin of a spectrum's phase, was NaN)."""
        re, im = self.parts(a)
        result = self(aten.atan2.default, im, re)
        if is_num(re) or is_num(im):
            return result
        dtype = result.meta["val"].dtype
        left = self(aten._to_copy.default, self(aten.signbit.default, re), dtype=dtype)  # 1 for a negative re

        def signed(value: Node) -> Node:  # value with im's sign
            return self(aten.where.self, self(aten.signbit.default, im), self(aten.neg.default, value), value)

        zeros = signed(self(aten.mul.Tensor, left, math.pi))
        infinities = signed(self(aten.add.Tensor, self(aten.mul.Tensor, left, 0.5 * math.pi), 0.25 * math.pi))
        on_axis = self(aten.logical_and.default, self(aten.eq.Scalar, im, 0),
                       self(aten.logical_not.default, self(aten.isnan.default, re)))
        result = self(aten.where.self, on_axis, zeros, result)
        both = self(aten.logical_and.default, self(aten.isinf.default, im), self(aten.isinf.default, re))
        return self(aten.where.self, both, infinities, result)

    def polar(self, magnitude: Any, angle: Node) -> tuple[Any, Any]:
        return (self.mul(magnitude, self(aten.cos.default, angle)),
                self.mul(magnitude, self(aten.sin.default, angle)))


def concrete(node: Node) -> Any:
    """A scalar graph input's value: the graph is specialized to it (as ``inline_scalar_inputs`` does)."""
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        val = val.node.hint
    if not is_num(val):
        raise NotImplementedError(f"complex_to_real: scalar graph input {node.name} has no concrete value")
    return val
