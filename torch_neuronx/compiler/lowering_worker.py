"""torch-mlir's lowering in a worker process, where its aborts cannot take the user's process down.

torch-mlir's torch-to-StableHLO pipeline is C++ that aborts on some graphs instead of
reporting them: a ``sum(dim=0)`` of a 0-d tensor dies with SIGSEGV, a zero-size gather
with ``LLVM ERROR: Failed to infer result type(s)``. In the user's process either kills
the whole run. So :func:`to_stablehlo` sends the raw torch-dialect text to a worker (one
per process, started on first use or by :func:`prestart`, reused for every graph) that
parses it and runs :func:`torch_neuronx.compiler.lower.to_stablehlo`. A worker that dies
becomes a :class:`NeuronCompileError` of stage ``lowering`` naming the signal and the
last lines it printed, and the next graph gets a new worker; one that takes longer than
TORCH_NEURONX_LOWERING_TIMEOUT seconds is killed the same way. The worker runs
:mod:`torch_neuronx.compiler.torch_to_stablehlo` alone (no torch import: it starts in
about half a second); requests and replies are length-prefixed JSON on its pipes.

TORCH_NEURONX_LOWER_IN_SUBPROCESS=0 lowers in the calling process instead (no worker,
no protection).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from torch_neuronx import config
from torch_neuronx.compiler import torch_to_stablehlo
from torch_neuronx.compiler.errors import NeuronCompileError, process_ended

_lock = threading.Lock()
_worker: _Worker | None = None

# The worker imports torch_to_stablehlo as a top-level module (its directory on sys.path), so
# neither torch nor this package loads in it: it starts in about half a second.
_SERVER = ("import sys; sys.path.insert(0, {directory!r}); import torch_to_stablehlo; "
           "torch_to_stablehlo.serve()")


class _Worker:
    """One lowering process and its pipes (owned by the process that started it)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.stderr = tempfile.TemporaryFile()
        directory = os.path.dirname(os.path.abspath(torch_to_stablehlo.__file__))
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER.format(directory=directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, close_fds=True)

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.process.poll() is None

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        torch_to_stablehlo.write_message(self.process.stdin, message)
        return torch_to_stablehlo.read_message(self.process.stdout, time.monotonic() + timeout)

    def stop(self, grace: float = 0.0) -> None:
        """End the worker: closing its stdin ends its loop; after ``grace`` seconds it is killed."""
        if self.owner != os.getpid():
            return  # a forked child: the parent's worker is not ours to stop
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except Exception:
                pass
        try:
            self.process.wait(timeout=grace)
        except Exception:
            pass
        try:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=10)
        except Exception:
            pass
        self.stderr.close()

    def stderr_tail(self, lines: int = 8) -> str:
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode("utf-8", "replace")
        except Exception:
            return ""
        kept = [line for line in text.splitlines() if line.strip()]
        return "\n".join(kept[-lines:])


def _current() -> _Worker:
    global _worker
    if _worker is None or not _worker.alive():
        if _worker is not None:
            _worker.stop()
        _worker = _Worker()
    return _worker


@atexit.register
def _shutdown() -> None:
    """At exit the worker ends with its pipes closed (no zombie, no unclosed-file warnings)."""
    global _worker
    if _worker is not None:
        _worker.stop(grace=2.0)
        _worker = None


def prestart() -> None:
    """Start the worker now, so its start overlaps other work before the first lowering."""
    if config.get("TORCH_NEURONX_LOWER_IN_SUBPROCESS"):
        with _lock:
            _current()


def _died(worker: _Worker) -> NeuronCompileError:
    try:
        code = worker.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    tail = worker.stderr_tail()
    detail = f"torch-mlir's lowering aborted: the lowering process {process_ended(code)}"
    if tail:
        detail += f"; its last output:\n{tail}"
    return NeuronCompileError("lowering", detail)


def to_stablehlo(raw: str, dialect: str = "stablehlo") -> str:
    """StableHLO text of the raw torch-dialect module ``raw``, lowered in the worker process
    (``dialect="linalg"``: linalg-on-tensors text)."""
    timeout = float(config.get("TORCH_NEURONX_LOWERING_TIMEOUT"))
    with _lock:
        worker = _current()
        try:
            reply = worker.request({"raw": raw, "dialect": dialect}, timeout)
        except TimeoutError:
            worker.stop()
            raise NeuronCompileError("lowering", f"torch-mlir's lowering took longer than {timeout:g} s "
                                     "(TORCH_NEURONX_LOWERING_TIMEOUT); the lowering process was stopped") from None
        except (EOFError, OSError, ValueError):
            error = _died(worker)
            worker.stop()
            raise error from None
    if "error" in reply:
        raise NeuronCompileError("lowering", reply["error"]["detail"], op=reply["error"].get("op"))
    return reply["stablehlo"]
