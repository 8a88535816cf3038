"""``torch.distributed.checkpoint.async_save`` of neuron tensors: staged to the host as CUDA's are.

DCP's stager copies a tensor subclass's ``__dict__`` onto the host copy it makes, deep-copying
each attribute: a neuron tensor's holds its device memory (``_allocation``, with a lock), and
``async_save`` of any neuron state_dict failed with "cannot pickle '_thread.lock' object". A
neuron tensor is staged as its host copy, with the attributes the program set on it.

The stager's module costs 0.17 s to import, which ``import torch_neuronx`` must not pay: it is
patched when a program imports it (:mod:`torch_neuronx.imports`).
"""

from __future__ import annotations

from typing import Any

from torch_neuronx import imports as after_import

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


def install() -> None:
    """Patch the stager now if it is loaded, else when it is (idempotent)."""
    after_import.when_imported(_MODULE, _staging_neuron_tensors)
