"""Benchmark of the torch.compile path: neuron vs torch eager vs inductor vs the raw IREE call.

One run; competitors alternate in short rounds and ratios are medians of
per-round ratios. Measures the targets of the compile-path issue:

- per-call latency of a compiled MLP at batch 32 (and the same module called
  through IREE's Python API directly: DLPack in, ``VmContext.invoke``, DLPack out),
  next to the "Dynamo floor": the model compiled with a backend that computes nothing;
- per-call latency of a transformer block;
- cold compile time of the transformer block (each competitor in a fresh
  process with empty caches);
- throughput of four 2048-wide fp32 linears at batch 256;
- per-call latency and training step of a small recurrent model (GRU + Linear), which
  Dynamo leaves to eager (the target: no slower than inductor);
- beyond the targets, the per-step time of a training step of the small MLP and
  of the transformer block, and the per-call time of both on ``neuron`` tensors.

Usage: ``python bench/compile.py [--quick] [--isa avx2]``. ``--isa avx2`` limits every
competitor to AVX2 on a wider host (bench/common.py: the neuron backend compiles for
x86-64-v3; oneDNN, MKL, ATen and inductor's C++ stop at AVX2). Threads: torch gets 2 threads
(this machine's cores); IREE's local-task executor uses its own workers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from copy import deepcopy

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from demo import Block  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import EMULATED_ISA_ENV, emulate_isa, isa_line  # noqa: E402  (bench/common.py)

THREADS = min(2, os.cpu_count() or 1)


def mlp(width: int, hidden: int, batch: int = 32) -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))
    return model.eval(), torch.randn(batch, width)


def big_mlp() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)]).eval(), torch.randn(256, 2048)


def block() -> tuple[nn.Module, torch.Tensor]:
    return Block().eval(), torch.randn(8, 64, 256)


class Recurrent(nn.Module):
    """Issue 20's recurrent model: GRU(8, 16) over 10 steps, then a Linear on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.fc = nn.GRU(8, 16, batch_first=True), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


def recurrent() -> tuple[nn.Module, torch.Tensor]:
    return Recurrent().eval(), torch.randn(4, 10, 8)


ROUNDS = 15


def _calls_per_batch(fn, x, seconds: float) -> int:
    """How many calls of ``fn`` take about ``seconds`` (at least 3)."""
    fn(x)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or n < 3:
        fn(x)
        n += 1
    return max(3, int(n * seconds / (time.perf_counter() - start)))


