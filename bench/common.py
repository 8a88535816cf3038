"""What the benchmarks share: the CPU's ISA line every table carries, and AVX2 emulated on a wider host."""

from __future__ import annotations

import os
import sys

#: What limits every competitor to AVX2 on a wider host, set before torch is imported: the neuron
#: backend compiles for x86-64-v3 (AVX2, FMA); oneDNN, MKL and ATen's vectorized kernels stop at
#: AVX2, and inductor's generated C++ is vectorized for and compiled with -march=x86-64-v3.
EMULATED_ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {"TORCH_NEURONX_TARGET_CPU": "x86-64-v3", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3"},
}


def isa() -> str:
    """The widest x86 vector ISA this CPU has (``AVX-512``, ``AVX2``, ``pre-AVX2``, or ``unknown``)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return "unknown"
    return "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "pre-AVX2"


def emulate_isa(name: str | None) -> None:
    """Run this script again with every competitor limited to ISA ``name`` (a key of
    :data:`EMULATED_ISA_ENV`), unless ``name`` is ``None`` or this process already is.

    The limits must be in the environment before torch is imported, so the script is
    executed anew (``os.execve``) with them; subprocesses it starts inherit them.
    """
    if name is None:
        return
    env = EMULATED_ISA_ENV[name]
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def isa_line(name: str | None) -> str:
    """The ISA line of a benchmark's output: the host's, and the one emulated on it (if any)."""
    if name is None:
        return f"ISA: {isa()} (this host's)"
    limits = " ".join(f"{k}={v}" for k, v in EMULATED_ISA_ENV[name].items())
    return f"ISA: {name.upper()} emulated on an {isa()} host ({limits})"
