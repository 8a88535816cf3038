"""The ``cuda`` target on a real GPU: NEFFs cross-compiled here, run there, checked against the CPU's.

``prepare OUT`` (on any host, with the project installed): compiles a few models and eager ops
twice, in two fresh processes with the same program, once for the ``cpu`` target (run here)
and once for ``cuda`` (compile only: no GPU needed); pairs the NEFFs by graph name and
signature, draws seeded inputs for each, runs the ``cpu`` NEFF on them (the expected results)
and writes ``OUT/cases.pt`` and the ``cuda`` NEFFs under ``OUT/neffs``.

``check OUT`` (on a host with an NVIDIA GPU, the IREE runtime and this package): runs each
``cuda`` NEFF through ``torch_neuronx.runtime.executable.Executable`` on the ``cuda`` driver
(inputs copied to device memory, results back: ``runtime/transfer.py``), compares with the
expected results and prints a table with the per-call time (median of 20 calls, copies
included). Exits 1 if any result differs.

``nccl`` (on a GPU host): an all_reduce over NCCL with 1 and with 2 ranks on the first GPU,
reporting what NCCL says (a host with one GPU cannot give two ranks their own).

Usage: ``python bench/cuda_target.py prepare /tmp/cudacheck``; on the GPU host
``python bench/cuda_target.py check /tmp/cudacheck`` and ``python bench/cuda_target.py nccl``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

_MODELS = ("mlp", "block", "cnn", "mlp_train", "eager")


def _models() -> None:
    """Run the programs whose graphs are checked (under the target of the environment)."""
    import torch_neuronx  # noqa: F401  (registers the backend and the device)
    from torch_neuronx.compiler import compile_only

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
    block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8).eval(),
                              torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10))
    only = compile_only() if os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") == "cuda" else contextlib.nullcontext()
    with only:
        with torch.no_grad():
            torch.compile(mlp, backend="neuron")(torch.randn(32, 64))
            torch.compile(block, backend="neuron")(torch.randn(2, 16, 64))
            torch.compile(cnn, backend="neuron")(torch.randn(4, 3, 16, 16))
            torch.compile(lambda a, b: (a @ b).to(torch.bfloat16).softmax(-1), backend="neuron")(
                torch.randn(8, 32), torch.randn(32, 16))
        train = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        step = torch.compile(lambda x, y: torch.nn.functional.mse_loss(train(x), y), backend="neuron")
        step(torch.randn(8, 16), torch.randn(8, 1)).backward()
        x = torch.randn(6, 10, device="neuron")
        ((x * 2.5 + 1).relu().sum(0), x.to(torch.bfloat16).exp(), (x > 0).any(1))


def _compile(target: str, cache: str) -> None:
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=cache, NEURON_PLATFORM_TARGET_OVERRIDE=target,
               PYTHONHASHSEED="0")
    subprocess.run([sys.executable, __file__, "_models"], env=env, check=True)


def _key(header: object) -> tuple:
    sig = header.signature
    return (header.metadata.get("graph", ""),
            tuple((i["dtype"], tuple(i["shape"])) for i in sig.get("inputs", ())),
            tuple((o["dtype"], tuple(o["shape"])) for o in sig.get("outputs", ())))


def _inputs(header: object, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for spec in header.signature.get("inputs", ()):
        dtype = getattr(torch, spec["dtype"])
        shape = tuple(spec["shape"])
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.rand(shape, generator=g) > 0.5)
        else:
            out.append(torch.randint(0, 4, shape, generator=g).to(dtype))
    return out


def _run(executable: object, header: object, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    if header.signature.get("output_storage"):
        outputs = [torch.empty(tuple(o["shape"]), dtype=getattr(torch, o["dtype"]))
                   for o in header.signature["outputs"]]
        executable.run_into(inputs, outputs)
        return outputs
    return executable(inputs)


def prepare(out: str, target: str = "cuda") -> None:
    """Compile the programs for both targets and write the cases (see the module's docstring)."""
    import torch_neuronx  # noqa: F401
    from torch_neuronx.format import neff
    from torch_neuronx.runtime.executable import Executable

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "neffs"))
    for name in ("cpu", target):
        _compile(name, os.path.join(out, "cache", "device" if name == target else name))
    cpu = {_key(neff.load(p).header): p
           for p in glob.glob(os.path.join(out, "cache", "cpu", "**", "*.neff"), recursive=True)}
    cases = []
    for i, path in enumerate(sorted(glob.glob(os.path.join(out, "cache", "device", "**", "*.neff"), recursive=True))):
        header = neff.load(path).header
        twin = cpu.get(_key(header))
        if twin is None:
            print(f"no cpu twin for {header.metadata.get('graph')}: skipped")
            continue
        inputs = _inputs(header, i)
        expected = _run(Executable(neff.load(twin), "local-sync"), neff.load(twin).header, inputs)
        name = f"{i:02d}_{header.metadata.get('graph', 'graph')}.neff"
        shutil.copy(path, os.path.join(out, "neffs", name))
        cases.append({"neff": name, "inputs": inputs, "expected": [e.clone() for e in expected]})
    torch.save(cases, os.path.join(out, "cases.pt"))
    shutil.rmtree(os.path.join(out, "cache"))
    print(f"{len(cases)} cases in {out}")


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    tol = 2e-2 if want.dtype in (torch.bfloat16, torch.float16) else 2e-4
    return torch.allclose(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True)


