"""Benchmark of the eager ``neuron`` device against torch's CPU eager mode, side by side in one run.

Measures the targets of the eager-device issue:

- warm dispatch of a small op (add of 32x64): the time to return to Python (the op is queued)
  and the time to completion, against torch CPU eager's add in the same process;
- a chain of 1000 small ops: time to return to Python and time to completion;
- a two-layer MLP training step (SGD) on ``neuron`` against the same step on the CPU, in fresh
  processes: cold caches (kernels compiled, compile time) and warm caches (the same caches
  reused: compiles left and the time the first step still spends on them);
- one kernel per op family (TORCH_NEURONX_EAGER_DYNAMIC_SHAPES): a training run whose batch size
  and sequence length change every step, with dynamic-shape kernels against one kernel per
  shape (kernels compiled, total time; fresh processes, cold caches), and the per-call cost of a
  dynamic kernel against the static kernel of the same op and shape.

Rounds alternate the competitors; figures are medians. Usage: ``python bench/eager.py [--quick]``.
Threads: torch gets 2 threads (this machine's cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

THREADS = min(2, os.cpu_count() or 1)


def _per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def small_op(rounds: int) -> dict[str, float]:
    """µs per add of 32x64: CPU eager, neuron to return, neuron to completion."""
    import torch_neuronx  # noqa: F401

    x = torch.randn(32, 64)
    nx = x.to("neuron")
    for _ in range(50):
        x + x
        nx + nx
    torch.neuron.synchronize()
    cpu, queued, complete = [], [], []
    n = 200
    for _ in range(rounds):
        cpu.append(_per_call(lambda: x + x, n))
        start = time.perf_counter()
        for _ in range(n):
            nx + nx
        returned = time.perf_counter()
        torch.neuron.synchronize()
        done = time.perf_counter()
        queued.append((returned - start) / n * 1e6)
        complete.append((done - start) / n * 1e6)
    return {"cpu": statistics.median(cpu), "queued": statistics.median(queued),
            "complete": statistics.median(complete)}


class _Bare(torch.Tensor):
    """The floor of any Python device: a wrapper subclass whose ``__torch_dispatch__`` returns a
    new wrapper at once (no key, no allocation, no kernel)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> _Bare:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device="meta")

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return _Bare(args[0].inner)

    __torch_function__ = torch._C._disabled_torch_function_impl


def python_floor(rounds: int) -> float:
    """µs per add of 32x64 through a bare wrapper subclass (see :class:`_Bare`)."""
    bare = _Bare(torch.randn(32, 64))
    for _ in range(200):
        bare + bare
    return statistics.median(_per_call(lambda: bare + bare, 2000) for _ in range(rounds))


