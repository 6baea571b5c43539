"""Accepting connections under a limit, and ``EMFILE`` as back-pressure.

Theory of operation
-------------------
:class:`AcceptGate` owns the accept loops of the server's listening sockets and
the count of connections being served.  A connection takes a slot before
``accept()`` is even called, so at most ``limit`` connections are ever open:

* **At the limit**, once a new client is waiting in the backlog, the gate sheds
  the connection that has been idle the longest between two requests (closing an
  idle keep-alive connection is always allowed in HTTP/1.1: nothing is owed on it).
  With none idle, it stops calling ``accept()`` until a slot frees; new clients
  wait in the kernel's listen backlog rather than being refused, and are served
  in the order they arrived.
* **``EMFILE``/``ENFILE``/``ENOBUFS``/``ENOMEM``** from ``accept()`` mean the process
  (or the machine) is out of descriptors or memory: the loop backs off (50 ms
  doubling to 1 s) and tries again.  It logs one line when that starts and then at
  most one every 10 s with the count, never a traceback per attempt.

A connection marks itself *idle* (:attr:`Slot.idle_since`) only while it waits
for the first byte of its next request, in the cancel scope that carries its read
deadlines (:attr:`Slot.scope`); shedding cancels that scope, which the connection
treats like its keep-alive timeout.  A cancel
that arrives after the read completed is a no-op (the scope has already exited),
so a request that has arrived is never lost to shedding.  A connection parked
without a task (``engine._parking``) is shed by its lot instead, at once; its slot
stays taken while it is parked and comes back when the lot closes it.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._parking import IdleLot

log = logging.getLogger(__name__)

#: ``accept()`` errors that mean "out of resources, try again later".
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Most connections taken from the backlog at one wake-up of the accept loop.
ACCEPT_BATCH = 128
_BACKOFF_MIN = 0.05
_BACKOFF_MAX = 1.0
_LOG_EVERY = 10.0


class Slot:
    """One connection's place under the limit (marking it idle costs two attribute stores)."""

    __slots__ = ("gate", "idle_since", "parked_fd", "parked_in", "scope")

    def __init__(self, gate: AcceptGate | None = None) -> None:
        #: The gate the slot belongs to (:meth:`release` gives it back there).
        self.gate = gate
        #: When the connection began waiting for its next request (None: busy).
        self.idle_since: float | None = None
        #: The scope of the connection's reads; cancelling it sheds the connection.
        self.scope: trio.CancelScope | None = None
        #: The lot holding the connection without a task (``engine._parking``), and
        #: its descriptor there; shedding asks the lot instead of cancelling a scope.
        self.parked_in: IdleLot | None = None
        self.parked_fd = -1

    def busy(self) -> None:
        """The connection is busy again (or gone): no longer a candidate to shed."""
        self.idle_since = None

    def enter_lot(self, lot: IdleLot, fd: int) -> None:
        """The connection is parked in ``lot`` under descriptor ``fd`` (counted by the gate)."""
        self.parked_in, self.parked_fd = lot, fd
        if self.gate is not None:
            self.gate.parked += 1

    def leave_lot(self) -> None:
        """The connection left its lot (resumed, or about to be closed)."""
        if self.parked_in is not None:
            self.parked_in, self.parked_fd = None, -1
            if self.gate is not None:
                self.gate.parked -= 1

    def release(self) -> None:
        """The connection is closed: its place goes back to the gate."""
        if self.gate is not None:
            self.gate.give_back(self)


