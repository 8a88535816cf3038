"""Compilation targets: what each NEURON_PLATFORM_TARGET_OVERRIDE value compiles for.

A target names the compiler backend and flags and the runtime driver that
executes its NEFFs. Flags are part of the cache key (through
``CompileOptions.compiler_config``), so changing them never serves a stale NEFF.

The CPU flags were chosen by measurement (bench/compile.py): data tiling with
ukernels lifts large fp32 matmuls well above IREE's default codegen on this
class of machine.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil

from torch_neuronx import config


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

    @property
    def executable_here(self) -> bool:
        """Whether this process can run NEFFs of this target."""
        return bool(self.driver) and _driver_available(self.driver)


# IREE demotes f64 to f32 unless told otherwise; torch programs expect float64 to stay float64.
_INPUT = ("--iree-input-type=stablehlo", "--iree-input-demote-f64-to-f32=false")

_CPU_FLAGS = (
    *_INPUT,
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
    "--iree-opt-data-tiling",
    "--iree-llvmcpu-enable-ukernels=all",
)

_TARGETS: dict[str, Target] = {
    "cpu": Target("cpu", "iree", _CPU_FLAGS, "local-task",
                  "this host's CPU through IREE llvm-cpu (the live default here)"),
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
    ), "local-task", "generic x86-64-v3 Linux CPUs (portable across hosts)"),
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
def _driver_available(driver: str) -> bool:
    import iree.runtime as rt

    if driver not in rt.query_available_drivers():
        return False
    if driver == "cuda":
        try:
            rt.get_device("cuda")
        except Exception:
            return False
    return True


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
