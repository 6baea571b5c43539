"""A second driver for weir's sans-io core, on stdlib asyncio instead of Trio.

Theory of operation
-------------------
:mod:`weir.protocol` does no I/O and reads no clock, so any event loop can drive it.  This
module is such a driver: an asyncio server around the same core the Trio engine drives,
with the same guarantees about a client that stops reading.

* **HTTP and the endpoint.**  Each connection runs ``reader.read ->
  HttpConnection.receive_data -> next_event -> respond``.  Framing, keep-alive and the
  automatic 400/413/431 come from :class:`HttpConnection`; every endpoint rule from
  :func:`route`; every refusal body from :func:`refusal`; ``initialize`` checks and
  result from :func:`parse_initialize` and :func:`initialize_result`.
* **Streams.**  Every SSE message is appended to its stream's :class:`StreamLog`
  first and written from the log, by whichever connection is attached: a POST's
  response stream, or the session's GET stream.  ``Last-Event-ID: <epoch>:<seq>``
  re-attaches to the stream the epoch names and sends exactly what follows the
  cursor (a second live GET is 409 ``stream_conflict``).
* **Credit.**  Each session has one :class:`SessionFlow`: a request is admitted, and
  a frame enters a log, only within the session's credit; frames that must wait are
  granted strictly in order.  Credit comes back when the *peer's kernel has
  acknowledged* the frame's last byte: the connection's :class:`DrainTracker`
  learns that from ``ioctl(SIOCOUTQ)`` (Linux), polled while marks are pending.
  A JSON body (a client that accepts only ``application/json``) holds credit the
  same way; on a lost connection it gives it back (it cannot be replayed).
* **Timers.**  One ``loop.call_at`` per session, at :meth:`SessionFlow.deadline`:
  past the drain window a session that does not drain is half-open, and new
  requests get 429 ``stream_half_open``; past the liveness timeout it is torn
  down (its handlers cancelled, its streams aborted, later requests 404).
* **Handlers** are tasks owned by the session, not the connection: a dropped
  connection does not cancel a call, whose response waits in the log for a
  resumption.

It serves an :class:`weir.engine.App` (the demo app by default): ``initialize``,
``notifications/initialized``, ``ping``, ``tools/list`` and ``tools/call``.
``weir.engine`` imports trio, but no trio code runs: tools are awaited on the asyncio loop.

* **Limits.**  Sessions (503 ``session_limit``), connections (503 ``overloaded``),
  idle sessions (forgotten after ``idle_timeout`` unless busy), each session's
  credit, and its replay history (a live stream's last 256 frames; a closed stream
  keeps only its unacknowledged ones, and at most 16 closed streams are known);
  request sizes and header counts are :class:`HttpConnection`'s, and read deadlines
  (idle, whole head, body) :class:`ReadClock`'s.

Not here (the Trio engine has them): tools taking an :class:`weir.engine.Context`
(they get a JSON-RPC error and are not listed); resources, prompts and completion;
the idempotency gate and session stores; authorization, and graceful shutdown.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import fcntl
import inspect
import logging
import math
import secrets
import socket
import sys
from collections.abc import Coroutine
from typing import Any

import msgspec

from weir.engine import App, McpError, ToolError, text, tool_result
from weir.engine.apps.demo import app as demo_app
from weir.protocol import (
    INVALID_PARAMS,
    LOOPBACK_HOSTS,
    METHOD_NOT_FOUND,
    NEED_DATA,
    SERVER_ERROR,
    Admit,
    CreditLimits,
    CreditState,
    DrainTracker,
    EndpointConfig,
    HttpConnection,
    HttpError,
    HttpRequest,
    Notification,
    OpenStream,
    PostMessages,
    ReadClock,
    ReadTimeouts,
    Reason,
    RemoteProtocolError,
    Request,
    RequestId,
    SessionFlow,
    SessionInput,
    SessionState,
    StreamInput,
    StreamKind,
    StreamLog,
    StreamState,
    StreamTable,
    WriterStep,
    accepts,
    check_resume_policy,
    closing_refusal,
    displaces_writer,
    encode_comment,
    encode_error,
    encode_result,
    format_epoch,
    initialize_result,
    parse_initialize,
    primes_streams,
    raw_error_response,
    refusal,
    route,
    session_refusal,
    session_transition,
    standalone_plan,
    writer_step,
)

log = logging.getLogger("weir.asyncio")
_SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
#: ``ioctl(SIOCOUTQ)``: bytes in a TCP socket's send queue not yet acknowledged (Linux).
_SIOCOUTQ = 0x5411
#: How often a connection with unacknowledged frames asks the kernel (seconds).
_ACK_POLL_S = 0.002
_ACK_POLL_MAX_S = 0.05
#: Replay history: frames a live stream keeps, and closed streams a session remembers.
_MAX_EVENTS = 256
_MAX_CLOSED_STREAMS = 16
#: A comment on an idle stream this often, so proxies do not cut it.
_SSE_KEEPALIVE_S = 15.0
_TCP = (socket.AF_INET, socket.AF_INET6)


class _Gone(Exception):
    """The session ended while something waited on it."""


class _Session:
    """One session: its flow control, its streams, its handler tasks, its timer."""

    def __init__(self, sid: str, version: str, credit: CreditLimits, driver: AsyncioDriver):
        self.sid, self.version, self.driver = sid, version, driver
        self.loop = asyncio.get_running_loop()
        self.state = SessionState.NEW
        self.flow = SessionFlow(credit, self.loop.time())
        self.streams = StreamTable(max_closed=_MAX_CLOSED_STREAMS)
        self.epochs = 0  # streams opened so far; the next one's epoch
        self.tasks: set[asyncio.Task[None]] = set()
        #: The connection tasks writing this session's streams (teardown cancels them),
        #: and which one writes each stream (a resumption displaces it).
        self.writers: set[asyncio.Task[Any]] = set()
        self.stream_writers: dict[str, asyncio.Task[Any]] = {}
        self._grants: dict[int, asyncio.Future[None]] = {}
        self._changed = asyncio.Event()  # replaced on every pulse
        self._wakeups: dict[str, asyncio.Event] = {}  # per stream epoch, for its writer
        self._timer: asyncio.TimerHandle | None = None
        #: When a request last named this session (idle expiry counts from here).
        self.last_seen = self.loop.time()

    @property
    def closed(self) -> bool:
        return self.state is SessionState.CLOSED

    # ------------------------------------------------------------------ timers
    def arm_timer(self) -> None:
        """(Re)schedule the one timer at the credit's next deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.flow.deadline()
        if not self.closed and when != math.inf:
            self._timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.flow.credit.handle_timer(self.loop.time()) is CreditState.DEAD:
            self.driver.end(self)  # no progress for the liveness timeout
            return
        self._pulse()
        self.arm_timer()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --------------------------------------------------------------- admission
    async def admit(self, n: int, request_id: RequestId | None) -> None:
        """Wait for room for ``n`` requests (429 once half-open; :class:`_Gone`)."""
        while True:
            if self.closed:
                raise _Gone
            verdict = self.flow.try_admit(n, self.loop.time(), request_id)
            if verdict is Admit.ADMITTED:
                return
            if verdict is Admit.BLOCKED:
                self.arm_timer()
            changed = self._changed
            wait = max(0.0, self.flow.deadline() - self.loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), None if wait == math.inf else wait)

    def done(self) -> None:
        self.flow.done()
        self._pulse()

    # ------------------------------------------------------------------ frames
    async def append(self, stream: StreamLog, payload: str, *, final: bool = False) -> None:
        """Take credit for the frame (waiting in order), then append it to ``stream``."""
        size = stream.size_of(payload)
        await self.take_credit(size)
        if stream.state is StreamState.CLOSED:
            self.release(1, size)  # aborted while we waited: nothing to send
            raise _Gone
        stream.append(payload, final=final)
        self.wake(stream)

    async def take_credit(self, size: int) -> None:
        """Credit for one frame (or JSON body) of ``size`` bytes, in FIFO order."""
        now = self.loop.time()
        if self.flow.try_acquire(size, now):
            if self.flow.credit.frames_in_use == 1:
                self.arm_timer()  # the first pending frame starts the liveness clock
        else:
            if self.closed:
                raise _Gone
            ticket = self.flow.wait_for(size, now)
            granted = self._grants[ticket] = self.loop.create_future()
            self.arm_timer()
            try:
                await granted
            except asyncio.CancelledError:
                self._grants.pop(ticket, None)
                if not self.flow.cancel(ticket, self.loop.time()) and not self.closed:
                    self.release(1, size)  # granted while we were cancelled
                raise
            if self.closed:
                raise _Gone

    def release(self, frames: int, nbytes: int) -> None:
        """Credit back (frames acknowledged or discarded); grant waiters in order."""
        for ticket in self.flow.release(frames, nbytes, self.loop.time()):
            future = self._grants.pop(ticket)
            if not future.done():
                future.set_result(None)
        self._pulse()
        self.arm_timer()

    def drained(self, stream: StreamLog, upto_seq: int) -> None:
        """The peer acknowledged every frame of ``stream`` below ``upto_seq``.

        A closed stream's acknowledged frames are dropped at once: what stays is
        only what a resumption may still need, so the history a session keeps is
        its live streams' last ``_MAX_EVENTS`` frames, not everything it was sent.
        """
        self.release(*stream.mark_drained(upto_seq))
        if stream.state is StreamState.CLOSED:
            stream.trim_drained()

    # ----------------------------------------------------------------- streams
    def open_stream(self, kind: StreamKind) -> StreamLog:
        log = StreamLog(format_epoch(self.epochs), kind, max_events=_MAX_EVENTS)
        stream = self.streams.add(log)
        self.epochs += 1
        return stream

    def wake(self, stream: StreamLog) -> None:
        event = self._wakeups.pop(stream.epoch, None)
        if event is not None:
            event.set()

    async def wait_for_frames(self, stream: StreamLog, timeout: float) -> None:
        event = self._wakeups.setdefault(stream.epoch, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task of the session (teardown cancels it, a hang-up does not)."""
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -------------------------------------------------------------------- end
    def close(self) -> None:
        """Cancel handlers, abort streams, wake every waiter (which then finds it gone)."""
        if self.closed:
            return
        self.state = session_transition(self.state, SessionInput.TEARDOWN)
        if self._timer is not None:
            self._timer.cancel()
        self.flow.close()
        for future in self._grants.values():
            if not future.done():
                future.set_result(None)
        self._grants.clear()
        for stream in self.streams:
            if stream.state is not StreamState.CLOSED:
                stream.handle(StreamInput.ABORT)
            self.wake(stream)
        for task in (*self.tasks, *self.writers):
            task.cancel()
        self._pulse()


class AsyncioDriver:
    """Serves one :class:`weir.engine.App`; :meth:`connection` is the ``start_server`` callback."""

    def __init__(
        self,
        app: App,
        endpoint: EndpointConfig,
        credit: CreditLimits | None = None,
        *,
        max_sessions: int = 1000,
        max_connections: int = 1000,
        idle_timeout: float = 600.0,
        read_timeouts: ReadTimeouts | None = None,
    ) -> None:
        """Serve ``app``.  Everything a client can make the driver hold is bounded:
        ``max_sessions`` (503 ``session_limit`` beyond), ``max_connections`` (503
        ``overloaded``, then close), a session unused for ``idle_timeout`` seconds
        (and running nothing) is forgotten, and each session holds at most its
        ``credit`` in unacknowledged frames.  Reads have the core's deadlines
        (``read_timeouts``: idle keep-alive, a whole head, a body; 408 past the last two).
        """
        self.app, self.endpoint = app, endpoint
        self.credit = credit or CreditLimits()
        self.max_sessions, self.max_connections = max_sessions, max_connections
        self.idle_timeout = idle_timeout
        self.read_timeouts = read_timeouts or ReadTimeouts()
        self.sessions: dict[str, _Session] = {}
        self.connections = 0
        self._sweeper: asyncio.TimerHandle | None = None

    def end(self, session: _Session) -> None:
        """Tear a session down; it is 404 from now on."""
        session.close()
        self.sessions.pop(session.sid, None)

    def add_session(self, session: _Session) -> None:
        """Register a new session (the caller checked :meth:`check_room`)."""
        self.sessions[session.sid] = session
        if self._sweeper is None:
            self._sweeper = session.loop.call_later(self.idle_timeout / 4, self._sweep)

    def check_room(self, request_id: RequestId | None) -> None:
        """Refuse a new session past ``max_sessions``: 503 ``session_limit``."""
        if len(self.sessions) >= self.max_sessions:
            raise RemoteProtocolError(
                f"this server holds its limit of {self.max_sessions} sessions; retry later",
                http_status=503,
                reason=Reason.SESSION_LIMIT,
                code=SERVER_ERROR,
                request_id=request_id,
                retry_after_ms=1000,
                data={"limit": self.max_sessions, "scope": "server"},
            )

    def _sweep(self) -> None:
        """Forget sessions idle for ``idle_timeout`` that run and write nothing."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for session in list(self.sessions.values()):
            busy = session.tasks or session.writers
            if not busy and now - session.last_seen >= self.idle_timeout:
                self.end(session)
        if self.sessions:
            self._sweeper = loop.call_later(self.idle_timeout / 4, self._sweep)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The ``start_server`` callback: serve one connection until it closes."""
        if self.connections >= self.max_connections:
            body = encode_error(
                None,
                SERVER_ERROR,
                "this server holds its limit of connections; retry later",
                {"reason": str(Reason.OVERLOADED), "limit": self.max_connections},
            )
            writer.write(raw_error_response(503, body, (("retry-after", "1"),)))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.transport.abort()
            return
        self.connections += 1
        try:
            await _Connection(self, writer).run(reader)
        finally:
            self.connections -= 1

    async def execute(self, req: Request) -> bytes:
        """One request's encoded JSON-RPC response."""
        try:
            if req.method == "ping":
                return encode_result(req.id, {})
            if req.method == "tools/list":
                tools = [t.listing() for t in self.app.tools.values() if t.context_param is None]
                return encode_result(req.id, {"tools": tools})
            if req.method == "tools/call":
                return encode_result(req.id, await self._call_tool(req.params or {}))
            raise McpError(METHOD_NOT_FOUND, f"method {req.method!r} not found")
        except McpError as exc:
            return encode_error(req.id, exc.code, exc.message, exc.data)

    async def _call_tool(self, params: dict[str, Any]) -> dict[str, Any]:
        name, arguments = params.get("name"), params.get("arguments") or {}
        tool = self.app.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise McpError(INVALID_PARAMS, f"unknown tool {name!r}")
        if tool.context_param is not None:
            raise McpError(
                SERVER_ERROR,
                f"tool {name!r} takes a Context (progress, logging, cancellation), "
                "which the asyncio example driver does not support; use the Trio engine",
                {"tool": name},
            )
        if not isinstance(arguments, dict):
            raise McpError(INVALID_PARAMS, "params.arguments must be an object")
        try:
            if tool.args_type is None:
                kwargs = dict(arguments) if tool.input_schema.get("properties") else {}
            else:
                args = msgspec.convert(arguments, tool.args_type, strict=False)
                kwargs = {f: getattr(args, f) for f in tool.args_type.__struct_fields__}
        except msgspec.ValidationError as exc:
            return {"content": [text(f"invalid arguments for {name}: {exc}")], "isError": True}
        try:
            out = tool.fn(**kwargs)
            return tool_result(await out if inspect.isawaitable(out) else out)
        except ToolError as exc:
            return {"content": [text(str(exc))], "isError": True}
        except McpError:
            raise
        except Exception as exc:
            log.exception("tool %s failed", name)
            return {"content": [text(f"tool {name} failed: {type(exc).__name__}")], "isError": True}


class _Connection:
    """One TCP connection: its read/respond loop around one :class:`HttpConnection`,
    and the acknowledgement tracking of every frame it writes."""

    def __init__(self, driver: AsyncioDriver, writer: asyncio.StreamWriter) -> None:
        self.driver, self.writer, self.conn = driver, writer, HttpConnection()
        # A mark's token: (session, stream, seq after the frame), or (session, None,
        # bytes) for a JSON body, whose credit comes back whole when it is acknowledged.
        self.acks: DrainTracker[tuple[_Session, StreamLog | None, int]] = DrainTracker()
        self._fd = -1
        self._outq = array.array("i", [0])
        sock = writer.get_extra_info("socket")
        if sys.platform == "linux" and sock is not None and sock.family in _TCP:
            self._fd = sock.fileno()
        self._watcher: asyncio.Task[None] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._early = b""  # bytes the peer sent while a stream was being written
        self._peer_gone = False

    # ----------------------------------------------------------- bytes out, acks in
    async def send(
        self, data: bytes, token: tuple[_Session, StreamLog | None, int] | None = None
    ) -> None:
        """Write ``data``; with ``token``, mark its last byte for acknowledgement first
        (so the mark exists even if the peer stalls and the drain never returns)."""
        try:
            self.writer.write(data)
            self.acks.wrote(len(data))
            if token is not None:
                self.acks.mark(self.acks.written, token)
                self._watch_acks()
            await self.writer.drain()
        except BaseException:
            self.conn.send_failed()
            raise

    def _unacknowledged(self) -> int:
        """Bytes written and not acknowledged: asyncio's buffer plus the kernel's queue."""
        buffered = self.writer.transport.get_write_buffer_size()
        if self._fd < 0:
            return buffered  # no SIOCOUTQ: "accepted by the kernel" stands in for acked
        try:
            fcntl.ioctl(self._fd, _SIOCOUTQ, self._outq, True)
        except OSError:
            return buffered
        return buffered + int(self._outq[0])

    def check_acks(self) -> bool:
        """Release the credit of every frame the peer has acknowledged; any progress?"""
        acked = self.acks.acked
        pending = self.acks.oldest()
        drained = self.acks.acknowledged_total(self._unacknowledged())
        for session, stream, upto in drained:
            if stream is None:
                session.release(1, upto)
            else:
                session.drained(stream, upto)
        if self.acks.acked > acked and pending is not None and not drained:
            session = pending[0]
            session.flow.credit.progress(session.loop.time())  # part of a frame
        return self.acks.acked > acked

    def _watch_acks(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._poll_acks())

    async def _poll_acks(self) -> None:
        # The kernel tells nobody when the peer acknowledges: ask while marks are pending.
        delay = _ACK_POLL_S
        while self.acks.pending:
            delay = _ACK_POLL_S if self.check_acks() else min(delay * 2, _ACK_POLL_MAX_S)
            await asyncio.sleep(delay)

    # ---------------------------------------------------------------- requests
    async def run(self, reader: asyncio.StreamReader) -> None:
        conn, self._reader = self.conn, reader
        clock, loop = ReadClock(self.driver.read_timeouts), asyncio.get_running_loop()
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA and self._early:
                    conn.receive_data(self._early)
                    self._early = b""
                elif event is NEED_DATA:
                    if conn.has_data_to_send:
                        await self.send(conn.data_to_send())  # e.g. 100 Continue
                    wait = clock.deadline(conn.inbound, loop.time()) - loop.time()
                    try:
                        data = await asyncio.wait_for(reader.read(65536), max(0.0, wait))
                    except TimeoutError:
                        if clock.owed:  # a head or body trickled past its deadline: 408
                            conn.send_failed()
                            await self.send(closing_refusal(clock.refusal()))
                        break
                    conn.receive_data(data)
                elif isinstance(event, HttpRequest):
                    clock.request_done()
                    await self.respond(event)
                    if conn.should_close:
                        break
                elif isinstance(event, HttpError):
                    await self.send(conn.data_to_send())
                    break
                else:  # ConnectionClosed
                    break
        except (ConnectionError, TimeoutError):
            pass
        except Exception:
            log.exception("connection handler failed")
        finally:
            # Frames written here and not acknowledged keep their credit: a
            # resumption on another connection sends them again.
            for session, stream, nbytes in self.acks.take_pending():
                if stream is None:
                    session.release(1, nbytes)  # a JSON body cannot be replayed: owed nothing
            if self._watcher is not None:
                self._watcher.cancel()
            if self.writer.transport.get_write_buffer_size():
                self.writer.transport.abort()  # a peer that stopped reading: do not flush
            self.writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    async def respond(self, request: HttpRequest) -> None:
        try:
            mcp = route(request, self.driver.endpoint)
            if isinstance(mcp, PostMessages) and mcp.is_initialize:
                await self._initialize(mcp)
                return
            sid = mcp.ctx.session_id or ""
            session = self.driver.sessions.get(sid)
            if session is None:
                first = mcp.messages[0] if isinstance(mcp, PostMessages) else None
                raise session_refusal(sid, first.id if isinstance(first, Request) else None)
            session.last_seen = session.loop.time()
            try:
                if isinstance(mcp, PostMessages):
                    await self._post(session, mcp)
                elif isinstance(mcp, OpenStream):
                    await self._get(session, mcp)
                else:
                    self.driver.end(session)
                    await self.send(self.conn.send_response(200, ()))
            except _Gone:
                raise session_refusal(sid) from None
        except RemoteProtocolError as exc:
            if self.conn.response_in_progress:
                raise
            status, headers, body = refusal(exc)
            await self.send(self.conn.send_response(status, headers, body))

    async def _post(self, session: _Session, post: PostMessages) -> None:
        for msg in post.messages:
            if isinstance(msg, Notification) and msg.method == "notifications/initialized":
                session.state = session_transition(session.state, SessionInput.INITIALIZED)
        requests = post.requests  # client responses and other notifications are dropped
        if not requests:
            await self.send(self.conn.send_response(202, ()))
            return
        session.state = session_transition(session.state, SessionInput.REQUEST)
        execute, sid = self.driver.execute, session.sid
        await session.admit(len(requests), requests[0].id)  # 429 once half-open
        if not accepts(post.ctx.headers.get("accept"), "text/event-stream"):
            try:
                bodies = [await execute(req) for req in requests]
                body = b"[" + b",".join(bodies) + b"]" if post.is_batch else bodies[0]
                await session.take_credit(len(body))  # JSON bodies hold credit like frames
            finally:
                for _ in requests:
                    session.done()
            headers = [("content-type", "application/json"), ("mcp-session-id", sid)]
            await self.send(self.conn.send_response(200, headers, body), (session, None, len(body)))
            return
        stream = session.open_stream(StreamKind.REQUEST)
        primes = primes_streams(session.version, post.ctx.protocol_version)
        remaining = [len(requests)]

        async def run(req: Request) -> None:
            try:
                payload = (await execute(req)).decode()
                remaining[0] -= 1
                await session.append(stream, payload, final=remaining[0] == 0)
            except _Gone:
                pass
            finally:
                session.done()

        async def prime_then_run() -> None:
            # In a task, as the calls are: waiting for credit must not hold the head back.
            try:
                if primes:
                    await session.append(stream, "")  # the priming event: an id, empty data
            except _Gone:
                for _ in requests:
                    session.done()
                return
            for req in requests:
                session.spawn(run(req))

        session.spawn(prime_then_run())  # the session owns them: a hang-up is no cancel
        await self._write_stream(session, stream, 0)

    async def _get(self, session: _Session, get: OpenStream) -> None:
        cursor = get.last_event_id
        check_resume_policy(cursor, "pinned")  # this process's own logs only
        if cursor is not None:
            stream = session.streams.get(cursor)  # 409 cursor_unknown
            start = stream.cursor_after(cursor)
            old = session.stream_writers.get(stream.epoch)
            if displaces_writer(stream) and old is not None:
                old.cancel()  # the newest reader wins: the old connection is given up
                await asyncio.wait({old}, timeout=1.0)  # it detaches as it unwinds
        else:
            standalone = session.streams.standalone
            if standalone_plan(standalone):  # 409 stream_conflict if one is live
                standalone = session.open_stream(StreamKind.STANDALONE)
            assert standalone is not None
            stream, start = standalone, standalone.next_seq
        await self._write_stream(session, stream, start)

    async def _write_stream(self, session: _Session, stream: StreamLog, start: int) -> None:
        """Write ``stream`` from seq ``start``: what the log holds, then live, to its end."""
        if displaces_writer(stream):  # the displaced writer did not let go in time
            raise RemoteProtocolError(
                "this stream is already being written to another connection",
                http_status=409,
                reason=Reason.STREAM_CONFLICT,
            )
        headers = (*_SSE_HEADERS, ("mcp-session-id", session.sid))
        await self.send(self.conn.start_stream(200, headers))
        if stream.state is not StreamState.CLOSED:  # a closed one is replayed, no more
            stream.handle(StreamInput.ATTACH)
        watch = self._watch_for_hang_up()
        me = asyncio.current_task()
        if me is not None:
            session.writers.add(me)
            session.stream_writers[stream.epoch] = me
        try:
            await self._stream_frames(session, stream, start)
        except asyncio.CancelledError:
            if not self._peer_gone:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ConnectionResetError("the peer hung up mid-stream") from None
        finally:
            watch.cancel()
            session.writers.discard(me)
            if session.stream_writers.get(stream.epoch) is me:
                del session.stream_writers[stream.epoch]
            if stream.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
                stream.handle(StreamInput.DETACH)

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

    async def _stream_frames(self, session: _Session, stream: StreamLog, start: int) -> None:
        cursor = start
        while True:
            step = writer_step(stream, cursor, session_closed=session.closed, close_retry_ms=None)
            if step is WriterStep.SEND:
                frames = stream.frames_from(cursor)
                cursor += len(frames)
                await self.send(
                    self.conn.send_stream_data(b"".join(frames)), (session, stream, cursor)
                )
                continue
            if step is WriterStep.FINISH:
                stream.handle(StreamInput.DELIVERED)
                stream.trim_drained()  # what was acknowledged before it closed
                break
            if step is not WriterStep.WAIT:
                break  # aborted, a replay of a delivered stream, or the session ended
            before = stream.next_seq
            await session.wait_for_frames(stream, _SSE_KEEPALIVE_S)
            if stream.next_seq == before and not stream.finished:
                await self.send(self.conn.send_stream_data(encode_comment()))
        await self.send(self.conn.end_stream())

    async def _initialize(self, post: PostMessages) -> None:
        req, driver = post.messages[0], self.driver
        assert isinstance(req, Request)
        asked = parse_initialize(req)  # the same checks and negotiation as weir's server
        driver.check_room(req.id)
        sid = secrets.token_urlsafe(32)
        driver.add_session(_Session(sid, asked.version, driver.credit, driver))
        result = initialize_result(
            asked.version,
            {"tools": {"listChanged": False}},
            name=driver.app.name,
            server_version=driver.app.version,
            instructions=driver.app.instructions,
        )
        headers = [("content-type", "application/json"), ("mcp-session-id", sid)]
        await self.send(self.conn.send_response(200, headers, encode_result(req.id, result)))


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    app: App = demo_app,
    path: str = "/mcp",
    credit: CreditLimits | None = None,
) -> asyncio.Server:
    """Start serving ``app`` at ``http://host:port/path`` (port 0: a free one).

    ``credit`` sets each session's drain credit and timers (the core's defaults
    otherwise).
    """
    hosts = LOOPBACK_HOSTS | {host.lower()}
    endpoint = EndpointConfig(path=path, allowed_hosts=hosts, json_response=True)
    driver = AsyncioDriver(app, endpoint, credit)
    return await asyncio.start_server(driver.connection, host, port)


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.asyncio_server [--host H] [--port N]``; Ctrl-C stops it."""
    parser = argparse.ArgumentParser(prog="python -m examples.asyncio_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    async def run() -> None:
        server = await serve(args.host, args.port)
        host, port = server.sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"asyncio-weir: serving http://{shown}:{port}/mcp", flush=True)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
