"""The collectives' algorithms over the transport (gloo's process group), on host views of memory.

Each function runs one collective to completion on plain tensors (a neuron tensor's memory seen
from the host, or CPU tensors): the transport does the exchange; this module adds what it lacks
(AVG, PREMUL_SUM, uneven all-gather and reduce-scatter by padding, all_to_all_v by padding,
split all-gather and reduce-scatter in chunks, buckets of at most COLLECTIVE_BUCKETSIZE_IN_MB).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import threading
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

RedOp = dist.ReduceOp.RedOpType


class Stopped(RuntimeError):
    """The collective was stopped while the transport ran it (:class:`Interrupt`)."""


class Interrupt:
    """A way to stop waiting for a collective's transport work from another thread: a rank that
    ran ahead into a collective whose agreement check then failed waits for peers that never
    join; :meth:`stop` frees its thread within a slice of a wait (the transport gives up at its own
    timeout)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    def _wait(self, work: dist.Work) -> None:
        """Wait for ``work`` until it ends or :meth:`stop` is called (then :class:`Stopped`).

        Waited for in slices, not woken by a callback on the transport's future: a Python callback
        there outlives the interpreter when the work never completes (a peer that never joins), and
        gloo's thread, failing the work at its own timeout after the interpreter exited, then
        aborted the process (SIGABRT or SIGSEGV at exit)."""
        while True:
            with self._lock:
                if self._stopped:
                    raise Stopped("stopped while its transport work waited for the peers")
            try:
                work.wait(_SLICE)
                return
            except RuntimeError:
                if _ended(work):  # it ended: its own outcome (the slice may have run out as it
                    work.wait()  # completed; that timeout is not the work's error)
                    return


def _ended(work: dist.Work) -> bool:
    try:
        return work.is_completed()
    except RuntimeError:
        return True


#: How long a stoppable wait waits between looks at its stop flag.
_SLICE = datetime.timedelta(milliseconds=20)


_running = threading.local()  # the Interrupt of the collective this thread runs, if it can be stopped


@contextlib.contextmanager
def interruptible(interrupt: Interrupt) -> Iterator[None]:
    """The transport waits of the algorithms run in this block end when ``interrupt`` stops."""
    _running.interrupt = interrupt
    try:
        yield
    finally:
        _running.interrupt = None


def _wait(work: dist.Work) -> None:
    interrupt = getattr(_running, "interrupt", None)
    if interrupt is None:
        work.wait()
    else:
        interrupt._wait(work)


def _reduce_options(op: RedOp) -> dist.AllreduceOptions:
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp(op)
    return options


def op_and_factor(reduce_op: dist.ReduceOp) -> tuple[RedOp, float | torch.Tensor | None]:
    """The reduction of ``reduce_op`` and PREMUL_SUM's factor (None for other reductions)."""
    op = reduce_op.op if hasattr(reduce_op, "op") else RedOp(int(reduce_op))
    return op, getattr(reduce_op, "factor", None) if op == RedOp.PREMUL_SUM else None


def _transport_op(op: RedOp) -> RedOp:
    return RedOp.SUM if op in (RedOp.AVG, RedOp.PREMUL_SUM) else op


def _before(tensor: torch.Tensor, op: RedOp, factor: float | torch.Tensor | None) -> None:
    if op == RedOp.PREMUL_SUM:
        tensor.mul_(factor.to(tensor.device) if isinstance(factor, torch.Tensor) else factor)


def _after(tensor: torch.Tensor, op: RedOp, size: int) -> None:
    if op != RedOp.AVG:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(size)
    else:  # NCCL's average of integers truncates
        tensor.copy_(torch.div(tensor, size, rounding_mode="trunc"))


