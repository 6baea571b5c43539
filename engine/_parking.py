"""Idle keep-alive connections held without a task of their own.

Theory of operation
-------------------
A connection waiting for its next request costs, in Trio, a task blocked in
``wait_readable``: the task, its cancel status, the epoll registration and the
coroutine frames of the wait -- about 4.7 KiB of a 15 KiB idle session.  A
connection that has waited ``park_idle_after`` seconds (``ServerConfig``) is handed
here instead: its task ends, and what is left is the
:class:`~weir.engine._connection.Connection` (its HTTP state, its drain tracker,
its socket) in :class:`IdleLot`.

The lot keeps one ``select.epoll`` set of its own (each descriptor registered
one-shot for input or the peer's half-close) and one task, which waits for that
set's descriptor to be readable through Trio, under a deadline: the earliest
keep-alive deadline of the parked connections.

* **Bytes arrive** (or the peer closes): the connection leaves the lot and a new
  task serves it from where it stopped (``resume``) -- the same code, the same
  state; a request's bytes are never read by the lot.
* **Its keep-alive deadline passes**, or the accept gate **sheds** it to make room
  (:meth:`IdleLot.evict`), or the lot **stops** (the server is stopping): it is
  closed at once (``close``: the same last steps as a connection whose task ends).

A connection leaves the lot exactly once, through :meth:`IdleLot._take`, which
unregisters it; every parked connection is either resumed or closed.  The lot
holds at most what the accept gate admits (one entry per open connection) and a
heap of deadlines rebuilt when stale entries outnumber live ones.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import select
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._connection import Connection
    from ._listen import Slot

_EVENTS = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT


class IdleLot:
    """Parked idle connections and the one task that watches them (module docstring).

    Args:
        resume: serves a connection whose bytes arrived (run as a new task).
        close: closes a parked connection at once (its deadline passed, it was
            shed, or the lot stops); must not wait.
    """

    __slots__ = ("_close", "_ep", "_heap", "_nursery", "_parked", "_resume", "_wait")

    def __init__(
        self,
        resume: Callable[[Connection, Slot], Awaitable[object]],
        close: Callable[[Connection, Slot], None],
    ) -> None:
        self._resume = resume
        self._close = close
        self._ep: select.epoll | None = None
        #: By descriptor: the connection, its slot and its keep-alive deadline.
        self._parked: dict[int, tuple[Connection, Slot, float]] = {}
        #: (deadline, descriptor); an entry whose connection left or re-parked with
        #: another deadline is stale and skipped.
        self._heap: list[tuple[float, int]] = []
        self._wait: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, conn: Connection, slot: Slot, until: float) -> bool:
        """Hold ``conn`` until bytes arrive or ``until``; False if the lot cannot
        (not running, or the kernel refused the registration): the caller closes it."""
        io, ep = conn.io, self._ep
        if io is None or ep is None or self._nursery is None:
            return False
        fd = io.fileno
        try:
            ep.register(fd, _EVENTS)
        except OSError:
            return False
        self._parked[fd] = (conn, slot, until)
        slot.enter_lot(self, fd)
        heapq.heappush(self._heap, (until, fd))
        if len(self._heap) > 2 * len(self._parked) + 64:
            self._heap = [(u, f) for f, (_, _, u) in self._parked.items()]
            heapq.heapify(self._heap)
        wait = self._wait
        if wait is not None and until < wait.deadline:
            wait.deadline = until
        return True

    def evict(self, slot: Slot) -> bool:
        """Close the parked connection of ``slot`` now (shedding); False if not parked."""
        entry = self._take(slot.parked_fd) if slot.parked_in is self else None
        if entry is None:
            return False
        self._close(entry[0], entry[1])
        return True

    def _take(self, fd: int) -> tuple[Connection, Slot, float] | None:
        entry = self._parked.pop(fd, None)
        if entry is None:
            return None
        if self._ep is not None:
            # (OSError: already gone from the set -- the socket was closed.)
            with contextlib.suppress(OSError):
                self._ep.unregister(fd)
        entry[1].leave_lot()
        return entry

    async def run(self, nursery: trio.Nursery) -> None:
        """Watch the parked connections until cancelled; resumed ones run in
        ``nursery``.  On the way out, every connection still parked is closed."""
        self._ep = ep = select.epoll()
        self._nursery = nursery
        try:
            while True:
                deadline = self._heap[0][0] if self._heap else math.inf
                with trio.CancelScope(deadline=deadline) as wait:
                    self._wait = wait
                    await trio.lowlevel.wait_readable(ep.fileno())
                self._wait = None
                for fd, _ in ep.poll(0):
                    entry = self._take(fd)
                    if entry is not None:
                        entry[1].busy()
                        nursery.start_soon(self._resume, entry[0], entry[1])
                self._expire(trio.current_time())
        finally:
            self._nursery = self._wait = None
            for fd in list(self._parked):
                entry = self._take(fd)
                if entry is not None:
                    self._close(entry[0], entry[1])
            self._ep = None
            ep.close()

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            until, fd = heapq.heappop(heap)
            entry = self._parked.get(fd)
            if entry is not None and entry[2] == until:
                self._take(fd)
                self._close(entry[0], entry[1])


__all__ = ["IdleLot"]
