"""Compilation targets: what each NEURON_PLATFORM_TARGET_OVERRIDE value compiles for.

A target names the compiler backend and flags and the runtime driver that
executes its NEFFs. Flags are part of the cache key (through
``CompileOptions.compiler_config``), so changing them never serves a stale NEFF.

The CPU flags were chosen by measurement (bench/compile.py): O3 with data
tiling and ukernels doubles large fp32 matmul throughput over IREE's default
codegen on this class of machine.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
from collections.abc import Sequence

from torch_neuronx import config

# Below this, IREE's task executor costs more in thread hand-offs than its second worker
# saves. Measured on 2 cores through torch.compile (bench/compile.py's harness, where the task
# workers are asleep when a call starts): MLPs of 25 MFLOP ran in 280-310 us on local-sync and
# 340 us on local-task; of 51 MFLOP in 515 us and 410-430 us; of 100 MFLOP in 990 and 650 us.
SMALL_GRAPH_FLOPS = 32_000_000


class UnknownTargetError(ValueError):
    """A target name nothing here can compile for."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One compilation target."""

    name: str
    compiler: str  # "iree" or "neuronx-cc"
    flags: tuple[str, ...]
    driver: str  # IREE runtime driver that executes it; "" when nothing here can
    description: str
    default_opt_level: int = 2
    small_driver: str = ""  # driver for graphs under SMALL_GRAPH_FLOPS, when it beats ``driver``
    # (flag, replacement) pairs, each one retry when the compiler rejects a module compiled
    # with ``flags``, tried in order: codegen paths that are faster but not yet robust in the
    # compiler. An empty flag means "append the replacement".
    flag_fallbacks: tuple[tuple[str, str], ...] = ()

    def fallback_flags(self, flags: Sequence[str]) -> list[list[str]]:
        """The retries for ``flags``: one per applicable :attr:`flag_fallbacks` pair, in order."""
        retries = []
        for flag, replacement in self.flag_fallbacks:
            if not flag and replacement not in flags:
                retries.append([*flags, replacement])
            elif flag and flag in flags:
                retries.append([replacement if f == flag else f for f in flags])
        return retries

    def driver_for(self, flops: int) -> str:
        """The runtime driver for a graph of ``flops`` contraction FLOPs."""
        return self.small_driver if self.small_driver and flops < SMALL_GRAPH_FLOPS else self.driver

    @property
    def host_specific(self) -> bool:
        """Whether code is generated for this very host's CPU (so the host is part of the cache key)."""
        return any(flag.endswith("-cpu=host") for flag in self.flags)


_INPUT = ("--iree-input-type=stablehlo",)
# The input flag for each dialect a lowered module can be in (compiler/torch_to_stablehlo.py).
# Linalg modules with tm_tensor ops (scatter, sort from torch-mlir's linalg backend) go through
# IREE's torch input pipeline, which converts them: with plain input IREE cannot resolve their
# dynamic result sizes ("dynamic dimensions must have been resolved prior to leaving the flow
# dialect"). That pipeline rewrites the function's ABI and ignores ``iree.abi.output`` arguments
# (results land elsewhere, the storage keeps its old bytes), so such modules are never compiled
# with output storage (pipeline/graph.py).
_INPUT_FLAGS = {"stablehlo": _INPUT[0], "linalg": "--iree-input-type=none",
                "linalg-tm_tensor": "--iree-input-type=torch"}


#: The input kinds whose modules may take output storage (see above).
STORAGE_DIALECTS = ("stablehlo", "linalg")


def input_dialect(dialect: str, module: str) -> str:
    """The input kind of a lowered ``module`` in ``dialect`` (a key of the input flags)."""
    return "linalg-tm_tensor" if dialect == "linalg" and "tm_tensor." in module else dialect


def with_input_dialect(flags: Sequence[str], dialect: str) -> list[str]:
    """``flags`` for a module in ``dialect``: its IREE input-type flag in place of StableHLO's."""
    if dialect == "stablehlo":
        return list(flags)
    return [_INPUT_FLAGS[dialect] if flag == _INPUT[0] else flag for flag in flags]


