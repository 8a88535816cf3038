"""3-d and adaptive pooling (max, average, adaptive max/average) and their backwards, through ops torch-mlir lowers."""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten

#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}
