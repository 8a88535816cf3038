"""Feedback on long compiles: a progress line on a terminal, the stages' durations in the log.

A first call can compile for tens of seconds. With TORCH_NEURONX_LOG_LEVEL=2 every stage of a
graph's compile (FX passes, lowering, NEFF, the compiler) logs its graph and duration (the
instrumentation layer's stage spans do that). When stderr is a terminal, a graph whose compile
has run longer than :data:`SHOW_AFTER_S` shows one line, rewritten in place: the graph, the
stage under way, the seconds so far, and how many of the graphs found so far are done. The line
disappears when the compile ends. Nothing is shown at TORCH_NEURONX_LOG_LEVEL=0 or when stderr
is not a terminal (a log file, CI).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

from torch_neuronx import config
from torch_neuronx.observe import samples

SHOW_AFTER_S = 2.0
TICK_S = 0.5
_ERASE = "\r\033[K"


class _Progress:
    """The graphs being compiled in this process and the ticker thread that draws the line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found = self._done = 0
        self._active: list[tuple[str, int, float]] = []  # (graph, thread id, start)
        self._ticker: threading.Thread | None = None
        self._shown = False

    @contextlib.contextmanager
    def graph(self, name: str) -> Iterator[None]:
        """Around one graph's compile."""
        if not _wanted():
            yield
            return
        entry = (name, threading.get_ident(), time.monotonic())
        with self._lock:
            self._found += 1
            self._active.append(entry)
            if self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, daemon=True, name="neuron compile progress")
                self._ticker.start()
        try:
            yield
        finally:
            with self._lock:
                self._done += 1
                self._active.remove(entry)
                if not self._active:
                    self._erase()

    def _erase(self) -> None:
        if self._shown:
            _write(_ERASE)
            self._shown = False

    def _tick(self) -> None:
        idle_since = None
        while True:
            time.sleep(TICK_S)
            with self._lock:
                if not self._active:
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > 5:
                        self._ticker = None
                        return
                    continue
                idle_since = None
                name, thread, start = self._active[-1]
                elapsed = time.monotonic() - start
                if elapsed < SHOW_AFTER_S:
                    continue
                stages = samples.running.get(thread) or ["tracing"]
                _write(f"{_ERASE}[torch_neuronx] compiling {name}: {stages[-1]}, {elapsed:.0f} s "
                       f"(graph {self._done + 1} of {self._found} found)")
                self._shown = True


def _wanted() -> bool:
    try:
        return sys.stderr.isatty() and config.get("TORCH_NEURONX_LOG_LEVEL") > 0
    except (AttributeError, ValueError):  # stderr replaced or closed
        return False


def _write(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


progress = _Progress()