def _bucketed(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive tensors of one dtype grouped so that each group holds at most ``bucket_bytes``
    (a tensor larger than that is a group of its own, split later)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        if buckets and buckets[-1][0].dtype == t.dtype and size + t.nbytes <= bucket_bytes:
            buckets[-1].append(t)
            size += t.nbytes
        else:
            buckets.append([t])
            size = t.nbytes
    return buckets


def _reduce_flat(pg: dist.ProcessGroup, flat: torch.Tensor, op: RedOp, bucket_bytes: int) -> None:
    """All-reduce a 1-D contiguous tensor in pieces of at most ``bucket_bytes``."""
    step = max(1, bucket_bytes // max(flat.element_size(), 1))
    options = _reduce_options(op)
    for start in range(0, flat.numel(), step):
        _wait(pg.allreduce([flat[start:start + step]], options))


def all_reduce(pg: dist.ProcessGroup, tensors: Sequence[torch.Tensor], reduce_op: dist.ReduceOp,
               size: int, bucket_bytes: int) -> None:
    """All-reduce ``tensors`` in place, every ReduceOp included; small tensors coalesced into
    buckets and large ones split into buckets of at most ``bucket_bytes``."""
    op, factor = op_and_factor(reduce_op)
    wire = _transport_op(op)
    for bucket in _bucketed(tensors, bucket_bytes):
        if len(bucket) == 1 and bucket[0].is_contiguous():
            flat = bucket[0].view(-1)
            _before(flat, op, factor)
            _reduce_flat(pg, flat, wire, bucket_bytes)
            _after(flat, op, size)
            continue
        flat = torch.cat([t.reshape(-1) for t in bucket])
        _before(flat, op, factor)
        _reduce_flat(pg, flat, wire, bucket_bytes)
        _after(flat, op, size)
        offset = 0
        for t in bucket:
            t.copy_(flat[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()


def broadcast(pg: dist.ProcessGroup, tensors: Sequence[torch.Tensor], root: int) -> None:
    """Broadcast ``tensors`` from ``root`` (in place)."""
    options = dist.BroadcastOptions()
    options.rootRank = root
    _wait(pg.broadcast([_contiguous(t) for t in tensors], options))


def reduce(pg: dist.ProcessGroup, tensor: torch.Tensor, root: int, reduce_op: dist.ReduceOp, size: int) -> None:
    """Reduce ``tensor`` onto ``root`` (in place there; other ranks keep their tensor as it was,
    as NCCL's reduce does: gloo uses a non-root's buffer as scratch, so they send a copy)."""
    op, factor = op_and_factor(reduce_op)
    is_root = pg.rank() == root
    work = tensor if tensor.is_contiguous() and is_root else tensor.clone(memory_format=torch.contiguous_format)
    _before(work, op, factor)
    options = dist.ReduceOptions()
    options.rootRank, options.reduceOp = root, dist.ReduceOp(_transport_op(op))
    _wait(pg.reduce([work], options))
    if is_root:
        _after(work, op, size)
        if work is not tensor:
            tensor.copy_(work)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError("collectives need contiguous tensors (call .contiguous() first)")
    return t


def all_gather_base(pg: dist.ProcessGroup, output: torch.Tensor, input: torch.Tensor, split: bool) -> None:
    """Gather every rank's ``input`` into ``output`` (rank-major). ``split``: in chunks, so that the
    extra memory stays within one chunk per rank."""
    if not output.is_contiguous():  # (a transposed view): gathered in order into a copy, written back
        staged = torch.empty(output.shape, dtype=output.dtype)
        all_gather_base(pg, staged, input, split)
        output.copy_(staged)
        return
    size = pg.size()
    out = output.view(size, -1)
    flat_in = input.reshape(-1)
    n = flat_in.numel()
    if not split or n * input.element_size() <= _chunk_bytes():
        _wait(pg._allgather_base(output.view(-1), flat_in.contiguous(), c10d.AllgatherOptions()))
        return
    step = max(1, _chunk_bytes() // input.element_size())
    flat_in = flat_in.contiguous()
    for start in range(0, n, step):
        count = min(step, n - start)
        # each rank's slice of the chunk lands straight in its row of the output (contiguous views)
        rows = [out[r, start:start + count] for r in range(size)]
        _wait(pg.allgather([rows], [flat_in[start:start + count]], c10d.AllgatherOptions()))


def _chunk_bytes() -> int:
    from torch_neuronx.distributed.options import SPLIT_CHUNK_BYTES
    return SPLIT_CHUNK_BYTES


def all_gather(pg: dist.ProcessGroup, outputs: Sequence[torch.Tensor], input: torch.Tensor) -> None:
    """Gather into a list of per-rank outputs, whose sizes may differ (uneven: padded to the largest)."""
    size = pg.size()
    largest = max(o.numel() for o in outputs)
    if all(o.numel() == largest for o in outputs) and input.numel() == largest:
        gathered = torch.empty(size * largest, dtype=input.dtype)
        _wait(pg._allgather_base(gathered, input.reshape(-1).contiguous(), c10d.AllgatherOptions()))
    else:
        padded = torch.zeros(largest, dtype=input.dtype)
        padded[:input.numel()] = input.reshape(-1)
        gathered = torch.empty(size * largest, dtype=input.dtype)
        _wait(pg._allgather_base(gathered, padded, c10d.AllgatherOptions()))
    for rank, out in enumerate(outputs):
        out.copy_(gathered[rank * largest:rank * largest + out.numel()].view(out.shape))


def reduce_scatter_base(pg: dist.ProcessGroup, output: torch.Tensor, input: torch.Tensor,
                        reduce_op: dist.ReduceOp, split: bool) -> None:
    """Reduce ``input`` (rank-major slices) and keep this rank's slice in ``output``. Without
    ``split``, one all-reduce of a copy of the whole input (gloo's own algorithm); with it, the
    same in chunks, so the extra memory stays within one chunk per rank."""
    size, rank = pg.size(), pg.rank()
    op, factor = op_and_factor(reduce_op)
    wire = _reduce_options(_transport_op(op))
    n = output.numel()
    if n == 0:  # (every rank's output is empty: the sizes agreed)
        return
    rows = input.reshape(size, n)
    step = n if not split else max(1, _chunk_bytes() // input.element_size())
    # a non-contiguous output gets this rank's slices in a contiguous copy, written back at the end
    flat_out = output.view(-1) if output.is_contiguous() else torch.empty(n, dtype=output.dtype)
    # the transport reduces in place: a copy of the input, whole, or one chunk's rows at a time
    # in a buffer reused by every chunk (one chunk live, its pages touched once)
    whole = step >= n
    buffer = (rows.clone() if input.is_contiguous() else rows.contiguous()) if whole else \
        torch.empty(size * step, dtype=input.dtype)
    for start in range(0, n, step):
        count = min(step, n - start)
        if whole:
            chunk = buffer
        else:
            chunk = buffer[:size * count].view(size, count)
            chunk.copy_(rows[:, start:start + count])
        _before(chunk, op, factor)
        _wait(pg.allreduce([chunk.view(-1)], wire))
        _after(chunk, op, size)
        flat_out[start:start + count].copy_(chunk[rank])
    if not output.is_contiguous():
        output.copy_(flat_out.view(output.shape))


def reduce_scatter(pg: dist.ProcessGroup, output: torch.Tensor, inputs: Sequence[torch.Tensor],
                   reduce_op: dist.ReduceOp, split: bool) -> None:
    """The list form: ``inputs[r]`` is what this rank contributes to rank ``r``'s ``output``
    (uneven sizes padded to the largest)."""
    largest = max(t.numel() for t in inputs)
    stacked = torch.zeros(len(inputs), largest, dtype=output.dtype)
    for r, t in enumerate(inputs):
        stacked[r, :t.numel()] = t.reshape(-1)
    result = torch.empty(largest, dtype=output.dtype)
    reduce_scatter_base(pg, result, stacked, reduce_op, split)
    output.copy_(result[:output.numel()].view(output.shape))


def all_to_all_single(pg: dist.ProcessGroup, output: torch.Tensor, input: torch.Tensor,
                      output_splits: Sequence[int], input_splits: Sequence[int], native: bool) -> None:
    """Exchange rows: rank ``r`` receives ``input_splits[r]`` rows of this rank's input (both
    splits given in full: :func:`even_splits` for a side the caller left empty).

    ``native`` (NEURON_USE_NKI_ALLTOALLV=1): the transport's uneven exchange; otherwise the
    compatibility path: pad every block to the largest split of any pair, exchange evenly, unpad.
    """
    size = pg.size()
    if native:
        _wait(pg.alltoall_base(output, input, list(output_splits), list(input_splits), dist.AllToAllOptions()))
        return
    row = math.prod(input.shape[1:])
    splits = torch.tensor(input_splits, dtype=torch.int64)
    every = torch.empty(size * size, dtype=torch.int64)
    _wait(pg._allgather_base(every, splits, c10d.AllgatherOptions()))
    largest = max(1, int(every.max()))
    # What each peer sends this rank (its input split for this rank), whatever output_splits says.
    output_splits = every.view(size, size)[:, pg.rank()].tolist()
    send = torch.zeros(size, largest * row, dtype=input.dtype)
    offset = 0
    flat_in = input.reshape(-1)
    for r, count in enumerate(input_splits):
        send[r, :count * row] = flat_in[offset:offset + count * row]
        offset += count * row
    received = torch.empty_like(send)
    _wait(pg.alltoall_base(received, send, [], [], dist.AllToAllOptions()))
    offset = 0
    flat_out = output.view(-1)
    for r, count in enumerate(output_splits):
        flat_out[offset:offset + count * row] = received[r, :count * row]
        offset += count * row


def even_splits(rows: int, size: int) -> list[int]:
    """The splits of an even all_to_all_single over ``rows`` rows (a side given empty, as the
    transport reads it)."""
    return [rows // size] * size
