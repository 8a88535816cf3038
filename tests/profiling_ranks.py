"""Run under torchrun by tests/test_profiling_ranks.py: each rank profiles a few eager ops.

The profile goes to TORCH_NEURONX_PROFILE_OUTPUT_DIR; only ranks listed in
TORCH_NEURONX_PROFILE_RANKS write one. No collectives: the ranks never talk to each other.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import torch_neuronx  # noqa: F401  (also loaded by torch's entry point)
from torch_neuronx.profiling import NeuronProfiler


def main() -> None:
    handler = NeuronProfiler()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], on_trace_ready=handler.export_trace):
        x = torch.randn(8, 8, device="neuron")
        (x * 2).cpu()
    print("exported", handler.exported, flush=True)


if __name__ == "__main__":
    main()
