"""Cold vs warm start of the demo's transformer block: neuron next to inductor, in one run.

Each measurement is a fresh process. "cold" starts from empty caches, "warm"
from the caches the cold run left. Reported per backend: time to first result
(process start to the first output, imports included), the first call alone,
and for neuron the compiler invocations of the warm process (must be 0). The
first call of ``backend="eager"`` (Dynamo tracing only) is the floor: what a
warm neuron start adds on top of it is the backend's own per-graph overhead.

Usage: ``python bench/warm_start.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")

CHILD = """
import time
start = time.perf_counter()
import json, sys, torch
sys.path.insert(0, {examples!r})
from demo import Block
torch.set_num_threads(2)
torch.manual_seed(0)
model, x = Block().eval(), torch.randn(8, 64, 256)
with torch.no_grad():
    model(x)  # eager warm-up: the first call below measures compilation, not first-touch costs
    compiled = torch.compile(model, backend={backend!r})
    t = time.perf_counter()
    compiled(x)
    first_call = time.perf_counter() - t
invocations = None
if {backend!r} == "neuron":
    from torch_neuronx.compiler import driver
    invocations = driver.invocations
print(json.dumps({{"first_result": time.perf_counter() - start, "first_call": first_call,
                  "invocations": invocations}}))
"""


def child(backend: str, cache_root: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_root, "inductor"),
           "TORCH_NEURONX_NEFF_CACHE_DIR": os.path.join(cache_root, "neff"),
           "TORCH_NEURONX_HLO_CACHE_DIR": os.path.join(cache_root, "hlo"),
           "TORCH_NEURONX_DEBUG_DIR": os.path.join(cache_root, "debug"),
           "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": os.path.join(cache_root, "local")}
    code = CHILD.format(examples=EXAMPLES, backend=backend)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="warm runs per backend (median reported)")
    args = parser.parse_args()
    rows = {}
    floor = []
    with tempfile.TemporaryDirectory() as root:
        for backend in ("neuron", "inductor"):
            cache = os.path.join(root, backend)
            cold = child(backend, cache)
            warm = [child(backend, cache) for _ in range(args.repeat)]
            floor.append(child("eager", cache)["first_call"])
            rows[backend] = (cold, warm)
    dynamo_only = statistics.median(floor)

    def med(runs: list[dict], field: str) -> float:
        return statistics.median(r[field] for r in runs)

    print("time to first result of the transformer block, s (fresh process each; median of warm runs)")
    print("| backend | cold first result | warm first result | cold first call | warm first call | "
          "warm compiler invocations |")
    print("| --- | --- | --- | --- | --- | --- |")
    for backend, (cold, warm) in rows.items():
        inv = warm[-1]["invocations"]
        print(f"| {backend} | {cold['first_result']:.2f} | {med(warm, 'first_result'):.2f} | "
              f"{cold['first_call']:.2f} | {med(warm, 'first_call'):.2f} | {'-' if inv is None else inv} |")
    neuron_warm = med(rows["neuron"][1], "first_call")
    inductor_warm = med(rows["inductor"][1], "first_call")
    print(f"\nDynamo tracing alone (backend='eager' first call): {dynamo_only * 1e3:.0f} ms")
    print(f"warm per-graph overhead beyond Dynamo tracing: neuron {(neuron_warm - dynamo_only) * 1e3:.0f} ms, "
          f"inductor {(inductor_warm - dynamo_only) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
