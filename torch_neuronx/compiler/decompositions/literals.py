"""Tensors computed at trace time and entered into the traced graph as literals.

A decomposition that needs a table (DFT matrices, pooling windows, a Kaiser
window, rotation patterns) builds it with torch now rather than recording the
ops that compute it: the graph then holds a constant, and IREE compiles no
dispatch (or constant-expression evaluation) for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


def literal(build: Callable[[], torch.Tensor], device: torch.device | str | None = None) -> torch.Tensor:
    """``build()``, computed with every dispatch mode off (real CPU kernels, nothing recorded),
    entered into the graph through ``lift_fresh_copy`` as ``torch.tensor`` data is, on ``device``."""
    with _disable_current_modes(), torch.no_grad():
        value = build()
    value = aten.lift_fresh_copy.default(value)
    return value if device is None or torch.device(device).type == "cpu" else value.to(device)
