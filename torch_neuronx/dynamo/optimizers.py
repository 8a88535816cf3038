"""Compiled optimizer steps over neuron parameters keep each group's ``step`` where they update it.

Dynamo traces ``optimizer.step`` group by group, running each group's ``_init_group`` for real,
and before each one moves every ``step`` tensor still on the CPU to its parameter's device
(``OptimizerVariable.move_step_if_cpu``). For CUDA parameters the steps never start on the CPU:
Dynamo sets ``capturable`` for groups of uninitialized CUDA/XPU parameters first, and a
capturable optimizer makes its steps on the parameters' device. Neuron parameters did not count,
so the first group's steps were made on the CPU, traced, then replaced by device copies when
the second group was initialized: the compiled step kept counting the traced tensors while the
optimizer's state held copies stuck at 0. Every group but the last applied Adam's bias
correction of the wrong step after a recompile (every float learning-rate schedule makes one),
and ``state_dict()`` saved ``step=0``. :func:`install` counts neuron parameters as torch counts
CUDA's there (torch's optimizers accept ``capturable`` on the PrivateUse1 device).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["install"]


def install() -> None:
    """Let Dynamo make groups of uninitialized neuron parameters capturable, as CUDA's; idempotent."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if hasattr(original, "__neuron_original__"):
        return

    @functools.wraps(original)
    def set_capturable(self: Any, tx: Any) -> None:
        optimizer = self.value
        for group in optimizer.param_groups:
            params = group.get("params", [])
            if ("capturable" in group and params and all(p.device.type == "neuron" for p in params)
                    and not any(p in optimizer.state for p in params)):
                group["capturable"] = True
        original(self, tx)

    set_capturable.__neuron_original__ = original  # type: ignore[attr-defined]
    OptimizerVariable._set_capturable = set_capturable
