"""DDP and FSDP2 (``fully_shard``) training on the ``neuron`` backend under torchrun: a few AdamW
steps of a tiny MLP, eager and under ``torch.compile(backend="neuron")``, end with the parameters
of the same MLP trained in one process on the CPU; FSDP2's reshard frees device memory after each
layer's forward (``tests/distributed_training.py`` does the checks on every rank)."""

from __future__ import annotations

import pytest
from test_distributed import _done, torchrun

from torch_neuronx.device import native


@pytest.mark.parametrize("mode, how, nproc", [
    ("ddp", "eager", 2),
    ("ddp", "compiled_inside", 2),  # DDP(torch.compile(model)): what compiles a torch.nn model's forward
    ("ddp_device_ids", "compiled", 2),  # DDP(device_ids=[current device]): inputs copied on a side stream
    ("ddp_buckets", "compiled", 2),  # small buckets: Dynamo's DDPOptimizer compiles the graph in pieces
    pytest.param("ddp_unused", "eager", 2,  # find_unused_parameters, then static_graph: pinned host memory
                 marks=pytest.mark.skipif(native.library() is None, reason=f"no native hooks: {native.failure()}")),
    pytest.param("fsdp2", "eager", 2, marks=pytest.mark.slow),  # CI time: fsdp2 compiled stays
    ("fsdp2", "compiled", 2),
    pytest.param("ddp_device_ids", "eager", 4, marks=pytest.mark.slow),  # 4 ranks on 2 cores: CI's slow step
    pytest.param("fsdp2", "eager", 4, marks=pytest.mark.slow),
])
def test_training_matches_one_process_on_the_cpu(mode, how, nproc):
    _done(torchrun("distributed_training.py", mode, how, nproc=nproc, timeout=300), nproc)