# IREE 3.13 at O3 miscompiles some modules whose results are concatenations sharing operands
# (the GRU cell's backward at batch 1: ``cat([dr, dz, dn])`` and ``cat([dr, dz, dn * r])``): a
# result came back all zeros and another held its neighbour's values, silently. Fusing producers
# with several uses is what goes wrong; such modules are compiled without it (measured: turning
# it off everywhere cost a transformer block 8%, so only these modules pay).
SHARED_CONCAT_FLAGS = ("--iree-dispatch-creation-fuse-multi-use=false",)
_CONCATENATE = re.compile(r"stablehlo\.concatenate\"?\(?\s*((?:%[\w#.]+\s*,?\s*)+)")


def module_flags(module: str, compiler: str) -> tuple[str, ...]:
    """Flags a lowered module needs beyond its target's (part of its NEFF cache key)."""
    if compiler != "iree" or module.count("stablehlo.concatenate") < 2:
        return ()
    seen: set[str] = set()
    for match in _CONCATENATE.finditer(module):
        operands = set(re.findall(r"%[\w#.]+", match.group(1)))
        if operands & seen:
            return SHARED_CONCAT_FLAGS
        seen |= operands
    return ()


# IREE demotes f64 to f32 unless told otherwise. Graphs with float64 tensors get this flag so
# float64 stays float64; others do not, because keeping the f64 scalar constants torch-mlir
# emits for Python floats costs real time (a transformer block: 8.6 ms against 7.3 ms).
KEEP_F64_FLAGS = ("--iree-input-demote-f64-to-f32=false",)

_CPU_FLAGS = (
    *_INPUT,
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",  # replaced by TORCH_NEURONX_TARGET_CPU (cpu_target)
    # Data tiling from global optimization on: weights and activations are packed by their own
    # dispatches, so a matmul never fuses its packing into an odd producer. The dispatch-creation
    # path (--iree-opt-data-tiling) fused a transposed attention product with the next matmul's
    # packing into one 1.8 ms dispatch (0.24 ms unfused): 7.2 ms against 5.6 ms for a
    # transformer block; the same 51 ms on 4x2048 linears (bench/compile.py, iree-profile).
    "--iree-global-opt-data-tiling",
    "--iree-llvmcpu-enable-ukernels=all",
    # Data-tiled matmuls distributed in tiles of up to 2 MiB of operands instead of IREE's default
    # (a 256x2048x2048 product got 8x16 output tiles over all of K, re-reading the weights 32
    # times): single-threaded, four 2048-wide linears at batch 256 ran in 93 ms against 222 ms on
    # x86-64-v3 (AVX2) and 88 against 105 ms on this AVX-512 host; the transformer block 3% faster
    # on AVX2, the same on AVX-512; 1, 4 and 8 MiB measured no better than 2
    # (docs/benchmarks.md, "AVX2 emulated on an AVX-512 host").
    "--iree-llvmcpu-matmul-tile-bytes=2097152",
)
# IREE 3.13's global-optimization data tiling fails on some padded batch matmuls of training
# graphs ("map_store ... restricted to workgroup distributed contexts"); those modules are
# compiled again with the dispatch-creation path, which handles them. Its aggressive fusion
# (on at O3) breaks dominance on some gather-heavy graphs (grid_sample: "operand #0 does not
# dominate this use"); those are compiled once more without it.
_CPU_FALLBACKS = (("--iree-global-opt-data-tiling", "--iree-opt-data-tiling"),
                  ("", "--iree-dispatch-creation-enable-aggressive-fusion=false"))

