"""One TCP connection of the asyncio runtime: HTTP in, responses and SSE streams out.

Theory of operation
-------------------
:class:`Connection` runs ``reader.read -> HttpConnection.receive_data -> next_event ->
respond``.  Framing, keep-alive and the automatic 400/413/431 come from
:class:`~weir.protocol.HttpConnection`; every endpoint rule from
:func:`~weir.protocol.route`; every refusal body from :func:`~weir.protocol.refusal`;
read deadlines (idle, whole head, body; 408) from :class:`~weir.protocol.ReadClock`;
the bytes of requests not yet complete count against the driver's
``max_inbound_bytes`` over every connection (503 ``overloaded`` past it, as on Trio);
a refused connection whose peer is still sending lingers (half-closed, discarding)
so the refusal is read, not reset away.

Every SSE message is appended to its stream's log first and written from the log by
whichever connection is attached (:func:`~weir.protocol.streams.writer_step` decides each
move), so a resumption (``GET`` + ``Last-Event-ID``) sends exactly what follows its
cursor, and the newest reader of a stream displaces an older one.  Each frame's last
byte is marked in a :class:`~weir.protocol.DrainTracker`; the kernel's send queue
(``ioctl(SIOCOUTQ)``, Linux) says when the peer acknowledged it, and only then does
its credit come back (under TLS, :mod:`._tls` maps the plaintext offsets to the
ciphertext the kernel counts).  A reader watches the socket while a stream is
written, so a peer that hangs up is noticed at once rather than at the next failed
write.  A stream whose answer is complete when its writer attaches (the common case:
a tool that answered at once) goes out in one write -- head, frames and terminator --
with no watcher: each write on loopback costs the peer's receive path too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING

from weir.common import as_seen
from weir.common._access import CURRENT as CURRENT_ACCESS
from weir.common._access import AccessRecord, speaks_for
from weir.common._access import enabled as access_log_on
from weir.common._sendqueue import KernelSendQueue
from weir.common._tls import LINGER_QUIET
from weir.engine._store_errors import StoreUnavailable
from weir.protocol import (
    NEED_DATA,
    SERVER_ERROR,
    DrainTracker,
    HttpConnection,
    HttpError,
    HttpRequest,
    OpenStream,
    PostMessages,
    ReadClock,
    Reason,
    RemoteProtocolError,
    closing_refusal,
    refusal,
    route,
    session_refusal,
)
from weir.protocol.forwarded import peer_address
from weir.protocol.resume import displaces_writer
from weir.protocol.sessionless import SessionlessMessage
from weir.protocol.sse import encode_comment, encode_retry
from weir.protocol.states import StreamInput, StreamState
from weir.protocol.streams import StreamLog, WriterStep, completes, writer_step

from ._auth import identify, is_metadata, metadata
from ._drain import refuse_if_closing
from ._legacy import is_legacy, serve_legacy
from ._lifecycle import serve_initialize
from ._metrics import answer as metrics_answer
from ._metrics import is_metrics
from ._post import PostEffects
from ._read_deadline import ReadDeadline
from ._session import Gone, Session
from ._sessionless import SessionlessPosts
from ._shared import store_unavailable
from ._streams import SSE_HEADERS, serve_delete, serve_get
from ._tls import TlsReader, TlsWriter

if TYPE_CHECKING:
    from ._driver import AsyncioDriver

log = logging.getLogger("weir.asyncio")
#: How often a connection with unacknowledged frames asks the kernel (seconds).
_ACK_POLL_S = 0.002
_ACK_POLL_MAX_S = 0.05


class Connection:
    """One TCP connection: its read/respond loop around one :class:`HttpConnection`,
    and the acknowledgement tracking of every frame it writes."""

    def __init__(self, driver: AsyncioDriver, writer: asyncio.StreamWriter | TlsWriter) -> None:
        self.driver, self.writer, self.conn = driver, writer, HttpConnection(driver.limits)
        #: The TCP peer's address, and whose forwarding headers are believed: each
        #: request's own view is computed from them (``respond``), never kept here.
        self.peer = peer_address(writer.get_extra_info("peername"))
        self.trusted = driver.endpoint.trusted_proxies
        self.scheme = "http" if driver.ssl_context is None else "https"
        # A mark's token: (session, stream, seq after the frame), or (session, None,
        # bytes) for a JSON body, whose credit comes back whole when it is acknowledged.
        self.acks: DrainTracker[tuple[Session, StreamLog | None, int]] = DrainTracker()
        #: Each session with unacknowledged bytes here: the end of its last mark (it
        #: counts this connection among its ``carrying`` until the peer acks that).
        self._marked: dict[Session, int] = {}
        # (No TCP_NOTSENT_LOWAT here: asyncio's transport buffers what the kernel
        # does not take, and that buffer is counted as unacknowledged too.)
        self._kernel = KernelSendQueue(writer.get_extra_info("socket"), notsent_lowat=None)
        #: The next look at the kernel's send queue while marks are pending (a timer,
        #: not a task: one per connection with bytes in flight), and its back-off.
        self._ack_timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._ack_delay = _ACK_POLL_S
        #: The last stream's hang-up watcher, cancelled: the next read waits for it to
        #: let go of the reader first (a reader takes one waiting read at a time).
        self._watching: asyncio.Task[bytes] | None = None
        self._reader: asyncio.StreamReader | TlsReader | None = None
        self._early = b""  # bytes the peer sent while a stream was being written
        #: Bytes of the request being read, counted in the driver's ``inbound``.
        self._inbound = 0
        self._peer_gone = False
        #: The request stream a POST's course opened, until its writer attaches, and
        #: how many responses it is opened for.
        #: The streams this connection wrote (their credit comes back when it ends).
        self._wrote: set[tuple[Session, StreamLog]] = set()
        #: Its sessionless requests and their credit owner (made on first use).
        self._sessionless: SessionlessPosts | None = None

    # ----------------------------------------------------------- bytes out, acks in
    async def send(
        self,
        data: bytes | list[bytes],
        token: tuple[Session, StreamLog | None, int] | None = None,
        tail: int = 0,
    ) -> None:
        """Write ``data``; with ``token``, mark its last byte for acknowledgement first
        (so the mark exists even if the peer stalls and the drain never returns) --
        or, with ``tail``, the byte ``tail`` bytes before its end (a stream's
        terminator written with its last frames is not a frame).

        ``data`` given as a list is taken over (emptied; its pieces joined unless it
        holds one): once the transport has it, only the transport's buffer -- the
        part the kernel has not taken -- is held while the peer is slow, not the
        whole write."""
        if isinstance(data, list):
            pieces, data = data, data[0] if len(data) == 1 else b"".join(data)
            pieces.clear()
        try:
            self.writer.write(data)
            size = len(data)
            del data
            self.acks.wrote(size)
            if token is not None:
                self.acks.mark(self.acks.written - tail, token)
                self._marked[token[0]] = self.acks.written
                token[0].carrying.add(self)
                self._watch_acks()
            await self.writer.drain()
        except BaseException:
            self.conn.send_failed()
            raise

    async def send_answer(
        self, session: Session, headers: list[tuple[str, str]], body: list[bytes]
    ) -> None:
        """A ``200`` of the one JSON body in ``body``, holding ``session``'s credit
        (taken for the body's size) until the peer acknowledges its last byte.

        ``body`` is taken over (emptied), so while a stalled peer keeps the write
        waiting neither the body nor the framed response is held beside the
        transport's buffer (see :meth:`send`); callers drop their own references."""
        size = len(body[0])
        framed = [self.conn.send_response(200, headers, body.pop())]
        await self.send(framed, (session, None, size))

    def _unacknowledged(self) -> int:
        """Bytes written and not acknowledged: asyncio's buffer plus the kernel's queue
        (under TLS those count ciphertext, which :class:`TlsWriter` maps to plaintext)."""
        unacked = self.writer.transport.get_write_buffer_size() + self._kernel.unacknowledged()
        writer = self.writer
        return writer.unacknowledged(unacked) if isinstance(writer, TlsWriter) else unacked

    def check_acks(self) -> bool:
        """Release the credit of every frame the peer has acknowledged; any progress?"""
        acked = self.acks.acked
        drained, partial = self.acks.settle(self._unacknowledged())
        for session, stream, upto in drained:
            if stream is None:
                session.release(1, upto)  # a JSON body
            else:
                session.drained(stream, upto)
        if partial is not None:
            session = partial[0]
            session.flow.credit.progress(session.clock())  # part of a frame
        if drained:
            self._unmark(self.acks.acked)
        return self.acks.acked > acked

    def _unmark(self, upto: float) -> None:
        """Sessions whose last mark here is at or below ``upto`` are carried no more."""
        for session, end in list(self._marked.items()):
            if end <= upto:
                del self._marked[session]
                session.carrying.discard(self)

    def cut_if_stalled(self, session: Session) -> None:
        """``session`` was torn down for want of progress: if bytes of it are still
        unacknowledged here, the peer stalled -- abort the connection, so its
        buffers (the transport's and the kernel's) go now, not when the peer leaves."""
        self.check_acks()
        if self._marked.get(session, 0) > self.acks.acked:
            self.writer.transport.abort()

    def _watch_acks(self) -> None:
        if self._ack_timer is None:
            self._ack_delay = _ACK_POLL_S
            self._ack_timer = asyncio.get_running_loop().call_soon(self._poll_acks)

    def _poll_acks(self) -> None:
        # The kernel tells nobody when the peer acknowledges: ask while marks are
        # pending, soon after progress, backing off (doubling) while there is none.
        self._ack_timer = None
        if not self.acks.pending:
            return
        progress = self.check_acks()
        self._ack_delay = _ACK_POLL_S if progress else min(self._ack_delay * 2, _ACK_POLL_MAX_S)
        if self.acks.pending:
            loop = asyncio.get_running_loop()
            self._ack_timer = loop.call_later(self._ack_delay, self._poll_acks)

    # ---------------------------------------------------------------- requests
    async def run(self, reader: asyncio.StreamReader | TlsReader) -> None:
        conn, self._reader = self.conn, reader
        clock, loop = ReadClock(self.driver.read_timeouts), asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(loop, task)  # (one timer for every read's deadline)
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA and self._early:
                    early, self._early = self._early, b""
                    if not self._charge(len(early)):
                        await self._overloaded(reader)
                        break
                    conn.receive_data(early)
                elif event is NEED_DATA:
                    data = await self._read(reader, clock, deadline)
                    if data is None:
                        break
                    if not self._charge(len(data)):
                        await self._overloaded(reader)
                        break
                    conn.receive_data(data)
                elif isinstance(event, HttpRequest):
                    clock.request_done()
                    self._give_back()  # (complete: its bytes are the request's now)
                    record = self._begin(event) if access_log_on() else None
                    try:
                        await self.respond(event)
                    finally:
                        if record is not None:
                            self._end(record)
                    if conn.should_close:
                        break
                elif isinstance(event, HttpError):
                    await self._refuse(event, reader)
                    break
                else:  # ConnectionClosed
                    break
        except (ConnectionError, TimeoutError):
            pass
        except Exception:
            log.exception("connection handler failed")
        finally:
            deadline.close()
            await self._teardown()

    async def _read(
        self, reader: asyncio.StreamReader | TlsReader, clock: ReadClock, deadline: ReadDeadline
    ) -> bytes | None:
        """The next bytes of the connection, read within the deadline ``clock`` gives;
        None when the read missed its deadline and the connection ends here (a head or
        body trickled past its deadline is answered 408 first; an idle keep-alive just
        closes)."""
        conn = self.conn
        if conn.has_data_to_send:
            await self.send(conn.data_to_send())  # e.g. 100 Continue
        if self._watching is not None:
            if not self._watching.done():
                await asyncio.wait({self._watching})
            self._watching = None
        deadline.wait_until(clock.deadline(conn.inbound, asyncio.get_running_loop().time()))
        try:
            return await reader.read(65536)  # (b"" at EOF: the core hears the end)
        except asyncio.CancelledError:
            if not deadline.timed_out():
                raise
        finally:
            deadline.done()
        if clock.owed:
            self.driver.metrics.refused(str(Reason.REQUEST_TIMEOUT))
            conn.send_failed()
            await self.send(closing_refusal(clock.refusal()))
            await self._linger(reader)
        return None

    async def _refuse(self, event: HttpError, reader: asyncio.StreamReader | TlsReader) -> None:
        """Send the core's refusal of a request it could not parse, log it, and let
        the peer's remaining bytes drain for a moment (then the connection ends)."""
        self.driver.metrics.refused(str(event.reason))
        out = self.conn.data_to_send()
        await self.send(out)
        if access_log_on():
            peer = self.writer.get_extra_info("peername")
            AccessRecord.refused(event.status, str(event.reason), peer=peer, nbytes=len(out)).emit()
        await self._linger(reader)

    async def _teardown(self) -> None:
        """The connection's last steps, however it ended."""
        self._give_back()
        # Nothing written here will be acknowledged any more: JSON bodies cannot
        # be replayed, so nothing is owed; the streams this connection wrote stay
        # in their logs as replay history (a resumption writes them again) but
        # stop holding credit, unless another connection writes them now.
        for session, stream, nbytes in self.acks.take_pending():
            if stream is None:
                session.release(1, nbytes)
        self._unmark(math.inf)
        for session, stream in self._wrote:
            session.let_go(stream)
        self._wrote.clear()
        if self._sessionless is not None:
            self._sessionless.close()  # its owner ends with it
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self.writer.transport.get_write_buffer_size():
            self.writer.transport.abort()  # a peer that stopped reading: do not flush
        self.writer.close()
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    def _begin(self, request: HttpRequest) -> AccessRecord:
        """The access-log record of ``request``, current in this task from now."""
        self.conn.status = 0  # (no response yet: the previous one's must not show)
        record = AccessRecord.begin(
            request.method,
            request.target,
            request.headers,
            request.body,
            peer=self.writer.get_extra_info("peername"),
            now=time.perf_counter(),
            written=self.acks.written,
        )
        CURRENT_ACCESS.set(record)
        return record

    def _end(self, record: AccessRecord) -> None:
        """The response to ``record``'s request has ended (or the connection has)."""
        CURRENT_ACCESS.set(None)
        conn = self.conn
        record.end(conn.status, conn.error_body, now=time.perf_counter(), written=self.acks.written)
        record.emit()

    def _charge(self, n: int) -> bool:
        """Count ``n`` more bytes of a request not yet complete against the driver's
        ``max_inbound_bytes`` (over every connection); False if that passes it."""
        driver = self.driver
        self._inbound += n
        driver.inbound += n
        return driver.inbound <= driver.max_inbound_bytes

    def _give_back(self) -> None:
        """The bytes this connection counted go back (its request is complete, or
        refused, or the connection ends)."""
        self.driver.inbound -= self._inbound
        self._inbound = 0

    async def _overloaded(self, reader: asyncio.StreamReader | TlsReader) -> None:
        """Too many request bytes are buffered on this server: 503 ``overloaded``
        (``Retry-After``), then the connection lingers and closes (as on Trio)."""
        self._give_back()  # at once: the refusal frees what this connection held
        self.driver.metrics.refused(str(Reason.OVERLOADED))
        exc = RemoteProtocolError(
            "too many request bytes are in flight on this server; retry later",
            http_status=503,
            reason=Reason.OVERLOADED,
            code=SERVER_ERROR,
            retry_after_ms=self.driver.retry_ms,
        )
        self.conn.send_failed()  # nothing else may follow on this connection
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self.send(closing_refusal(exc))
        await self._linger(reader)

    async def _linger(self, reader: asyncio.StreamReader | TlsReader) -> None:
        """After a refusal sent while the peer is still sending: half-close, then read and
        discard for at most the linger timeout -- closing with unread bytes would reset
        the connection and could destroy the refusal before the peer reads it."""
        linger = self.driver.read_timeouts.linger
        if not linger:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(linger):
                if not self.writer.can_write_eof():
                    # TLS: no half-close; discard until the peer has been quiet a moment.
                    while True:
                        try:
                            async with asyncio.timeout(LINGER_QUIET):
                                data = await reader.read(65536)
                        except TimeoutError:
                            return
                        if not data:
                            return
                self.writer.write_eof()
                while await reader.read(65536):
                    pass

    async def respond(self, request: HttpRequest) -> None:
        try:
            driver, auth = self.driver, self.driver.auth
            refuse_if_closing(driver)  # (draining: nothing new starts)
            # As its client sent it (what trusted proxies say about this request alone).
            request = as_seen(request, self.peer, self.trusted, self.scheme)
            if is_metadata(auth, request, driver.endpoint):
                assert auth is not None
                await self.send(self.conn.send_response(*metadata(auth, request, driver.endpoint)))
                return
            if is_metrics(driver, request):  # (no token needed, as on Trio)
                await self.send(self.conn.send_response(*metrics_answer(driver, request)))
                return
            # Who this request speaks for: handed to everything below, never kept on
            # the connection (its next request may speak for someone else).
            who = await identify(auth, request)
            speaks_for(who.principal, who.authorized)  # (the access log's line)
            if is_legacy(self, request):  # (the 2024-11-05 transport's two paths)
                await serve_legacy(self, request, who)
                return
            mcp = route(request, driver.endpoint)
            if isinstance(mcp, SessionlessMessage):
                if self._sessionless is None:
                    self._sessionless = SessionlessPosts(self)
                await self._sessionless.serve(mcp, who)
                return
            if isinstance(mcp, PostMessages) and mcp.is_initialize:
                await serve_initialize(self, mcp, who)
                return
            sid = mcp.ctx.session_id or ""
            rid = mcp.refusal_id if isinstance(mcp, PostMessages) else None
            session = await driver.shared.load(who.principal, sid, rid)
            try:
                if isinstance(mcp, PostMessages):
                    await PostEffects(self, session).run(mcp)
                elif isinstance(mcp, OpenStream):
                    await serve_get(self, session, mcp)
                else:
                    await serve_delete(self, session, mcp)
            except Gone:
                raise session_refusal(sid) from None
        except (RemoteProtocolError, StoreUnavailable) as exc:
            if self.conn.response_in_progress:
                raise
            if isinstance(exc, StoreUnavailable):  # (on any path: session, sessionless, tasks)
                log.warning("store unavailable: %s", exc)
                exc = store_unavailable()
            self.driver.metrics.refused(str(exc.reason))
            if exc.reason is Reason.IN_PROGRESS:
                self.driver.metrics.duplicates_in_progress += 1
            status, headers, body = refusal(exc)
            await self.send(self.conn.send_response(status, headers, body))

    async def write_stream(self, session: Session, stream: StreamLog, start: int) -> None:
        """Write ``stream`` from seq ``start``: what the log holds, then live, to its end
        (the head names the session, unless it is a sessionless owner)."""
        if displaces_writer(stream):  # (a writer that is not a resumption's to displace)
            raise RemoteProtocolError(
                "this stream is already being written to another connection",
                http_status=409,
                reason=Reason.STREAM_CONFLICT,
            )
        sid = () if session.sessionless else (("mcp-session-id", session.sid),)
        head = self.conn.start_stream(200, (*SSE_HEADERS, *sid))  # (sent with the frames)
        if stream.state is not StreamState.CLOSED:  # a closed one is replayed, no more
            stream.handle(StreamInput.ATTACH)
        session.abandoned.discard(stream.epoch)  # a reader again: frames hold credit
        # (Only streams that may still hold credit are remembered: a keep-alive
        # connection writes many.)
        self._wrote = {(s, w) for s, w in self._wrote if not s.closed and _may_hold(w)}
        self._wrote.add((session, stream))
        # A stream whose answer is all there goes out in one write (head, frames and
        # terminator) and needs no watcher: nothing is left to wait for.
        at_once = completes(stream, stream.next_seq) and start < stream.next_seq
        watch = None if at_once else self._watch_for_hang_up()
        me = asyncio.current_task()
        if me is not None:
            session.writers.add(me)
            session.stream_writers[stream.epoch] = me
        try:
            await self._stream_frames(session, stream, start, head)
        except asyncio.CancelledError:
            if not self._peer_gone:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ConnectionResetError("the peer hung up mid-stream") from None
        finally:
            if watch is not None:
                watch.cancel()
                self._watching = watch
            session.writers.discard(me)
            if session.stream_writers.get(stream.epoch) is me:
                del session.stream_writers[stream.epoch]
                # A close asked for this connection ends with it (honoured, or moot
                # because the stream finished first): a resumption is not cut short.
                session.close_requests.pop(stream.epoch, None)
                if stream.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
                    stream.handle(StreamInput.DETACH)
            else:
                # A newer reader displaced this writer (and unregistered it): the stream,
                # still attached, and its credit are that reader's now, so this
                # connection's end must not let go of it.
                self._wrote.discard((session, stream))

    def _watch_for_hang_up(self) -> asyncio.Task[bytes]:
        """Read while a stream is written: EOF means the peer is gone, so stop writing.

        Without it a writer waiting for the next frame would hold the stream
        attached, and the client's own reconnection would get 409 until the next
        write failed.
        """
        assert self._reader is not None
        writer = asyncio.current_task()
        watch = asyncio.get_running_loop().create_task(self._reader.read(65536))

        def done(task: asyncio.Task[bytes]) -> None:
            if task.cancelled():
                return
            data = b"" if task.exception() is not None else task.result()
            if data:
                self._early += data  # a pipelined request: served after this stream
            elif writer is not None:
                self._peer_gone = True
                writer.cancel()

        watch.add_done_callback(done)
        return watch

    async def _stream_frames(
        self, session: Session, stream: StreamLog, start: int, pending: bytes
    ) -> None:
        """Write the stream from ``start``; ``pending`` (the head) goes out with the
        first frames, or before the first wait.  Frames that complete the stream go
        out in the same write as its terminator."""
        cursor = start
        while True:
            retry = session.close_requests.get(stream.epoch)
            step = writer_step(stream, cursor, session_closed=session.closed, close_retry_ms=retry)
            if step is WriterStep.SEND:
                frames = stream.frames_from(cursor)
                cursor += len(frames)
                out = pending + self.conn.send_stream_data(b"".join(frames))
                pending = b""
                if completes(stream, cursor):
                    end = self.conn.end_stream()
                    await self.send(out + end, (session, stream, cursor), tail=len(end))
                    stream.handle(StreamInput.DELIVERED)  # (its frames: history, in the budget)
                    return
                await self.send(out, (session, stream, cursor))
                continue
            if pending:
                await self.send(pending)  # the head goes out before any wait
                pending = b""
            if step is WriterStep.FINISH:
                stream.handle(StreamInput.DELIVERED)
                break
            if step is WriterStep.RETRY and retry is not None:
                # The handler ended this response early: the client reconnects after
                # ``retry`` ms and resumes the stream from its last event id.
                del session.close_requests[stream.epoch]
                await self.send(self.conn.send_stream_data(encode_retry(retry)))
                break
            if step is not WriterStep.WAIT:
                break  # aborted, a replay of a delivered stream, or the session ended
            before, keepalive = stream.next_seq, self.driver.sse_keepalive
            await session.wait_for_frames(stream, keepalive)
            if keepalive is not None and stream.next_seq == before and not stream.finished:
                await self.send(self.conn.send_stream_data(encode_comment()))
        await self.send(self.conn.end_stream())


def _may_hold(stream: StreamLog) -> bool:
    """Whether ``stream`` may still hold credit, or take more (not finished)."""
    return not stream.finished or stream.undrained() != (0, 0)
