"""``torch.distributed.checkpoint.async_save`` of neuron tensors: staged to the host as CUDA's are.

DCP's stager copies a tensor subclass's ``__dict__`` onto the host copy it makes, deep-copying
each attribute: a neuron tensor's holds its device memory (``_allocation``, with a lock), and
``async_save`` of any neuron state_dict failed with "cannot pickle '_thread.lock' object". A
neuron tensor is staged as its host copy, with the attributes the program set on it.

The stager's module costs 0.17 s to import, which ``import torch_neuronx`` must not pay: it is
patched when a program imports it (:class:`_AfterImport`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

_MODULE = "torch.distributed.checkpoint._state_dict_stager"


def _staging_neuron_tensors(module: Any) -> None:
    """Wrap ``StateDictStager._offload_tensor`` (see the module docstring)."""
    from torch_neuronx.runtime.serialization import program_attributes
    from torch_neuronx.runtime.tensor import NeuronTensor

    stager = module.StateDictStager
    offload = stager._offload_tensor
    if getattr(offload, "_neuron", False):
        return

    def offload_tensor(self: Any, x: Any, memo: dict[int, Any], non_blocking: bool = False) -> Any:
        if not isinstance(x, NeuronTensor):
            return offload(self, x, memo, non_blocking=non_blocking)
        host = x.detach().cpu()
        # Kept alive for the whole copy (``copy.deepcopy``'s convention): the stager remembers
        # storages by id(), which a freed host copy's successor could take.
        memo.setdefault(id(memo), []).append(host)
        staged = offload(self, host, memo, non_blocking=non_blocking)
        memo[id(x)] = staged
        for name, value in program_attributes(x).items():
            setattr(staged, name, self.deepcopy_with_tensor_offload(value, memo, non_blocking=non_blocking))
        return staged

    offload_tensor._neuron = True  # type: ignore[attr-defined]
    stager._offload_tensor = offload_tensor


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs :func:`_staging_neuron_tensors` once the stager's module is loaded, whenever that is."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name != _MODULE:
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
        _staging_neuron_tensors(module)


def install() -> None:
    """Patch the stager now if it is loaded, else when it is (idempotent)."""
    if _MODULE in sys.modules:
        _staging_neuron_tensors(sys.modules[_MODULE])
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
