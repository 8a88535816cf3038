"""Checks of a collective's arguments on this rank, before anything is exchanged.

gloo aborts the whole process on some shape errors (a stacked ``reduce_scatter_tensor``, an
all-reduce whose sizes differ across ranks) and lets others fail on one rank only while the
peers wait. The local checks here raise a clear :class:`CollectiveArgumentError` in the caller,
before the collective is queued; :func:`signature` and :func:`disagreement` check, once every
rank's row has been exchanged (:class:`Agreements`, ahead of the data), what the ranks must agree
on, so that a mismatch across ranks is the same error on every rank.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

_log = logging.getLogger("torch_neuronx.distributed")


class CollectiveArgumentError(ValueError):
    """A collective called with tensors that cannot work (sizes, dtypes, devices, ranks)."""


def _fail(kind: str, message: str) -> CollectiveArgumentError:
    return CollectiveArgumentError(f"{kind}: {message}")


def same_device(kind: str, tensors: Sequence[Any], index: int) -> None:
    """Every neuron tensor of one collective lives on one device."""
    for t in tensors:
        if t._index != index:
            raise _fail(kind, f"tensors on neuron:{index} and neuron:{t._index} in one collective")


def dtypes(kind: str, tensors: Sequence[torch.Tensor]) -> None:
    """A collective over several tensors: one dtype."""
    if len({t.dtype for t in tensors}) > 1:
        raise _fail(kind, f"tensors of different dtypes {sorted(str(t.dtype) for t in tensors)}")


def contiguous(kind: str, tensors: Sequence[torch.Tensor]) -> None:
    """The transport reads and writes memory in place: tensors must be contiguous."""
    for t in tensors:
        if not t.is_contiguous():
            raise _fail(kind, f"a non-contiguous tensor of shape {tuple(t.shape)} (call .contiguous() first)")


def root(kind: str, rank: int, size: int) -> None:
    """A root or peer rank within the group."""
    if not 0 <= rank < size:
        raise _fail(kind, f"rank {rank} is not in a group of {size} ranks")


def gather_base(kind: str, output: torch.Tensor, input: torch.Tensor, size: int) -> None:
    """``all_gather_into_tensor``: the output holds ``size`` inputs (stacked or concatenated)."""
    _same_dtype(kind, output, input)
    contiguous(kind, [output])
    if output.numel() != input.numel() * size:
        raise _fail(kind, f"output of {output.numel()} elements for {size} inputs of {input.numel()}")


def scatter_base(kind: str, output: torch.Tensor, input: torch.Tensor, size: int) -> None:
    """``reduce_scatter_tensor``: the input holds ``size`` outputs (stacked or concatenated)."""
    _same_dtype(kind, output, input)
    if input.numel() != output.numel() * size:
        raise _fail(kind, f"input of {input.numel()} elements for {size} outputs of {output.numel()}")


def gather_lists(kind: str, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                 size: int) -> None:
    """``all_gather`` (list form): one list of ``size`` outputs per input, each of the input's dtype."""
    _list_per_tensor(kind, inputs, output_lists, size, "input", "output")


def coalesced_gather(kind: str, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                     size: int) -> None:
    """``all_gather_coalesced``: ``size`` lists, each with one output per input."""
    if len(output_lists) != size:
        raise _fail(kind, f"{len(output_lists)} output lists for a group of {size} ranks")
    for outputs in output_lists:
        if len(outputs) != len(inputs):
            raise _fail(kind, f"an output list of {len(outputs)} tensors for {len(inputs)} inputs")
        for output, input in zip(outputs, inputs):
            _same_dtype(kind, output, input)


def scatter_lists(kind: str, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
                  size: int) -> None:
    """``reduce_scatter`` (list form): ``size`` inputs per output."""
    _list_per_tensor(kind, outputs, input_lists, size, "output", "input")
    for output, inputs in zip(outputs, input_lists):
        if inputs[0].numel() != output.numel() and len({t.numel() for t in inputs}) == 1:
            raise _fail(kind, f"inputs of {inputs[0].numel()} elements for an output of {output.numel()}")


def _list_per_tensor(kind: str, tensors: Sequence[torch.Tensor], lists: Sequence[Sequence[torch.Tensor]],
                     size: int, tensor_name: str, list_name: str) -> None:
    """The list forms of all_gather and reduce_scatter: one list of ``size`` tensors (one per
    rank) for each of ``tensors``, each of its dtype."""
    if len(lists) != len(tensors):
        raise _fail(kind, f"{len(tensors)} {tensor_name}s for {len(lists)} {list_name} lists")
    for tensor, members in zip(tensors, lists):
        if len(members) != size:
            raise _fail(kind, f"{len(members)} {list_name}s for a group of {size} ranks")
        for member in members:
            _same_dtype(kind, member, tensor)


