"""torch.fft through DFT matrix products (complex results are split into real parts downstream)."""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten

#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}
