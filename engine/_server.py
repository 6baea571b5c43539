"""The Trio server: listeners, one task per connection, request dispatch, SSE writers.

Theory of operation
-------------------
Each TCP connection gets one task running :meth:`Server._connection`: the small
``receive_some -> receive_data -> next_event -> respond -> send_all`` loop around a
:class:`protocol.HttpConnection`.  All MCP endpoint rules come from
:func:`protocol.route`; this module adds what needs state or I/O: sessions (held in
the :class:`~engine.SessionStore` plus the live :class:`~engine._session.Session`),
handler tasks, and SSE writers.

Handlers never run in the connection's task: they run in the server's handler
nursery, so a dropped connection does not cancel them (MCP: disconnection is not
cancellation) and their output stays replayable.  A handler's only channel to the
client is its stream's log; the connection task that holds the HTTP response is a
*writer* that copies frames from the log to the socket from a cursor:

* POST with requests -> a REQUEST stream (epoch from the store), primed for
  2025-11-25 clients, written until its final response is delivered;
* GET -> the session's STANDALONE stream (a second concurrent one is 409
  ``stream_conflict``); GET with ``Last-Event-ID`` -> whichever stream the cursor's
  epoch names, from the event after the cursor, then live;
* the writer also watches the socket for EOF, so a vanished peer detaches the
  writer at once, and a handler may end the HTTP response early
  (``Context.close_stream``) after a ``retry:`` field.

Shutdown (:meth:`Server.shutdown`): stop accepting, refuse new requests with 503
``shutting_down``, let running handlers finish within the grace period, end every
open stream with ``retry:``, then cancel what is left.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LOOPBACK_HOSTS,
    NEED_DATA,
    ConnectionClosed,
    DeleteSession,
    EndpointConfig,
    ErrorResponse,
    HttpConnection,
    HttpError,
    HttpLimits,
    HttpRequest,
    Notification,
    OpenStream,
    PostMessages,
    Reason,
    RemoteProtocolError,
    Request,
    Response,
    SessionInput,
    StreamInput,
    StreamKind,
    StreamState,
    encode_error,
    encode_result,
    encode_retry,
    negotiate_version,
    refusal,
    route,
    session_refusal,
    version_at_least,
)

from ._app import App, McpError
from ._context import Context
from ._mcp import capabilities, dispatch
from ._session import Session, StreamHandle
from ._store import MemoryStore, SessionRecord, SessionStore

log = logging.getLogger("weir")

_RECV = 65536
_SSE_HEADERS = (
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """Everything ``weir serve`` can be told.

    Attributes:
        host: address to listen on (loopback by default).
        port: TCP port; 0 picks a free one.
        path: the MCP endpoint path.
        json_response: answer requests with one JSON body instead of an SSE stream.
        allowed_hosts: accepted ``Host``/``Origin`` host names; ``None`` means the
            loopback names plus ``host`` itself.
        allowed_origins: extra exact origins to accept.
        limits: HTTP size limits.
        keepalive_timeout: idle seconds before an idle keep-alive connection is closed.
        session_idle_timeout: seconds without traffic after which a session with
            nothing running is forgotten (``None``: never).
        max_stream_events: frames each stream retains for replay.
        max_closed_streams: finished streams each session keeps for replay.
        retry_ms: the ``retry:`` hint sent when the server ends a stream early.
        shutdown_grace: seconds running handlers get to finish at shutdown.
        principal: the owner recorded for sessions (no authentication yet).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    path: str = "/mcp"
    json_response: bool = False
    allowed_hosts: frozenset[str] | None = None
    allowed_origins: frozenset[str] = frozenset()
    limits: HttpLimits = field(default_factory=HttpLimits)
    keepalive_timeout: float = 75.0
    session_idle_timeout: float | None = 3600.0
    max_stream_events: int = 4096
    max_closed_streams: int = 64
    retry_ms: int = 1000
    shutdown_grace: float = 10.0
    principal: str = "anonymous"

    def endpoint(self) -> EndpointConfig:
        """The sans-io endpoint configuration derived from this one."""
        hosts = self.allowed_hosts
        if hosts is None:
            hosts = LOOPBACK_HOSTS | (
                {self.host.lower()} if self.host not in ("0.0.0.0", "::", "") else set()
            )
        return EndpointConfig(
            path=self.path,
            allowed_hosts=frozenset(hosts),
            allowed_origins=self.allowed_origins,
            json_response=self.json_response,
        )


