"""Eager work on streams: an op returns its outputs at once and runs later, in stream order.

An eager op whose kernel's outputs are known from its trace (shapes and dtypes: every
static kernel without host-side checks or random inputs) is *queued*: its outputs are
allocated from the caching allocator now, the kernel's execution is submitted to the
current stream of the inputs' device (:meth:`~torch_neuronx.runtime.streams.Stream.enqueue`),
and the outputs go back to Python before it runs. Each output's allocation remembers
the queued op that writes it (``Allocation.writer``).

Everything that reads or writes device memory on the host (``.cpu()``, ``.item()``,
printing, ops that fall back to the CPU, copies from host memory) runs through
:func:`on_host`: after the work queued on the current stream, and after the op that
writes each tensor it touches, on whatever stream. Those are the synchronization
points, as on CUDA.

A queued op that fails *poisons* its outputs (``Allocation.error``): an op that reads
them fails in turn without running, a host read raises :class:`PoisonedTensorError`,
and the stream reports the first failure at its next synchronization
(``torch.neuron.synchronize()``, or any host read on it), naming the op, and with
TORCH_NEURONX_ENABLE_STACK_TRACE=1 the user's line that issued it. With
NEURON_LAUNCH_BLOCKING=1 every op runs synchronously and raises where it is called.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_neuronx import config
from torch_neuronx.runtime.device import current_index as current_device
from torch_neuronx.runtime.errors import InputFailedError, NeuronRuntimeError
from torch_neuronx.runtime.streams import current_stream, in_worker
from torch_neuronx.runtime.tensor import NeuronTensor, PoisonedTensorError, wait_for_host

__all__ = ["QueuedOpError", "PoisonedTensorError", "on_host", "enqueue", "run_small", "issuing_stack", "stack_traces"]

_HERE = (__file__.rsplit("/", 2)[0],)  # frames inside torch_neuronx are not the user's
_TORCH = (torch.__file__.rsplit("/", 1)[0],)
_stack_traces: bool | None = None


class QueuedOpError(NeuronRuntimeError):
    """An op queued on a stream failed when it ran; raised at the next synchronization."""


def stack_traces() -> bool:
    """TORCH_NEURONX_ENABLE_STACK_TRACE, read once per process (ops check it on every call)."""
    global _stack_traces
    if _stack_traces is None:
        _stack_traces = bool(config.get("TORCH_NEURONX_ENABLE_STACK_TRACE"))
    return _stack_traces


def issuing_stack() -> list[tuple[str, int, str]]:
    """The Python frames that issued the current op, innermost last, without torch's and ours:
    (file, line, function) only; the source lines are read if an error needs them."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_HERE + _TORCH):
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    frames.reverse()
    return frames


def describe_stack(stack: Sequence[tuple[str, int, str]] | None) -> str:
    """The issuing stack as text for an error message (a hint when it was not recorded)."""
    if not stack:
        if config.get("NEURON_LAUNCH_BLOCKING"):  # (it raised where it was issued: the caller's traceback)
            return "\n(set TORCH_NEURONX_ENABLE_STACK_TRACE=1 to see the line that issued it)"
        return ("\n(set TORCH_NEURONX_ENABLE_STACK_TRACE=1 to see the line that issued it, or "
                "NEURON_LAUNCH_BLOCKING=1 to raise it there)")
    summary = traceback.StackSummary.from_list(
        [traceback.FrameSummary(file, line, name) for file, line, name in stack])
    return "\nIssued at (most recent call last):\n" + "".join(summary.format()).rstrip()


def on_host(index: int, tensors: Sequence[Any], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in the calling thread once device ``index``'s current stream has run its
    queued work and the ops writing the neuron tensors among ``tensors`` have run.

    A failure of queued work on that stream is raised here (this is a synchronization), as is
    the failure that left one of ``tensors`` without values.
    """
    stream = current_stream(index)
    stream.drain()
    stream._queue.raise_error()
    wait_for_host(tensors)
    return fn(*args)


def _poison(allocations: Sequence[Any], error: BaseException) -> None:
    for allocation in allocations:
        allocation.error = error


def _writers_elsewhere(inputs: Sequence[NeuronTensor], queue: Any) -> tuple:
    """The queued ops, on other streams than ``queue``, that write ``inputs`` as of now (when an op
    is issued): the op waits for these, not for writers issued after it, which may themselves be
    ordered after this op (``wait_stream``) and would wait for it in turn."""
    found = ()
    for t in inputs:
        allocation = t._allocation
        writer = None if allocation is None else allocation.writer
        if writer is not None and writer.queue is not queue and not writer.done():
            found += (writer,)
    return found


def _check_inputs(inputs: Sequence[NeuronTensor], writers: tuple, name: str) -> None:
    """Wait for ``writers`` (the inputs' writers on other streams when the op was issued); fail
    when an input's producing op failed."""
    for writer in writers:
        if not writer.done():
            writer.wait()
    for t in inputs:
        allocation = t._allocation
        if allocation is None:
            continue
        if allocation.error is not None:
            raise _input_failed(name, allocation.error)


class _InputFailed(QueuedOpError, InputFailedError):
    """A queued op that did not run: an input's producing op failed (raised by the op's host
    reads, ``synchronize()``, as any queued op's error)."""


def _input_failed(name: str, error: BaseException) -> _InputFailed:
    """The error of op ``name``, which did not run since an input's producer failed with ``error``:
    it names the first failure of the chain (not every op between, each nesting the one before)."""
    root = error.root if isinstance(error, InputFailedError) else error
    failed = _InputFailed(f"{name} did not run: an input's producing op failed ({root})", root)
    failed.__cause__ = root
    return failed


def synchronized(args: Sequence[Any], kwargs: dict[str, Any], fn: Callable[..., Any], *extra: Any) -> Any:
    """``fn(*extra)``, which touches the device memory of the neuron tensors among ``args`` and
    ``kwargs`` on the host, as a synchronization (:func:`on_host`)."""
    tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, NeuronTensor)]
    return on_host(tensors[0]._index if tensors else current_device(), tensors, fn, *extra)