def interleaved_us(competitors: dict, x, seconds: float) -> dict[str, list[float]]:
    """Per-call times of every competitor, in ``ROUNDS`` rounds that each time every competitor once.

    Rounds are short and alternate competitors, so the drift of a noisy machine hits them
    alike; ratios are then taken round by round (:func:`paired_ratio`).
    """
    batch = seconds / ROUNDS / len(competitors)
    reps = {label: _calls_per_batch(fn, x, batch) for label, fn in competitors.items()}
    samples: dict[str, list[float]] = {label: [] for label in competitors}
    for _ in range(ROUNDS):
        for label, fn in competitors.items():
            t = time.perf_counter()
            for _ in range(reps[label]):
                fn(x)
            samples[label].append((time.perf_counter() - t) / reps[label] * 1e6)
    return samples


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a/b."""
    return statistics.median(x / y for x, y in zip(a, b))


def raw_iree_call(compiled_graph, inputs: list[torch.Tensor]) -> object:
    """The IREE Python API on the very NEFF payload the backend runs: DLPack in, invoke, DLPack out.

    Resident parameters (see torch_neuronx/compiler/resident.py) are bound once, as the
    backend binds them; each call passes the other inputs.
    """
    import iree.runtime as rt
    from torch.utils import dlpack

    exe = compiled_graph._executable
    device, function = exe.device.hal, exe._function
    context = exe.bind(inputs) if exe._resident else exe._context
    arguments = [t for i, t in enumerate(inputs) if i not in exe._resident]
    n_out = len(exe.neff.header.signature["outputs"])

    def call() -> list[torch.Tensor]:
        args = rt.VmVariantList(len(arguments))
        for t in arguments:
            args.push_ref(device.from_dlpack_capsule(dlpack.to_dlpack(t)))
        results = rt.VmVariantList(n_out)
        context.invoke(function, args, results)
        return [torch.from_dlpack(device.create_dlpack_capsule(results.get_as_object(i, rt.HalBufferView), 1, 0))
                for i in range(results.size)]

    return call


def last_compiled_graph():
    import gc

    from torch_neuronx.pipeline.graph import CompiledGraph

    found = None
    for obj in gc.get_objects():
        try:
            if type(obj) is CompiledGraph and obj._executable is not None:
                found = obj
        except ReferenceError:
            continue
    return found


def dynamo_floor(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """``model`` compiled with a backend that computes nothing: what Dynamo alone costs per call."""
    outputs = model(x)
    return torch.compile(model, backend=lambda gm, example_inputs: lambda *args: outputs)


def per_call_row(name: str, model: nn.Module, x: torch.Tensor, seconds: float, raw: bool) -> dict:
    torch._dynamo.reset()
    neuron = torch.compile(model, backend="neuron")
    inductor = torch.compile(model)
    with torch.no_grad():
        neuron(x)
        inductor(x)
        floor = dynamo_floor(model, x)
        floor(x)
        competitors = {"eager": model, "inductor": inductor, "neuron": neuron, "floor": floor}
        if raw:
            graph = last_compiled_graph()
            order = graph._executable.neff.header.signature["inputs"]
            # aot_autograd's input order: parameters in the order the graph uses them, then x.
            call = raw_iree_call(graph, _match_inputs(order, [*model.parameters(), x]))
            competitors["raw_iree"] = lambda _x: call()
        return _row(name, interleaved_us(competitors, x, seconds * len(competitors)))


def _row(name: str, samples: dict[str, list[float]]) -> dict:
    """A table row: the samples of every competitor and, under its label, their median."""
    return {"name": name, "samples": samples, **{label: statistics.median(v) for label, v in samples.items()}}


def train_step_row(name: str, model: nn.Module, x: torch.Tensor, seconds: float) -> dict:
    """Per-step time of a training step (zero_grad, forward, loss, backward, SGD step) per competitor.

    Each competitor trains its own copy of ``model``; only the model is compiled (the loss
    and the optimizer run eagerly for all three).
    """
    torch._dynamo.reset()

    def stepper(backend: str | None):
        copy = deepcopy(model).train()
        forward = copy if backend is None else torch.compile(copy, backend=backend)
        optimizer = torch.optim.SGD(copy.parameters(), lr=1e-4)

        def step(batch: torch.Tensor) -> None:
            optimizer.zero_grad(set_to_none=True)
            forward(batch).square().mean().backward()
            optimizer.step()
        return step

    competitors = {"eager": stepper(None), "inductor": stepper("inductor"), "neuron": stepper("neuron")}
    for step in competitors.values():
        step(x)  # compile
    return _row(name, interleaved_us(competitors, x, seconds * len(competitors)))


def device_tensor_row(name: str, model: nn.Module, x: torch.Tensor, seconds: float) -> dict:
    """Per-call time of the neuron backend on host tensors and on ``neuron`` tensors (inference)."""
    import torch_neuronx  # noqa: F401  (the neuron device)

    torch._dynamo.reset()
    on_device, x_device = deepcopy(model).to("neuron"), x.to("neuron")
    host, device = torch.compile(model, backend="neuron"), torch.compile(on_device, backend="neuron")
    with torch.no_grad():
        host(x)
        device(x_device)
        competitors = {"host": host, "device": lambda _x: device(x_device)}
        return _row(name, interleaved_us(competitors, x, seconds * len(competitors)))


def _match_inputs(specs: list[dict], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    pool, out = list(tensors), []
    for spec in specs:
        for i, t in enumerate(pool):
            if list(t.shape) == spec["shape"]:
                out.append(pool.pop(i))
                break
    return out


_COLD = """
import os, sys, time, torch
sys.path.insert(0, {examples!r})
from demo import Block
torch.manual_seed(0)
torch.set_num_threads({threads})
model, x = Block().eval(), torch.randn(8, 64, 256)
backend = {backend!r}
compiled = torch.compile(model, backend=backend)
with torch.no_grad():
    t = time.perf_counter(); compiled(x); print(time.perf_counter() - t)
