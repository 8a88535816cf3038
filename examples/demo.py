"""Demo: what the ``neuron`` backend is for, on this machine, in about a minute.

A TorchNeuron program runs here unchanged: a GPT-style transformer block goes through
``torch.compile(backend="neuron")`` (Dynamo → aot_autograd → torch-mlir → IREE, a NEFF in the
persistent cache), the same block serves from ``torch_neuronx.aot_compile`` without Dynamo at call
time, a serving loop over changing batch sizes compiles once, and eager ops run on the ``neuron``
device. Timings are measured as ``bench/`` measures them: torch with the same threads, warm-up,
competitors alternating in short rounds, medians; the printout says what each number means.
"""

from __future__ import annotations

import glob
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import config, observe
from torch_neuronx.compiler import CompileOptions, driver
from torch_neuronx.pipeline import artifacts

THREADS = min(2, os.cpu_count() or 1)  # as the benchmarks: torch and IREE get the same cores
ROUNDS = 9


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


def medians_us(competitors: dict, x: torch.Tensor, calls: int = 10) -> dict[str, float]:
    """Median µs per call of each competitor over ``ROUNDS`` rounds that alternate them."""
    for fn in competitors.values():  # warm-up
        for _ in range(3):
            fn(x)
    samples: dict[str, list[float]] = {name: [] for name in competitors}
    for _ in range(ROUNDS):
        for name, fn in competitors.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn(x)
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def _isa() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return "unknown ISA"
    return "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"


def compiled_block(model: Block, x: torch.Tensor) -> None:
    compiled = torch.compile(model, backend="neuron",
                             options=CompileOptions(preserve_artifacts=True, model_name="demo_block"))
    invocations = driver.invocations
    start = time.perf_counter()
    out = compiled(x)
    compile_s = time.perf_counter() - start
    cold = driver.invocations > invocations
    print(f"max |neuron - eager|      : {(out - model(x)).abs().max().item():.2e} (float32 rounding)")
    print(f"first call                : {compile_s:.2f} s, "
          f"{'cold: traced, lowered and compiled' if cold else 'warm: the NEFF came from the cache'} "
          "(run the demo again: the persistent cache serves it)")
    aot = torch_neuronx.aot_compile(model, (x,))
    times = medians_us({"eager": model, "neuron": compiled, "aot": aot}, x)
    print(f"per call, median of {ROUNDS}   : eager {times['eager']:.0f} us, torch.compile(neuron) "
          f"{times['neuron']:.0f} us ({times['neuron'] / times['eager']:.2f}x eager), "
          f"aot_compile {times['aot']:.0f} us ({times['aot'] / times['eager']:.2f}x)")
    print(f"                            {THREADS} threads on {_isa()}: IREE's generated matmuls lead oneDNN's "
          "on AVX-512 and trail them on AVX2-only CPUs")
    job = artifacts.job_dir()
    files = sorted(glob.glob(os.path.join(job, "*", "demo_block*")))
    print(f"artifacts of this run     : {job} ({len(files)} graph directories: FX, MLIR, NEFF)")
    print(f"NEFF cache                : {config.get('TORCH_NEURONX_NEFF_CACHE_DIR')}")


def serving_loop(model: Block) -> None:
    compiled = torch.compile(model, backend="neuron")
    before = observe.counter("compiled_graphs")
    batches = (1, 3, 2, 5, 4, 7, 6, 8)
    for batch in batches:  # only the batch changes (the block above ran at this sequence length)
        compiled(torch.randn(batch, 64, 256))
    graphs = observe.counter("compiled_graphs") - before  # a dynamic graph counts there too
    why = ("Dynamo's first, static one, then one NEFF for every later size" if graphs <= 2 else
           "one NEFF per size: TORCH_NEURONX_LOG_LEVEL=2 says why the dynamic one was not made")
    print(f"serving loop, batch sizes {list(batches)}: {graphs} graphs compiled ({why})")


def eager_device() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data, target = torch.randn(32, 64, device="neuron"), torch.randint(0, 10, (32,)).to("neuron")
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"eager training on {data.device}: losses {' '.join(f'{v:.3f}' for v in losses)} "
          "(ops queued on a stream, kernels compiled once per op family)")


def main() -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        compiled_block(model, torch.randn(8, 64, 256))
        serving_loop(model)
    eager_device()


if __name__ == "__main__":
    main()