class _PeerGone(Exception):
    pass


class Server:
    """An MCP server for one :class:`~engine.App` (see the module docstring).

    Args:
        app: the application.
        config: server configuration.
        store: the session store (default: a new :class:`~engine.MemoryStore`).
        session_id_factory: makes session ids (default: 32 random bytes, base64url).
    """

    def __init__(
        self,
        app: App,
        config: ServerConfig | None = None,
        *,
        store: SessionStore | None = None,
        session_id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.app = app
        self.config = config or ServerConfig()
        self.store: SessionStore = store if store is not None else MemoryStore()
        self._endpoint = self.config.endpoint()
        self._new_session_id = session_id_factory or (lambda: secrets.token_urlsafe(32))
        self.sessions: dict[str, Session] = {}
        self._last_seen: dict[str, float] = {}
        self._closing = False
        self._shutdown = trio.Event()
        #: Set once :meth:`run` has finished (after a shutdown or cancellation).
        self.stopped = trio.Event()
        self._handlers: trio.Nursery | None = None
        self.listeners: list[trio.SocketListener] = []

    # ---------------------------------------------------------------- lifecycle
    @property
    def port(self) -> int:
        """The bound port (after :meth:`run` has started)."""
        return int(self.listeners[0].socket.getsockname()[1])

    @property
    def url(self) -> str:
        """``http://host:port/path`` of the endpoint (after start)."""
        host = self.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}{self.config.path}"

    async def run(
        self, *, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED, listen: bool = True
    ) -> None:
        """Listen and serve until :meth:`shutdown`; usable with ``nursery.start``.

        With ``listen=False`` no socket is opened: connections are handed in with
        :meth:`serve_connection` (in-memory tests, or another accept loop).
        """
        if listen:
            self.listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        try:
            await self._run(task_status)
        finally:
            self.stopped.set()

    async def _run(self, task_status: trio.TaskStatus[Server]) -> None:
        async with trio.open_nursery() as handlers:
            self._handlers = handlers
            async with trio.open_nursery() as conns:
                conns.start_soon(self._serve_listeners, conns)
                if self.config.session_idle_timeout is not None:
                    conns.start_soon(self._sweep_sessions, self.config.session_idle_timeout)
                task_status.started(self)
                await self._shutdown.wait()
                await self._drain(handlers)
                conns.cancel_scope.cancel()
            handlers.cancel_scope.cancel()
        await self.store.aclose()

    async def _serve_listeners(self, conns: trio.Nursery) -> None:
        if self.listeners:
            await trio.serve_listeners(self._connection, self.listeners, handler_nursery=conns)

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one already-accepted connection until it closes (needs :meth:`run` started)."""
        if self._handlers is None:
            raise RuntimeError("Server.run() must be started before serve_connection()")
        await self._connection(stream)

    @property
    def shutting_down(self) -> bool:
        """True once :meth:`shutdown` was called."""
        return self._shutdown.is_set()

    def shutdown(self) -> None:
        """Begin a graceful shutdown (idempotent; returns at once)."""
        self._shutdown.set()

    async def _drain(self, handlers: trio.Nursery) -> None:
        self._closing = True
        for listener in self.listeners:
            await listener.aclose()
        with trio.move_on_after(self.config.shutdown_grace):
            while any(s.running for s in self.sessions.values()):
                await trio.sleep(0.05)
        for session in self.sessions.values():
            for h in session.handles.values():
                h.request_close(self.config.retry_ms)
        with trio.move_on_after(1.0):  # let writers send their retry: and end
            while any(
                h.writer_scope is not None
                for s in self.sessions.values()
                for h in s.handles.values()
            ):
                await trio.sleep(0.01)

    async def _sweep_sessions(self, idle: float) -> None:
        while True:
            await trio.sleep(max(1.0, min(idle / 4, 60.0)))
            now = trio.current_time()
            for sid, session in list(self.sessions.items()):
                busy = session.running or any(
                    h.writer_scope is not None for h in session.handles.values()
                )
                if busy:
                    self._last_seen[sid] = now
                elif now - self._last_seen.get(sid, now) >= idle:
                    log.info("session %s idle for %.0f s: forgotten", sid, idle)
                    await self._end_session(session)

    async def _end_session(self, session: Session) -> None:
        session.close()
        self.sessions.pop(session.session_id, None)
        self._last_seen.pop(session.session_id, None)
        await self.store.delete_session(session.record.principal, session.session_id)

    # ---------------------------------------------------------------- connections
    async def _connection(self, sock: trio.abc.Stream) -> None:
        conn = HttpConnection(self.config.limits)
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    with trio.move_on_after(self.config.keepalive_timeout) as idle:
                        data = await sock.receive_some(_RECV)
                    if idle.cancelled_caught:
                        break
                    conn.receive_data(data)
                elif isinstance(event, HttpRequest):
                    await self._respond(sock, conn, event)
                    if conn.should_close:
                        break
                elif isinstance(event, HttpError):
                    await sock.send_all(conn.data_to_send())
                    break
                elif isinstance(event, ConnectionClosed):
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, _PeerGone):
            pass
        except Exception:
            # One broken connection must never take the server down.
            log.exception("connection handler failed")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await sock.aclose()

    async def _send(self, sock: trio.abc.Stream, conn: HttpConnection, data: bytes) -> None:
        try:
            await sock.send_all(data)
        except BaseException:
            conn.send_failed()
            raise

    async def _refuse(
        self, sock: trio.abc.Stream, conn: HttpConnection, exc: RemoteProtocolError
    ) -> None:
        status, headers, body = refusal(exc)
        await self._send(sock, conn, conn.send_response(status, headers, body))

    async def _respond(
        self, sock: trio.abc.Stream, conn: HttpConnection, request: HttpRequest
    ) -> None:
        try:
            if self._closing:
                raise RemoteProtocolError(
                    "server is shutting down",
                    http_status=503,
                    reason=Reason.SHUTTING_DOWN,
                    retry_after_ms=self.config.retry_ms,
                )
            mcp = route(request, self._endpoint)
            if isinstance(mcp, PostMessages):
                await self._post(sock, conn, mcp)
            elif isinstance(mcp, OpenStream):
                await self._get(sock, conn, mcp)
            elif isinstance(mcp, DeleteSession):
                await self._delete(sock, conn, mcp)
        except RemoteProtocolError as exc:
            if conn.response_in_progress:
                raise
            await self._refuse(sock, conn, exc)

    def _session(self, session_id: str | None, request_id: Any = None) -> Session:
        session = self.sessions.get(session_id) if session_id is not None else None
        if session is None or session.closed:
            raise session_refusal(session_id or "", request_id)
        self._last_seen[session.session_id] = trio.current_time()
        return session

    # ---------------------------------------------------------------- POST
    async def _post(
        self, sock: trio.abc.Stream, conn: HttpConnection, post: PostMessages
    ) -> None:
        if post.is_initialize:
            await self._initialize(sock, conn, post)
            return
        first = post.messages[0]
        session = self._session(
            post.ctx.session_id, first.id if isinstance(first, Request) else None
        )
        requests: list[Request] = []
        for msg in post.messages:
            if isinstance(msg, Request):
                requests.append(msg)
            elif isinstance(msg, Notification):
                self._notification(session, msg)
            else:
                pending = session.pending.get(msg.id) if msg.id is not None else None
                if pending is not None and isinstance(msg, Response | ErrorResponse):
                    pending.answer = msg
                    pending.done.set()
        if not requests:
            await self._send(sock, conn, conn.send_response(202, ()))
            return
        session.handle(SessionInput.REQUEST)
        headers = (*_SSE_HEADERS, ("mcp-session-id", session.session_id))
        if self.config.json_response:
            await self._post_json(sock, conn, session, requests, post.is_batch)
            return
        epoch = await self.store.allocate_epoch(session.record.principal, session.session_id)
        handle = session.open_stream(
            epoch, StreamKind.REQUEST, max_events=self.config.max_stream_events
        )
        handle.outstanding = len(requests)
        if self._primes(session, post.ctx.protocol_version):
            handle.log.prime()
        assert self._handlers is not None
        for req in requests:
            self._handlers.start_soon(self._run_request, session, req, handle)
        await self._write_stream(sock, conn, session, handle, 0, headers)

    async def _post_json(
        self,
        sock: trio.abc.Stream,
        conn: HttpConnection,
        session: Session,
        requests: list[Request],
        is_batch: bool,
    ) -> None:
        results: list[bytes | None] = [None] * len(requests)
        done = trio.Event()

        async def one(i: int, req: Request) -> None:
            results[i] = await self._execute(session, req, None)

        async def run_all() -> None:
            try:
                async with trio.open_nursery() as n:
                    for i, req in enumerate(requests):
                        n.start_soon(one, i, req)
            finally:
                done.set()

        # Handlers run in the server's nursery: a dropped connection is not a cancel.
        assert self._handlers is not None
        self._handlers.start_soon(run_all)
        await done.wait()
        bodies = [r for r in results if r is not None]
        if not bodies:
            await self._send(sock, conn, conn.send_response(202, ()))
            return
        body = b"[" + b",".join(bodies) + b"]" if is_batch else bodies[0]
        headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
        await self._send(sock, conn, conn.send_response(200, headers, body))

    async def _initialize(
        self, sock: trio.abc.Stream, conn: HttpConnection, post: PostMessages
    ) -> None:
        req = post.messages[0]
        assert isinstance(req, Request)
        params = req.params or {}
        caps = params.get("capabilities", {})
        info = params.get("clientInfo", {})
        if (
            not isinstance(params.get("protocolVersion"), str)
            or not isinstance(caps, dict)
            or not isinstance(info, dict)
        ):
            raise RemoteProtocolError(
                "initialize needs params.protocolVersion (a string), "
                "and capabilities and clientInfo (objects)",
                reason=Reason.INVALID_REQUEST,
                code=INVALID_PARAMS,
                request_id=req.id,
            )
        version = negotiate_version(params["protocolVersion"])
        record = SessionRecord(
            session_id=self._new_session_id(),
            principal=self.config.principal,
            protocol_version=version,
            created_at=trio.current_time(),
        )
        await self.store.create_session(record)
        session = Session(record, max_closed_streams=self.config.max_closed_streams)
        session.client_capabilities = caps
        session.client_info = info
        self.sessions[record.session_id] = session
        self._last_seen[record.session_id] = trio.current_time()
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": capabilities(self.app),
            "serverInfo": {"name": self.app.name, "version": self.app.version},
        }
        if self.app.instructions:
            result["instructions"] = self.app.instructions
        headers = [("content-type", "application/json"), ("mcp-session-id", record.session_id)]
        await self._send(
            sock, conn, conn.send_response(200, headers, encode_result(req.id, result))
        )

    @staticmethod
    def _primes(session: Session, header_version: str) -> bool:
        # Priming events (empty data) are a 2025-11-25 feature; older clients may
        # choke on them.  The negotiated revision says what the client understands,
        # whatever revision a single request's header names.
        return version_at_least(session.record.protocol_version, "2025-11-25") or version_at_least(
            header_version, "2025-11-25"
        )

    def _notification(self, session: Session, msg: Notification) -> None:
        if msg.method == "notifications/initialized":
            session.handle(SessionInput.INITIALIZED)
        elif msg.method == "notifications/cancelled":
            rid = (msg.params or {}).get("requestId")
            scope = session.running.get(rid) if isinstance(rid, int | str) else None
            if scope is not None:
                scope.cancel()

    async def _execute(
        self, session: Session, req: Request, handle: StreamHandle | None
    ) -> bytes | None:
        """Run one request's handler; the encoded response, or ``None`` if cancelled."""
        if req.id in session.running:
            return encode_error(
                req.id,
                INVALID_REQUEST,
                f"request id {req.id!r} is already in use",
                {"reason": str(Reason.INVALID_REQUEST)},
            )
        params = req.params or {}
        meta = params.get("_meta")
        ctx = Context(session, req.id, handle, meta if isinstance(meta, dict) else None)
        payload: bytes | None = None
        with trio.CancelScope() as scope:
            session.running[req.id] = scope
            try:
                payload = encode_result(req.id, await dispatch(self.app, session, req, ctx))
            except McpError as exc:
                payload = encode_error(req.id, exc.code, exc.message, exc.data)
            except Exception:
                log.exception("handler for %s failed", req.method)
                payload = encode_error(req.id, INTERNAL_ERROR, f"internal error in {req.method}")
            finally:
                session.running.pop(req.id, None)
        return None if scope.cancelled_caught else payload

    async def _run_request(self, session: Session, req: Request, handle: StreamHandle) -> None:
        payload = await self._execute(session, req, handle)
        handle.outstanding -= 1
        final = handle.outstanding == 0
        if payload is not None:
            handle.append(payload.decode(), final=final)
        elif final and handle.log.state is not StreamState.CLOSED:
            handle.handle(StreamInput.ABORT)  # cancelled: end the stream with no response

    # ---------------------------------------------------------------- GET / DELETE
    async def _get(self, sock: trio.abc.Stream, conn: HttpConnection, get: OpenStream) -> None:
        session = self._session(get.ctx.session_id)
        cursor = get.last_event_id
        if cursor is None:
            handle = session.standalone
            if handle is None:
                epoch = await self.store.allocate_epoch(
                    session.record.principal, session.session_id
                )
                handle = session.open_stream(
                    epoch, StreamKind.STANDALONE, max_events=self.config.max_stream_events
                )
            elif handle.log.state is StreamState.LIVE_ATTACHED:
                raise RemoteProtocolError(
                    "this session already has an open GET stream",
                    http_status=409,
                    reason=Reason.STREAM_CONFLICT,
                )
            next_seq = handle.log.next_seq
            if self._primes(session, get.ctx.protocol_version):
                handle.log.prime()
        else:
            log_ = session.streams.get(cursor)
            handle = session.handle_for(log_)
            next_seq = log_.cursor_after(cursor)
            handle.close_retry_ms = None  # a close asked of an earlier connection is done with
            if handle.writer_scope is not None:
                # The old connection is presumed dead: the newest reader wins.
                handle.writer_scope.cancel()
                handle.writer_scope = None
                if handle.log.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
                    handle.handle(StreamInput.DETACH)
        headers = (*_SSE_HEADERS, ("mcp-session-id", session.session_id))
        await self._write_stream(sock, conn, session, handle, next_seq, headers)

    async def _delete(
        self, sock: trio.abc.Stream, conn: HttpConnection, delete: DeleteSession
    ) -> None:
        session = self._session(delete.ctx.session_id)
        session.handle(SessionInput.DELETE)
        await self._end_session(session)
        await self._send(sock, conn, conn.send_response(200, ()))

    # ---------------------------------------------------------------- the writer
    async def _write_stream(
        self,
        sock: trio.abc.Stream,
        conn: HttpConnection,
        session: Session,
        handle: StreamHandle,
        next_seq: int,
        headers: tuple[tuple[str, str], ...],
    ) -> None:
        """Copy frames from ``handle``'s log to the socket from ``next_seq`` on (see module doc)."""
        log_ = handle.log
        await self._send(sock, conn, conn.start_stream(200, headers))
        if log_.state in (StreamState.LIVE_DETACHED, StreamState.FINAL_DETACHED):
            handle.handle(StreamInput.ATTACH)
        scope = trio.CancelScope()
        handle.writer_scope = scope
        peer_gone = False

        async def watch_peer() -> None:
            nonlocal peer_gone
            try:
                data = await sock.receive_some(_RECV)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if data:
                conn.receive_data(data)  # a pipelined request: served after this response
                return
            peer_gone = True
            scope.cancel()

        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_peer)
                try:
                    await self._copy_frames(sock, conn, session, handle, next_seq)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    peer_gone = True
                nursery.cancel_scope.cancel()
        if handle.writer_scope is scope:
            handle.writer_scope = None
            if log_.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
                handle.handle(StreamInput.DETACH)
        if peer_gone or scope.cancelled_caught or conn.should_close:
            conn.send_failed()
            raise _PeerGone
        await self._send(sock, conn, conn.end_stream())

    async def _copy_frames(
        self,
        sock: trio.abc.Stream,
        conn: HttpConnection,
        session: Session,
        handle: StreamHandle,
        next_seq: int,
    ) -> None:
        log_ = handle.log
        while True:
            try:
                frames = log_.frames_from(next_seq)
            except RemoteProtocolError:
                log.warning("writer fell behind stream %s's retention; ending it", log_.epoch)
                return
            if frames:
                await self._send(sock, conn, conn.send_stream_data(b"".join(frames)))
                next_seq += len(frames)
                continue
            state = log_.state
            if state is StreamState.FINAL_ATTACHED:
                handle.handle(StreamInput.DELIVERED)
                return
            if state is StreamState.CLOSED or session.closed:
                return
            if handle.close_retry_ms is not None:
                retry = handle.close_retry_ms
                handle.close_retry_ms = None
                await self._send(sock, conn, conn.send_stream_data(encode_retry(retry)))
                return
            await handle.wait_changed()


async def serve(
    app: App,
    config: ServerConfig | None = None,
    *,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
    **kwargs: Any,
) -> None:
    """Serve ``app`` until cancelled or shut down.

    ``server = await nursery.start(serve, app, config)`` returns the running
    :class:`Server` once it listens.
    """
    server = Server(app, config, **kwargs)
    await server.run(task_status=task_status)


__all__ = ["Server", "ServerConfig", "serve"]
