"""``send`` and ``recv`` over the transport, each message preceded by its size.

gloo aborts the receiving process when a message is longer than the receive buffer (an
assertion in its pair thread: SIGABRT, no exception). Every send here first sends a header
(the message's byte count), and the receiver checks it against its buffer before it posts the
data's receive: a longer message is drained into scratch memory, so the pair stays usable, and
the receive raises an error that names both sizes. A shorter message fills the front of the
buffer, as gloo's receive does.

A send posts both messages at once. A receive is :class:`Deferred`: it posts its header's
receive, then its data's, when its group's receiving thread waits for it (one thread per group,
in issue order, apart from the sends': :class:`~.work.CollectiveQueue`), so that on each pair
the receives are posted header, data, header, data, in the order the sends went out, and a
receive waiting for its header never holds up a send.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["Deferred", "recv", "recv_anysource", "send"]

_NO_TIMEOUT = datetime.timedelta(0)  # gloo's default: the group's own timeout


class Deferred(dist.Work):
    """A transport operation that runs when it is waited for (``run(timeout)``)."""

    def __init__(self, run: Callable[[datetime.timedelta], None]) -> None:
        super().__init__()
        self._run = run

    def wait(self, timeout: datetime.timedelta = _NO_TIMEOUT) -> bool:
        self._run(timeout)
        return True


def _header(tensor: torch.Tensor) -> torch.Tensor:
    return torch.tensor([tensor.numel() * tensor.element_size()], dtype=torch.int64)


def send(pg: dist.ProcessGroup, tensor: torch.Tensor, dst: int, tag: int) -> Deferred:
    """Post the header and the data of ``tensor`` (contiguous) to rank ``dst``; the work waits for both."""
    posted = (pg.send([_header(tensor)], dst, tag), pg.send([tensor], dst, tag))

    def run(timeout: datetime.timedelta) -> None:
        for work in posted:
            work.wait(timeout)

    return Deferred(run)


def recv(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int, tag: int) -> Deferred:
    """Rank ``src``'s next message into ``tensor`` (contiguous), its size checked first."""
    def run(timeout: datetime.timedelta) -> None:
        header = torch.empty(1, dtype=torch.int64)
        pg.recv([header], src, tag).wait(timeout)
        _receive(pg, tensor, src, tag, int(header[0]), timeout)

    return Deferred(run)


def recv_anysource(pg: dist.ProcessGroup, tensor: torch.Tensor, tag: int, sources: list[int]) -> Deferred:
    """The next message any rank sends with ``tag`` into ``tensor``; its sender's rank is appended
    to ``sources``."""
    def run(timeout: datetime.timedelta) -> None:
        header = torch.empty(1, dtype=torch.int64)
        received = pg.recv_anysource([header], tag)
        received.wait(timeout)
        src = received._source_rank()
        _receive(pg, tensor, src, tag, int(header[0]), timeout)
        sources.append(src)

    return Deferred(run)


def _receive(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int, tag: int, nbytes: int,
             timeout: datetime.timedelta) -> None:
    mine = tensor.numel() * tensor.element_size()
    if nbytes <= mine:
        target = tensor if nbytes == mine else tensor.reshape(-1).view(torch.uint8)[:nbytes]
        pg.recv([target], src, tag).wait(timeout)
        return
    pg.recv([torch.empty(nbytes, dtype=torch.uint8)], src, tag).wait(timeout)  # drained: the pair stays usable
    raise ValueError(f"recv: rank {src} sent {nbytes} bytes, more than the receive buffer holds "
                     f"({tuple(tensor.shape)} {tensor.dtype}: {mine} bytes); the message was discarded")