"""


def cold_compile_s(backend: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
               "TORCH_NEURONX_NEFF_CACHE_DIR": os.path.join(tmp, "neff"),
               "TORCH_NEURONX_HLO_CACHE_DIR": os.path.join(tmp, "hlo"),
               "TORCH_NEURONX_DEBUG_DIR": os.path.join(tmp, "debug"),
               "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": os.path.join(tmp, "local")}
        examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
        code = _COLD.format(examples=examples, threads=THREADS, backend=backend)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])


DYNAMIC_BATCHES = (8, 16, 24, 32, 48, 64, 96, 128)


def _graphs_compiled() -> int:
    from torch_neuronx import observe

    return observe.counter("compiled_graphs") + observe.counter("kernel_traces")


def dynamic_shapes_row(seconds: float) -> dict:
    """An inference loop over 8 batch sizes: graphs compiled with Dynamo's dynamic shapes (one NEFF
    for every size) against ``dynamic=False`` (one per size), and the per-call cost at batch 32 of
    the dynamic NEFF against the static one (and inductor's dynamic kernel)."""
    model, _ = mlp(64, 128)
    model.eval()
    counts = {}
    with torch.no_grad():
        for label, dynamic in (("static", False), ("dynamic", None)):
            torch._dynamo.reset()  # (both compile the model's forward: its cache and recompile limit)
            fn = torch.compile(model, backend="neuron", dynamic=dynamic)
            before = _graphs_compiled()
            for batch in DYNAMIC_BATCHES:
                fn(torch.randn(batch, 64))
            counts[label] = _graphs_compiled() - before
        # Other code objects than the model's forward: caches of their own. Each competitor is a
        # compiled function calling the model (a compiled module's own call path costs more).
        competitors = {"dynamic": torch.compile(lambda x: model(x), backend="neuron"),
                       "static": torch.compile(lambda x: model(x), backend="neuron", dynamic=False),
                       "inductor": torch.compile(lambda x: model(x), backend="inductor", dynamic=True)}
        for batch in DYNAMIC_BATCHES:  # the dynamic one goes dynamic at its second size
            competitors["dynamic"](torch.randn(batch, 64))
            competitors["inductor"](torch.randn(batch, 64))
        samples = interleaved_us(competitors, torch.randn(32, 64), seconds)
    return {"counts": counts, "samples": samples,
            **{label: statistics.median(v) for label, v in samples.items()}}


def gemm_ceiling_gflops(seconds: float) -> float:
    """The best float32 rate torch's GEMM (MKL) reaches here on the block's own matmul shapes, into
    preallocated outputs (no allocation, no other work), GFLOP/s: the practical ceiling of the
    block's arithmetic on this host at the current ISA limits."""
    best = 0.0
    for m, k, n in ((512, 256, 768), (512, 256, 1024), (512, 1024, 256)):
        a, b, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        samples = interleaved_us({"gemm": lambda _x, a=a, b=b, out=out: torch.mm(a, b, out=out)}, a,
                                 seconds / 3)["gemm"]
        best = max(best, 2 * m * k * n / min(samples) / 1e3)
    return best


def flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of one call of ``fn``, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def roofline_rows(per_call: dict, training: dict, ceiling: float) -> list[list[str]]:
    """The block's targets against the host's ceiling: the rate each target needs, as a share of it."""
    model, x = block()
    with torch.no_grad():
        forward = flops(lambda: model(x))
    train = deepcopy(model).train()
    step = flops(lambda: train(x).square().mean().backward())
    lines = []
    for label, count, row, target in (("forward", forward, per_call, 0.85), ("training step", step, training, 1.0)):
        budget_us = target * row["inductor"]
        lines.append([label, f"{count / 1e9:.3f}", f"{count / row['inductor'] / 1e3:.0f}",
                      f"{count / row['neuron'] / 1e3:.0f}", f"{target:.2f}x = {budget_us:.0f}",
                      f"{count / budget_us / 1e3:.0f}", f"{count / budget_us / 1e3 / ceiling:.0%}"])
    return lines


def _table(title: str, columns: list[str], lines: list[list[str]]) -> None:
    """Print a markdown table under ``title``."""
    print(f"\n{title}")
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for line in lines:
        print("| " + " | ".join(line) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings (noisier)")
    parser.add_argument("--isa", choices=sorted(EMULATED_ISA_ENV),
                        help="limit every competitor to this ISA (emulated on a wider host)")
    args = parser.parse_args()
    emulate_isa(args.isa)
    print(isa_line(args.isa))
    seconds = 0.5 if args.quick else 2.0
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)

    rows = [
        per_call_row("MLP 64-128-128-10, batch 32", *mlp(64, 128), seconds, raw=True),
        per_call_row("MLP 256-512-512-10, batch 32", *mlp(256, 512), seconds, raw=True),
        per_call_row("transformer block (8x64x256)", *block(), seconds, raw=False),
        per_call_row("4x Linear 2048, batch 256", *big_mlp(), seconds, raw=False),
        per_call_row("GRU 8-16 + Linear (4x10x8)", *recurrent(), seconds, raw=False),
    ]
    lines = []
    for r in rows:
        smp, raw = r["samples"], r.get("raw_iree")
        net = [n - f for n, f in zip(smp["neuron"], smp["floor"])]
        lines.append([r["name"], f"{r['eager']:.0f}", f"{r['inductor']:.0f}", f"{r['neuron']:.0f}",
                      f"{raw:.0f}" if raw else "-", f"{r['floor']:.0f}",
                      f"{paired_ratio(smp['neuron'], smp['eager']):.2f}",
                      f"{paired_ratio(smp['neuron'], smp['inductor']):.2f}",
                      f"{paired_ratio(smp['neuron'], smp['raw_iree']):.2f}" if raw else "-",
                      f"{paired_ratio(net, smp['raw_iree']):.2f}" if raw else "-"])
    _table(f"per-call latency, us (torch threads: {THREADS}; lower is better). Dynamo floor: the same\n"
           "model compiled with a backend that computes nothing (Dynamo's own cost per call).",
           ["workload", "eager", "inductor", "neuron", "raw IREE call", "Dynamo floor", "neuron/eager",
            "neuron/inductor", "neuron/raw", "(neuron-floor)/raw"], lines)

    training = [
        train_step_row("MLP 64-128-128-10, batch 32", *mlp(64, 128), seconds),
        train_step_row("transformer block (8x64x256)", *block(), seconds),
        train_step_row("GRU 8-16 + Linear (4x10x8)", *recurrent(), seconds),
    ]
    _table("training step (zero_grad, forward, loss, backward, SGD step), us per step",
           ["workload", "eager", "inductor", "neuron", "neuron/eager", "neuron/inductor"],
           [[r["name"], f"{r['eager']:.0f}", f"{r['inductor']:.0f}", f"{r['neuron']:.0f}",
             f"{paired_ratio(r['samples']['neuron'], r['samples']['eager']):.2f}",
             f"{paired_ratio(r['samples']['neuron'], r['samples']['inductor']):.2f}"] for r in training])

    on_device = [
        device_tensor_row("MLP 64-128-128-10, batch 32", *mlp(64, 128), seconds),
        device_tensor_row("transformer block (8x64x256)", *block(), seconds),
    ]
    _table("neuron backend on host tensors and on neuron tensors (model and input .to('neuron')), us per call",
           ["workload", "host tensors", "neuron tensors", "neuron/host"],
           [[r["name"], f"{r['host']:.0f}", f"{r['device']:.0f}",
             f"{paired_ratio(r['samples']['device'], r['samples']['host']):.2f}"] for r in on_device])

    dyn = dynamic_shapes_row(seconds)
    _table(f"dynamic shapes: MLP 64-128-128-10 inference over batches {list(DYNAMIC_BATCHES)}; graphs "
           "compiled, and us per call at batch 32",
           ["graphs compiled, dynamic", "graphs compiled, dynamic=False", "dynamic NEFF", "static NEFF",
            "inductor (dynamic)", "dynamic/static"],
           [[str(dyn["counts"]["dynamic"]), str(dyn["counts"]["static"]), f"{dyn['dynamic']:.0f}",
             f"{dyn['static']:.0f}", f"{dyn['inductor']:.0f}",
             f"{paired_ratio(dyn['samples']['dynamic'], dyn['samples']['static']):.2f}"]])

    ceiling = gemm_ceiling_gflops(seconds)
    _table(f"transformer block (8x64x256) against this host's ceiling: torch's GEMM on the block's shapes, "
           f"{ceiling:.0f} GFLOP/s\n"
           "(the rate a target needs: the block's FLOPs over the target's time; FLOPs by FlopCounterMode)",
           ["", "GFLOP", "inductor GFLOP/s", "neuron GFLOP/s", "target, us", "GFLOP/s needed", "share of ceiling"],
           roofline_rows(rows[2], training[1], ceiling))

    neuron_cold, inductor_cold = cold_compile_s("neuron"), cold_compile_s("inductor")
    _table("cold compile of the transformer block (fresh process, empty caches), s",
           ["neuron", "inductor", "neuron/inductor"],
           [[f"{neuron_cold:.2f}", f"{inductor_cold:.2f}", f"{neuron_cold / inductor_cold:.2f}"]])

if __name__ == "__main__":
    main()
