"""SSE writers: copying a stream's log to one connection, from a cursor.

Theory of operation
-------------------
A writer is nothing but a cursor into a :class:`weir.protocol.streams.StreamLog` and the
connection holding the HTTP response: it copies frames in log order, marks where
each frame's last byte lies (so the frame's credit comes back when the peer
acknowledges it), and ends the response when the stream is finished, closed, or
asked to close early (``retry:``).  Handlers never write; they append to the log.

The hot path matters: for a call that answers within a few scheduling steps the
head, the frames and the terminating chunk go out as ONE write, with no watcher
task.  Only a writer that has to wait runs a watcher, which notices a peer that
goes away (EOF) and cancels the writer at once.
"""

from __future__ import annotations

import logging

import trio

from weir.protocol import RemoteProtocolError
from weir.protocol.resume import KEEPALIVE
from weir.protocol.sse import encode_retry
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.streams import WriterStep, completes, writer_step

from ._connection import Connection
from ._session import Session, StreamHandle

log = logging.getLogger(__name__)

RECV_BYTES = 65536
#: An SSE comment line: ignored by every client, enough to keep a proxy's idle timer off.
SSE_HEADERS = (
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
)


#: Seconds a displaced writer may spend sending the head it owes before its cut (the
#: head is a few hundred bytes into a socket that has carried nothing of this response).
DISPLACED_HEAD_GRACE = 1.0


class PeerGone(Exception):
    """The peer went away (or a newer reader took over) while we wrote its stream."""


async def write_stream(
    conn: Connection,
    session: Session,
    handle: StreamHandle,
    next_seq: int,
    headers: tuple[tuple[str, str], ...],
    *,
    keepalive: float | None = None,
) -> None:
    """Copy frames from ``handle``'s log to the socket from ``next_seq`` on (see module doc).

    ``keepalive``: while the stream is quiet, a ``:`` comment every this many seconds.

    Hot path: a response whose answer is ready within a few scheduling steps
    goes out as ONE write -- head, frames and terminator together -- with no
    watcher task.  Otherwise the head and first frames go out as soon as they
    exist, and a watcher task notices a peer that goes away while we wait.
    """
    log_ = handle.log
    http = conn.http
    handle.abandoned = False  # a reader again: its frames hold credit until acknowledged
    if log_.state in (StreamState.LIVE_DETACHED, StreamState.FINAL_DETACHED):
        handle.handle(StreamInput.ATTACH)
    if (
        conn.scope is not None
        and log_.state is StreamState.FINAL_ATTACHED
        and handle.close_retry_ms is None
        and not session.closed
        and log_.first_retained() <= next_seq
    ):
        await _write_ready(conn, session, handle, next_seq, headers)
        return
    scope = trio.CancelScope()
    handle.writer_scope = scope
    pump = _Pump(conn, session, handle, next_seq, http.start_stream(200, headers))
    pump.keepalive = keepalive
    gone = True  # unless the writer ends as it should
    try:
        peer_gone = await _run_watched(pump, scope)
        gone = peer_gone or scope.cancelled_caught or http.should_close
    finally:
        # Whatever ended the writer, a stream it leaves must not keep holding credit.
        _let_go(session, handle, scope, gone=gone)
    if gone:
        if scope.cancelled_caught and not peer_gone and handle.writer_scope is not scope:
            await _displaced(pump)
        http.send_failed()
        raise PeerGone
    if not pump.ended:
        await conn.send(pump.pending + http.end_stream())


async def _run_watched(pump: _Pump, scope: trio.CancelScope) -> bool:
    """Run ``pump`` within ``scope`` -- once it has to wait, with a task watching the
    peer, which cancels ``scope`` if the peer goes away; whether it went away."""
    conn = pump.conn
    peer_gone = False

    async def watch_peer() -> None:
        nonlocal peer_gone
        try:
            data = await conn.receive(RECV_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if data:
            conn.http.receive_data(data)  # a pipelined request: served after this response
            return
        peer_gone = True
        scope.cancel()

    with scope:
        try:
            if not await pump.run(fast=True):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch_peer)
                    await pump.run(fast=False)
                    nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            peer_gone = True
        except BaseExceptionGroup as group:
            # A write that failed in the nursery arrives wrapped: the peer is gone.
            if group.split((trio.BrokenResourceError, trio.ClosedResourceError))[1]:
                raise
            peer_gone = True
    return peer_gone


async def _displaced(pump: _Pump) -> None:
    """A newer reader took the stream from this writer: if its response had not begun,
    it still gets its status line before the cut, as one displaced later would have."""
    if not pump.head_sent and not pump.conn.http.should_close:
        with trio.move_on_after(DISPLACED_HEAD_GRACE):
            await pump.conn.send(pump.pending)


def _let_go(
    session: Session, handle: StreamHandle, scope: trio.CancelScope, *, gone: bool = False
) -> None:
    """The writer that held ``scope`` is done: detach it, unless a newer one took over.

    ``gone``: its connection will carry nothing more, so the stream's frames give
    their credit back (see :meth:`Session.let_go`).
    """
    if handle.writer_scope is scope:
        handle.writer_scope = None
        if handle.log.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
            handle.handle(StreamInput.DETACH)
        if gone:
            session.let_go(handle)
        if session.on_activity is not None:
            session.on_activity()


