"""Names of resident parameters, shared by the rewrite that declares them and the runtime that binds them.

A NEFF compiled with resident parameters (``compiler/resident.py``) reads each weight
from ``#stream.parameter.named<SCOPE::parameter_key(i)>``; the runtime's provider
(``runtime/executable.py``) serves the tensor at input position ``i`` under that name.
"""

from __future__ import annotations

#: Parameter scope of resident inputs in NEFFs and in the runtime's provider.
SCOPE = "neuron"


def parameter_key(index: int) -> str:
    """The parameter key of the module input at ``index`` (its position among the graph's inputs)."""
    return f"input{index}"
