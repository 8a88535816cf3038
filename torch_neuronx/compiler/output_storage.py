"""Output storage: a module that writes its results into buffers the caller passes.

IREE's native ABI lets a caller provide the storage of a function's results:
an argument marked ``{iree.abi.output = N : index}`` is used as the buffer of
result ``N``. The eager device allocates an op's outputs from the caching
allocator before the op runs (it returns them at once, the op runs later on its
stream), so its kernels are compiled with one such argument per result, and the
NEFF writes straight into the device memory of the outputs: no copy follows
execution.

A result that no dispatch produces (an input returned as is, a constant, the
same value returned twice) must be copied into its storage by the runtime,
which buffers imported from host memory do not allow (IREE 3.13 asks for
DISCARD_WRITE access). Such a kernel fails at its first call with
``PERMISSION_DENIED``; its caller then runs the module compiled without output
storage and copies (``pipeline/graph.py``).
"""

from __future__ import annotations

import re

_RESULTS = re.compile(r"\)\s*->\s*(\(.*?\)|tensor<[^<>]*>)\s*(attributes\s*\{[^{}]*\}\s*)?\{", re.S)
_TENSOR = re.compile(r"tensor<[^<>]*>")

#: What the runtime reports when a result needs copying into storage it may not discard.
UNSUPPORTED = "PERMISSION_DENIED"


def with_output_storage(stablehlo: str) -> str | None:
    """``stablehlo`` with one ``iree.abi.output`` argument per result of ``@main`` appended.

    Returns None when the module is not in the plain form this rewrite knows (one
    ``@main`` with a parenthesized argument list and tensor results).
    """
    start = stablehlo.find("func.func @main(")
    if start < 0 or stablehlo.find("func.func @main(", start + 1) >= 0:
        return None
    open_at = start + len("func.func @main(")
    depth, close_at = 1, -1
    for pos in range(open_at, len(stablehlo)):
        char = stablehlo[pos]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                close_at = pos
                break
    if close_at < 0:
        return None
    match = _RESULTS.match(stablehlo, close_at)
    if match is None:
        return None
    results = _TENSOR.findall(match.group(1))
    if not results:
        return None
    existing = stablehlo[open_at:close_at].strip()
    storage = ", ".join(f"%neuron_out{i}: {t} {{iree.abi.output = {i} : index}}" for i, t in enumerate(results))
    arguments = f"{existing}, {storage}" if existing else storage
    return stablehlo[:open_at] + arguments + stablehlo[close_at:]
