"""torch-mlir's torch dialect → StableHLO, with no torch import: run in the lowering worker process.

This module imports nothing of torch or of this package (only torch-mlir's MLIR
bindings), so the worker that runs it (``compiler/lowering_worker.py``) starts in
half a second. :func:`to_stablehlo` runs torch-mlir's two pipelines, the ones
``torch_mlir.fx`` runs for ``output_type="stablehlo"`` (FX-import cleanup to the
torch backend contract, then the torch backend to StableHLO), followed by the fixups of
the StableHLO that IREE needs (:mod:`.stablehlo_fixups`). :func:`serve` is the worker's loop: length-prefixed
UTF-8 JSON requests ``{"raw": text}`` on stdin, replies ``{"stablehlo": text}`` or
``{"error": {"detail", "op"}}`` on stdout.
"""

from __future__ import annotations

import json
import os
import re
import select
import struct
import sys
import time
from typing import IO, Any

if __package__:
    from torch_neuronx.compiler import linalg_fixups, stablehlo_fixups
else:  # the lowering worker imports this module alone, its directory on sys.path
    import linalg_fixups
    import stablehlo_fixups

_TO_BACKEND = ("builtin.module(func.func(torch-match-quantized-custom-ops), "
               "torchdynamo-export-to-torch-backend-pipeline{ extra-library=%s})")
# Ops kept for the linalg lowering, which lowers them right where it lowers their decomposition
# wrong (passes/collapse_views.py: a view merging symbolic dims; flatten's is a plain collapse).
_LINALG_LEGAL = " backend-legal-ops=aten.flatten.using_ints"
_TO_STABLEHLO = "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"
# Dynamic-shape kernels: IREE 3.13 rejects the shape-operand forms of StableHLO's dynamic ops that
# torch-mlir emits (``dynamic_broadcast_in_dim`` with ``tensor<Nxindex>`` shapes), but compiles
# torch-mlir's linalg-on-tensors output, dynamic dimensions included.
_TO_LINALG = "builtin.module(torch-backend-to-linalg-on-tensors-backend-pipeline)"
#: The dialects a raw module can be lowered to: what the compiler consumes.
DIALECTS = ("stablehlo", "linalg")


class LoweringError(Exception):
    """torch-mlir could not lower the module: ``detail`` says why, ``op`` names the op when known."""

    def __init__(self, detail: str, op: str | None) -> None:
        super().__init__(detail)
        self.detail, self.op = detail, op


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


def asm(module: object) -> str:
    """The module's text without locations (they hold Python file/line info that would make the
    HLO, and so the cache key, change on benign source edits)."""
    return module.operation.get_asm(enable_debug_info=False)  # type: ignore[attr-defined]


def parse_raw(text: str) -> object:
    """A raw torch-dialect module parsed from ``text`` (in a new MLIR context)."""
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_dialect

    context = ir.Context()
    torch_dialect.register_dialect(context)
    return ir.Module.parse(text, context)


def to_stablehlo(raw_module: object, dialect: str = "stablehlo") -> str:
    """Lower a raw torch-dialect module to StableHLO text (mutates the module); raises LoweringError.

    ``dialect="linalg"``: to linalg-on-tensors instead (the form dynamic-shape kernels compile from).
    """
    from torch_mlir.passmanager import PassManager

    diagnostics: list[str] = []

    def collect(diagnostic: object) -> bool:
        diagnostics.append(f"{diagnostic.severity}: {diagnostic.message}")  # type: ignore[attr-defined]
        return True  # handled: keep MLIR from printing it to stderr

    context = raw_module.context  # type: ignore[attr-defined]
    handler = context.attach_diagnostic_handler(collect)
    try:
        with context:
            context.emit_error_diagnostics = True
            backend = _TO_BACKEND % ("" if dialect == "stablehlo" else _LINALG_LEGAL)
            PassManager.parse(backend).run(raw_module.operation)  # type: ignore[attr-defined]
            if dialect != "stablehlo":
                raw_module = _with_bitcasts(raw_module)
            PassManager.parse(_TO_STABLEHLO if dialect == "stablehlo" else _TO_LINALG).run(
                raw_module.operation)  # type: ignore[attr-defined]
    except Exception as exc:
        found = [d for d in diagnostics if "legalize" in d] + diagnostics
        message = "\n".join(dict.fromkeys(found[:6])) or f"{type(exc).__name__}: {exc}".splitlines()[0]
        target = "StableHLO" if dialect == "stablehlo" else "linalg-on-tensors"
        raise LoweringError(f"torch-mlir could not lower to {target}: {message}", op_from_message(message)) from exc
    finally:
        handler.detach()
    if dialect == "stablehlo":
        stablehlo_fixups.apply(raw_module)
        return asm(raw_module)
    return nontrapping_divisions(asm(raw_module))


