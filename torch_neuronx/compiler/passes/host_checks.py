"""Error checks of ``info`` tensors → extra graph outputs the host checks after each call.

Where eager raises on bad input to a linear-algebra op (a singular matrix to
``torch.linalg.inv``, a matrix that is not positive-definite to
``torch.linalg.cholesky``), the decompositions compute LAPACK's ``info`` in the
graph and call ``neuron::linalg_check_errors`` on it
(``compiler/decompositions/linalg.py``). A compiled graph cannot raise, so this
pass removes each such call, appends its ``info`` as a trailing output and
records the check (``gm.meta["host_checks"]``: ``{"api_name", "is_matrix"}``
dicts, JSON-serializable for plans). :func:`run_checks` applies them to those
outputs on the host, with torch's own ``_linalg_check_errors``: the same
exception and message as eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx.compiler.decompositions.linalg import CHECK
from torch_neuronx.compiler.passes.rewrite import append_checks


def checks_to_outputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``neuron::linalg_check_errors`` call by a trailing output and a recorded check."""
    checks = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is CHECK]
    if not checks:
        return gm
    recorded = []
    for node in checks:
        info, api_name, is_matrix = node.args
        recorded.append((info, {"api_name": api_name, "is_matrix": bool(is_matrix)}))
        gm.graph.erase_node(node)
    append_checks(gm, recorded)
    return gm


def run_checks(checks: Sequence[dict[str, Any]], results: list[torch.Tensor]) -> list[torch.Tensor]:
    """Check the trailing outputs of ``results`` (raising eager's error); return the others.

    A check is a linear-algebra ``info`` (this pass's) or, with ``kind: "index"``, an index
    operand's (min, max) (``passes/index_bounds.py``), or with ``kind: "zero_division"`` whether
    an integer divisor held a zero (``passes/zero_divisors.py``).
    """
    from torch_neuronx.compiler.passes.index_bounds import raise_out_of_range
    from torch_neuronx.compiler.passes.zero_divisors import raise_on_zero

    kept = len(results) - len(checks)
    for check, value in zip(checks, results[kept:]):
        if check.get("kind") == "index":
            raise_out_of_range(check, value)
        elif check.get("kind") == "zero_division":
            raise_on_zero(value)
        else:
            try:
                torch._linalg_check_errors(value, check["api_name"], is_matrix=check["is_matrix"])
            except RuntimeError as error:
                error.neuron_input_error = True  # type: ignore[attr-defined]  # bad input: never a fallback
                raise
    return results[:kept]