_TARGETS: dict[str, Target] = {
    # O3 + data tiling + ukernels: 4x2048 fp32 linears at batch 256 ran in 50 ms against 61 ms (O3),
    # 100 ms (default flags) and torch eager's 49 ms on this class of host (bench/compile.py).
    "cpu": Target("cpu", "iree", _CPU_FLAGS, "local-task",
                  "this host's CPU through IREE llvm-cpu (the live default here)", default_opt_level=3,
                  small_driver="local-sync", flag_fallbacks=_CPU_FALLBACKS),
    "cuda": Target("cuda", "iree", (
        *_INPUT,
        "--iree-hal-target-device=cuda",
        "--iree-cuda-target=sm_80",
    ), "cuda", "NVIDIA GPUs through IREE's CUDA backend (sm_80 PTX, JIT-compiled on newer GPUs)"),
    "x86_64": Target("x86_64", "iree", (
        *_INPUT,
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=x86_64-linux-gnu",
        "--iree-llvmcpu-target-cpu=x86-64-v3",
    ), "local-task", "generic x86-64-v3 Linux CPUs (portable across hosts)", small_driver="local-sync"),
    "aarch64": Target("aarch64", "iree", (
        *_INPUT,
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=aarch64-linux-gnu",
        "--iree-llvmcpu-target-cpu=generic",
    ), "", "64-bit Arm Linux CPUs (cross-compile only from an x86 host)"),
    "trn2": Target("trn2", "neuronx-cc", ("--target=trn2",), "",
                   "AWS Trainium2, only through a real neuronx-cc on PATH"),
    "trn3": Target("trn3", "neuronx-cc", ("--target=trn3",), "",
                   "AWS Trainium3, only through a real neuronx-cc on PATH"),
}


@functools.cache
def cpu_target(cpu: str = "host") -> Target:
    """The ``cpu`` target compiling for LLVM CPU ``cpu`` (TORCH_NEURONX_TARGET_CPU) instead of ``host``.

    Its other flags are the same for every CPU: they measured best on AVX2 (x86-64-v3)
    and AVX-512 alike. The CPU is in the flags, hence in the NEFF cache key.
    """
    base = _TARGETS["cpu"]
    if cpu == "host":
        return base
    flags = tuple(f"--iree-llvmcpu-target-cpu={cpu}" if f.startswith("--iree-llvmcpu-target-cpu=") else f
                  for f in base.flags)
    return dataclasses.replace(base, flags=flags, description=f"{cpu} through IREE llvm-cpu on this host")


@functools.cache
def driver_available(driver: str) -> bool:
    import iree.runtime as rt

    if driver not in rt.query_available_drivers():
        return False
    if driver == "cuda":
        try:
            rt.get_device("cuda")
        except Exception:
            return False
    return True


@functools.cache
def host_cpu() -> str:
    """This host's CPU identity: machine, model name and feature flags (a cache-key component).

    NEFFs built with ``-cpu=host`` use every instruction this CPU has; a node with
    another CPU sharing the cache must not load them.
    """
    import hashlib
    import platform

    model, features = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() in ("flags", "Features") and not features:
                    features = " ".join(sorted(value.split()))
    except OSError:
        pass
    digest = hashlib.sha256(features.encode()).hexdigest()[:16]
    return f"{platform.machine()} {model or platform.processor()} features:{digest}"


def available_targets() -> list[str]:
    """Target names that can be compiled for on this host."""
    names = [n for n, t in _TARGETS.items() if t.compiler == "iree"]
    if shutil.which("neuronx-cc"):
        names += [n for n, t in _TARGETS.items() if t.compiler == "neuronx-cc"]
    return names


def live_target() -> str:
    """The target of this host's live devices: ``cpu`` (no Trainium here)."""
    return "cpu"


def resolve(name: str | None = None) -> Target:
    """The target for ``name``, NEURON_PLATFORM_TARGET_OVERRIDE, or the live target."""
    if name is None:
        name = config.get("NEURON_PLATFORM_TARGET_OVERRIDE") or live_target()
    key = name.strip().lower()
    if key == "cpu":
        return cpu_target(config.get("TORCH_NEURONX_TARGET_CPU").strip() or "host")
    target = _TARGETS.get(key)
    if target is None:
        raise UnknownTargetError(
            f"unknown target {name!r} (from CompileOptions(target=...) or "
            f"NEURON_PLATFORM_TARGET_OVERRIDE); available targets: {', '.join(available_targets())}")
    if target.compiler == "neuronx-cc" and not shutil.which("neuronx-cc"):
        raise UnknownTargetError(
            f"target {target.name!r} needs the real neuronx-cc compiler on PATH, and none was found; "
            f"available targets on this host: {', '.join(available_targets())}")
    return target