def rooted_lists(kind: str, lists: Sequence[Sequence[torch.Tensor]], singles: Sequence[torch.Tensor],
                 is_root: bool, size: int) -> None:
    """``gather`` / ``scatter``: the root holds ``size`` tensors shaped like the single tensor;
    other ranks hold none."""
    if len(singles) != 1:
        raise _fail(kind, f"expected one tensor, got {len(singles)}")
    if not is_root:
        if any(len(lst) for lst in lists):
            raise _fail(kind, "only the root rank passes a list of tensors")
        return
    if len(lists) != 1 or len(lists[0]) != size:
        raise _fail(kind, f"the root passes one list of {size} tensors")
    for t in lists[0]:
        _same_dtype(kind, t, singles[0])
        if t.shape != singles[0].shape:
            raise _fail(kind, f"the root's tensors must have this rank's shape {tuple(singles[0].shape)}, "
                        f"got {tuple(t.shape)}")


def all_to_all(kind: str, output: torch.Tensor, input: torch.Tensor, output_splits: Sequence[int],
               input_splits: Sequence[int], size: int) -> None:
    """``all_to_all_single``: splits (rows) that add up to the tensors' first dimension."""
    _same_dtype(kind, output, input)
    contiguous(kind, [output, input])
    for name, tensor, splits in (("input", input, input_splits), ("output", output, output_splits)):
        if splits:
            if len(splits) != size:
                raise _fail(kind, f"{len(splits)} {name} splits for a group of {size} ranks")
            if any(s < 0 for s in splits):
                raise _fail(kind, f"negative {name} split in {list(splits)}")
            rows = tensor.shape[0] if tensor.dim() else 1
            if sum(splits) != rows:
                raise _fail(kind, f"{name} splits {list(splits)} add up to {sum(splits)}, not its {rows} rows")
        elif tensor.dim() and tensor.shape[0] % size:
            raise _fail(kind, f"{name} of {tensor.shape[0]} rows does not split evenly over {size} ranks")


def list_lengths(kind: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], size: int) -> None:
    """``all_to_all`` (list form): one tensor per rank each way, of one dtype."""
    if len(outputs) != size or len(inputs) != size:
        raise _fail(kind, f"{len(inputs)} inputs and {len(outputs)} outputs for a group of {size} ranks")
    dtypes(kind, [*outputs, *inputs])


def _same_dtype(kind: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise _fail(kind, f"tensors of dtypes {a.dtype} and {b.dtype}")


# -- agreement across ranks --------------------------------------------------------------------

_KINDS = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_coalesced",
          "reduce_scatter", "reduce_scatter_coalesced", "gather", "scatter", "all_to_all")
#: kind, dtype, crc of what must agree, four per-rank values, ranks' count, the first four agreed,
#: whether the rank runs ahead; then all_to_all's sends and receives (one per rank each)
_FIXED = 13
_AHEAD = 12
_DTYPE_CODES: dict[torch.dtype | None, int] = {}


def _dtype_code(dtype: torch.dtype | None) -> int:
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = -1 if dtype is None else zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF
    return code


def signature(kind: str, dtype: torch.dtype | None, agreed: Sequence[int], mine: Sequence[int], size: int,
              sends: Sequence[int] = (), receives: Sequence[int] = ()) -> tuple[int, ...]:
    """This rank's row of a collective's agreement check: what every rank must agree on (its kind,
    dtype, the sizes they share) and this rank's own values (up to four; all_to_all's splits)."""
    kind_code = _KINDS.index(kind) if kind in _KINDS else len(_KINDS)
    own = (*mine, 0, 0, 0, 0)[:4]
    shown = (*agreed[:4], 0, 0, 0, 0)[:4]
    splits = (*sends, *receives) if sends else (0,) * (2 * size)
    return (kind_code, _dtype_code(dtype), zlib.crc32(",".join(map(str, agreed)).encode()), *own, size,
            *shown, 0, *splits)


def disagreement(kind: str, rows: torch.Tensor, expected_mine: Sequence[Sequence[int]] | None = None) -> str | None:
    """What the ranks disagree on, from every rank's :func:`signature` (the same verdict on every
    rank, since each sees every row); None when they agree."""
    size = rows.shape[0]
    for column, what in ((0, "the collective called"), (1, "the dtype"), (2, "the tensor sizes")):
        values = rows[:, column].tolist()
        if len(set(values)) > 1:
            return f"the ranks disagree on {what}: " + _per_rank(rows, column, what)
    if expected_mine is not None:
        for r in range(size):
            got = rows[r, 3:3 + len(expected_mine[r])].tolist()
            if got != list(expected_mine[r]):
                return f"rank {r} contributes {got} elements where the others expect {list(expected_mine[r])}"
    if rows.shape[1] > _FIXED and rows[:, _FIXED:].any():
        sends, receives = rows[:, _FIXED:_FIXED + size], rows[:, _FIXED + size:_FIXED + 2 * size]
        if not torch.equal(sends, receives.t()):
            return (f"{kind} splits do not match: rank i sends rows {sends.tolist()} (row i), "
                    f"rank j expects {receives.t().tolist()} (column j)")
    return None


