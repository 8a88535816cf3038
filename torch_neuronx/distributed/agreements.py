"""The agreement check across ranks: each collective's signature row, exchanged only when it changed.

gloo aborts the process on some mismatches and hangs on others, so before a collective's data
moves, the ranks must know that they called the same collective on matching sizes
(:func:`.validate.signature`, :func:`.validate.disagreement`). Exchanging a row for every
collective cost one small gloo exchange each, about as much as a 1 MB all-reduce's own latency
on a small host; here a rank exchanges nothing when its row is the one it predicted, which a loop
of repeated collectives always is:

- **Prediction.** Every rank keeps the sequence of its rows' shared part (collective, dtype, the
  sizes all ranks hold): identical on every rank as long as the checks agree. From it every rank
  derives the same period ``P`` (how far back the last collective's shared part occurred before;
  1 if never), and calls its row at collective ``k`` *ahead* when it equals its own row at
  ``k - P``, every earlier check agreed, and no failure since made history start over. If every
  rank is ahead, every row repeats one that agreed, so the rows agree: nothing is exchanged and the
  data goes at once.
- **A changed row** is sent (REQ) to every peer on the checks' own gloo group, point to point. A
  peer that was ahead at ``k`` answers with its row (RESP) from its listener thread (one per peer,
  blocked on a receive), whether it posted ``k`` before or after the request came; a peer whose row
  changed too sent its own REQ, which serves. With every row in, each changed rank reaches the
  same verdict; a failure is sent (FAIL, with every row) to the ranks that went ahead, whose data
  may be in flight: they raise the same error, and the group becomes unusable (their transport
  holds a collective the others never joined). A failure where no rank went ahead leaves the
  group usable, and the prediction starts over on every rank.
- **Waits.** The changed rank waits for the verdict within the group's timeout (``Task``); the
  listeners and the sender wait on gloo without a deadline, since nothing waits for them except
  through such a bounded wait; a dead peer closes its connection, which fails the listener's
  receive and every check still waiting, at once.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx.distributed.validate import AHEAD, FIXED, CollectiveArgumentError, disagreement

_log = logging.getLogger("torch_neuronx.distributed")
_TAG = 0x4E43  # the checks' group carries nothing else
_REQ, _RESP, _FAIL, _BYE = 1, 2, 3, 4
_HEADER = 3  # message type, collective's sequence number, sender's rank
_HISTORY = 1024  # rows a rank keeps (to answer a late request, to predict); a period beyond is no period
_FOREVER = datetime.timedelta(days=3650)  # the listeners' and sender's gloo waits (see the module doc)
_CLOSE_S = 10.0  # at exit, how long a rank waits for its peers' goodbyes
_open: weakref.WeakSet[Agreements] = weakref.WeakSet()
_SETTLED = threading.Event()  # the ``done`` of every predicted check
_SETTLED.set()
_callbacks = threading.Lock()  # a failure callback runs once, whichever thread settles or registers


class Check:
    """One collective's agreement check on this rank.

    ``ahead``: its row was predicted, so it was not sent and its data need not wait; ``done`` is
    set at once, and a failure can still come later (another rank's row changed and disagrees),
    with ``breaks`` set. Otherwise ``done`` is set once every rank's row is in and the verdict is
    taken: ``error`` (a :class:`CollectiveArgumentError`, or the transport's error) and ``breaks``
    (some rank had gone ahead into the data, so the group cannot go on: the same on every rank).
    """

    __slots__ = ("kind", "row", "ahead", "expected", "seq", "rows", "open", "done", "error", "breaks", "_on_failure")

    def __init__(self, kind: str, row: tuple[int, ...], ahead: bool, expected: Sequence[Sequence[int]] | None,
                 seq: int) -> None:
        self.kind, self.row, self.ahead, self.expected, self.seq = kind, row, ahead, expected, seq
        self.rows: dict[int, list[int]] = {}  # a changed check: the rows in so far, by rank
        self.open = not ahead  # a changed check whose verdict is not taken yet (see Agreements)
        self.done = _SETTLED if ahead else threading.Event()
        self.error: BaseException | None = None
        self.breaks = False
        self._on_failure: Callable[[Check], None] | None = None

    @property
    def agreed(self) -> bool:
        """The verdict is in (or predicted), and no failure came."""
        return self.done.is_set() and self.error is None

    def on_failure(self, callback: Callable[[Check], None]) -> None:
        """Call ``callback(self)`` once the check fails (at once if it already did)."""
        with _callbacks:
            self._on_failure = callback
        if self.error is not None:
            self._call_back()

    def settle(self, error: BaseException | None, breaks: bool) -> None:
        """The verdict: ``error`` (None: the ranks agree); only the first failure counts."""
        if self.error is None and error is not None:
            self.error, self.breaks = error, breaks
            if self.done is not _SETTLED:
                self.done.set()
            self._call_back()
        elif self.done is not _SETTLED:
            self.done.set()

    def _call_back(self) -> None:
        with _callbacks:
            callback, self._on_failure = self._on_failure, None
        if callback is not None:
            try:
                callback(self)
            except BaseException:  # called on a listener's thread, which must go on
                _log.exception("the agreement failure callback of %s failed", self.kind)


class _History:
    """The rows this rank posted, and the shared parts' sequence the prediction reads."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, ...]] = {}  # seq -> this rank's row
        self.previous: dict[int, int] = {}  # seq -> the last earlier seq with the same shared part
        self._last: dict[tuple[int, ...], int] = {}  # shared part -> the last seq that had it
        self.fresh_from = 1  # a check failed before this seq: older rows predict nothing

    def record(self, seq: int, row: tuple[int, ...]) -> None:
        key = row[:3]
        before = self._last.get(key)
        if before is not None:
            self.previous[seq] = before
        self._last[key] = seq
        self.rows[seq] = row
        old = seq - _HISTORY
        self.rows.pop(old, None)
        self.previous.pop(old, None)
        if len(self._last) > 2 * _HISTORY:
            self._last = {k: s for k, s in self._last.items() if s > old}

    def predicts(self, seq: int, row: tuple[int, ...]) -> bool:
        """Whether ``row`` is the row this rank predicts for ``seq`` (every rank derives the same period)."""
        last = seq - 1
        if last < self.fresh_from:
            return False
        before = self.previous.get(last)
        period = last - before if before is not None and before >= self.fresh_from else 1
        reference = seq - period
        return reference >= self.fresh_from and self.rows.get(reference) == row

    def start_over(self, failed: int) -> None:
        self.fresh_from = max(self.fresh_from, failed + 1)


class Agreements:
    """The agreement checks of one process group, on a gloo group of their own (see the module doc)."""

    def __init__(self, transport: Any, rank: int, size: int) -> None:
        self._transport, self._rank, self._size = transport, rank, size
        self._width = FIXED + 2 * size  # a signature row's length (see validate.signature)
        self._lock = threading.Lock()
        self._seq = 0
        self._history = _History()
        self._checks: dict[int, Check] = {}  # seq -> this rank's check, kept while a peer may refer to it
        self._early: dict[int, dict[int, list[int]]] = {}  # seq -> rows of peers' requests before it was posted
        self._pending = 0  # changed checks without a verdict
        self._failure: BaseException | None = None  # the checks' transport failed (a peer died)
        self._sends: queue.SimpleQueue[tuple[int, torch.Tensor] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._pid = os.getpid()
        self._goodbye_said = False
        self._bye_sent: set[int] = set()  # peers this rank said goodbye to (once each way)
        if size > 1:
            self._start()

    # -- posting -----------------------------------------------------------------------------

    def post(self, kind: str, row: tuple[int, ...], expected: Sequence[Sequence[int]] | None) -> Check:
        """This rank's check of its next collective: predicted (nothing sent), or sent to every peer."""
        with self._lock:
            seq = self._seq = self._seq + 1
            ahead = self._failure is None and self._pending == 0 and self._history.predicts(seq, row)
            check = Check(kind, row, ahead, expected, seq)
            self._history.record(seq, row)
            self._checks[seq] = check
            self._checks.pop(seq - _HISTORY, None)
            early = self._early.pop(seq, {})
            if ahead:
                sends = [(peer, _RESP) for peer in early]
            else:
                self._pending += 1
                check.rows = {self._rank: list(row), **early}
                sends = [(peer, _REQ) for peer in range(self._size) if peer != self._rank]
            complete = not ahead and len(check.rows) == self._size and self._close(check)
        for peer, kind_of in sends:
            self._send(peer, kind_of, seq, row)
        if complete:
            self._judge(check)
        elif self._failure is not None and not ahead:
            self._conclude(check, self._failure)
        return check

    def _close(self, check: Check) -> bool:
        """Under the lock: take ``check`` off the waiting ones; False if another thread already did."""
        if not check.open:
            return False
        check.open = False
        self._pending -= 1
        return True

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, peer: int, message: list[int]) -> None:
        """A peer's message (on its listener's thread)."""
        kind_of, seq = message[0], message[1]
        rows = [message[_HEADER + i * self._width:_HEADER + (i + 1) * self._width] for i in range(self._size)]
        if kind_of == _FAIL:
            self._failed_ahead(seq, rows)
            return
        row = rows[0]
        complete = False
        with self._lock:
            check = self._checks.get(seq)
            if check is None and seq > self._seq:  # not posted yet: answered when it is
                self._early.setdefault(seq, {})[peer] = row
                return
            if check is not None and not check.ahead:  # the peer's row (its request, or its answer)
                check.rows[peer] = row
                complete = len(check.rows) == self._size and self._close(check)
        if check is None:  # posted too long ago to answer: a row that disagrees with any
            self._send(peer, _RESP, seq, (-1,) * self._width)
        elif check.ahead:  # a peer's row changed where this rank's was predicted: send it this row
            self._send(peer, _RESP, seq, check.row)
        elif complete:
            self._judge(check)

    def _judge(self, check: Check) -> None:
        """Every rank's row of a changed check is in: the verdict, the same on every changed rank."""
        rows = torch.tensor([check.rows[r] for r in range(self._size)], dtype=torch.int64)
        ahead = [r for r in range(self._size) if rows[r, AHEAD]]
        problem = disagreement(check.kind, rows, check.expected)
        if problem is None:
            check.settle(None, False)
            return
        if ahead:
            message = rows.view(-1).tolist()
            for peer in ahead:
                self._send_rows(peer, _FAIL, check.seq, message)
        else:
            with self._lock:
                self._history.start_over(check.seq)
        check.settle(CollectiveArgumentError(f"{check.kind}: {problem}"), bool(ahead))

    def _failed_ahead(self, seq: int, rows: list[list[int]]) -> None:
        """A changed rank's verdict on a collective this rank went ahead into: it failed."""
        with self._lock:
            check = self._checks.get(seq)
        if check is None:
            return
        problem = disagreement(check.kind, torch.tensor(rows, dtype=torch.int64), check.expected)
        check.settle(CollectiveArgumentError(f"{check.kind}: {problem or 'the ranks disagree'}"), True)

    def _conclude(self, check: Check, error: BaseException) -> None:
        """A changed check ends with the transport's ``error`` (unless its verdict was taken)."""
        with self._lock:
            if not self._close(check):
                return
        check.settle(error, False)

    def _transport_failed(self, exc: BaseException) -> None:
        """The checks' transport failed (a peer died): every check still waiting fails with it."""
        with self._lock:
            if self._failure is None:
                self._failure = exc
            waiting = [c for c in self._checks.values() if not c.done.is_set()]
        for check in waiting:
            self._conclude(check, exc)

    # -- the threads -------------------------------------------------------------------------

    def _start(self) -> None:
        """Start the listeners (one per peer, each always waiting for its peer's next message, so
        that a peer's send completes at once) and the sender."""
        for peer in range(self._size):
            if peer != self._rank:
                self._threads.append(threading.Thread(target=self._listen, args=(peer,), daemon=True,
                                                      name=f"neuron agreement listener {self._rank}<-{peer}"))
        self._threads.append(threading.Thread(target=self._send_all, daemon=True,
                                              name=f"neuron agreement sender {self._rank}"))
        for thread in self._threads:
            thread.start()
        _open.add(self)

    def close(self, timeout_s: float = _CLOSE_S) -> None:
        """Say goodbye to every peer and wait (at most ``timeout_s``) for their goodbyes, so that no
        listener is still inside gloo when the interpreter shuts down (a thread that comes back
        from C++ then aborts the process). At exit; in a forked child, nothing."""
        self.say_goodbye()
        self.join(time.monotonic() + timeout_s, timeout_s)

    def say_goodbye(self) -> None:
        """Queue the goodbyes to every peer (once; :meth:`close`'s first half)."""
        if os.getpid() != self._pid or not self._threads or self._goodbye_said:
            return
        with self._lock:
            self._goodbye_said = True
            peers = [p for p in range(self._size) if p != self._rank and p not in self._bye_sent]
            self._bye_sent.update(peers)
            for peer in peers:
                self._send_rows(peer, _BYE, 0, [])
            self._sends.put(None)

    def _answer_goodbye(self, peer: int) -> None:
        """A peer leaves (its process exits) before this rank does: its listener for this rank
        waits for a goodbye, which this rank, still running (maybe inside a collective that peer
        will never join), would only say at its own exit; the peer then left with that listener
        inside gloo and died of SIGABRT. Answered now, once."""
        with self._lock:
            if self._goodbye_said or peer in self._bye_sent:
                return
            self._bye_sent.add(peer)
            self._send_rows(peer, _BYE, 0, [])

    def join(self, deadline: float, timeout_s: float) -> None:
        """Wait until ``deadline`` (time.monotonic) for the peers' goodbyes (:meth:`close`'s second half)."""
        if os.getpid() != self._pid or not self._threads:
            return
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _log.warning("%s still waits for its peer at exit (after %g s)", thread.name, timeout_s)
        self._threads = []

    def _listen(self, peer: int) -> None:
        buffer = torch.empty(_HEADER + self._size * self._width, dtype=torch.int64)
        while True:
            try:
                self._transport.recv([buffer], peer, _TAG).wait(_FOREVER)
            except BaseException as exc:  # a dead peer (its connection closed)
                self._transport_failed(exc)
                return
            message = buffer.tolist()
            if message[0] == _BYE:
                self._answer_goodbye(peer)
                self._transport_failed(ConnectionError(f"rank {peer} left the group (its process exits)"))
                return
            try:
                self._receive(peer, message)
            except BaseException:  # a bug must not stop the listener
                _log.exception("handling rank %d's agreement message failed", peer)

    def _send(self, peer: int, kind_of: int, seq: int, row: Sequence[int]) -> None:
        """Send this rank's ``row`` of collective ``seq`` (an answer marks it predicted: ahead)."""
        flat = list(row)
        if kind_of == _RESP:
            flat[AHEAD] = 1
        self._send_rows(peer, kind_of, seq, flat)

    def _send_rows(self, peer: int, kind_of: int, seq: int, flat: list[int]) -> None:
        message = torch.zeros(_HEADER + self._size * self._width, dtype=torch.int64)
        message[:_HEADER + len(flat)] = torch.tensor([kind_of, seq, self._rank, *flat], dtype=torch.int64)
        self._sends.put((peer, message))

    def _send_all(self) -> None:
        while True:
            item = self._sends.get()
            if item is None:
                return
            peer, message = item
            try:
                self._transport.send([message], peer, _TAG).wait(_FOREVER)
            except BaseException as exc:
                self._transport_failed(exc)



@atexit.register
def _close_all() -> None:
    """At exit: every group's goodbyes first, then the waits for the peers' (closing the groups one
    by one, in an order that differs between processes, would have a rank wait for a peer's goodbye
    on one group while that peer waits for its own on another)."""
    groups = list(_open)
    for agreements in groups:
        agreements.say_goodbye()
    deadline = time.monotonic() + _CLOSE_S
    for agreements in groups:
        agreements.join(deadline, _CLOSE_S)