class AcceptGate:
    """Accept loops bounded by a connection limit (see the module docstring).

    Args:
        limit: most connections open at once.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the connection limit must be >= 1")
        self.limit = limit
        #: Connections being served now.
        self.open = 0
        #: Idle keep-alive connections closed to make room for new ones.
        self.shed_total = 0
        #: ``accept()`` calls that failed for lack of descriptors or memory.
        self.accept_errors = 0
        #: Connections held without a task (``engine._parking``) now.
        self.parked = 0
        self._slots: set[Slot] = set()
        self._room: trio.Event | None = None
        self._last_log = -math.inf
        self._unlogged = 0

    def _take(self) -> Slot:
        self.open += 1
        slot = Slot(self)
        self._slots.add(slot)
        return slot

    def give_back(self, slot: Slot) -> None:
        """``slot``'s connection is closed (once per slot)."""
        if slot not in self._slots:
            return
        slot.busy()
        self._slots.discard(slot)
        self.open -= 1
        room = self._room
        if room is not None:
            self._room = None
            room.set()

    def _shed_one(self) -> bool:
        # Only at the limit, with a client waiting: a scan of the open connections.
        idle = [
            s
            for s in self._slots
            if s.idle_since is not None
            and (s.parked_in is not None or (s.scope is not None and not s.scope.cancel_called))
        ]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.idle_since or 0.0)
        if slot.parked_in is not None:
            slot.parked_in.evict(slot)  # closed at once; its slot comes back now
        else:
            assert slot.scope is not None
            slot.scope.cancel()
            slot.busy()
        self.shed_total += 1
        return True

    async def _wait_for_room(self, listener: trio.SocketListener) -> None:
        if self.open < self.limit:
            return
        while self.open >= self.limit:
            # Shed only for a client that is really waiting to be accepted.
            await trio.lowlevel.wait_readable(listener.socket)
            if self.open < self.limit:
                return
            # The shed connection (if one was idle) frees its slot once its task has
            # unwound (a parked one at once); either way, wait for a slot to come back.
            self._shed_one()
            if self.open < self.limit:
                return
            room = self._room
            if room is None:
                room = self._room = trio.Event()
            await room.wait()

    def _log_capacity(self, exc: OSError) -> None:
        self.accept_errors += 1
        now = trio.current_time()
        if now - self._last_log >= _LOG_EVERY:
            more = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
            log.error(
                "accept() failed: %s; backing off while %d connections are open%s",
                exc.strerror or exc,
                self.open,
                more,
            )
            self._last_log = now
            self._unlogged = 0
        else:
            self._unlogged += 1

    async def serve(
        self,
        listener: trio.SocketListener,
        handler: Callable[[trio.SocketStream, Slot], Awaitable[bool | None]],
        nursery: trio.Nursery,
    ) -> None:
        """Accept on ``listener`` forever, each connection handled in ``nursery``.

        Every wake-up takes all the connections already waiting in the backlog (up
        to the limit and :data:`ACCEPT_BATCH`), not one: Trio's ``accept()`` yields to
        the scheduler once per connection, so when hundreds of clients connect at
        once the last would wait behind hundreds of rounds of the others' requests.
        """
        raw = socket.socket(fileno=os.dup(listener.socket.fileno()))
        raw.setblocking(False)
        backoff = _BACKOFF_MIN
        try:
            while True:
                await self._wait_for_room(listener)
                await trio.lowlevel.wait_readable(raw)
                for _ in range(ACCEPT_BATCH):
                    if self.open >= self.limit:
                        break
                    try:
                        sock, _addr = raw.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:
                        if exc.errno == errno.ECONNABORTED:
                            continue  # the client left before we took it
                        if exc.errno not in CAPACITY_ERRNOS:
                            raise
                        self._log_capacity(exc)
                        await trio.sleep(backoff)
                        backoff = min(backoff * 2, _BACKOFF_MAX)
                        break
                    backoff = _BACKOFF_MIN
                    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                    nursery.start_soon(self._run, handler, stream, self._take())
                await trio.lowlevel.checkpoint()
        finally:
            raw.close()

    async def _run(
        self,
        handler: Callable[[trio.SocketStream, Slot], Awaitable[bool | None]],
        stream: trio.SocketStream,
        slot: Slot,
    ) -> None:
        kept = False
        try:
            # True: the connection lives on without this task (parked); whoever
            # closes it gives its slot back.
            kept = bool(await handler(stream, slot))
        finally:
            if not kept:
                self.give_back(slot)


__all__ = ["ACCEPT_BATCH", "CAPACITY_ERRNOS", "AcceptGate", "Slot"]