def _per_rank(rows: torch.Tensor, column: int, what: str) -> str:
    if column == 0:
        names = [(_KINDS[v] if v < len(_KINDS) else "another") for v in rows[:, 0].tolist()]
        return ", ".join(f"rank {r}: {n}" for r, n in enumerate(names))
    if column == 2:  # the first sizes they hold
        return ", ".join(f"rank {r}: {[v for v in rows[r, 8:12].tolist()]}" for r in range(rows.shape[0]))
    return "different on " + ", ".join(f"rank {r}" for r in range(rows.shape[0]))


class Check:
    """One collective's agreement check, in flight on the checks transport.

    ``ahead``: this rank runs the collective's data without waiting for the verdict (its row is
    the one it sent for the last collective of this kind, whose check agreed). ``done`` is set once
    the verdict is in: ``error`` (a :class:`CollectiveArgumentError`, or the transport's error),
    and ``breaks``: the check failed while some rank ran ahead into the data, so the data transport
    is out of step on that rank and the group cannot go on (the same verdict on every rank).
    """

    __slots__ = ("kind", "row", "ahead", "expected", "rows", "done", "error", "breaks", "_lock", "_on_failure")

    def __init__(self, kind: str, row: tuple[int, ...], ahead: bool,
                 expected: Sequence[Sequence[int]] | None) -> None:
        self.kind, self.row, self.ahead, self.expected = kind, row, ahead, expected
        self.rows: torch.Tensor | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.breaks = False
        self._lock = threading.Lock()
        self._on_failure: Callable[[Check], None] | None = None

    @property
    def agreed(self) -> bool:
        """The verdict is in, and the ranks agree."""
        return self.done.is_set() and self.error is None

    def on_failure(self, callback: Callable[[Check], None]) -> None:
        """Call ``callback(self)`` once the verdict is a failure (at once if it already is)."""
        with self._lock:
            if not self.done.is_set():
                self._on_failure = callback
                return
        if self.error is not None:
            callback(self)

    def complete(self, future: Any) -> None:
        """The transport's callback: every rank's row has arrived (or the exchange failed)."""
        try:
            future.wait()
            ahead = self.rows[:, _AHEAD].tolist()
            # every rank ahead: each sent the row of its last such collective, whose check agreed
            problem = None if all(ahead) else disagreement(self.kind, self.rows, self.expected)
            if problem is not None:
                self.error = CollectiveArgumentError(f"{self.kind}: {problem}")
                self.breaks = any(ahead)
        except BaseException as exc:  # the exchange failed (a dead peer, the timeout)
            self.error, self.breaks = exc, self.ahead
        with self._lock:
            self.done.set()
            callback, self._on_failure = self._on_failure, None
        if callback is not None and self.error is not None:
            try:
                callback(self)
            except BaseException:  # a callback on the transport's thread must not raise
                _log.exception("the agreement failure callback of %s failed", self.kind)


class Agreements:
    """The agreement checks of one process group, exchanged on a transport of their own.

    Every rank posts every check (an all-gather of its :func:`signature` row) when the collective
    is issued, in program order, so the checks run ahead of the data. A rank waits for the verdict
    before the data unless its row is the one of the last collective of that kind and that check
    agreed: then, if every rank is in that case, the ranks agree again (the rows of that earlier
    collective agreed), and the data need not wait for the round trip. A rank whose row changed
    waits; the ranks that went ahead learn a failed verdict from the same exchange (:class:`Check`).
    """

    def __init__(self, transport: Any, size: int) -> None:
        self._transport, self._size = transport, size
        self._last: dict[str, Check] = {}

    def post(self, kind: str, row: tuple[int, ...], expected: Sequence[Sequence[int]] | None) -> Check:
        """Send this rank's row of ``kind``'s check; the :class:`Check` completes with the verdict."""
        last = self._last.get(kind)
        check = Check(kind, row, last is not None and last.row == row and last.agreed, expected)
        self._last[kind] = check
        sent = torch.tensor(row, dtype=torch.int64)
        if check.ahead:
            sent[_AHEAD] = 1
        check.rows = torch.empty(self._size, len(row), dtype=torch.int64)
        work = self._transport._allgather_base(check.rows.view(-1), sent, c10d.AllgatherOptions())
        work.get_future().add_done_callback(check.complete)
        return check
