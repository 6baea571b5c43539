"""One task re-checks the acknowledgements of every connection with bytes in flight.

Theory of operation
-------------------
After each write, :meth:`Connection.check_acks` asks the kernel once how much of
what was written the peer has acknowledged.  On loopback and on any real network
the answer right after a write is usually "not all of it yet", so something must
ask again later, or a session's drain credit would only come back at its next
write.  That re-check used to be a task per connection, woken per write: a timer,
a wake-up and an event per response, and a task's memory per connection.

:class:`AckPoller` is one task for the whole server.  A connection that still has
bytes in flight after a check is :meth:`watch`-ed: it enters a heap keyed by when
to check next (10 ms after the write, doubling to 250 ms while the peer makes no
progress, back to 10 ms when it does -- the same backoff as before).  The task
sleeps until the earliest entry is due, checks every due connection, and puts
back those still waiting.  A connection is in the heap at most once; one that
closed, or whose bytes were all acknowledged meanwhile (the next request on a
keep-alive connection checks too, see ``engine._connections``), leaves it when its
entry comes due.

So a stalled peer is still seen as "no progress" on the same schedule, whatever
its writer is blocked on, and the per-response cost is one heap push.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING

import trio

from weir.common._sendqueue import KernelSendQueue

if TYPE_CHECKING:
    from ._connection import Connection

#: First re-check after a write, and again after progress (seconds).
MIN_POLL = 0.01
#: Longest wait between re-checks of a peer that makes no progress (seconds).
MAX_POLL = 0.25


class AckPoller:
    """The server's acknowledgement re-checks (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Connection]] = []
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None

    @property
    def watched(self) -> int:
        """Connections waiting for a re-check now (each has exactly one entry)."""
        return len(self._heap)

    def watch(self, conn: Connection) -> None:
        """``conn`` has unacknowledged bytes: re-check it soon (no-op if already due)."""
        if conn.poll_due:
            return
        due = trio.current_time() + conn.poll_delay
        conn.poll_due = True
        heapq.heappush(self._heap, (due, next(self._order), conn))
        scope = self._scope
        if scope is not None and due < scope.deadline:
            scope.deadline = due

    async def run(self) -> None:
        """Check connections as they come due, forever (run it in the server's nursery)."""
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, _, conn = heapq.heappop(heap)
                conn.poll_due = False
                if conn.closed or not conn.tracker.outstanding:
                    conn.poll_delay = MIN_POLL
                    continue
                before = conn.tracker.acked
                if conn.check_acks():
                    progressed = conn.tracker.acked > before
                    conn.poll_delay = MIN_POLL if progressed else min(conn.poll_delay * 2, MAX_POLL)
                    self.watch(conn)
                else:
                    conn.poll_delay = MIN_POLL
            await trio.lowlevel.checkpoint()


def kernel_queue(stream: trio.abc.Stream, notsent_lowat: int | None) -> KernelSendQueue:
    """The kernel send queue of ``stream``'s TCP socket (inexact for any other
    stream: a Unix socket, an in-memory test stream)."""
    sock = stream.socket if isinstance(stream, trio.SocketStream) else None
    return KernelSendQueue(sock, notsent_lowat=notsent_lowat)


__all__ = ["MAX_POLL", "MIN_POLL", "AckPoller", "kernel_queue"]