async def _write_ready(
    conn: Connection,
    session: Session,
    handle: StreamHandle,
    next_seq: int,
    headers: tuple[tuple[str, str], ...],
) -> None:
    """The whole stream is in the log already (a call answered before its stream was
    written): head, frames and terminator in one write, nothing to wait for.

    The only wait is the write itself, which a stalled peer can block.  Whoever must
    stop this writer (a teardown, a newer reader of the stream) cancels
    ``handle.writer_scope``; here that is the connection's own scope, since a
    response cut short ends its connection anyway -- so the usual path's scope per
    response is not needed.
    """
    assert conn.scope is not None
    log_, http = handle.log, conn.http
    pump = _Pump(conn, session, handle, next_seq, http.start_stream(200, headers))
    scope = handle.writer_scope = conn.scope
    gone = True  # unless the write completes
    try:
        await pump._write(log_.frames_from(next_seq))
        gone = http.should_close
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        http.send_failed()
        raise PeerGone from None
    finally:
        _let_go(session, handle, scope, gone=gone)
    if http.should_close:
        http.send_failed()
        raise PeerGone


class _Pump:
    """A writer's cursor into one stream log, and the bytes not written yet."""

    __slots__ = (
        "conn",
        "ended",
        "handle",
        "head_sent",
        "keepalive",
        "next_seq",
        "pending",
        "session",
    )

    #: Scheduling steps the fast path yields, waiting for a ready answer, before writing
    #: (a handler that returns without blocking needs about this many to finish).
    COALESCE = 8

    def __init__(
        self, conn: Connection, session: Session, handle: StreamHandle, next_seq: int, head: bytes
    ) -> None:
        self.conn = conn
        self.session = session
        self.handle = handle
        self.next_seq = next_seq
        self.pending = head  # written with the first frames (or before the first wait)
        self.ended = False  # the terminating chunk went out with the last frames
        self.head_sent = False  # the response's head has been handed to the socket
        #: Seconds of quiet before a keep-alive comment (None: never).
        self.keepalive: float | None = None

    async def run(self, *, fast: bool) -> bool:
        """Write until the stream is done (True); with ``fast``, give up (False) rather
        than wait with nobody watching the peer."""
        handle, log_, http = self.handle, self.handle.log, self.conn.http
        budget = self.COALESCE if fast else 0
        while True:
            try:
                frames = log_.frames_from(self.next_seq)
            except RemoteProtocolError:
                log.warning("writer fell behind stream %s's retention; ending it", log_.epoch)
                return True
            step = writer_step(
                log_,
                self.next_seq,
                session_closed=self.session.closed,
                close_retry_ms=handle.close_retry_ms,
            )
            if step is WriterStep.SEND:
                if budget and log_.state is not StreamState.FINAL_ATTACHED:
                    budget -= 1  # the answer may be a step away: let its task run first
                    await trio.lowlevel.checkpoint()
                    continue
                await self._write(frames)
                if self.ended:
                    return True
                continue
            if step is WriterStep.FINISH:
                handle.handle(StreamInput.DELIVERED)
                return True
            if step is WriterStep.END:
                return True
            if step is WriterStep.RETRY:
                assert handle.close_retry_ms is not None
                self.pending += http.send_stream_data(encode_retry(handle.close_retry_ms))
                handle.close_retry_ms = None
                return True
            if budget:
                budget -= 1
                await trio.lowlevel.checkpoint()
                continue
            if fast:
                return False  # not ready within a few steps: wait, watching the peer
            if self.pending:
                self.head_sent = True
                await self.conn.send(self.pending)  # the head goes out before any wait
                self.pending = b""
                continue  # frames may have arrived while we sent: never wait past them
            keepalive = self.keepalive
            if keepalive is None:
                await handle.wait_changed()
                continue
            with trio.move_on_after(keepalive) as quiet:
                await handle.wait_changed()
            if quiet.cancelled_caught:
                # A comment, so proxies that cut idle streams see traffic (and a
                # vanished peer shows as a failed write); clients ignore it.
                self.pending = http.send_stream_data(KEEPALIVE)

    async def _write(self, frames: list[bytes]) -> None:
        """Write ``frames`` (with the head or anything else pending, and the stream's
        end if they complete it), marking where each frame that holds credit ends.

        The frames go out as pieces, never joined here: the stream's log keeps each
        frame for a resumption, and a large one written to a slow peer must not be
        held a second time by the write (see :meth:`Connection.send`)."""
        handle, log_, http = self.handle, self.handle.log, self.conn.http
        out = http.send_stream_parts(frames)
        if self.pending:
            out.insert(0, self.pending)
        offset = sum(map(len, out)) - sum(map(len, frames)) - 2  # the frames' start
        marks: list[tuple[int, tuple[StreamHandle, int]]] = []
        first, drained = self.next_seq, log_.drained_seq
        for i, frame in enumerate(frames):
            offset += len(frame)
            if first + i >= drained:
                marks.append((offset, (handle, first + i)))
        self.next_seq = first + len(frames)
        if completes(log_, self.next_seq):
            handle.handle(StreamInput.DELIVERED)
            out.append(http.end_stream())
            self.ended = True
        self.pending = b""
        self.head_sent = True
        await self.conn.send(out, marks)
