"""Sorts along long dimensions run by torch's CPU kernel over the device memory.

IREE lowers a sort (``stablehlo.sort``, which ``sort``, ``argsort``, ``topk``, ``kthvalue``,
``median`` and ``mode`` become) to a serial loop that compares every pair: ``torch.sort`` of 100k
elements took 5.5 s on the eager device and 300k 50 s, where torch's CPU takes 0.03 s. Such a
call (a sorted dimension of :data:`HOST_SORT_LENGTH` or more) runs torch's CPU kernel instead, as
a synchronization, with its values and indices bit for bit the CPU's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["HOST_SORT_LENGTH", "too_long"]

aten = torch.ops.aten

#: The sorted length from which the CPU's kernel sorts (IREE's pairwise loop: 4096 elements about 10 ms).
HOST_SORT_LENGTH = 4096

_SORTS = frozenset({aten.sort.default, aten.sort.stable, aten.topk.default, aten.kthvalue.default,
                    aten.median.dim, aten.median.default, aten.nanmedian.dim, aten.nanmedian.default,
                    aten.mode.default, aten.msort.default, aten.argsort.default, aten.argsort.stable})


@functools.cache
def _dim_position(func: Any) -> int | None:
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "dim":
            return position
    return None


def too_long(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` is a sort whose sorted dimension has :data:`HOST_SORT_LENGTH` elements or more."""
    if func not in _SORTS or not args or not isinstance(args[0], torch.Tensor):
        return False
    x = args[0]
    position = _dim_position(func)
    if position is None:  # the whole tensor (median(), msort sorts dim 0)
        length = x.shape[0] if func is aten.msort.default and x.dim() else x.numel()
    else:
        dim = kwargs.get("dim", args[position] if len(args) > position else -1)
        length = x.shape[dim] if x.dim() else 1
    return length >= HOST_SORT_LENGTH
