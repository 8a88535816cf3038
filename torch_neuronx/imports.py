"""Patches of torch modules applied when a program imports them, not before.

Some of torch's modules need a neuron-aware change (DCP's stager, FSDP2's move of parameters to
the mesh's device, Dynamo's list of code it never traces) but cost a noticeable time to import,
which ``import torch_neuronx`` must not pay: :func:`when_imported` applies a patch at once if the
module is loaded, else right after it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``patch(module)`` once the module named ``name`` is loaded, whenever that is."""

    def __init__(self, name: str, patch: Callable[[Any], None]) -> None:
        self.name, self.patches = name, [patch]

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders find it; this one only waits for it
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        for patch in self.patches:
            patch(module)


def when_imported(name: str, patch: Callable[[Any], None]) -> None:
    """Call ``patch(module)`` on module ``name`` now if it is loaded, else when it is (each patch
    once; several patches of one module run in the order given)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    waiting = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name), None)
    if waiting is None:
        sys.meta_path.insert(0, _AfterImport(name, patch))
    elif patch not in waiting.patches:
        waiting.patches.append(patch)
