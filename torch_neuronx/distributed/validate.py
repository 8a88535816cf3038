"""Checks of a collective's arguments on this rank, before anything is exchanged.

gloo aborts the whole process on some shape errors (a stacked ``reduce_scatter_tensor``, an
all-reduce whose sizes differ across ranks) and lets others fail on one rank only while the
peers wait. The local checks here raise a clear :class:`CollectiveArgumentError` in the caller,
before the collective is queued; :func:`signature` and :func:`disagreement` check, once every
rank's row is in (:mod:`.agreements`, ahead of the data), what the ranks must agree
on, so that a mismatch across ranks is the same error on every rank.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import torch


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


def single(kind: str, tensors: Sequence[torch.Tensor]) -> None:
    """Point-to-point messages carry one tensor, as gloo's do."""
    if len(tensors) != 1:
        raise _fail(kind, f"one tensor per message, got {len(tensors)}")


def reduce_op(kind: str, op: Any, tensors: Sequence[torch.Tensor]) -> None:
    """Averages and pre-multiplied sums of booleans have no boolean result: refused, as gloo refuses
    them ("result type Float can't be cast to ... Bool"); the average came back all False."""
    code = op.op if hasattr(op, "op") else torch.distributed.ReduceOp.RedOpType(int(op))
    if code in (torch.distributed.ReduceOp.AVG, torch.distributed.ReduceOp.PREMUL_SUM) \
            and any(t.dtype == torch.bool for t in tensors):
        raise _fail(kind, f"{code.name} of bool tensors has no bool result; convert them to an integer "
                          "or floating dtype first")


def root(kind: str, rank: int, size: int) -> None:
    """A root or peer rank within the group."""
    if not 0 <= rank < size:
        raise _fail(kind, f"rank {rank} is not in a group of {size} ranks")


def gather_base(kind: str, output: torch.Tensor, input: torch.Tensor, size: int) -> None:
    """``all_gather_into_tensor``: the output holds ``size`` inputs (stacked or concatenated)."""
    _same_dtype(kind, output, input)
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


def own_slots(kind: str, tensors: Sequence[torch.Tensor], lists: Sequence[Sequence[torch.Tensor]],
              rank: int) -> None:
    """The multi-tensor list forms of all_gather and reduce_scatter: this rank's slot of each list
    is the size of its own tensor (the ranks then agree on every slot's size)."""
    for i, (tensor, members) in enumerate(zip(tensors, lists)):
        if members[rank].numel() != tensor.numel():
            raise _fail(kind, f"tensor {i}: this rank's ({rank}) slot holds {members[rank].numel()} elements, "
                              f"its own tensor {tensor.numel()}")


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
          "reduce_scatter", "reduce_scatter_coalesced", "gather", "scatter", "all_to_all", "barrier")
#: a row: kind, dtype, crc of what must agree, four per-rank values, ranks' count, the first four agreed,
#: whether the rank runs ahead; then all_to_all's sends and receives (one per rank each)
FIXED = 13
AHEAD = 12
_DTYPE_CODES: dict[torch.dtype | None, int] = {}


#: What the first values of a collective's row are (:func:`_per_rank`'s legend of a disagreement).
_ROW_LAYOUTS = {
    "all_reduce": "each tensor's element count, then the reduce op's code",
    "reduce": "each tensor's element count, then the root rank and the reduce op's code",
    "broadcast": "each tensor's element count, then the root rank (src)",
    "gather": "the input's element count, then the root rank (dst)",
    "scatter": "the output's element count, then the root rank (src)",
    "all_gather": "the element counts of its tensors",
    "reduce_scatter": "each output's element count, then the reduce op's code",
}


def dtype_code(dtype: torch.dtype | None) -> int:
    """``dtype`` as a number every rank computes alike (-1: none)."""
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
    return (kind_code, dtype_code(dtype), zlib.crc32(",".join(map(str, agreed)).encode()), *own, size,
            *shown, 0, *splits)


def disagreement(kind: str, rows: torch.Tensor, expected_mine: Sequence[Sequence[int]] | None = None) -> str | None:
    """What the ranks disagree on, from every rank's :func:`signature` (the same verdict on every
    rank, since each sees every row); None when they agree."""
    size = rows.shape[0]
    for column, what in ((0, "the collective called"), (1, "the dtype"),
                         (2, "the tensor sizes, dtypes, roots or reduce ops")):
        values = rows[:, column].tolist()
        if len(set(values)) > 1:
            return f"the ranks disagree on {what}: " + _per_rank(rows, column, what)
    if expected_mine is not None:
        for r in range(size):
            got = rows[r, 3:3 + len(expected_mine[r])].tolist()
            if got != list(expected_mine[r]):
                return f"rank {r} contributes {got} elements where the others expect {list(expected_mine[r])}"
    if rows.shape[1] > FIXED and rows[:, FIXED:].any():
        sends, receives = rows[:, FIXED:FIXED + size], rows[:, FIXED + size:FIXED + 2 * size]
        if not torch.equal(sends, receives.t()):
            return (f"{kind} splits do not match: rank i sends rows {sends.tolist()} (row i), "
                    f"rank j expects {receives.t().tolist()} (column j)")
    return None


def _per_rank(rows: torch.Tensor, column: int, what: str) -> str:
    if column == 0:
        names = [(_KINDS[v] if v < len(_KINDS) else "another") for v in rows[:, 0].tolist()]
        return ", ".join(f"rank {r}: {n}" for r, n in enumerate(names))
    if column == 2:  # the first sizes they hold
        shown = [rows[r, 8:12].tolist() for r in range(rows.shape[0])]
        differ = next((i for i in range(4) if len({row[i] for row in shown}) > 1), None)
        where = "" if differ is None else f" (they differ at value {differ + 1})"
        kind = _KINDS[int(rows[0, 0])] if int(rows[0, 0]) < len(_KINDS) else None
        return (", ".join(f"rank {r}: {row}" for r, row in enumerate(shown)) + where
                + (f"; a {kind} row holds {_ROW_LAYOUTS[kind]}" if kind in _ROW_LAYOUTS else ""))
    return "different on " + ", ".join(f"rank {r}" for r in range(rows.shape[0]))
