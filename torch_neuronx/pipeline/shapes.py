"""Dynamic dimensions of a traced kernel: recorded at trace time, evaluated at every call.

An eager op traced with symbolic shapes (``make_fx(..., tracing_mode="symbolic")``)
compiles to one kernel for every size of its dynamic dimensions. Its plan
records each dimension as an int (static) or as the printed expression of its
symbol (``"s7"``, ``"s7*s9"``, ``"s7 // 2"``): input dimensions name the
symbols, output dimensions are expressions of them. :class:`ShapeFunction`
turns those expressions into one small Python function that gives a call's
output shapes from its inputs' shapes, so outputs are allocated before the
kernel runs (no meta-tensor propagation per call).

A trace is dynamic only if it holds for every size: :func:`check_dynamic`
rejects a trace whose shape environment recorded guards (the trace branched on
a size, or a symbol was fixed to a constant), which must then be compiled for
its concrete shapes instead.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx.compiler.errors import NotDynamic

__all__ = ["NotDynamic", "ShapeFunction", "SizeGuards", "check_dynamic", "dimension", "is_dynamic"]


def _printer() -> Any:
    from torch.utils._sympy.printers import PythonPrinter

    return PythonPrinter()


def dimension(d: Any) -> int | str:
    """One dimension as a plan stores it: an int, or its symbol's expression as Python text."""
    if isinstance(d, int):
        return d
    expr = d.node.expr
    if expr.is_number:
        return int(expr)
    return _printer().doprint(expr)


def is_dynamic(specs: Sequence[dict[str, Any]]) -> bool:
    """Whether any of these ``{"shape", "dtype"}`` specs has a symbolic dimension."""
    return any(isinstance(d, str) for spec in specs for d in spec["shape"])


def _shape_env(gm: torch.fx.GraphModule) -> Any:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for value in val if isinstance(val, list | tuple) else (val,):
            if isinstance(value, torch.Tensor):
                for d in value.shape:
                    if isinstance(d, torch.SymInt):
                        return d.node.shape_env
    return None


def check_dynamic(gm: torch.fx.GraphModule, guards_allowed: bool = False) -> list[str]:
    """Raise :class:`NotDynamic` unless ``gm``'s trace holds for every size of its symbols, or, with
    ``guards_allowed``, for every size its guards accept (``s0 <= 512``: a position table's
    length); returns those guards as Python text (see :class:`SizeGuards`)."""
    env = _shape_env(gm)
    if env is None:
        raise NotDynamic("no dynamic dimension")
    if env.guards and not guards_allowed:
        raise NotDynamic(f"the trace guards on sizes: {', '.join(str(g.expr) for g in env.guards[:3])}")
    fixed = [str(k) for k, v in env.replacements.items() if v.is_number]
    if fixed:
        raise NotDynamic(f"sizes fixed to constants: {', '.join(fixed[:3])}")
    return list(dict.fromkeys(_printer().doprint(g.expr) for g in env.guards))


# What an output dimension's expression may contain: arithmetic of symbols and integers.
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod,
            ast.USub, ast.UAdd, ast.Name, ast.Load, ast.Constant, ast.Call)
# What a guard may add: comparisons and their logic.
_CONDITIONS = (ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.BoolOp, ast.And,
               ast.Or, ast.Not)
_FUNCTIONS = {"max": max, "min": min}


def _checked(text: str, symbols: set[str], allowed: tuple[type, ...] = _ALLOWED) -> set[str]:
    """The symbols ``text`` uses, when it is an arithmetic expression of ``symbols``; ValueError otherwise."""
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise ValueError(f"unsupported {type(node).__name__} in dimension {text!r}")
        if isinstance(node, ast.Constant) and type(node.value) is not int:
            raise ValueError(f"non-integer constant in dimension {text!r}")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
            raise ValueError(f"unsupported call in dimension {text!r}")
        if isinstance(node, ast.Name) and node.id not in symbols and node.id not in _FUNCTIONS:
            raise ValueError(f"dimension {text!r} depends on {node.id}, which no input dimension is")
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in symbols}


