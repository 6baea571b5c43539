"""Connections: one task per connection, reading requests under per-phase deadlines.

Theory of operation
-------------------
Each TCP connection gets one task running :meth:`Connections.connection` (under TLS,
after its handshake: ``engine._tls``): the small
``receive_some -> receive_data -> next_event -> respond -> send`` loop around an
:class:`~weir.engine._connection.Connection` (the :class:`weir.protocol.HttpConnection` plus
byte-exact send accounting).  One broken connection never takes the server down.

Every read waits under the deadline of its phase: between requests the keep-alive
timeout (and the connection may be shed, see :mod:`engine._listen`); then the whole
head within ``head_timeout`` of its first byte and the body within ``body_timeout``
of the head.  A head or body that misses its deadline gets 408 and the connection
is closed.  Bytes of requests not yet complete count against one process-wide cap
(``max_inbound_bytes``); past it the connection gets 503 ``overloaded`` and closes.
A connection closed on such a refusal (or a 413/431 from the parser) lingers first:
half-closed, discarding what the peer still sends for at most ``linger_timeout``,
so the peer reads the refusal rather than a reset.

A connection that has waited ``park_idle_after`` seconds for its next request (plain
TCP, accepted by the server's own listener) is parked: its task ends and
:class:`~weir.engine._parking.IdleLot` holds it, without a task, until bytes arrive (a
new task resumes it: :meth:`Connections._resume`), its keep-alive deadline passes, it is
shed, or the server stops (closed: :meth:`Connections._close_parked`).  The park is
armed on the same read-deadline heap: the park instant is the read's deadline, marked
as such, and a read interrupted by it hands the connection over instead of closing it.

Each complete request is handed to the router (:meth:`~._routing.Router.respond`,
``engine._routing``), which answers it or refuses it.  When a connection ends it
gives back the sessionless credit owners its requests used (``engine._owners``).
"""

from __future__ import annotations

import enum
import math
import time

import trio

from weir.common._access import CURRENT as CURRENT_ACCESS
from weir.common._access import AccessRecord, client_address
from weir.common._access import enabled as access_log_on
from weir.common._tls import LINGER_QUIET
from weir.protocol import (
    NEED_DATA,
    SERVER_ERROR,
    ConnectionClosed,
    HttpError,
    HttpRequest,
    Inbound,
    ReadClock,
    ReadTimeouts,
    Reason,
    RemoteProtocolError,
    closing_refusal,
)
from weir.protocol.forwarded import peer_address

from ._connection import Connection
from ._listen import Slot
from ._owners import Owners
from ._parking import IdleLot
from ._routing import Router
from ._shared import Shared, log
from ._store_errors import StoreUnavailable
from ._timers import Deadlines, Timed
from ._tls import TlsMeter, accept_tls
from ._writer import RECV_BYTES, PeerGone


class _ReadTimer:
    """A connection's read deadline, as the server's read-deadline heap sees it.

    The heap wakes at the earliest deadline, and a connection asks for an entry
    only when its deadline moves earlier than the one it has -- so a busy keep-alive
    connection, whose deadline slides later with every request, costs two stores per
    request instead of re-arming a Trio deadline twice.
    """

    __slots__ = ("closed", "deadline", "park_after", "parks", "scope", "timer_at", "timer_key")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        #: When the read in progress must have completed (inf: not reading).
        self.deadline = math.inf
        #: The deadline is the instant to park, not the keep-alive timeout.
        self.parks = False
        #: Idle this long, the connection parks (0: it never does).
        self.park_after = 0.0
        self.timer_at = math.inf
        self.timer_key = 0
        self.closed = False


class _End(enum.Enum):
    """How :meth:`Connections._serve_requests` ended."""

    DONE = "done"  # the connection closes
    REFUSED = "refused"  # closes after a refusal sent while the peer may still send
    PARK = "park"  # idle long enough: handed to the idle lot
    AGAIN = "again"  # bytes came just as it was to park: serve on, in a new scope


