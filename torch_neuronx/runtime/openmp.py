"""Torch's OpenMP threads, ended before the runtime's own workers compute.

After a parallel torch op, the OpenMP runtime's worker threads spin-wait for the
next one (libgomp: GOMP_SPINCOUNT iterations, several milliseconds by default).
A NEFF call on the multi-threaded local-task driver that starts in that window
shares every core with them: a transformer block took 9.1-9.6 ms instead of
5.1-5.8 ms right after an inductor call (2 cores, bench/compile.py's block). Any
training loop meets this window at every step (the optimizer, the loss, a graph
break). ``omp_pause_resource_all(omp_pause_soft)`` ends those threads: 50-70 us
while they spin, about 200 us once they sleep (wake-ups are slow on that VM),
well under a microsecond when there are none; the next parallel torch op
creates them again (about 30 us, once).

Only the calling thread's pool is affected, and only outside a parallel region
(the OpenMP runtime refuses otherwise). TORCH_NEURONX_PAUSE_OPENMP=0 turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

from torch_neuronx import config

_log = logging.getLogger("torch_neuronx.runtime")

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: omp_pause_soft
_RUNTIMES = ("libgomp", "libiomp5", "libomp")


def _loaded_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes this process has loaded (torch's among them)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.rsplit("/", 1)[-1].startswith(_RUNTIMES))


@functools.cache
def _pause_function() -> Callable[[int], int] | None:
    """``omp_pause_resource_all`` of the loaded OpenMP runtime, or None when there is none."""
    for path in _loaded_runtimes():
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all  # the loaded library's own handle
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        _log.debug("idle OpenMP threads end through %s", path)
        return pause
    return None


def end_idle_threads() -> None:
    """End the calling thread's idle OpenMP workers (a no-op when disabled or unavailable)."""
    if not config.get("TORCH_NEURONX_PAUSE_OPENMP"):
        return
    pause = _pause_function()
    if pause is not None:
        pause(_OMP_PAUSE_SOFT)