def _with_bitcasts(module: object) -> object:
    """``module`` (at the torch backend contract) with ``linalg_fixups.bitcasts`` applied: a new
    module in the same context when there was something to rewrite, else ``module`` itself."""
    from torch_mlir import ir
    from torch_mlir.passmanager import PassManager

    text = linalg_fixups.bitcasts(asm(module))
    if text is None:
        return module
    context = module.context  # type: ignore[attr-defined]
    # The rewrite uses torch_c's casts, a dialect torch-mlir's Python bindings do not register:
    # a pass that depends on it loads it into the context, so the text parses.
    PassManager.parse("builtin.module(torch-func-backend-type-conversion)").run(
        ir.Module.parse("module {}", context).operation)
    return ir.Module.parse(text, context)


_DIVISION = re.compile(r"^(\s*)(%[\w.$-]+) = arith\.(divsi|divui|remsi|remui|ceildivsi|floordivsi|ceildivui) "
                       r"(%[\w.$-]+), (%[\w.$-]+) : (i64|i32|index)$", re.MULTILINE)


def nontrapping_divisions(text: str) -> str:
    """Linalg text whose scalar integer divisions divide by 1 where the divisor is 0.

    An x86 integer division by zero raises SIGFPE, which kills the process. torch-mlir's
    dynamic-shape lowering divides by sizes it computes at run time (a ``view``'s ``-1``); when
    it mis-types a size (a small GPT-2's dynamic trace came out with a dimension of 1 where the
    sequence length belonged), the divisor is 0 and the first call died. With the divisor
    guarded the call returns, its wrong result fails the first-call comparison with eager, and
    the graph is compiled per signature instead. (torch gives no meaning to a zero divisor in
    a shape, and an integer tensor division by zero is an error or undefined in torch.)
    """
    count = 0

    def guarded(match: re.Match) -> str:
        nonlocal count
        count += 1
        indent, result, op, lhs, rhs, kind = match.groups()
        zero, one, is_zero, divisor = (f"%tnx_div{count}_{name}" for name in ("zero", "one", "is_zero", "divisor"))
        return (f"{indent}{zero} = arith.constant 0 : {kind}\n{indent}{one} = arith.constant 1 : {kind}\n"
                f"{indent}{is_zero} = arith.cmpi eq, {rhs}, {zero} : {kind}\n"
                f"{indent}{divisor} = arith.select {is_zero}, {one}, {rhs} : {kind}\n"
                f"{indent}{result} = arith.{op} {lhs}, {divisor} : {kind}")

    return _DIVISION.sub(guarded, text)


_HEADER = struct.Struct("<Q")


def write_message(stream: IO[bytes], message: dict[str, Any]) -> None:
    """Send ``message`` as length-prefixed UTF-8 JSON."""
    payload = json.dumps(message).encode("utf-8")
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_exact(stream: IO[bytes], size: int, deadline: float | None) -> bytes:
    fd = stream.fileno()
    chunks, remaining = [], size
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(stream: IO[bytes], deadline: float | None) -> dict[str, Any]:
    """Receive one message; TimeoutError past ``deadline`` (a ``time.monotonic`` value), EOFError at the end."""
    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size, deadline))
    return json.loads(_read_exact(stream, size, deadline).decode("utf-8"))


def serve() -> None:
    """The worker's loop: one request per graph until stdin closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the reply pipe
    while True:
        try:
            request = read_message(stdin, None)
        except EOFError:
            return
        try:
            dialect = request.get("dialect", "stablehlo")
            reply: dict[str, Any] = {"stablehlo": to_stablehlo(parse_raw(request["raw"]), dialect)}
        except LoweringError as exc:
            reply = {"error": {"detail": exc.detail, "op": exc.op}}
        except Exception as exc:  # a bug on this side: still an answer, not a dead worker
            reply = {"error": {"detail": f"{type(exc).__name__}: {exc}", "op": None}}
        write_message(stdout, reply)
