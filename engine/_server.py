"""The Trio server: listeners, one task per connection, admission, handlers, SSE writers.

Theory of operation
-------------------
Each TCP connection gets one task running :meth:`Server._connection`: the small
``receive_some -> receive_data -> next_event -> respond -> send`` loop around an
:class:`~engine._connection.Connection` (the :class:`protocol.HttpConnection` plus
byte-exact send accounting).  All MCP endpoint rules come from
:func:`protocol.route`; this module adds what needs state or I/O: sessions (the
:class:`~engine.SessionStore` plus the live :class:`~engine._session.Session`),
admission, handler tasks and SSE writers.

**Admission** happens here, before any handler is dispatched: a POST carrying
requests for a session whose credit is half-open is refused with 429
``stream_half_open`` and ``Retry-After``; nothing is enqueued, nothing runs.
``initialize`` and other sessions are never refused on its account.

**Execution.**  Handlers run in the server's handler nursery, never in the
connection's task, so a dropped connection does not cancel them (MCP:
disconnection is not cancellation) and their output stays replayable.  Before a
``tools/call`` runs, the session's idempotency gate records its key
(``Idempotency-Key`` or the JSON-RPC id): a second delivery while it runs waits a
bounded time and then gets 409 ``in_progress``; after it finished, the stored
response is replayed and nothing executes again.

**Writers.**  A handler's only channel to the client is its stream's log; the
connection task holding the HTTP response is a *writer* copying frames from the
log to the socket from a cursor:

* POST with requests -> a REQUEST stream (epoch from the store), primed for
  2025-11-25 sessions, written until its final response is delivered;
* GET -> the session's STANDALONE stream (a second concurrent one is 409
  ``stream_conflict``); GET with ``Last-Event-ID`` -> whichever stream the cursor's
  epoch names, from the event after the cursor, then live;
* the legacy 2024-11-05 transport: ``GET /sse`` opens a session whose one LEGACY
  stream carries every response; ``POST /messages?session_id=`` answers 202.

A writer also watches the socket for EOF, so a vanished peer detaches it at once.

**Teardown.**  Each session has a timer task driven by its credit's deadline; when
the credit reports DEAD (frames pending, no progress for the liveness timeout) the
session's streams are closed, its handlers cancelled, its credit released and the
session forgotten -- later requests get 404.

**Shutdown** (:meth:`Server.shutdown`): stop accepting, refuse new requests with
503 ``shutting_down``, let running handlers finish within the grace period, end
every open stream with ``retry:``, then cancel what is left.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LOOPBACK_HOSTS,
    NEED_DATA,
    ConnectionClosed,
    CreditLimits,
    CreditState,
    DeleteSession,
    EndpointConfig,
    ErrorResponse,
    HttpError,
    HttpLimits,
    HttpRequest,
    Notification,
    OpenStream,
    PostMessages,
    Reason,
    RemoteProtocolError,
    Request,
    RequestId,
    Response,
    SessionInput,
    StreamInput,
    StreamKind,
    StreamState,
    accepts,
    check_host_and_origin,
    decode_body,
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
from ._connection import Connection
from ._context import Context
from ._mcp import capabilities, dispatch
from ._metrics import Metrics
from ._session import Execution, Session, SessionClosed, StreamHandle
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
        credit: per-session drain credit and its timers.
        notsent_lowat: ``TCP_NOTSENT_LOWAT`` for accepted sockets (``None``: leave as is).
        keepalive_timeout: idle seconds before an idle keep-alive connection is closed.
        session_idle_timeout: seconds without traffic after which a session with
            nothing running is forgotten (``None``: never).
        max_stream_events: frames each stream retains for replay (at least the
            frame credit, so no unacknowledged frame is ever dropped).
        max_closed_streams: finished streams each session keeps for replay.
        max_executions: finished ``tools/call`` results each session keeps for
            the idempotency gate.
        in_progress_wait: seconds a duplicate of a running call waits before 409.
        retry_ms: the ``retry:`` hint sent when the server ends a stream early.
        shutdown_grace: seconds running handlers get to finish at shutdown.
        principal: the owner recorded for sessions (no authentication yet).
        legacy_sse_path: the 2024-11-05 HTTP+SSE stream endpoint (``None``: off).
        legacy_messages_path: the 2024-11-05 POST endpoint.
        metrics_path: Prometheus metrics (``None``: off).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    path: str = "/mcp"
    json_response: bool = False
    allowed_hosts: frozenset[str] | None = None
    allowed_origins: frozenset[str] = frozenset()
    limits: HttpLimits = field(default_factory=HttpLimits)
    credit: CreditLimits = field(default_factory=CreditLimits)
    notsent_lowat: int | None = 16384
    keepalive_timeout: float = 75.0
    session_idle_timeout: float | None = 3600.0
    max_stream_events: int = 4096
    max_closed_streams: int = 64
    max_executions: int = 1024
    in_progress_wait: float = 5.0
    retry_ms: int = 1000
    shutdown_grace: float = 10.0
    principal: str = "anonymous"
    legacy_sse_path: str | None = "/sse"
    legacy_messages_path: str = "/messages"
    metrics_path: str | None = "/metrics"

    def __post_init__(self) -> None:
        if self.max_stream_events < self.credit.frames:
            raise ValueError(
                f"max_stream_events ({self.max_stream_events}) must be >= the frame credit "
                f"({self.credit.frames}): a stream must retain every unacknowledged frame"
            )

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


def _fingerprint(req: Request) -> bytes:
    return hashlib.sha256(msgspec.json.encode([req.method, req.params])).digest()


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
        self.metrics = Metrics()
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
        self,
        *,
        task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
        listen: bool = True,
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
                await self._drain()
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

    async def _drain(self) -> None:
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

    async def _new_session(self, version: str) -> Session:
        now = trio.current_time()
        record = SessionRecord(
            session_id=self._new_session_id(),
            principal=self.config.principal,
            protocol_version=version,
            created_at=now,
        )
        await self.store.create_session(record)
        session = Session(
            record,
            max_closed_streams=self.config.max_closed_streams,
            credit=self.config.credit,
            now=now,
        )
        self.sessions[record.session_id] = session
        self._last_seen[record.session_id] = now
        assert self._handlers is not None
        self._handlers.start_soon(self._session_timer, session)
        return session

    async def _session_timer(self, session: Session) -> None:
        """Drive the session's credit timers; tear the session down when it is DEAD."""
        credit = session.credit
        while not session.closed:
            changed = session.credit_changed
            with trio.move_on_at(credit.deadline()):
                await changed.wait()
            state = credit.handle_timer(trio.current_time())
            if state is CreditState.DEAD and not session.closed:
                log.warning(
                    "session %s: no progress for %.1f s with %d frames pending: torn down",
                    session.session_id,
                    credit.limits.liveness_timeout,
                    credit.frames_in_use,
                )
                self.metrics.teardowns += 1
                await self._end_session(session)

    # ---------------------------------------------------------------- connections
    async def _connection(self, stream: trio.abc.Stream) -> None:
        conn = Connection(stream, self.config.limits, notsent_lowat=self.config.notsent_lowat)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.poll_acks)
                await self._connection_loop(conn)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, _PeerGone):
            pass
        except Exception as exc:
            # One broken connection must never take the server down.
            if not _only_disconnects(exc):
                log.exception("connection handler failed")
        finally:
            # Last look before the socket goes: what the peer acknowledged counts.
            conn.check_acks()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def _connection_loop(self, conn: Connection) -> None:
        http = conn.http
        while True:
            event = http.next_event()
            if event is NEED_DATA:
                with trio.move_on_after(self.config.keepalive_timeout) as idle:
                    data = await conn.stream.receive_some(_RECV)
                if idle.cancelled_caught:
                    return
                http.receive_data(data)
            elif isinstance(event, HttpRequest):
                await self._respond(conn, event)
                if http.should_close:
                    return
            elif isinstance(event, HttpError):
                await conn.send(http.data_to_send())
                return
            elif isinstance(event, ConnectionClosed):
                return

    async def _refuse(self, conn: Connection, exc: RemoteProtocolError) -> None:
        self.metrics.refused(str(exc.reason))
        status, headers, body = refusal(exc)
        await conn.send(conn.http.send_response(status, headers, body))

    async def _respond(self, conn: Connection, request: HttpRequest) -> None:
        try:
            if self._closing:
                raise RemoteProtocolError(
                    "server is shutting down",
                    http_status=503,
                    reason=Reason.SHUTTING_DOWN,
                    retry_after_ms=self.config.retry_ms,
                )
            path = request.path
            cfg = self.config
            if path != cfg.path and path in (
                cfg.metrics_path,
                cfg.legacy_sse_path,
                cfg.legacy_messages_path,
            ):
                await self._auxiliary(conn, request)
                return
            mcp = route(request, self._endpoint)
            if isinstance(mcp, PostMessages):
                await self._post(conn, mcp)
            elif isinstance(mcp, OpenStream):
                await self._get(conn, mcp)
            elif isinstance(mcp, DeleteSession):
                await self._delete(conn, mcp)
        except RemoteProtocolError as exc:
            if conn.http.response_in_progress:
                raise
            await self._refuse(conn, exc)

    def _session(self, session_id: str | None, request_id: RequestId | None = None) -> Session:
        session = self.sessions.get(session_id) if session_id is not None else None
        if session is None or session.closed:
            raise session_refusal(session_id or "", request_id)
        self._last_seen[session.session_id] = trio.current_time()
        return session

    # ---------------------------------------------------------------- POST
    async def _post(self, conn: Connection, post: PostMessages) -> None:
        if post.is_initialize:
            await self._initialize(conn, post)
            return
        first = post.messages[0]
        session = self._session(
            post.ctx.session_id, first.id if isinstance(first, Request) else None
        )
        requests = self._absorb(session, post.messages)
        if not requests:
            await conn.send(conn.http.send_response(202, ()))
            return
        # Admission, before anything is dispatched or enqueued (seed 000).
        session.credit.admit(trio.current_time(), requests[0].id)
        self.metrics.admissions += len(requests)
        session.handle(SessionInput.REQUEST)
        key = post.ctx.headers.get("idempotency-key")
        plans = [
            await self._plan(session, req, key if len(requests) == 1 else None) for req in requests
        ]
        if self.config.json_response:
            await self._post_json(conn, session, plans, post.is_batch)
            return
        epoch = await self.store.allocate_epoch(session.record.principal, session.session_id)
        handle = session.open_stream(
            epoch, StreamKind.REQUEST, max_events=self.config.max_stream_events
        )
        handle.outstanding = len(plans)
        assert self._handlers is not None
        if self._primes(session, post.ctx.protocol_version):
            self._handlers.start_soon(self._prime_then_run, session, handle, plans)
        else:
            for plan in plans:
                self._handlers.start_soon(self._run_request, session, plan, handle)
        headers = (*_SSE_HEADERS, ("mcp-session-id", session.session_id))
        await self._write_stream(conn, session, handle, 0, headers)

    def _absorb(self, session: Session, messages: list[Any]) -> list[Request]:
        """Handle notifications and responses at once; return the requests."""
        requests: list[Request] = []
        for msg in messages:
            if isinstance(msg, Request):
                requests.append(msg)
            elif isinstance(msg, Notification):
                self._notification(session, msg)
            elif isinstance(msg, Response | ErrorResponse) and msg.id is not None:
                pending = session.pending.get(msg.id)
                if pending is not None:
                    pending.answer = msg
                    pending.done.set()
        return requests

    async def _plan(self, session: Session, req: Request, header_key: str | None) -> _Plan:
        """Pass the idempotency gate: decide whether ``req`` executes or replays.

        Raises:
            RemoteProtocolError: 409 ``in_progress`` (still running after the bounded
                wait) or 422 ``idempotency_key_reused`` (same key, different request).
        """
        if req.method != "tools/call":
            return _Plan(req, None, None)
        key = ("header", header_key) if header_key else ("id", req.id)
        fp = _fingerprint(req)
        found = session.executions.get(key)
        if found is None:
            execution = session.record_execution(key, fp, self.config.max_executions)
            return _Plan(req, execution, None)
        if found.fingerprint != fp:
            raise RemoteProtocolError(
                f"idempotency key {key[1]!r} was used for a different request",
                http_status=422,
                reason=Reason.IDEMPOTENCY_KEY_REUSED,
                request_id=req.id,
            )
        with trio.move_on_after(self.config.in_progress_wait):
            await found.done.wait()
        if found.payload is None:
            self.metrics.duplicates_in_progress += 1
            raise RemoteProtocolError(
                f"request {key[1]!r} is still running",
                http_status=409,
                reason=Reason.IN_PROGRESS,
                request_id=req.id,
                retry_after_ms=self.config.retry_ms,
            )
        self.metrics.duplicates_replayed += 1
        payload = found.payload if req.id == found.request_id else _reid(found.payload, req.id)
        return _Plan(req, None, payload)

    async def _post_json(
        self, conn: Connection, session: Session, plans: list[_Plan], is_batch: bool
    ) -> None:
        results: list[bytes | None] = [None] * len(plans)
        done = trio.Event()

        async def one(i: int, plan: _Plan) -> None:
            results[i] = await self._execute(session, plan, None)

        async def run_all() -> None:
            try:
                async with trio.open_nursery() as n:
                    for i, plan in enumerate(plans):
                        n.start_soon(one, i, plan)
            finally:
                done.set()

        # Handlers run in the server's nursery: a dropped connection is not a cancel.
        assert self._handlers is not None
        self._handlers.start_soon(run_all)
        await done.wait()
        bodies = [r for r in results if r is not None]
        if not bodies:
            await conn.send(conn.http.send_response(202, ()))
            return
        body = b"[" + b",".join(bodies) + b"]" if is_batch else bodies[0]
        headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
        await conn.send(conn.http.send_response(200, headers, body))

    async def _initialize(self, conn: Connection, post: PostMessages) -> None:
        req = post.messages[0]
        assert isinstance(req, Request)
        session = await self._initialize_session(req, None)
        result = self._initialize_result(session)
        headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
        await conn.send(conn.http.send_response(200, headers, encode_result(req.id, result)))

    async def _initialize_session(self, req: Request, session: Session | None) -> Session:
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
        if session is None:
            session = await self._new_session(version)
        session.client_capabilities = caps
        session.client_info = info
        return session

    def _initialize_result(self, session: Session) -> dict[str, Any]:
        result: dict[str, Any] = {
            "protocolVersion": session.record.protocol_version,
            "capabilities": capabilities(self.app),
            "serverInfo": {"name": self.app.name, "version": self.app.version},
        }
        if self.app.instructions:
            result["instructions"] = self.app.instructions
        return result

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
        self, session: Session, plan: _Plan, handle: StreamHandle | None
    ) -> bytes | None:
        """Run one request's handler; the encoded response, or ``None`` if cancelled."""
        req = plan.request
        if plan.replay is not None:
            return plan.replay
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
                if plan.execution is not None:
                    self.metrics.executions += 1
                payload = encode_result(req.id, await dispatch(self.app, session, req, ctx))
            except McpError as exc:
                payload = encode_error(req.id, exc.code, exc.message, exc.data)
            except SessionClosed:
                payload = None
            except Exception:
                log.exception("handler for %s failed", req.method)
                payload = encode_error(req.id, INTERNAL_ERROR, f"internal error in {req.method}")
            finally:
                session.running.pop(req.id, None)
        if plan.execution is not None:
            session.finish_execution(
                plan.execution, None if scope.cancelled_caught else payload, req.id
            )
        return None if scope.cancelled_caught else payload

    async def _prime_then_run(
        self, session: Session, handle: StreamHandle, plans: list[_Plan]
    ) -> None:
        try:
            await handle.send("")  # the priming event: an id and empty data
        except SessionClosed:
            return
        assert self._handlers is not None
        for plan in plans:
            self._handlers.start_soon(self._run_request, session, plan, handle)

    async def _run_request(self, session: Session, plan: _Plan, handle: StreamHandle) -> None:
        payload = await self._execute(session, plan, handle)
        handle.outstanding -= 1
        final = handle.outstanding == 0 and handle.log.kind is not StreamKind.LEGACY
        try:
            if payload is not None:
                await handle.send(payload.decode(), final=final)
            elif final and handle.log.state is not StreamState.CLOSED:
                handle.handle(StreamInput.ABORT)  # cancelled: end the stream with no response
        except SessionClosed:
            pass

    # ---------------------------------------------------------------- GET / DELETE
    async def _get(self, conn: Connection, get: OpenStream) -> None:
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
                self._handlers_start(handle.send, "")
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
        await self._write_stream(conn, session, handle, next_seq, headers)

    def _handlers_start(self, fn: Callable[..., Any], *args: Any) -> None:
        async def guarded() -> None:
            with contextlib.suppress(SessionClosed):
                await fn(*args)

        assert self._handlers is not None
        self._handlers.start_soon(guarded)

    async def _delete(self, conn: Connection, delete: DeleteSession) -> None:
        session = self._session(delete.ctx.session_id)
        session.handle(SessionInput.DELETE)
        await self._end_session(session)
        await conn.send(conn.http.send_response(200, ()))

    # ---------------------------------------------------------------- metrics & legacy
    async def _auxiliary(self, conn: Connection, request: HttpRequest) -> None:
        """``/metrics`` and the 2024-11-05 HTTP+SSE endpoints (same Host/Origin rules)."""
        check_host_and_origin(request.headers, self._endpoint)
        cfg = self.config
        path, method = request.path, request.method
        allowed = "GET" if path in (cfg.metrics_path, cfg.legacy_sse_path) else "POST"
        if method != allowed:
            raise RemoteProtocolError(
                f"method {method} not allowed",
                http_status=405,
                reason=Reason.METHOD_NOT_ALLOWED,
                headers=(("allow", allowed),),
            )
        if path == cfg.metrics_path:
            body = self.metrics.render(self.sessions).encode()
            headers = [("content-type", "text/plain; version=0.0.4; charset=utf-8")]
            await conn.send(conn.http.send_response(200, headers, body))
        elif path == cfg.legacy_sse_path:
            await self._legacy_stream(conn, request)
        else:
            await self._legacy_post(conn, request)

    async def _legacy_stream(self, conn: Connection, request: HttpRequest) -> None:
        if not accepts(request.headers.get("accept"), "text/event-stream"):
            raise RemoteProtocolError(
                "GET must accept text/event-stream", http_status=406, reason=Reason.NOT_ACCEPTABLE
            )
        session = await self._new_session("2024-11-05")
        epoch = await self.store.allocate_epoch(session.record.principal, session.session_id)
        handle = session.open_stream(
            epoch, StreamKind.LEGACY, max_events=self.config.max_stream_events
        )
        handle.log.emit_ids = False  # 2024-11-05 has no resumption
        endpoint = f"{self.config.legacy_messages_path}?session_id={session.session_id}"
        await handle.send(endpoint, event="endpoint")
        try:
            await self._write_stream(conn, session, handle, 0, _SSE_HEADERS)
        finally:
            # The legacy session lives exactly as long as its stream.
            if not session.closed:
                with trio.CancelScope(shield=True):
                    await self._end_session(session)

    async def _legacy_post(self, conn: Connection, request: HttpRequest) -> None:
        headers = request.headers
        ctype = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            raise RemoteProtocolError(
                "Content-Type must be application/json",
                http_status=415,
                reason=Reason.UNSUPPORTED_MEDIA_TYPE,
            )
        sid = parse_qs(request.query).get("session_id", [None])[0]
        if sid is None:
            raise RemoteProtocolError(
                "session_id query parameter is required", reason=Reason.SESSION_REQUIRED
            )
        messages, _ = decode_body(request.body, allow_batch=True)
        session = self._session(sid)
        legacy = next(
            (h for h in session.handles.values() if h.log.kind is StreamKind.LEGACY), None
        )
        if legacy is None:
            raise session_refusal(sid)
        requests = self._absorb(session, messages)
        if requests:
            session.credit.admit(trio.current_time(), requests[0].id)
            self.metrics.admissions += len(requests)
            key = headers.get("idempotency-key")
            plans = [
                await self._plan(session, r, key if len(requests) == 1 else None) for r in requests
            ]
            assert self._handlers is not None
            for plan in plans:
                if plan.request.method == "initialize":
                    self._handlers.start_soon(
                        self._legacy_initialize, session, plan.request, legacy
                    )
                else:
                    legacy.outstanding += 1
                    self._handlers.start_soon(self._run_request, session, plan, legacy)
        await conn.send(conn.http.send_response(202, ()))

    async def _legacy_initialize(
        self, session: Session, req: Request, handle: StreamHandle
    ) -> None:
        try:
            await self._initialize_session(req, session)
            payload = encode_result(req.id, self._initialize_result(session))
        except RemoteProtocolError as exc:
            payload = encode_error(req.id, exc.code, exc.message, exc.error_data())
        with contextlib.suppress(SessionClosed):
            await handle.send(payload.decode())

    # ---------------------------------------------------------------- the writer
    async def _write_stream(
        self,
        conn: Connection,
        session: Session,
        handle: StreamHandle,
        next_seq: int,
        headers: tuple[tuple[str, str], ...],
    ) -> None:
        """Copy frames from ``handle``'s log to the socket from ``next_seq`` on (see module doc)."""
        log_ = handle.log
        http = conn.http
        await conn.send(http.start_stream(200, headers))
        conn.session = session
        if log_.state in (StreamState.LIVE_DETACHED, StreamState.FINAL_DETACHED):
            handle.handle(StreamInput.ATTACH)
        scope = trio.CancelScope()
        handle.writer_scope = scope
        peer_gone = False

        async def watch_peer() -> None:
            nonlocal peer_gone
            try:
                data = await conn.stream.receive_some(_RECV)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if data:
                http.receive_data(data)  # a pipelined request: served after this response
                return
            peer_gone = True
            scope.cancel()

        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_peer)
                try:
                    await self._copy_frames(conn, session, handle, next_seq)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    peer_gone = True
                nursery.cancel_scope.cancel()
        if handle.writer_scope is scope:
            handle.writer_scope = None
            if log_.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
                handle.handle(StreamInput.DETACH)
        if peer_gone or scope.cancelled_caught or http.should_close:
            http.send_failed()
            raise _PeerGone
        await conn.send(http.end_stream())

    async def _copy_frames(
        self, conn: Connection, session: Session, handle: StreamHandle, next_seq: int
    ) -> None:
        log_ = handle.log
        http = conn.http
        while True:
            try:
                frames = log_.frames_from(next_seq)
            except RemoteProtocolError:
                log.warning("writer fell behind stream %s's retention; ending it", log_.epoch)
                return
            if frames:
                data = b"".join(frames)
                chunk = http.send_stream_data(data)
                offset = len(chunk) - len(data) - 2  # chunk header; the frames follow it
                marks: list[tuple[int, tuple[StreamHandle, int]]] = []
                for i, frame in enumerate(frames):
                    offset += len(frame)
                    if next_seq + i >= log_.drained_seq:
                        marks.append((offset, (handle, next_seq + i)))
                await conn.send(chunk, marks)
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
                await conn.send(http.send_stream_data(encode_retry(retry)))
                return
            await handle.wait_changed()


@dataclass(slots=True)
class _Plan:
    """What the idempotency gate decided for one request."""

    request: Request
    execution: Execution | None  # set: this delivery executes and records its result
    replay: bytes | None  # set: answer with this stored response, execute nothing


def _reid(payload: bytes, request_id: RequestId) -> bytes:
    # A replay under an Idempotency-Key answers the *new* JSON-RPC id.
    msg = msgspec.json.decode(payload)
    msg["id"] = request_id
    return msgspec.json.encode(msg)


def _only_disconnects(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in exc.exceptions)
    return isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | _PeerGone)


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