class ShapeFunction:
    """The output shapes of a dynamic kernel's call, from its inputs' shapes.

    ``inputs`` and ``outputs`` are the plan's ``{"shape", "dtype"}`` specs. Calling the
    function with the call's input tensors returns one shape tuple per output.
    Raises ValueError when an output dimension is not an arithmetic expression of
    input dimensions.
    """

    def __init__(self, inputs: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]) -> None:
        where: dict[str, tuple[int, int]] = {}
        related: list[tuple[int, int, str]] = []  # input dimensions that are expressions (``s0 + 1``)
        for i, spec in enumerate(inputs):
            for j, d in enumerate(spec["shape"]):
                if isinstance(d, str):
                    if d.isidentifier():
                        where.setdefault(d, (i, j))
                    else:
                        related.append((i, j, d))
        dims = [list(spec["shape"]) for spec in outputs]
        used = set().union(*(_checked(d, set(where)) for shape in dims for d in shape if isinstance(d, str)),
                           *(_checked(d, set(where)) for _, _, d in related))
        lines = ["def shapes(t):"]
        lines += [f"    {name} = t[{where[name][0]}].shape[{where[name][1]}]" for name in sorted(used)]
        # Sizes that break the relation the kernel was traced with are refused (None), never run.
        lines += [f"    if t[{i}].shape[{j}] != ({d}):\n        return None" for i, j, d in related]
        shapes = ", ".join("(" + "".join(f"{d}, " for d in shape) + ")" for shape in dims)
        lines.append(f"    return ({shapes}{',' if len(dims) == 1 else ''})")
        self._related = [f"dimension {j} of input {i} must be {d}" for i, j, d in related]
        namespace: dict[str, Any] = {"__builtins__": {}, **_FUNCTIONS}
        exec(compile("\n".join(lines), "<neuron kernel shapes>", "exec"), namespace)  # noqa: S102 - checked above
        self._shapes = namespace["shapes"]

    def __call__(self, tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
        result = self._shapes(tensors)
        if result is None:
            raise ValueError(f"input sizes {[tuple(t.shape) for t in tensors]} break the relation the kernel was "
                             f"compiled for: {'; '.join(self._related)}")
        return result


def _input_symbols(inputs: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each symbol an input dimension is, and the first (input, dimension) that is it."""
    where: dict[str, tuple[int, int]] = {}
    for i, spec in enumerate(inputs):
        for j, d in enumerate(spec["shape"]):
            if isinstance(d, str) and d.isidentifier():
                where.setdefault(d, (i, j))
    return where


class SizeGuards:
    """Whether a call's input sizes satisfy the guards its dynamic trace recorded.

    A trace that compared a size with a bound (``s0 <= 512``: a slice of a position table)
    holds for every size the comparison accepts; the kernel then serves exactly those, and
    the caller takes another route for the others. ``inputs`` are the plan's input specs,
    ``guards`` the trace's guards as Python text (:func:`check_dynamic`). Raises
    ValueError for a guard that is not a comparison of input dimensions.
    """

    def __init__(self, inputs: Sequence[dict[str, Any]], guards: Sequence[str]) -> None:
        where = _input_symbols(inputs)
        used = set().union(*(_checked(g, set(where), _ALLOWED + _CONDITIONS) for g in guards))
        lines = ["def accepts(t):"]
        lines += [f"    {name} = t[{where[name][0]}].shape[{where[name][1]}]" for name in sorted(used)]
        lines.append("    return " + " and ".join(f"({g})" for g in guards) if guards else "    return True")
        namespace: dict[str, Any] = {"__builtins__": {}, **_FUNCTIONS}
        exec(compile("\n".join(lines), "<neuron size guards>", "exec"), namespace)  # noqa: S102 - checked above
        self.guards = tuple(guards)
        self._accepts = namespace["accepts"]

    def __call__(self, tensors: Sequence[torch.Tensor]) -> bool:
        return bool(self._accepts(tensors))