class _Op:
    """One queued op's work, as its stream runs it (an object, not a closure: cheaper to make)."""

    __slots__ = ("index", "name", "inputs", "outputs", "work", "args", "writers", "stack", "inference")

    def __init__(self, index: int, name: str, inputs: Sequence[NeuronTensor], outputs: Sequence[Any],
                 work: Callable[..., None], args: tuple, queue: Any, stack: Any, inference: bool) -> None:
        self.index, self.name, self.inputs, self.outputs = index, name, inputs, outputs
        self.work, self.args, self.stack, self.inference = work, args, stack, inference
        self.writers = _writers_elsewhere(inputs, queue)

    def __call__(self) -> None:
        try:
            _check_inputs(self.inputs, self.writers, self.name)
            if self.inference:
                # On the stream's thread, whose grad and inference modes are not the caller's: the
                # work computes on raw device memory, which may hold inference tensors.
                with torch.inference_mode():
                    self.work(*self.args)
            else:  # work that runs no torch op on those tensors outside its own inference mode
                self.work(*self.args)
        except BaseException as exc:
            if isinstance(exc, QueuedOpError):
                _poison(self.outputs, exc)
                raise
            error = QueuedOpError(f"{self.name} failed on neuron:{self.index}: {type(exc).__name__}: {exc}"
                                  f"{describe_stack(self.stack)}")
            _poison(self.outputs, error)
            raise error from exc


#: A compiled kernel's inputs and outputs of at most this many bytes make it small: it runs in
#: the issuing thread when its stream is idle (``Stream.enqueue_small``), since handing it to the
#: stream's worker costs more than running it; larger kernels always go to the worker, so that
#: Python runs ahead while they compute.
INLINE_BYTES = 256 << 10


def _small(inputs: Sequence[NeuronTensor], outputs: Sequence[Any], writers: tuple) -> bool:
    """Whether a kernel is small and its inputs are ready (no ``writers`` on another stream, which
    the issuing thread must not wait for: :func:`_writers_elsewhere`)."""
    if writers:
        return False
    total = 0
    for allocation in outputs:
        total += allocation.nbytes
    for t in inputs:
        allocation = t._allocation
        if allocation is not None:
            total += allocation.nbytes
    return total <= INLINE_BYTES


def enqueue(index: int, name: str, inputs: Sequence[NeuronTensor], outputs: Sequence[Any],
            work: Callable[..., None], *args: Any, stream: Any = None, inference: bool = True) -> None:
    """Queue ``work(*args)`` on device ``index``'s current stream as the op ``name`` that reads
    ``inputs`` (neuron tensors) and writes the allocations ``outputs``.

    ``stream``: the current stream of device ``index``, when the caller has it already.
    ``inference``: whether ``work`` runs in inference mode (False for work that enters it
    itself where it runs torch ops, saving the mode switch on its fast path).
    ``work`` fills the outputs' memory. When it raises, the outputs are poisoned and the
    stream records a :class:`QueuedOpError` naming the op (and, with stack traces on, the
    line that issued it); with launch blocking it raises here instead.
    """
    stack = issuing_stack() if stack_traces() else None
    if stream is None:
        stream = current_stream(index)
    op = _Op(index, name, inputs, outputs, work, args, stream._queue, stack, inference)
    if not inference and _small(inputs, outputs, op.writers):
        pending = stream.enqueue_small(op)  # run at once when the stream is idle
    else:
        pending = stream.enqueue(op)
    if pending is not None:
        for allocation in outputs:
            allocation.writer = pending


def run_small(stream: Any, direct: Callable[[list, list], None], tensors: list[torch.Tensor],
              storage: list[torch.Tensor], op: tuple) -> bool:
    """A launch plan's small kernel (``device/launch.py``), run at once in the issuing thread when
    ``stream`` is idle, as :func:`enqueue` runs one, without its per-op objects: the plan checked
    once what enqueue checks per op, and per call that the inputs are ready and unpoisoned.

    ``direct(tensors, storage)`` runs the kernel into its outputs' memory; when it fails, the op
    goes the whole way (``op``: the index, name, inputs, allocations, work and work arguments of
    :func:`enqueue`): its CPU fallback, or its error, kept by the stream. False when the stream is
    busy or launches block (nothing ran: the caller enqueues).
    """
    queue = stream._queue
    if queue.blocking or in_worker():
        return False
    return queue.run_inline(_direct, (direct, tensors, storage, op, queue))


def _direct(direct: Callable[[list, list], None], tensors: list[torch.Tensor], storage: list[torch.Tensor],
            op: tuple, queue: Any) -> None:
    try:
        direct(tensors, storage)
    except Exception:
        index, name, inputs, allocations, work, args = op
        _Op(index, name, inputs, allocations, work, args, queue, None, False)()
