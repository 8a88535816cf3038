"""Demo: a transformer block through torch.compile(backend="neuron") on this machine.

Prints the error against eager PyTorch, the compile time (cold, or warm when the
NEFF cache already holds the block), the per-call time next to eager, and where
the artifacts and the cached NEFFs are.
"""

from __future__ import annotations

import glob
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_neuronx import config
from torch_neuronx.compiler import CompileOptions, driver
from torch_neuronx.pipeline import artifacts


class Block(nn.Module):
    """A GPT-style pre-norm transformer block with causal self-attention."""

    def __init__(self, dim: int = 256, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp(self.ln2(x))


def per_call_us(fn, x: torch.Tensor, iters: int = 50) -> float:
    for _ in range(5):
        fn(x)
    start = time.perf_counter()
    for _ in range(iters):
        fn(x)
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(8, 64, 256)
    compiled = torch.compile(model, backend="neuron",
                             options=CompileOptions(preserve_artifacts=True, model_name="demo_block"))
    with torch.no_grad():
        invocations = driver.invocations
        start = time.perf_counter()
        out = compiled(x)
        compile_s = time.perf_counter() - start
        cold = driver.invocations > invocations
        ref = model(x)
        print(f"max |neuron - eager|     : {(out - ref).abs().max().item():.3e}")
        print(f"compile (first call)     : {compile_s:.2f} s ({'cold: compiled' if cold else 'warm: NEFF cache hit'})")
        eager_us, neuron_us = per_call_us(model, x), per_call_us(compiled, x)
        print(f"per call                 : neuron {neuron_us:.0f} us, eager {eager_us:.0f} us")
    debug_dir = config.get("TORCH_NEURONX_DEBUG_DIR")
    job = artifacts.job_dir()  # this process's job directory
    files = sorted(glob.glob(os.path.join(job, "*", "demo_block*")))
    print(f"artifacts                : {job}")
    for path in files:
        print(f"                           {os.path.relpath(path, debug_dir)}")
    print(f"NEFF cache               : {config.get('TORCH_NEURONX_NEFF_CACHE_DIR')}")


if __name__ == "__main__":
    main()
