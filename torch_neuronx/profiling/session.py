"""One Neuron profiling session: started and stopped with torch.profiler's recording, writing its files.

A session measures the offset between the instrumentation layer's clock
(``time.perf_counter_ns()``) and torch's trace clock (``time.time_ns()``) when it starts,
subscribes its :class:`~.recorder.Recorder` (runtime and device modes) and starts the host
sampler (cpu_util, host_memory). When it stops it writes, under
``{output_dir}/{instance_id}_pid_{pid}/{timestamp}/``, one file per mode:

- ``runtime.json``: every recorded event (Chrome trace);
- ``cpu_util.json``, ``host_memory.json``: the host counters (Chrome trace);
- ``device.json``: per-execution timings of every NEFF (Chrome trace, summary in ``neuron.neffs``),
  and the NEFFs themselves in ``neffs/``;

plus ``trace.json`` (torch's trace with ours merged) when :class:`~.profiler.NeuronProfiler`
exports it. Every file carries the session's metadata (rank, settings, dropped events).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from typing import Any

from torch_neuronx import observe, process
from torch_neuronx.profiling import chrome, device
from torch_neuronx.profiling.options import ProfileMode, Settings
from torch_neuronx.profiling.recorder import Record, Recorder, clock_offset_ns
from torch_neuronx.profiling.samplers import HostSampler

_log = logging.getLogger("torch_neuronx.profiling")


def instance_id() -> str:
    """The name of this machine (an EC2 instance id on Trainium; the host name here)."""
    return socket.gethostname() or "localhost"


class Session:
    """A profiling session of this rank, with :class:`Settings`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.rank = process.rank()
        self.recorder: Recorder | None = None
        self.sampler = HostSampler(cpu=ProfileMode.CPU_UTIL in settings.modes,
                                   memory=ProfileMode.HOST_MEMORY in settings.modes)
        self.start_ns = 0
        self.stop_ns = 0
        self.directory = ""
        self.files: dict[str, str] = {}
        self.running = False

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start recording: the clock offset, the listener, the sampler."""
        self.start_ns = time.time_ns()
        now = datetime.datetime.fromtimestamp(self.start_ns / 1e9)
        self.directory = self._unique(os.path.join(self.settings.output_dir, f"{instance_id()}_pid_{os.getpid()}",
                                                   f"{now:%Y%m%d_%H%M%S}_{now.microsecond // 1000:03d}"))
        self.recorder = Recorder(self.settings.capture_nc, self.settings.max_events_per_nc, clock_offset_ns())
        if self.settings.listens:
            observe.subscribe(self.recorder)
        self.sampler.start()
        self.running = True
        _log.info("neuron profiling session started (rank %d, modes %s): %s", self.rank,
                  ",".join(sorted(m.value for m in self.settings.modes)), self.directory)

    @staticmethod
    def _unique(path: str) -> str:
        candidate, n = path, 1
        while os.path.exists(candidate):
            candidate, n = f"{path}_{n}", n + 1
        return candidate

    def stop(self) -> None:
        """Stop recording and write the mode files; a failure to write is a warning."""
        if not self.running:
            return
        self.running = False
        if self.recorder is not None and self.settings.listens:
            observe.unsubscribe(self.recorder)
        self.sampler.stop()
        self.stop_ns = time.time_ns()
        self._warn_drops()
        try:
            self.write()
        except OSError as exc:
            _log.warning("could not write the neuron profile to %s: %s", self.directory, exc)

    def _warn_drops(self) -> None:
        if self.recorder is None or not self.recorder.dropped:
            return
        _log.warning("neuron profiler: dropped %d events over TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC=%d "
                     "(per device: %s); raise it to keep them", sum(self.recorder.dropped.values()),
                     self.settings.max_events_per_nc, self.recorder.drops())

    # -- contents ---------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """What the listener recorded, in time order."""
        return self.recorder.snapshot() if self.recorder is not None else []

    def metadata(self) -> dict[str, Any]:
        """The session's facts, written into every output file under ``neuron``."""
        rec = self.recorder
        return {
            "rank": self.rank, "pid": os.getpid(), "instance_id": instance_id(), "job_id": process.job_id(),
            "modes": sorted(m.value for m in self.settings.modes), "capture_nc": self.settings.capture_nc.describe(),
            "max_events_per_nc": self.settings.max_events_per_nc, "start_ns": self.start_ns, "stop_ns": self.stop_ns,
            "events_kept": sum(rec.kept.values()) if rec else 0,
            "events_dropped": sum(rec.dropped.values()) if rec else 0,
            "events_dropped_per_nc": rec.drops() if rec else {},
            "events_not_captured": rec.filtered if rec else 0,
            "files": dict(self.files),
        }

    def trace_events(self, base_ns: int) -> list[dict[str, Any]]:
        """Every event of the session as trace events on torch's clock from ``base_ns``."""
        modes = self.settings.modes
        records = self.records()
        events: list[dict[str, Any]] = []
        if ProfileMode.RUNTIME in modes:
            events += chrome.record_events(records, base_ns)
        elif ProfileMode.DEVICE in modes:
            events += device.execution_events(device.executions(records), base_ns)
        cpu = self.sampler.cpu_samples if ProfileMode.CPU_UTIL in modes else []
        memory = self.sampler.memory_samples if ProfileMode.HOST_MEMORY in modes else []
        return events + chrome.sample_events(cpu, memory, base_ns)

    def write(self) -> None:
        """Write one file per mode into :attr:`directory`."""
        modes, base = self.settings.modes, self.start_ns // 1_000_000_000 * 1_000_000_000
        os.makedirs(self.directory, exist_ok=True)
        # every file names all of the session's files, those written after it included
        self.files = {m.value: f"{m.value}.json" for m in ProfileMode if m in modes}
        records = self.records()
        if ProfileMode.DEVICE in modes:
            runs = device.executions(records)
            copied = device.copy_neffs(self.settings.neff_cache_dir, sorted(runs),
                                       os.path.join(self.directory, device.NEFF_DIR))
            missing = sorted(set(runs) - set(copied))
            if missing:
                _log.warning("neuron profiler: NEFFs %s are not in the NEFF cache %s; their timings are kept",
                             missing, self.settings.neff_cache_dir)
            self._write("device", device.execution_events(runs, base), base,
                        neffs=device.summary(runs, copied), neff_cache_dir=self.settings.neff_cache_dir)
        if ProfileMode.RUNTIME in modes:
            self._write("runtime", chrome.record_events(records, base), base)
        if ProfileMode.CPU_UTIL in modes:
            self._write("cpu_util", chrome.sample_events(self.sampler.cpu_samples, [], base), base)
        if ProfileMode.HOST_MEMORY in modes:
            self._write("host_memory", chrome.sample_events([], self.sampler.memory_samples, base), base)

    def _write(self, mode: str, events: list[dict[str, Any]], base_ns: int, **extra: Any) -> None:
        path = os.path.join(self.directory, self.files[mode])
        chrome.write_trace(path, events, base_ns, {**self.metadata(), "mode": mode, **extra})