def _runtime_layer_alone() -> None:
    """Make ``torch_neuronx.runtime`` importable without the package root, which registers the
    device and imports every layer (on a host whose torch is not the pinned one, the compiler's
    imports can fail; the runtime layer needs only config, format, observe and memory)."""
    import types

    package = types.ModuleType("torch_neuronx")
    package.__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_neuronx")]
    sys.modules.setdefault("torch_neuronx", package)


def check(out: str, driver: str = "cuda", runtime_only: bool = False) -> int:
    """Run every case's ``cuda`` NEFF on the GPU and compare (see the module's docstring)."""
    if runtime_only:
        _runtime_layer_alone()
    from torch_neuronx.format import neff
    from torch_neuronx.runtime.executable import Executable

    cases = torch.load(os.path.join(out, "cases.pt"))
    failed = 0
    print(f"{'graph':44} {'outputs':>7} {'result':>8} {'max |diff|':>11} {'per call':>10}")
    for case in cases:
        module = neff.load(os.path.join(out, "neffs", case["neff"]))
        try:
            executable = Executable(module, driver)
            got = _run(executable, module.header, case["inputs"])
            times = []
            for _ in range(20):
                start = time.perf_counter()
                _run(executable, module.header, case["inputs"])
                times.append(time.perf_counter() - start)
        except Exception as exc:  # a report, not a crash: every case runs
            failed += 1
            print(f"{case['neff']:44} {'':>7} {'ERROR':>8} {type(exc).__name__}: {str(exc)[:300]}")
            continue
        ok = len(got) == len(case["expected"]) and all(map(_close, got, case["expected"]))
        diff = max((float((g.double() - e.double()).abs().max()) if e.numel() and g.shape == e.shape else 0.0)
                   for g, e in zip(got, case["expected"])) if got else 0.0
        failed += not ok
        print(f"{case['neff']:44} {len(got):>7} {'ok' if ok else 'WRONG':>8} {diff:>11.3g} "
              f"{statistics.median(times) * 1e6:>8.0f} us")
    print(f"{len(cases) - failed} of {len(cases)} correct on the {driver} driver")
    return 1 if failed else 0


def _nccl_rank(rank: int, world: int, port: int, queue: object) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", 0),
                                timeout=datetime.timedelta(seconds=60))
        t = torch.full((4,), float(rank + 1), device="cuda:0")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        queue.put((rank, "ok", t.tolist()))
        dist.destroy_process_group()
    except Exception as exc:  # reported by the parent
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}"[:500]))


def nccl() -> None:
    """NCCL on this host's first GPU with 1 and 2 ranks (2 ranks share the GPU: can NCCL do that?)."""
    import multiprocessing
    import queue as queues

    context = multiprocessing.get_context("spawn")
    for world in (1, 2):
        results: queues.Queue = context.Queue()
        procs = [context.Process(target=_nccl_rank, args=(r, world, 29611 + world, results)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=150)
            if p.is_alive():
                p.kill()
        seen = []
        while True:
            try:
                seen.append(results.get(timeout=1))
            except queues.Empty:
                break
        print(f"NCCL, {world} rank(s) on cuda:0: {sorted(seen) or 'no result (hung, killed)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("prepare", "check", "nccl", "_models"))
    parser.add_argument("out", nargs="?", default="/tmp/cudacheck")
    parser.add_argument("--target", default="cuda", help="prepare: the target checked (another one tests this script)")
    parser.add_argument("--driver", default="cuda", help="check: the runtime driver that runs the NEFFs")
    parser.add_argument("--runtime-only", action="store_true",
                        help="check: import the runtime layer alone (a host whose torch is not the pinned one)")
    args = parser.parse_args()
    if args.command == "_models":
        _models()
    elif args.command == "prepare":
        prepare(args.out, args.target)
    elif args.command == "nccl":
        nccl()
    else:
        sys.exit(check(args.out, args.driver, args.runtime_only))


if __name__ == "__main__":
    main()
