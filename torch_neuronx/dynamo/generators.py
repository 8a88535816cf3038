"""Dynamo takes a neuron device's ``torch.Generator`` as it takes a CPU one.

``torch.Generator(device="neuron")`` is a subclass of ``torch._C.Generator``
(``device/random.py``). Dynamo wraps an exact ``torch._C.Generator`` as an ordinary object, so
that an op given it (``torch.randn(..., generator=g)``) or a method of it (``manual_seed``)
breaks the graph and runs eagerly; a subclass fell through to the opaque-object path and every
compiled function given one failed ("Dynamo failed to run FX node with fake tensors ...
FakeScriptObject"). :func:`install` sends generator subclasses down the same path as the exact type.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["install"]


def install() -> None:
    """Wrap Dynamo's ``VariableBuilder._wrap`` for generator subclasses; idempotent."""
    from torch._dynamo.variables.builder import VariableBuilder

    original = VariableBuilder._wrap
    if hasattr(original, "__neuron_original__"):
        return

    @functools.wraps(original)
    def wrap(self: Any, value: Any) -> Any:
        if isinstance(value, torch._C.Generator) and type(value) is not torch._C.Generator:
            return self.wrap_user_defined(value)
        return original(self, value)

    wrap.__neuron_original__ = original  # type: ignore[attr-defined]
    VariableBuilder._wrap = wrap
