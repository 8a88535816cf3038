"""The stoppable wait of a collective that ran ahead of its agreement check (in one process:
the wait's own logic; the collectives themselves run under torchrun in test_distributed)."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch.distributed as dist

from torch_neuronx.distributed import algorithms


class _Work(dist.Work):
    """A transport work that completes (or fails) when told to; a sliced wait that runs out
    before then raises as gloo's does ("timed out")."""

    def __init__(self, completes_during_slice: int = -1, error: str | None = None) -> None:
        super().__init__()
        self.done = threading.Event()
        self.error = error
        self.slices = 0
        self._completes_during = completes_during_slice

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if timeout is not None and not self.done.is_set():
            self.slices += 1
            if self.slices == self._completes_during:
                self.done.set()  # completes just as the slice runs out: the slice still times out
            else:
                self.done.wait(timeout.total_seconds())
            if self.slices == self._completes_during or not self.done.is_set():
                raise RuntimeError("[gloo] Timed out waiting for the operation to complete")
        self.done.wait()
        if self.error is not None:
            raise RuntimeError(self.error)
        return True

    def is_completed(self) -> bool:
        return self.done.is_set()


def test_a_work_that_completes_as_a_slice_runs_out_is_a_success():
    work = _Work(completes_during_slice=3)
    algorithms.Interrupt()._wait(work)  # the slice's timeout is not the work's outcome
    assert work.slices == 3


def test_a_work_that_fails_raises_its_own_error():
    work = _Work(error="Connection closed by peer")
    threading.Timer(0.1, work.done.set).start()
    with pytest.raises(RuntimeError, match="closed by peer"):
        algorithms.Interrupt()._wait(work)


def test_stop_frees_the_waiting_thread_within_a_slice():
    work, interrupt = _Work(), algorithms.Interrupt()
    threading.Timer(0.1, interrupt.stop).start()
    with pytest.raises(algorithms.Stopped):
        interrupt._wait(work)
    assert not work.is_completed() and work.slices >= 2