def chain(rounds: int, length: int = 1000) -> dict[str, float]:
    """ms for ``length`` dependent small ops (x = x * 0.5 + 1): to return, to completion, CPU eager."""
    x0 = torch.randn(32, 64)
    nx0 = x0.to("neuron")
    y = nx0
    for _ in range(5):
        y = y * 0.5 + 1
    y.cpu()
    returned, complete, cpu = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        y = x0
        for _ in range(length // 2):
            y = y * 0.5 + 1
        cpu.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        y = nx0
        for _ in range(length // 2):
            y = y * 0.5 + 1
        back = time.perf_counter()
        y.cpu()
        done = time.perf_counter()
        returned.append((back - start) * 1e3)
        complete.append((done - start) * 1e3)
    return {"cpu": statistics.median(cpu), "returned": statistics.median(returned),
            "complete": statistics.median(complete)}


_TRAIN = """
import json, sys, time, torch
torch.set_num_threads({threads})
device = sys.argv[1]
if device == "neuron":
    import torch_neuronx
    from torch_neuronx import observe
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data, target = torch.randn(32, 64).to(device), torch.randint(0, 10, (32,)).to(device)
steps = []
for _ in range({steps}):
    start = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(data), target)
    loss.backward()
    opt.step()
    loss.item()
    steps.append(time.perf_counter() - start)
counts = observe.counters() if device == "neuron" else {{}}
print(json.dumps({{"first": steps[0], "steady": sorted(steps[1:])[len(steps[1:]) // 2],
                  "compiled": counts.get("eager_ops_compiled", 0), "hlo_hits": counts.get("eager_hlo_cache_hits", 0)}}))
"""


def training(steps: int) -> dict[str, dict]:
    """The MLP step on the CPU, and on neuron with cold then warm caches, each in a fresh process."""
    script = _TRAIN.format(threads=THREADS, steps=steps)
    with tempfile.TemporaryDirectory(prefix="bench-eager-") as root:
        env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": os.path.join(root, "neff"),
               "TORCH_NEURONX_HLO_CACHE_DIR": os.path.join(root, "hlo"),
               "TORCH_NEURONX_DEBUG_DIR": os.path.join(root, "debug")}
        results = {}
        for name, device in (("cpu", "cpu"), ("neuron cold", "neuron"), ("neuron warm", "neuron")):
            done = subprocess.run([sys.executable, "-c", script, device], env=env, capture_output=True, text=True,
                                  timeout=1800)
            if done.returncode:
                raise RuntimeError(f"{name} training failed:\n{done.stderr[-2000:]}")
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


_VARYING = """
import json, random, sys, time, torch
torch.set_num_threads({threads})
import torch_neuronx
from torch_neuronx import observe
torch.manual_seed(0)
random.seed(0)
embed, hidden, vocab = torch.nn.Embedding(100, 48), torch.nn.Linear(48, 96), torch.nn.Linear(96, 100)
norm = torch.nn.LayerNorm(96)
params = [p for m in (embed, hidden, vocab, norm) for p in m.parameters()]
for m in (embed, hidden, vocab, norm):
    m.to("neuron")
opt = torch.optim.AdamW([p for m in (embed, hidden, vocab, norm) for p in m.parameters()], lr=1e-3)
start = time.perf_counter()
for step in range({steps}):
    batch, seq = random.randint(2, 12), random.randint(5, 40)
    tokens = torch.randint(0, 100, (batch, seq)).to("neuron")
    opt.zero_grad()
    h = norm(torch.nn.functional.gelu(hidden(embed(tokens))))
    loss = torch.nn.functional.cross_entropy(vocab(h).flatten(0, 1), tokens.flatten())
    loss.backward()
    opt.step()
    loss.item()
print(json.dumps({{"seconds": time.perf_counter() - start,
                  "compiled": observe.counters().get("eager_ops_compiled", 0)}}))
"""


def recurrent_training(steps: int) -> dict[str, float]:
    """Steady-state training step (ms, median) of a 2-layer LSTM + Linear with Adam, CPU and neuron."""
    results = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True).to(device)
        head = torch.nn.Linear(64, 10).to(device)
        opt = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=1e-3)
        x, y = torch.randn(8, 20, 32).to(device), torch.randint(0, 10, (8,)).to(device)
        times = []
        for _ in range(steps + 3):  # the first calls compile (and the first takes the composite)
            start = time.perf_counter()
            out, _ = lstm(x)
            loss = torch.nn.functional.cross_entropy(head(out[:, -1]), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            times.append(time.perf_counter() - start)
        results[device] = statistics.median(times[3:]) * 1e3
    return results


def varying_shapes(steps: int) -> dict[str, dict]:
    """A training run with a new batch size and sequence length every step, dynamic-shape kernels
    against one kernel per shape, each in a fresh process with cold caches."""
    script = _VARYING.format(threads=THREADS, steps=steps)
    results = {}
    for name, dynamic in (("static", "0"), ("dynamic", "1")):
        with tempfile.TemporaryDirectory(prefix="bench-eager-") as root:
            env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": os.path.join(root, "neff"),
                   "TORCH_NEURONX_HLO_CACHE_DIR": os.path.join(root, "hlo"),
                   "TORCH_NEURONX_DEBUG_DIR": os.path.join(root, "debug"),
                   "TORCH_NEURONX_EAGER_DYNAMIC_SHAPES": dynamic}
            done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                  timeout=3600)
            if done.returncode:
                raise RuntimeError(f"{name} run failed:\n{done.stderr[-2000:]}")
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def dynamic_call_cost(rounds: int) -> list[tuple[str, float, float]]:
    """µs per call to completion of ops run by their static kernel and by their dynamic one (made
    first: a family's dynamic kernel comes with its second shape, and serves shapes it has not seen)."""
    from torch_neuronx import config
    from torch_neuronx.device import choice

    # Measure the dynamic kernel itself, not the kernel a hot shape gets.
    promote_after, choice.PROMOTE_AFTER_S = choice.PROMOTE_AFTER_S, float(1 << 30)
    cases = [("add 32x64", lambda a, b: a + b, (32, 64), (32, 64)),
             ("mm 256x256", torch.mm, (256, 256), (256, 256)),
             ("softmax 64x1024", lambda a, b: torch.softmax(a, -1), (64, 1024), (1,))]
    rows = []
    for name, fn, left, right in cases:
        a, b = torch.randn(left).to("neuron"), torch.randn(right).to("neuron")
        for scale in (3, 5):  # two other shapes: the family's dynamic kernel
            other = [max(2, d * scale // 4) if d > 1 else d for d in left]
            fn(torch.randn(other).to("neuron"), torch.randn(other if right == left else right).to("neuron"))
        times = {}
        for dynamic in (True, False):
            with config.override(TORCH_NEURONX_EAGER_DYNAMIC_SHAPES=dynamic):
                for _ in range(20):
                    fn(a, b)
                torch.neuron.synchronize()
                samples = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    for _ in range(50):
                        fn(a, b)
                    torch.neuron.synchronize()
                    samples.append((time.perf_counter() - start) / 50 * 1e6)
                times[dynamic] = statistics.median(samples)
        rows.append((name, times[False], times[True]))
    choice.PROMOTE_AFTER_S = promote_after
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    rounds = 5 if args.quick else 15
    op = small_op(rounds)
    print("| measure | torch CPU eager | neuron | neuron / CPU |\n| --- | --- | --- | --- |")
    print(f"| add 32x64, µs to return | {op['cpu']:.1f} | {op['queued']:.1f} | {op['queued'] / op['cpu']:.1f} |")
    print(f"| add 32x64, µs to completion | {op['cpu']:.1f} | {op['complete']:.1f} | "
          f"{op['complete'] / op['cpu']:.1f} |")
    floor = python_floor(rounds)
    print(f"| add 32x64 through a bare Python wrapper subclass (the floor), µs | {op['cpu']:.1f} | "
          f"{floor:.1f} | {floor / op['cpu']:.1f} |")
    ch = chain(max(3, rounds // 3))
    print(f"| 1000 ops, ms to return | {ch['cpu']:.2f} | {ch['returned']:.2f} | {ch['returned'] / ch['cpu']:.1f} |")
    print(f"| 1000 ops, ms to completion | {ch['cpu']:.2f} | {ch['complete']:.2f} | "
          f"{ch['complete'] / ch['cpu']:.1f} |")
    train = training(6 if args.quick else 20)
    cpu = train["cpu"]
    for name in ("neuron cold", "neuron warm"):
        r = train[name]
        print(f"| MLP step, {name}: first step s (kernels compiled, HLO hits) | {cpu['first']:.3f} | "
              f"{r['first']:.3f} ({r['compiled']}, {r['hlo_hits']}) | {r['first'] / cpu['first']:.0f} |")
    warm = train["neuron warm"]
    print(f"| MLP step, steady state, ms | {cpu['steady'] * 1e3:.2f} | {warm['steady'] * 1e3:.2f} | "
          f"{warm['steady'] / cpu['steady']:.1f} |")
    rnn = recurrent_training(5 if args.quick else 15)
    print(f"| LSTM 2x64 (8x20x32) + Linear, Adam step, steady state, ms | {rnn['cpu']:.2f} | {rnn['neuron']:.2f} | "
          f"{rnn['neuron'] / rnn['cpu']:.1f} |")
    print("\n| one kernel per op family | kernel per shape | dynamic kernels | dynamic / per shape |\n"
          "| --- | --- | --- | --- |")
    steps = 6 if args.quick else 12
    varying = varying_shapes(steps)
    per_shape, dynamic = varying["static"], varying["dynamic"]
    print(f"| {steps} training steps, new batch and sequence length each: kernels compiled | "
          f"{per_shape['compiled']} | {dynamic['compiled']} | {dynamic['compiled'] / per_shape['compiled']:.2f} |")
    print(f"| the same run, s (cold caches) | {per_shape['seconds']:.1f} | {dynamic['seconds']:.1f} | "
          f"{dynamic['seconds'] / per_shape['seconds']:.2f} |")
    for name, static_us, dynamic_us in dynamic_call_cost(rounds):
        print(f"| {name}, µs per call to completion | {static_us:.1f} | {dynamic_us:.1f} | "
              f"{dynamic_us / static_us:.2f} |")


if __name__ == "__main__":
    main()
