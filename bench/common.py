"""What the benchmarks share: the CPU's ISA line every table carries."""

from __future__ import annotations


def isa() -> str:
    """The widest x86 vector ISA this CPU has (``AVX-512``, ``AVX2``, ``pre-AVX2``, or ``unknown``)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return "unknown"
    return "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "pre-AVX2"