class Connections:
    """The connections being served (see the module docstring).

    Guarantees: every read waits under its phase's deadline; the bytes of requests
    not yet complete, over every connection, stay within ``max_inbound_bytes``; one
    broken connection never takes the server down; a connection that ends gives
    back its credit owners.

    Args:
        shared: the server's shared state.
        router: answers each complete request.
        owners: the sessionless era's credit owners (a connection holds some).
    """

    def __init__(self, shared: Shared, router: Router, owners: Owners) -> None:
        cfg = self.config = shared.config
        self.metrics = shared.metrics
        self._heads = shared.heads
        self._acks = shared.acks
        self._respond = router.respond
        self._owners = owners
        #: Read deadlines by what a connection's peer owes (idle, head, body).
        self._read_timeouts = ReadTimeouts(
            keepalive=cfg.keepalive_timeout,
            head=cfg.head_timeout,
            body=cfg.body_timeout,
            linger=cfg.linger_timeout,
        )
        #: Every connection's read deadline, in one heap served by one task.
        self.read_deadlines = Deadlines(self._read_due)
        #: False once the read-deadline heap's task has stopped (reads then arm Trio deadlines).
        self._reads_on_heap = True
        #: Bytes of incomplete requests buffered by all connections (see
        #: ``ServerConfig.max_inbound_bytes``).
        self.inbound = 0
        #: The connections being served right now (read-only, for introspection: each
        #: one's drain tracking, ``tracker.written``/``acked``, ``meter.exact``).
        self.open_connections: set[Connection] = set()
        #: Idle connections held without a task (None: ``park_idle_after`` is 0).
        self.lot = IdleLot(self._resume, self._close_parked) if cfg.park_idle_after > 0 else None

    async def serve_read_deadlines(self) -> None:
        """Serve the read-deadline heap; when it stops (the server stopped), hand every
        read still waiting a Trio deadline of its own, and later reads use one too --
        a connection handed in by ``Server.serve_connection`` may outlive the server's tasks."""
        try:
            await self.read_deadlines.run()
        finally:
            self._reads_on_heap = False
            for timed in self.read_deadlines.pending():
                assert isinstance(timed, _ReadTimer)
                timed.scope.deadline = timed.deadline

    def _read_due(self, timed: Timed, now: float) -> None:
        """The read-deadline heap's handler: cancel a read that missed its deadline;
        a connection reading under a later deadline gets its entry back at that one."""
        assert isinstance(timed, _ReadTimer)
        if timed.deadline <= now:
            timed.scope.cancel()
        elif timed.deadline != math.inf:
            self.read_deadlines.schedule(timed, timed.deadline)

    async def connection(self, stream: trio.abc.Stream, slot: Slot | None = None) -> bool:
        """Serve ``stream`` until it closes (``slot``: its place under the accept gate).

        With ``ssl_context`` configured, ``stream`` carries TLS: the handshake must
        finish within ``head_timeout`` (``engine._tls``).  True: the connection was
        parked (it lives on in :attr:`lot`, which gives ``slot`` back when it ends);
        only a connection with a ``slot`` is ever parked."""
        cfg, meter = self.config, None
        peer, address = _peer(stream)
        if cfg.ssl_context is not None:
            tls = await accept_tls(stream, cfg.ssl_context, timeout=cfg.head_timeout)
            if tls is None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()
                return False
            stream, counting = tls
            meter = TlsMeter(counting, notsent_lowat=cfg.notsent_lowat)
        conn = Connection(
            stream,
            cfg.limits,
            notsent_lowat=cfg.notsent_lowat,
            heads=self._heads,
            poller=self._acks,
            meter=meter,
            peer=peer,
        )
        conn.address = address
        self.open_connections.add(conn)
        return await self._serve(conn, slot)

    async def _resume(self, conn: Connection, slot: Slot) -> None:
        """Serve a parked connection whose bytes arrived (its own task, from the lot)."""
        kept = False
        try:
            kept = await self._serve(conn, slot)
        finally:
            if not kept:
                slot.release()

    def _close_parked(self, conn: Connection, slot: Slot) -> None:
        """Close a parked connection now (its deadline passed, shed, or the server stops).

        Runs in the idle lot's task: nothing here may take that task down."""
        try:
            self._forget(conn, slot)
        except Exception:
            log.exception("closing a parked connection failed")
        finally:
            stream = conn.stream
            assert isinstance(stream, trio.SocketStream)  # (only plain TCP is ever parked)
            stream.socket.close()
            slot.release()

    def _forget(self, conn: Connection, slot: Slot | None) -> None:
        if slot is not None:
            slot.busy()
        # Last look before the socket goes: what the peer acknowledged counts.
        conn.check_acks()
        conn.closed = True
        conn.abandon()
        self._owners.release(conn)
        self.open_connections.discard(conn)

    async def _serve(self, conn: Connection, slot: Slot | None) -> bool:
        """Serve ``conn`` until it closes (False) or is parked (True: it lives on in
        the idle lot, and its slot stays taken)."""
        parked = False
        try:
            try:
                end = await self._serve_requests(conn, slot)
                while end is _End.AGAIN:
                    end = await self._serve_requests(conn, slot)
            finally:
                self.inbound -= conn.inbound
                conn.inbound = 0
            if end is _End.PARK and slot is not None and self.lot is not None:
                assert slot.idle_since is not None
                until = slot.idle_since + self._read_timeouts.keepalive
                parked = self.lot.park(conn, slot, until)
            elif end is _End.REFUSED and self._read_timeouts.linger:
                await self._linger(conn.stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, PeerGone):
            pass
        except StoreUnavailable as exc:
            # Only mid-response (before one, the router answers 503): it cannot be
            # finished, so the connection ends -- one line, no traceback.
            log.warning("store unavailable mid-response, connection closed: %s", exc)
        except Exception as exc:
            # One broken connection must never take the server down.
            if not _only_disconnects(exc):
                log.exception("connection handler failed")
        finally:
            if not parked:
                self._forget(conn, slot)
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await conn.stream.aclose()
        return parked

    async def _serve_requests(self, conn: Connection, slot: Slot | None) -> _End:
        """Serve requests until the connection is done: ``REFUSED`` if it ends on a
        refusal sent while the peer may still be sending (408, 413, 431, 503
        ``overloaded``), ``PARK`` if it waited ``park_idle_after`` for a request,
        ``AGAIN`` if a request came just as it was to park.

        Each read is under the deadline of its phase.  Waiting for the first byte of a
        request: the keep-alive timeout, and the connection may be shed (see
        :mod:`engine._listen`); then the whole head must arrive within
        ``head_timeout`` of its first byte and the body within ``body_timeout`` of
        the head -- however the bytes trickle in.  A head or body that misses its
        deadline gets 408 and the connection is closed.

        One scope is cancelled when a read misses its deadline (or the connection is
        shed); the deadline itself is a float in a :class:`_ReadTimer`.
        """
        clock = ReadClock(self._read_timeouts)
        reads = trio.CancelScope()
        timer = _ReadTimer(reads)
        try:
            with reads:
                conn.scope = reads
                if slot is not None:
                    slot.scope = reads
                return await self._read_loop(conn, slot, clock, timer)
        finally:
            timer.closed = True  # its heap entry, if any, is skipped
        if reads.cancelled_caught and clock.owed:
            await self._time_out(conn, clock)
            return _End.REFUSED
        if (
            reads.cancelled_caught
            and timer.parks
            and slot is not None
            and slot.idle_since is not None  # (not shed: shedding clears it)
        ):
            return _End.PARK
        return _End.DONE

    async def _read_loop(
        self, conn: Connection, slot: Slot | None, clock: ReadClock, timer: _ReadTimer
    ) -> _End:
        """:meth:`_serve_requests`'s loop: read, parse, respond, until the connection
        is done (or a read misses its deadline: ``timer.scope`` is cancelled)."""
        http, reads = conn.http, timer.scope
        cfg = self.config
        keepalive = cfg.keepalive_timeout
        # (The descriptor's own reader when there is one: a coroutine less per wait.)
        receive = conn.io.receive if conn.io is not None else conn.stream.receive_some
        # Parked after this long idle (plain TCP under the accept gate only).
        timer.park_after = cfg.park_idle_after if slot is not None and conn.io is not None else 0.0
        while True:
            event = http.next_event()
            if event is NEED_DATA:
                if http.has_data_to_send:
                    await conn.send(http.data_to_send())  # e.g. 100 Continue
                now = trio.current_time()
                self._arm(timer, http.inbound, clock.deadline(http.inbound, now), now, slot)
                try:
                    data = await receive(RECV_BYTES)
                finally:
                    timer.deadline = math.inf
                    if not self._reads_on_heap:
                        reads.deadline = math.inf
                parking, timer.parks = timer.parks, False
                if slot is not None:
                    parking = parking and slot.idle_since is not None  # (not shed)
                    slot.idle_since = None
                if conn.tracker.outstanding:
                    conn.check_acks()  # a new request: the peer has likely read our last
                if reads.cancel_called:
                    if parking:  # bytes came just as it was to park: go on, in a new scope
                        return _End.DONE if self._take_in(conn, data) else _End.AGAIN
                    # Shed (or timed out) just as bytes arrived.
                    await self._last_requests(conn, data, now + keepalive)
                    return _End.DONE
                if self._take_in(conn, data):
                    await self._overloaded(conn)
                    return _End.REFUSED
            elif isinstance(event, HttpRequest):
                clock.request_done()
                record = _begin(conn, event) if access_log_on() else None
                # Handed over, not kept: a long response (an SSE stream) must not
                # keep the request's body alive for as long as it lasts.
                handoff, event = [event], NEED_DATA
                self.inbound -= conn.inbound
                conn.inbound = 0
                try:
                    await self._respond(conn, handoff)
                finally:
                    if record is not None:
                        _end(conn, record)
                if http.should_close:
                    return _End.DONE
            elif isinstance(event, HttpError):
                await self._refuse_malformed(conn, event)
                return _End.REFUSED
            elif isinstance(event, ConnectionClosed):
                return _End.DONE

    def _arm(
        self, timer: _ReadTimer, inbound: Inbound, deadline: float, now: float, slot: Slot | None
    ) -> None:
        """Set the deadline of the read about to start: ``deadline``, or the instant to
        park when the connection is idle and parks sooner.  The heap gets an entry only
        when the deadline moves earlier than the one it has."""
        if inbound is Inbound.IDLE and slot is not None:
            slot.idle_since = now  # idle: it may be shed
            park_after = timer.park_after
            if park_after and now + park_after < deadline and self._reads_on_heap:
                deadline, timer.parks = now + park_after, True
        timer.deadline = deadline
        if not self._reads_on_heap:
            timer.scope.deadline = deadline  # (the heap's task has stopped)
        elif deadline < timer.timer_at:
            self.read_deadlines.schedule(timer, deadline)

    async def _refuse_malformed(self, conn: Connection, event: HttpError) -> None:
        """Send the HTTP core's refusal of a request it could not accept (and log it)."""
        self.metrics.refused(str(event.reason))
        out = conn.http.data_to_send()
        await conn.send(out)
        if access_log_on():
            AccessRecord.refused(
                event.status, str(event.reason), peer=conn.address, nbytes=len(out)
            ).emit()

    def _take_in(self, conn: Connection, data: bytes | bytearray) -> bool:
        """Hand ``data`` to the parser; True if that takes the bytes of requests not
        yet complete, over all connections, past ``max_inbound_bytes`` (the data is
        then not handed over: the caller refuses 503 ``overloaded``)."""
        n = len(data)
        conn.inbound += n
        self.inbound += n
        if self.inbound > self.config.max_inbound_bytes:
            return True
        conn.http.receive_data(data)
        return False

    async def _last_requests(self, conn: Connection, data: bytes | bytearray, until: float) -> None:
        """Serve the complete requests in ``data`` and stop (the connection then closes).

        The connection was shed (or timed out) just as ``data`` arrived: the
        cancellation is pending in its scope, so this runs shielded, until ``until``.
        """
        http = conn.http
        http.receive_data(data)
        with trio.CancelScope(shield=True) as last:
            last.deadline = until
            while True:
                event = http.next_event()
                if not isinstance(event, HttpRequest):
                    return
                record = _begin(conn, event) if access_log_on() else None
                try:
                    await self._respond(conn, [event])
                finally:
                    if record is not None:
                        _end(conn, record)
                if http.should_close:
                    return

    async def _linger(self, stream: trio.abc.Stream) -> None:
        """Half-close, then read and discard what the peer still sends, for at most the
        linger timeout: closing with unread bytes would reset the connection, and a
        reset can destroy the refusal just sent before the peer reads it.  (Under TLS,
        which cannot half-close: discard until the peer is quiet for ``LINGER_QUIET``.)"""
        with trio.move_on_after(self._read_timeouts.linger):
            if not isinstance(stream, trio.abc.HalfCloseableStream):
                # TLS: no half-close; discard until the peer has been quiet a moment.
                while True:
                    with trio.move_on_after(LINGER_QUIET) as quiet:
                        data = await stream.receive_some(RECV_BYTES)
                    if quiet.cancelled_caught or not data:
                        return
            await stream.send_eof()
            while await stream.receive_some(RECV_BYTES):
                pass

    async def _overloaded(self, conn: Connection) -> None:
        self.metrics.refused(str(Reason.OVERLOADED))
        exc = RemoteProtocolError(
            "too many request bytes are in flight on this server; retry later",
            http_status=503,
            reason=Reason.OVERLOADED,
            code=SERVER_ERROR,
            retry_after_ms=self.config.retry_ms,
        )
        conn.http.send_failed()
        with trio.move_on_after(1):
            await conn.send(closing_refusal(exc))

    async def _time_out(self, conn: Connection, clock: ReadClock) -> None:
        self.metrics.refused(str(Reason.REQUEST_TIMEOUT))
        exc = clock.refusal()
        conn.http.send_failed()  # nothing else may follow on this connection
        with trio.move_on_after(1):
            await conn.send(closing_refusal(exc))


def _peer(stream: trio.abc.Stream) -> tuple[str, str]:
    """The remote address of ``stream``'s socket (``""`` if it has none), and how the
    access log names it (``host:port``; ``-`` for none)."""
    sock = getattr(stream, "socket", None)
    try:
        name = sock.getpeername() if sock is not None else None
    except OSError:  # (already disconnected)
        name = None
    return peer_address(name), client_address(name, None)


def _begin(conn: Connection, request: HttpRequest) -> AccessRecord:
    """The access-log record of ``request``, current in this task from now."""
    conn.http.status = 0  # (no response yet: the previous one's must not show)
    record = AccessRecord.begin(
        request.method,
        request.target,
        request.headers,
        request.body,
        peer=conn.address,
        now=time.perf_counter(),
        written=conn.tracker.written,
    )
    CURRENT_ACCESS.set(record)
    return record


def _end(conn: Connection, record: AccessRecord) -> None:
    """The response to ``record``'s request has ended (or the connection has)."""
    CURRENT_ACCESS.set(None)
    http = conn.http
    record.end(http.status, http.error_body, now=time.perf_counter(), written=conn.tracker.written)
    record.emit()


def _only_disconnects(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in exc.exceptions)
    return isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | PeerGone)
