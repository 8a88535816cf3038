"""Host samples of a session: CPU utilization and memory, once a second, on a daemon thread.

psutil answers a per-CPU utilization sample in ~140 µs and the process's memory in ~56 µs,
so 1 Hz costs nothing measurable. A sample is also taken when the session stops, so even a
session shorter than a second has one utilization reading (over its whole length).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

import psutil

_log = logging.getLogger("torch_neuronx.profiling")

INTERVAL_S = 1.0
JOIN_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """Utilization (percent) of each CPU and their average since the previous sample."""

    time_ns: int
    per_cpu: tuple[float, ...]
    average: float


@dataclasses.dataclass(frozen=True)
class MemorySample:
    """Used host memory: the system's (bytes, percent) and this process's resident set."""

    time_ns: int
    system_used_bytes: int
    system_percent: float
    process_rss_bytes: int
    process_percent: float


class HostSampler:
    """Samples CPU utilization and/or host memory until :meth:`stop`."""

    def __init__(self, cpu: bool, memory: bool, interval_s: float = INTERVAL_S) -> None:
        self.cpu, self.memory, self.interval_s = cpu, memory, interval_s
        self.cpu_samples: list[CpuSample] = []
        self.memory_samples: list[MemorySample] = []
        self._process = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take the first reading and start the sampling thread."""
        if not (self.cpu or self.memory):
            return
        if self.cpu:
            psutil.cpu_percent(percpu=True)  # primes the counters the next reading is measured against
        if self.memory:
            self._sample_memory()
        self._thread = threading.Thread(target=self._run, name="torch_neuronx profiler sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """One reading of each enabled kind (a failure is logged once and the session goes on)."""
        try:
            if self.cpu:
                self._sample_cpu()
            if self.memory:
                self._sample_memory()
        except Exception as exc:  # psutil errors must never fail the user's program
            _log.warning("profiler host sample failed (%s); samples stop", exc)
            self._stop.set()

    def _sample_cpu(self) -> None:
        per_cpu = tuple(float(p) for p in psutil.cpu_percent(percpu=True))
        average = sum(per_cpu) / len(per_cpu) if per_cpu else 0.0
        self.cpu_samples.append(CpuSample(time.time_ns(), per_cpu, average))

    def _sample_memory(self) -> None:
        vm = psutil.virtual_memory()
        rss = self._process.memory_info().rss
        self.memory_samples.append(MemorySample(time.time_ns(), int(vm.used), float(vm.percent), int(rss),
                                                100.0 * rss / vm.total if vm.total else 0.0))

    def stop(self) -> None:
        """Stop the thread (joined with a timeout) and take the last reading."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            _log.warning("the profiler's sampling thread did not stop within %.0f s", JOIN_TIMEOUT_S)
        self._thread = None
        self._stop.clear()
        self.sample()
