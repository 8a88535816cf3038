"""Special functions (erfinv, erfc, lgamma, digamma, polygamma) as elementwise arithmetic torch-mlir lowers."""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten

#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}
