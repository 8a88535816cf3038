"""FX graph → raw torch dialect → StableHLO, through torch-mlir's FX importer.

Each step returns text for the artifact tree. Failures become
:class:`NeuronCompileError` with stage ``import`` (the FX importer rejected the
graph) or ``lowering`` (torch dialect → StableHLO failed), naming the op when
the message identifies one.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from torch_neuronx.compiler.errors import NeuronCompileError

_OP_PATTERNS = (
    # An op torch-mlir has no definition for is a generic torch.operator carrying its name.
    re.compile(r"'torch\.operator'[^\n]*?name = \"([\w.]+)\""),
    re.compile(r"failed to legalize operation '([\w.]+)'"),
    re.compile(r"unsupported (?:by backend contract|op)[^']*'([\w.]+)'"),
    re.compile(r"'(torch\.aten\.[\w.]+)'"),
    re.compile(r"(torch\.aten\.[\w]+(?:\.[\w]+)?)"),
    re.compile(r"(aten\.[\w]+(?:\.[\w]+)?)"),
)


def op_from_message(message: str) -> str | None:
    """The first operator an MLIR / torch-mlir diagnostic names, if any."""
    for pattern in _OP_PATTERNS:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


@dataclasses.dataclass
class Lowered:
    """The two textual forms of one graph; ``stablehlo`` is what the compiler consumes."""

    raw: str
    stablehlo: str


def _asm(module: object) -> str:
    # Locations stripped: they hold Python file/line info that would make the
    # HLO (and so the cache key) change on benign source edits.
    return module.operation.get_asm(enable_debug_info=False)  # type: ignore[attr-defined]


def import_raw(gm: torch.fx.GraphModule, func_name: str = "main") -> object:
    """Import a stateless FX graph (parameters already lifted to inputs) as the raw torch dialect."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch_mlir import fx as tmfx

    try:
        # aot_autograd calls compilers under its fake mode, but tensor constants are real: the
        # importer converts bool ones (.to(uint8)), which a fake mode refuses on real tensors.
        with unset_fake_temporarily():
            return tmfx.stateless_fx_import(gm, output_type="raw", model_name=func_name)
    except Exception as exc:  # torch-mlir raises many types; all mean "cannot import"
        message = f"{type(exc).__name__}: {exc}"
        raise NeuronCompileError("import", f"torch-mlir could not import the FX graph: {message}",
                                 op=op_from_message(message)) from exc


def to_stablehlo(raw_module: object) -> str:
    """Lower an imported raw torch-dialect module to StableHLO text (mutates the module)."""
    from torch_mlir import fx as tmfx
    from torch_mlir.compiler_utils import OutputType

    diagnostics: list[str] = []

    def collect(diagnostic: object) -> bool:
        diagnostics.append(f"{diagnostic.severity}: {diagnostic.message}")  # type: ignore[attr-defined]
        return True  # handled: keep MLIR from printing it to stderr

    handler = raw_module.context.attach_diagnostic_handler(collect)  # type: ignore[attr-defined]
    try:
        module = tmfx._module_lowering(False, False, OutputType.STABLEHLO, raw_module)
    except Exception as exc:
        found = [d for d in diagnostics if "legalize" in d] + diagnostics
        message = "\n".join(dict.fromkeys(found[:6])) or f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise NeuronCompileError("lowering", f"torch-mlir could not lower to StableHLO: {message}",
                                 op=op_from_message(message)) from exc
    finally:
        handler.detach()
    _narrow_scatter_indices(module)
    return _asm(module)


_INT32_LIMIT = 2**31


def _narrow_scatter_indices(module: object) -> None:
    """Give every ``stablehlo.scatter`` with int64 indices an explicit int32 copy of them.

    IREE 3.13 narrows scatter indices to int32 itself, and fails ("failed to legalize
    unresolved source materialization") when one index tensor feeds two scatters, as when
    a graph sums values and counts into the same targets. Converting first avoids it. Only
    where every dimension of the scattered-into operand is below 2**31, so every valid
    index fits; out-of-range indices are already invalid in torch.
    """
    from torch_mlir import ir

    scatters: list[object] = []

    def visit(op: object) -> object:
        if op.name == "stablehlo.scatter":  # type: ignore[attr-defined]
            scatters.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)  # type: ignore[attr-defined]
    with module.context, ir.Location.unknown():  # type: ignore[attr-defined]
        i32 = ir.IntegerType.get_signless(32)
        for op in scatters:
            operands = op.operands  # type: ignore[attr-defined]
            count = len(operands) // 2  # (inputs..., indices, updates...)
            inputs, indices = operands[:count], operands[count]
            index_type = ir.RankedTensorType(indices.type)
            if str(index_type.element_type) != "i64":
                continue
            if not index_type.has_static_shape or any(
                    d >= _INT32_LIMIT or d < 0 for v in inputs for d in ir.RankedTensorType(v.type).shape):
                continue
            narrowed = ir.Operation.create(
                "stablehlo.convert", results=[ir.RankedTensorType.get(index_type.shape, i32)],
                operands=[indices], ip=ir.InsertionPoint(op))  # type: ignore[attr-defined]
            op.operands[count] = narrowed.result  # type: ignore[attr-defined]


def lower(gm: torch.fx.GraphModule, func_name: str = "main") -> Lowered:
    """Import and lower ``gm``; the raw text is captured before lowering mutates the module."""
    module = import_raw(gm, func_name)
    raw = _asm(module)
    try:
        stablehlo = to_stablehlo(module)
    except NeuronCompileError as err:
        err.raw_text = raw  # type: ignore[attr-defined]  # for the torch_mlir_error artifact
        raise
    return Lowered(raw=raw, stablehlo=stablehlo)
