"""The Trio server: listeners, one task per connection, admission, handlers, SSE writers.

Theory of operation
-------------------
Each TCP connection gets one task running :meth:`Server._connection`: the small
``receive_some -> receive_data -> next_event -> respond -> send`` loop around an
:class:`~weir.engine._connection.Connection` (the :class:`weir.protocol.HttpConnection` plus
byte-exact send accounting).  All MCP endpoint rules come from
:func:`weir.protocol.route`; this module adds what needs state or I/O: sessions (the
:class:`~weir.engine.SessionStore` plus the live :class:`~weir.engine._session.Session`),
admission, handler tasks and SSE writers.

**Admission** happens here, before any handler is dispatched: a POST carrying
requests for a session whose credit is half-open is refused with 429
``stream_half_open`` and ``Retry-After``; nothing is enqueued, nothing runs.
``initialize`` and other sessions are never refused on its account.

**Execution.**  Handlers run in the server's handler nursery, not in the
connection's task, so a dropped connection does not cancel them (MCP:
disconnection is not cancellation) and their output stays replayable.  The
exception is a ``tools/call`` of a tool whose ``async def`` has no suspension
point at all (:func:`weir.engine._app.never_suspends`), with the process-local store:
it finishes on its first step, so it runs right in the connection's task
(:meth:`Server._run_now`) -- it can neither be cancelled half-way nor outlive
anything -- and its response goes out in the same write as the head.  Before a
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

Pieces that live in their own modules: the writer (``engine._writer``), channel
tokens (``engine._channel``), configuration and listeners (``engine._config``),
byte-exact send accounting (``engine._connection``), the stores
(``engine._store``, ``engine._redis_store``).

**Shutdown** (:meth:`Server.shutdown`): stop accepting, refuse new requests with
503 ``shutting_down``, let running handlers finish within the grace period, end
every open stream with ``retry:``, then cancel what is left.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import msgspec
import trio

from weir.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    NEED_DATA,
    SERVER_ERROR,
    CallStart,
    ChannelVerdict,
    ConnectionClosed,
    CreditState,
    DeleteSession,
    ErrorResponse,
    EventId,
    Execute,
    HeadCache,
    HttpError,
    HttpRequest,
    Inbound,
    Notification,
    OpenStream,
    PostMessages,
    Reason,
    Refuse,
    RemoteProtocolError,
    Replay,
    Request,
    RequestContext,
    RequestId,
    Response,
    RetentionBudget,
    SessionInput,
    StreamInput,
    StreamKind,
    StreamLog,
    StreamState,
    accepts,
    call_key,
    check_host_and_origin,
    closing_refusal,
    decode_body,
    decode_message,
    encode,
    encode_comment,
    encode_error,
    encode_result,
    fingerprint,
    gate_decision,
    initialize_result,
    parse_initialize,
    primes_streams,
    refusal,
    replay_as,
    route,
    session_refusal,
)

from ._app import App, McpError
from ._auth import METADATA_PATH, Authorization, InvalidToken, bearer_token
from ._channel import channel_refusal, parse_token, raise_channel
from ._config import ServerConfig, _open_listeners
from ._connection import Connection
from ._context import Context
from ._listen import AcceptGate, Slot
from ._mcp import call_tool_now, capabilities, dispatch, inline_tool
from ._memory import trim
from ._metrics import Metrics, redact
from ._session import JsonCharge, Session, SessionClosed, StreamHandle, StreamLost
from ._store import (
    INTERRUPTED_MESSAGE,
    ChannelRejected,
    MemoryStore,
    SessionGone,
    SessionRecord,
    SessionStore,
    StoreUnavailable,
    check_channel,
)
from ._writer import KEEPALIVE_COMMENT, RECV_BYTES, SSE_HEADERS, PeerGone, write_stream

log = logging.getLogger(__name__)

#: A session that held at least this much (history, results, credit) is followed by a
#: ``malloc_trim`` when it ends.
_TRIM_AFTER = 256 * 1024

#: The explicit rebind handshake (fencing), advertised in ``capabilities.experimental``.
REBIND_METHOD = "weir/rebind"


class Server:
    """An MCP server for one :class:`~weir.engine.App` (see the module docstring).

    Args:
        app: the application.
        config: server configuration.
        store: the session store (default: a new :class:`~weir.engine.MemoryStore`).
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
        #: Replay history and kept results, in bytes, per session and in total.
        self.budget = RetentionBudget(
            total=self.config.memory_budget, per_owner=self.config.session_retain_bytes
        )
        if isinstance(self.store, MemoryStore) and self.store.budget is None:
            self.store.budget = self.budget
        self._endpoint = self.config.endpoint()
        self._new_session_id = session_id_factory or (lambda: secrets.token_urlsafe(32))
        self.replica_id = self.config.replica_id or secrets.token_hex(4)
        self.sessions: dict[str, Session] = {}
        self.metrics = Metrics()
        self._last_seen: dict[str, float] = {}
        self._per_principal: dict[str, int] = {}
        #: Validated response heads, shared by every connection of this server.
        self._heads = HeadCache()
        #: Bytes of incomplete requests buffered by all connections (see
        #: ``ServerConfig.max_inbound_bytes``).
        self.inbound = 0
        self._last_trim = -math.inf
        self._closing = False
        self._shutdown = trio.Event()
        #: Set once :meth:`run` has finished (after a shutdown or cancellation).
        self.stopped = trio.Event()
        self._handlers: trio.Nursery | None = None
        self.listeners: list[trio.SocketListener] = []
        self._accept_scope = trio.CancelScope()
        self._accepting_done = trio.Event()
        #: What the app's lifespan yielded (``Context.state``); None without one.
        self.state: Any = None
        #: Accept loops under the connection limit (see :mod:`engine._listen`).
        self.gate = AcceptGate(self.config.connection_limit)

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
        try:
            lifespan = self.app.lifespan_fn
            async with lifespan(self.app) if lifespan is not None else _no_lifespan() as state:
                self.state = state
                if listen:
                    self.listeners = await _open_listeners(self.config)
                await self._run(task_status)
        finally:
            self.stopped.set()

    async def _run(self, task_status: trio.TaskStatus[Server]) -> None:
        async with trio.open_nursery() as handlers:
            self._handlers = handlers
            async with trio.open_nursery() as conns:
                conns.start_soon(self._serve_listeners, conns)
                conns.start_soon(self._sweep_sessions)
                if self.store.shared:
                    conns.start_soon(self._relay_mail)
                    conns.start_soon(self._renew_leases)
                task_status.started(self)
                await self._shutdown.wait()
                await self._drain()
                conns.cancel_scope.cancel()
            handlers.cancel_scope.cancel()
        await self.store.aclose()

    async def _serve_listeners(self, conns: trio.Nursery) -> None:
        try:
            if self.listeners:
                with self._accept_scope:
                    async with trio.open_nursery() as loops:
                        for listener in self.listeners:
                            loops.start_soon(self.gate.serve, listener, self._connection, conns)
        finally:
            self._accepting_done.set()

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
        # Stop accepting first; close the listening sockets only once no task uses them.
        self._accept_scope.cancel()
        await self._accepting_done.wait()
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

    async def _sweep_sessions(self) -> None:
        """Forget idle sessions, and sessions whose ``initialize`` was never followed up.

        A session counts as busy (never idle) while a handler runs for it or a
        writer is attached to one of its streams.
        """
        cfg = self.config
        idle = cfg.session_idle_timeout
        every = max(0.5, min(cfg.initialize_timeout / 4, (idle or 240.0) / 4, 60.0))
        while True:
            await trio.sleep(every)
            now = trio.current_time()
            for sid, session in list(self.sessions.items()):
                busy = session.running or any(
                    h.writer_scope is not None for h in session.handles.values()
                )
                seen = self._last_seen.get(sid, now)
                if busy:
                    self._last_seen[sid] = now
                elif session.provisional and now - seen >= cfg.initialize_timeout:
                    log.info(
                        "session %s: nothing followed its initialize for %.0f s: forgotten",
                        redact(sid),
                        cfg.initialize_timeout,
                    )
                    self.metrics.sessions_expired += 1
                    await self._end_session(session)
                elif idle is not None and now - seen >= idle:
                    log.info("session %s idle for %.0f s: forgotten", redact(sid), idle)
                    self.metrics.sessions_expired += 1
                    await self._end_session(session)

    async def _end_session(self, session: Session) -> None:
        sid = session.session_id
        heavy = self.budget.owner_held(sid) + session.credit.bytes_in_use >= _TRIM_AFTER
        session.close()
        now = trio.current_time()
        if heavy and now - self._last_trim >= 1.0:
            self._last_trim = now
            self._handlers_start(self._reclaim)
        if self.sessions.pop(session.session_id, None) is not None:
            principal = session.record.principal
            left = self._per_principal[principal] - 1
            if left > 0:
                self._per_principal[principal] = left
            else:
                self._per_principal.pop(principal, None)
        self._last_seen.pop(session.session_id, None)
        await self.store.delete_session(session.record.principal, session.session_id)

    async def _reclaim(self) -> None:
        """After a heavy session ended: collect the cycles that may still hold its
        buffers (tracebacks of its cancelled tasks), then return free pages to the OS.

        Runs once the cancelled tasks have unwound (a second later), at most once a
        second, only after sessions that held at least ``_TRIM_AFTER`` bytes.
        """
        await trio.sleep(1.0)
        gc.collect()
        trim()

    def _check_session_room(self, principal: str, request_id: RequestId | None) -> None:
        """Refuse a new session past the global or the principal's limit.

        Raises:
            RemoteProtocolError: 503 ``session_limit`` (the process is full) or 429
                ``session_limit`` (this principal holds its share), with
                ``Retry-After``; existing sessions are unaffected.
        """
        cfg = self.config
        if len(self.sessions) >= cfg.max_sessions:
            full = (503, "server", cfg.max_sessions, "this server holds its limit", "retry later")
        elif self._per_principal.get(principal, 0) >= cfg.principal_session_limit:
            full = (
                429,
                "principal",
                cfg.principal_session_limit,
                "this principal holds its limit",
                "end one or retry later",
            )
        else:
            return
        status, scope, limit, who, then = full
        raise RemoteProtocolError(
            f"{who} of {limit} sessions; {then}",
            http_status=status,
            reason=Reason.SESSION_LIMIT,
            code=SERVER_ERROR,
            request_id=request_id,
            retry_after_ms=int(min(cfg.initialize_timeout, 30.0) * 1000),
            data={"limit": limit, "scope": scope},
        )

    def _register(self, session: Session, now: float) -> None:
        sid = session.session_id
        self.sessions[sid] = session
        principal = session.record.principal
        self._per_principal[principal] = self._per_principal.get(principal, 0) + 1
        self._last_seen[sid] = now
        session.replica = self.replica_id
        session.start_timer = self._start_timer
        store = self.store
        if isinstance(store, MemoryStore):
            session.shed_results = partial(store.shed_results, session.record.principal, sid)

    def _start_timer(self, session: Session) -> None:
        assert self._handlers is not None
        self._handlers.start_soon(self._session_timer, session)

    async def _new_session(
        self, version: str, principal: str, request_id: RequestId | None = None
    ) -> Session:
        now = trio.current_time()
        self._check_session_room(principal, request_id)
        record = SessionRecord(
            session_id=self._new_session_id(),
            principal=principal,
            protocol_version=version,
            created_at=now,
            secret=secrets.token_urlsafe(16),
            salt=secrets.token_hex(8),
        )
        await self.store.create_session(record)
        session = Session(
            record,
            max_closed_streams=self.config.max_closed_streams,
            credit=self.config.credit,
            now=now,
            budget=self.budget,
        )
        session.provisional = True
        self._register(session, now)
        return session

    async def _session_timer(self, session: Session) -> None:
        """Drive the session's credit timers; tear the session down when it is DEAD.

        Runs only while the credit has a deadline (frames pending, or a frame
        waiting for credit); :meth:`Session._pulse` starts it again when one
        appears, so an idle session costs no task.
        """
        credit = session.credit
        try:
            while not session.closed:
                deadline = credit.deadline()
                if deadline == math.inf:
                    return
                changed = session.timer_changed
                session.timer_at = deadline
                with trio.move_on_at(deadline):
                    await changed.wait()
                state = credit.handle_timer(trio.current_time())
                if state is CreditState.DEAD and not session.closed:
                    log.warning(
                        "session %s: no progress for %.1f s with %d frames pending: torn down",
                        redact(session.session_id),
                        credit.limits.liveness_timeout,
                        credit.frames_in_use,
                    )
                    self.metrics.teardowns += 1
                    await self._end_session(session)
        finally:
            session.timer_stopped()

    # ---------------------------------------------------------------- connections
    async def _connection(self, stream: trio.abc.Stream, slot: Slot | None = None) -> None:
        conn = Connection(
            stream, self.config.limits, notsent_lowat=self.config.notsent_lowat, heads=self._heads
        )
        conn.principal = self.config.principal  # (with authorization: set per request)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.poll_acks)
                await self._connection_loop(conn, slot)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, PeerGone):
            pass
        except Exception as exc:
            # One broken connection must never take the server down.
            if not _only_disconnects(exc):
                log.exception("connection handler failed")
        finally:
            if slot is not None:
                slot.unpark()
            # Last look before the socket goes: what the peer acknowledged counts.
            conn.check_acks()
            conn.abandon()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def _connection_loop(self, conn: Connection, slot: Slot | None) -> None:
        """Read requests and answer them, each read under the deadline of its phase.

        Waiting for the first byte of a request: the keep-alive timeout, and the
        connection may be shed (see :mod:`engine._listen`); then the whole head
        must arrive within ``head_timeout`` of its first byte and the body within
        ``body_timeout`` of the head -- however the bytes trickle in.  A head or
        body that misses its deadline gets 408 and the connection is closed.
        """
        try:
            await self._serve_requests(conn, slot)
        finally:
            self.inbound -= conn.inbound
            conn.inbound = 0

    async def _serve_requests(self, conn: Connection, slot: Slot | None) -> None:
        http = conn.http
        cfg = self.config
        keepalive, receive = cfg.keepalive_timeout, conn.stream.receive_some
        phase, since = Inbound.IDLE, 0.0
        # One scope carries every read's deadline (cheaper than a scope per read); it
        # is armed, and the connection parked for shedding, only while we wait.
        with trio.CancelScope() as reads:
            if slot is not None:
                slot.scope = reads
            while True:
                event = http.next_event()
                if event is NEED_DATA:
                    if http.has_data_to_send:
                        await conn.send(http.data_to_send())  # e.g. 100 Continue
                    now = trio.current_time()
                    inbound = http.inbound
                    if inbound is Inbound.IDLE:
                        phase = inbound
                        reads.deadline = now + keepalive
                        if slot is not None:
                            slot.idle_since = now  # parked: it may be shed
                    else:
                        if inbound is not phase:
                            phase, since = inbound, now
                        limit = cfg.head_timeout if phase is Inbound.HEAD else cfg.body_timeout
                        reads.deadline = since + limit
                    data = await receive(RECV_BYTES)
                    reads.deadline = math.inf
                    if slot is not None:
                        slot.idle_since = None
                    if reads.cancel_called:
                        # Shed (or timed out) just as bytes arrived: the cancellation
                        # is pending in this scope.  Answer what came, shielded, then close.
                        with trio.CancelScope(shield=True) as last:
                            last.deadline = now + keepalive
                            await self._last_requests(conn, data)
                        return
                    # Bytes of requests not yet complete count against one process-wide cap.
                    n = len(data)
                    conn.inbound += n
                    self.inbound += n
                    if self.inbound > cfg.max_inbound_bytes:
                        await self._overloaded(conn)
                        return
                    http.receive_data(data)
                elif isinstance(event, HttpRequest):
                    phase = Inbound.IDLE
                    # Handed over, not kept: a long response (an SSE stream) must not
                    # keep the request's body alive for as long as it lasts.
                    handoff, event = [event], NEED_DATA
                    self.inbound -= conn.inbound
                    conn.inbound = 0
                    await self._respond(conn, handoff)
                    if http.should_close:
                        return
                elif isinstance(event, HttpError):
                    self.metrics.refused(str(event.reason))
                    await conn.send(http.data_to_send())
                    return
                elif isinstance(event, ConnectionClosed):
                    return
        if reads.cancelled_caught and phase is not Inbound.IDLE:
            await self._time_out(conn, phase)

    async def _last_requests(self, conn: Connection, data: bytes | bytearray) -> None:
        """Serve the complete requests in ``data`` and stop (the connection then closes)."""
        http = conn.http
        http.receive_data(data)
        while True:
            event = http.next_event()
            if not isinstance(event, HttpRequest):
                return
            await self._respond(conn, [event])
            if http.should_close:
                return

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

    async def _time_out(self, conn: Connection, phase: Inbound) -> None:
        what = "request head" if phase is Inbound.HEAD else "request body"
        limit = self.config.head_timeout if phase is Inbound.HEAD else self.config.body_timeout
        self.metrics.refused(str(Reason.REQUEST_TIMEOUT))
        exc = RemoteProtocolError(
            f"the {what} did not arrive within {limit:g} s",
            http_status=408,
            reason=Reason.REQUEST_TIMEOUT,
        )
        conn.http.send_failed()  # nothing else may follow on this connection
        with trio.move_on_after(1):
            await conn.send(closing_refusal(exc))

    async def _refuse(self, conn: Connection, exc: RemoteProtocolError) -> None:
        self.metrics.refused(str(exc.reason))
        status, headers, body = refusal(exc)
        await conn.send(conn.http.send_response(status, headers, body))

    async def _respond(self, conn: Connection, handoff: list[HttpRequest]) -> None:
        request = handoff.pop()
        sid_header = request.headers.get("mcp-session-id") or ""
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
            endpoint = path == cfg.path
            # Metadata and metrics need no token; the legacy endpoints and the MCP
            # endpoint do, and anything else is routed (and refused) like the endpoint.
            if not endpoint and cfg.auth is not None and path.startswith(METADATA_PATH):
                await self._resource_metadata(conn, request, cfg.auth)
                return
            if not endpoint and path == cfg.metrics_path:
                await self._auxiliary(conn, request)
                return
            if cfg.auth is not None:
                conn.principal = await self._authenticate(request)
            if not endpoint and path in (cfg.legacy_sse_path, cfg.legacy_messages_path):
                await self._auxiliary(conn, request)
                return
            mcp = route(request, self._endpoint)
            del request  # the body is decoded: from here on only the messages count
            if isinstance(mcp, PostMessages):
                await self._post(conn, mcp)
            elif isinstance(mcp, OpenStream):
                await self._get(conn, mcp)
            elif isinstance(mcp, DeleteSession):
                await self._delete(conn, mcp)
        except SessionGone:
            if conn.http.response_in_progress:
                raise
            await self._refuse(conn, session_refusal(sid_header))
        except StoreUnavailable as exc:
            if conn.http.response_in_progress:
                raise
            log.warning("store unavailable: %s", exc)
            await self._refuse(conn, _store_unavailable(self.config))
        except RemoteProtocolError as exc:
            if conn.http.response_in_progress:
                raise
            await self._refuse(conn, exc)

    async def _authenticate(self, request: HttpRequest) -> str:
        """The principal of ``request``: its verified token's, or the anonymous one.

        Raises:
            RemoteProtocolError: 401 (no token, or a refused one), 403 (a scope is
                missing) or 400 (a malformed ``Authorization`` header), each with
                ``WWW-Authenticate`` pointing at the resource metadata.
        """
        auth = self.config.auth
        if auth is None:
            return self.config.principal
        try:
            token = bearer_token(request.headers.get("authorization"))
        except ValueError as exc:
            raise _auth_refusal(
                auth, 400, Reason.INVALID_REQUEST, str(exc), "invalid_request"
            ) from None
        if token is None:
            raise _auth_refusal(auth, 401, Reason.UNAUTHORIZED, "a bearer token is required")
        try:
            access = await auth.verifier.verify(token)
        except InvalidToken as exc:
            raise _auth_refusal(
                auth, 401, Reason.UNAUTHORIZED, f"invalid token: {exc}", "invalid_token"
            ) from None
        missing = auth.required_scopes - access.scopes
        if missing:
            raise _auth_refusal(
                auth,
                403,
                Reason.INSUFFICIENT_SCOPE,
                f"the token lacks scope {' '.join(sorted(missing))}",
                "insufficient_scope",
            )
        return access.principal

    async def _resource_metadata(
        self, conn: Connection, request: HttpRequest, auth: Authorization
    ) -> None:
        """RFC 9728 protected resource metadata (no token needed)."""
        path = request.path
        if path not in (METADATA_PATH, METADATA_PATH + self.config.path):
            raise RemoteProtocolError(
                f"no resource at {path}", http_status=404, reason=Reason.NOT_FOUND
            )
        if request.method != "GET":
            raise RemoteProtocolError(
                f"method {request.method} not allowed",
                http_status=405,
                reason=Reason.METHOD_NOT_ALLOWED,
                headers=(("allow", "GET"),),
            )
        headers = [("content-type", "application/json"), ("cache-control", "max-age=300")]
        await conn.send(conn.http.send_response(200, headers, auth.metadata()))

    async def _session(
        self,
        principal: str,
        session_id: str | None,
        request_id: RequestId | None = None,
        *,
        verify: bool = True,
    ) -> Session:
        """``principal``'s live session ``session_id``, or the 404 refusal.

        A session of another principal is answered exactly like one that does not
        exist (and is left alone).  With a shared store the record is re-read
        (``verify``) so a session deleted or rebound on another replica is seen here;
        a session first seen on this replica is adopted from its record.
        """
        sid = session_id or ""
        session = self.sessions.get(sid)
        if session is not None and session.closed:
            session = None
        if session is not None and session.record.principal != principal:
            raise session_refusal(sid, request_id)  # as if it did not exist; left alone
        if self.store.shared and (session is None or verify):
            record = await self.store.get_session(principal, sid)
            if record is None:
                if session is not None:
                    await self._end_session(session)
                raise session_refusal(sid, request_id)
            if session is None:
                session = self._adopt(record)
            else:
                session.record = record
        if session is None:
            raise session_refusal(sid, request_id)
        self._last_seen[session.session_id] = trio.current_time()
        session.provisional = False
        return session

    def _adopt(self, record: SessionRecord) -> Session:
        # An existing session (made on another replica) is never refused for the limit:
        # that would lock out a client the limit exists to protect.  At most every
        # replica's limit's worth can be adopted.
        now = trio.current_time()
        session = Session(
            record,
            max_closed_streams=self.config.max_closed_streams,
            credit=self.config.credit,
            now=now,
            budget=self.budget,
        )
        session.handle(SessionInput.INITIALIZED)
        self._register(session, now)
        return session

    def _check_rebind(self, session: Session, raw_token: str | None, rid: RequestId | None) -> None:
        """Who may rebind: whoever proves the channel (its current token), or -- with
        authorization on -- the session's principal, token or not.

        Without authorization, a client that knows only the session id must not be
        able to fence the owner (its next request would be ``cursor_stale``) or read
        the results the rebind hands back.  A token of an older generation is always
        ``cursor_stale``: that client has been fenced.

        Raises:
            RemoteProtocolError: 409 ``cursor_stale`` or ``channel_unbound``.
        """
        try:
            verdict = check_channel(session.record, parse_token(raw_token))
        except RemoteProtocolError:
            verdict = ChannelVerdict.UNBOUND
        if verdict is ChannelVerdict.STALE:
            raise channel_refusal(ChannelVerdict.STALE, rid)
        if self.config.auth is not None:
            return
        if raw_token is None or verdict is not ChannelVerdict.OK:
            raise channel_refusal(
                ChannelVerdict.UNBOUND,
                rid,
                "weir/rebind needs the session's current Mcp-Channel-Token",
            )

    async def _prove_channel(
        self, session: Session, token: tuple[int, str] | None, what: str
    ) -> None:
        """A session whose client has presented its token needs it from then on.

        For ``DELETE`` and GET streams (fresh or resumed): without authorization, a
        session id alone must not end or read a session whose client uses a channel
        token.  Sessions of token-less clients (standard SDK clients) are served as
        before; with authorization on, the principal is the proof.

        Raises:
            RemoteProtocolError: 409 ``channel_unbound``.
        """
        if token is not None:
            if not session.record.bound:
                await self._mark_bound(session)
            return
        if session.record.bound and self.config.auth is None:
            raise channel_refusal(
                ChannelVerdict.UNBOUND,
                None,
                f"this session's client uses a channel token: {what} needs it",
            )

    async def _mark_bound(self, session: Session) -> None:
        await self.store.mark_bound(session.record.principal, session.session_id)
        session.record = replace(session.record, bound=True)

    def _channel(self, session: Session, ctx: RequestContext) -> tuple[int, str] | None:
        """Parse and check ``Mcp-Channel-Token`` against the session (fencing).

        Raises:
            RemoteProtocolError: 409 ``cursor_stale`` (older generation) or
                ``channel_unbound`` (wrong secret, future generation, malformed).
        """
        token = parse_token(ctx.headers.get("mcp-channel-token"))
        raise_channel(check_channel(session.record, token))
        return token

    def _open_stream(
        self, session: Session, epoch: str, kind: StreamKind, token: tuple[int, str] | None
    ) -> StreamHandle:
        cfg = self.config
        handle = session.open_stream(
            epoch,
            kind,
            max_events=cfg.max_stream_events,
            emit_ids=cfg.resume != "off",
            replica=self.replica_id,
            binding=token[0] if token else 0,
        )
        if self.store.shared and cfg.resume == "shared" and kind is not StreamKind.LEGACY:
            handle.sink = self._store_sink(session, handle)
        return handle

    def _store_sink(
        self, session: Session, handle: StreamHandle
    ) -> Callable[[int, str, bool, str | None], Any]:
        store, principal, sid = self.store, session.record.principal, session.session_id
        generation, epoch, binding = session.record.generation, handle.log.epoch, handle.log.binding
        replica = self.replica_id

        async def sink(seq: int, payload: str, final: bool, call_key: str | None) -> None:
            if seq == 0 and payload == "":
                return  # the priming event carries nothing to replay
            try:
                await store.append_event(
                    principal,
                    sid,
                    epoch,
                    seq,
                    payload.encode(),
                    final=final,
                    generation=generation,
                    binding=binding,
                    call_key=call_key,
                    replica=replica,
                )
            except (SessionGone, ChannelRejected, StoreUnavailable) as exc:
                # Not stored means not sent: the stream ends here (a rebind fenced
                # it, the session is gone, or the store failed -- fail closed).
                raise StreamLost(f"{epoch}:{seq} not appended: {exc!r}") from exc

        return sink

    # ---------------------------------------------------------------- POST
    async def _post(self, conn: Connection, post: PostMessages) -> None:
        if post.is_initialize:
            await self._initialize(conn, post)
            return
        first = post.messages[0]
        rid = first.id if isinstance(first, Request) else None
        # A lone tools/call is checked by the store in begin_call (one round trip).
        lone_call = (
            len(post.messages) == 1 and isinstance(first, Request) and first.method == "tools/call"
        )
        session = await self._session(
            conn.principal, post.ctx.session_id, rid, verify=not lone_call
        )
        rebind = (
            len(post.messages) == 1 and isinstance(first, Request) and first.method == REBIND_METHOD
        )
        raw_token = post.ctx.headers.get("mcp-channel-token")
        if rebind:
            self._check_rebind(session, raw_token, rid)
            token = None
        else:
            token = parse_token(raw_token, rid)
        if not lone_call and not rebind:
            raise_channel(check_channel(session.record, token), rid)
        if (
            token is not None
            and not session.record.bound
            and check_channel(session.record, token) is ChannelVerdict.OK
        ):
            await self._mark_bound(session)  # only a token that proves the channel counts
        requests = await self._absorb(session, post.messages)
        if not requests:
            await conn.send(conn.http.send_response(202, ()))
            return
        if len(requests) == 1 and requests[0].method == REBIND_METHOD:
            session.credit.admit(trio.current_time(), requests[0].id)
            await self._rebind(conn, session, requests[0])
            return
        session.handle(SessionInput.REQUEST)
        primes = self._primes(session, post.ctx.protocol_version) and self.config.resume != "off"
        if len(requests) > 1:
            await self._post_batch(conn, session, requests, token, primes=primes)
            return
        key = post.ctx.headers.get("idempotency-key")
        plans = await self._admit_and_plan(session, requests, key, token)
        if self.config.json_response:
            is_batch = post.is_batch
            post.messages.clear()
            del first, requests
            await self._post_json(conn, session, plans, is_batch)
            return
        epoch = plans[0].epoch
        if epoch is None:
            try:
                epoch = await self.store.allocate_epoch(
                    session.record.principal, session.session_id, token[0] if token else 0
                )
            except BaseException:
                await self._release_unstarted(session, plans)
                raise
        handle = self._open_stream(session, epoch, StreamKind.REQUEST, token)
        handle.outstanding = 1
        assert self._handlers is not None
        if await self._run_now(session, plans[0], handle, primes=primes):
            pass
        elif primes:
            self._handlers.start_soon(self._prime_then_run, session, handle, plans)
        else:
            self._handlers.start_soon(self._run_request, session, plans[0], handle)
        # The handlers own the requests now; the stream may outlive them by far.
        post.messages.clear()
        del first, requests, plans
        headers = (*SSE_HEADERS, ("mcp-session-id", session.session_id))
        await write_stream(conn, session, handle, 0, headers, keepalive=self.config.sse_keepalive)

    async def _post_batch(
        self,
        conn: Connection,
        session: Session,
        requests: list[Request],
        token: tuple[int, str] | None,
        *,
        primes: bool,
    ) -> None:
        """A batch (2025-03-26): its entries are admitted one by one, each like a lone
        request, and dispatched as they are admitted (:meth:`_admit_each`).

        The response starts at once; entries wait for admission while it is open,
        so a batch never holds more in flight than a session may.
        """
        if self.config.json_response:

            async def feed(run: Callable[[int, _Plan], Awaitable[None]]) -> None:
                await self._admit_each(session, requests, token, run)

            bodies = await self._collect_json(session, len(requests), feed)
            await self._answer_json(conn, session, bodies, True)
            return
        epoch = await self.store.allocate_epoch(
            session.record.principal, session.session_id, token[0] if token else 0
        )
        handle = self._open_stream(session, epoch, StreamKind.REQUEST, token)
        handle.outstanding = len(requests)

        async def run_sse(i: int, plan: _Plan) -> None:
            await self._run_request(session, plan, handle)

        async def all_sse() -> None:
            if primes:
                await handle.send("")  # the priming event: an id and empty data
            await self._admit_each(session, requests, token, run_sse)

        self._handlers_start(all_sse)
        sse_headers = (*SSE_HEADERS, ("mcp-session-id", session.session_id))
        await write_stream(
            conn, session, handle, 0, sse_headers, keepalive=self.config.sse_keepalive
        )

    async def _admit_each(
        self,
        session: Session,
        requests: list[Request],
        token: tuple[int, str] | None,
        run: Callable[[int, _Plan], Any],
    ) -> None:
        """Admit, gate and dispatch a batch's requests one at a time, in order.

        Each entry waits for admission as a lone request would (so the in-flight
        and credit limits hold for every entry), then passes the idempotency gate,
        then runs.  An entry refused on the way (half-open, a gate refusal) gets
        that refusal as its JSON-RPC error in the batch's response and executes
        nothing; ``run`` accounts for it like any other (:meth:`Session.done`).
        """
        async with trio.open_nursery() as nursery:
            for i, req in enumerate(requests):
                try:
                    await session.admit(1, req.id)
                except SessionClosed:
                    return  # the session ended: its streams are gone with it
                except RemoteProtocolError as exc:
                    self.metrics.refused(str(exc.reason))
                    session.flow.count_in()  # accounted like an admitted entry
                    nursery.start_soon(run, i, _Plan(req, replay=_error_of(req, exc)))
                    continue
                self.metrics.admissions += 1
                try:
                    plan = await self._plan(session, req, None, token)
                except RemoteProtocolError as exc:
                    self.metrics.refused(str(exc.reason))
                    plan = _Plan(req, replay=_error_of(req, exc))
                except StoreUnavailable:
                    plan = _Plan(req, replay=_error_of(req, _store_unavailable(self.config)))
                nursery.start_soon(run, i, plan)

    async def _absorb(self, session: Session, messages: list[Any]) -> list[Request]:
        """Handle notifications and responses at once; return the requests.

        With a shared store, an answer to another replica's request and a
        cancellation of a request running elsewhere are forwarded through the
        session's mailboxes (see :meth:`_relay_mail`).
        """
        requests: list[Request] = []
        principal, sid = session.record.principal, session.session_id
        for msg in messages:
            if isinstance(msg, Request):
                requests.append(msg)
            elif isinstance(msg, Notification):
                rid = (msg.params or {}).get("requestId")
                if (
                    msg.method == "notifications/cancelled"
                    and self.store.shared
                    and isinstance(rid, int | str)
                    and rid not in session.running
                ):
                    await self.store.post_message(
                        principal, sid, "cancel", msgspec.json.encode(rid)
                    )
                self._notification(session, msg)
            elif isinstance(msg, Response | ErrorResponse) and msg.id is not None:
                pending = session.pending.get(msg.id)
                if pending is not None:
                    pending.answer = msg
                    pending.done.set()
                elif self.store.shared and isinstance(msg.id, str) and msg.id.startswith("weir:"):
                    replica = msg.id[5:].rpartition(":")[0]
                    await self.store.post_message(principal, sid, f"answers:{replica}", encode(msg))
        return requests

    async def _renew_leases(self) -> None:
        """Shared stores only: keep the leases of the calls this replica runs alive.

        Every third of ``claim_lease``, one store round trip per session with running
        calls.  If this process dies (SIGKILL, OOM, power), the renewals stop and,
        within one lease, any replica answers retries and resumes of its calls with
        ``interrupted`` -- never an endless ``in_progress``, never a second run.
        """
        lease = self.config.claim_lease
        while True:
            await trio.sleep(lease / 3)
            for session in list(self.sessions.values()):
                if session.closed or not session.calls:
                    continue
                try:
                    await self.store.renew_claims(
                        session.record.principal,
                        session.session_id,
                        list(session.calls),
                        self.replica_id,
                        lease,
                    )
                except (StoreUnavailable, SessionGone):
                    continue

    async def _relay_mail(self) -> None:
        """Shared stores only: deliver answers and cancellations other replicas received.

        Polls (every 100 ms) only sessions that wait for a client's answer, or run a
        request for more than a second, so idle or fast traffic costs nothing.
        """
        box = f"answers:{self.replica_id}"
        while True:
            await trio.sleep(0.1)
            now = trio.current_time()
            for session in list(self.sessions.values()):
                if session.closed:
                    continue
                principal, sid = session.record.principal, session.session_id
                try:
                    if session.pending:
                        for raw in await self.store.take_messages(principal, sid, box):
                            msg = decode_message(raw)
                            if isinstance(msg, Response | ErrorResponse) and msg.id is not None:
                                pending = session.pending.get(msg.id)
                                if pending is not None:
                                    pending.answer = msg
                                    pending.done.set()
                    if any(now - t > 1.0 for t in session.started.values()):
                        wanted = await self.store.take_messages(principal, sid, "cancel", keep=True)
                        for raw in wanted:
                            scope = session.running.get(msgspec.json.decode(raw))
                            if scope is not None:
                                scope.cancel()
                except (StoreUnavailable, RemoteProtocolError, msgspec.DecodeError):
                    continue

    async def _admit_and_plan(
        self,
        session: Session,
        requests: list[Request],
        key: str | None,
        token: tuple[int, str] | None,
    ) -> list[_Plan]:
        """Admission (half-open), then the idempotency gate (fencing), before any dispatch.

        Every request admitted here is accounted for exactly once later
        (:meth:`Session.done`), whether it executes, replays or is cancelled.
        """
        try:
            await session.admit(len(requests), requests[0].id)
        except SessionClosed:
            raise session_refusal(session.session_id, requests[0].id) from None
        self.metrics.admissions += len(requests)
        plans: list[_Plan] = []
        try:
            for req in requests:
                one_key = key if len(requests) == 1 else None
                plans.append(await self._plan(session, req, one_key, token))
        except BaseException:
            session.done(len(requests))
            for plan in plans:  # give back keys this refused POST had claimed
                if plan.key is not None:
                    await self._finish_call(session, plan.key, None)
            raise
        return plans

    async def _plan(
        self,
        session: Session,
        req: Request,
        header_key: str | None,
        token: tuple[int, str] | None,
    ) -> _Plan:
        """Pass the idempotency gate (in the store): does ``req`` execute, or replay?

        Raises:
            RemoteProtocolError: 409 ``in_progress`` (still running after the bounded
                wait), 422 ``idempotency_key_reused`` (same key, different request), or
                a channel refusal.
        """
        if req.method != "tools/call":
            return _Plan(req)
        key = call_key(header_key, req.id)
        fp = fingerprint(req)
        principal, sid = session.record.principal, session.session_id
        deadline = trio.current_time() + self.config.in_progress_wait
        delay = 0.01
        while True:
            try:
                if self.store.shared:  # a claim another replica may have to interrupt
                    start = await self._claim(session, req, key, fp, token)
                else:
                    start = await self.store.begin_call(principal, sid, key, fp, token)
            except SessionGone:
                await self._end_session(session)
                raise session_refusal(sid, req.id) from None
            except ChannelRejected as exc:
                raise_channel(exc.verdict, req.id)
                raise  # unreachable: _raise_channel raises
            decision = gate_decision(
                start,
                key,
                req.id,
                now=trio.current_time(),
                give_up_at=deadline,
                retry_ms=self.config.retry_ms,
            )
            if isinstance(decision, Execute):
                session.calls[key] = None  # an Event only once a duplicate waits
                return _Plan(req, key=key, epoch=decision.epoch)
            if isinstance(decision, Replay):
                self.metrics.duplicates_replayed += 1
                return _Plan(req, replay=replay_as(decision.payload, req.id), epoch=decision.epoch)
            if isinstance(decision, Refuse):
                if decision.error.reason is Reason.IN_PROGRESS:
                    self.metrics.duplicates_in_progress += 1
                raise decision.error
            now = trio.current_time()
            ours = key in session.calls
            with trio.move_on_at(min(deadline, now + (3600.0 if ours else delay))):
                if ours:
                    local = session.calls[key]
                    if local is None:
                        local = session.calls[key] = trio.Event()
                    await local.wait()  # the running delivery is ours: wake exactly when done
                else:
                    await trio.sleep_forever()  # another replica runs it: poll the store
            delay = min(delay * 2, 0.25)

    async def _claim(
        self, session: Session, req: Request, key: str, fp: bytes, token: tuple[int, str] | None
    ) -> CallStart:
        """``begin_call`` on a shared store, shielded from this process's cancellation.

        A cancellation landing while the claim is in flight would leave us not
        knowing whether the store granted it: a granted claim nobody releases holds
        every retry at 409 ``in_progress`` until its lease runs out.  So the round
        trip completes (bounded by the store's own timeout, and by 5 s here); a claim
        granted to a request that then never starts is given back by the caller.
        """
        with trio.CancelScope(shield=True) as shield:
            shield.deadline = trio.current_time() + 5.0
            return await self.store.begin_call(
                session.record.principal,
                session.session_id,
                key,
                fp,
                token,
                request_id=msgspec.json.encode(req.id),
                owner=self.replica_id,
                lease=self.config.claim_lease,
            )
        raise StoreUnavailable("the store did not answer a claim within 5 s")

    async def _release_unstarted(self, session: Session, plans: list[_Plan]) -> None:
        """Give back the keys of claimed calls that will never start here.

        Nothing ran, so a retry (on this replica or another) may run them: releasing
        is safe where it would not be for a call that had begun (see
        :meth:`_interrupted`).
        """
        for plan in plans:
            if plan.key is not None and plan.replay is None:
                await self._finish_call(session, plan.key, None)

    async def _rebind(self, conn: Connection, session: Session, req: Request) -> None:
        """The explicit rebind handshake (fencing): new generation, new token, past results."""
        secret = secrets.token_urlsafe(16)
        try:
            record = await self.store.rebind(session.record.principal, session.session_id, secret)
        except SessionGone:
            await self._end_session(session)
            raise session_refusal(session.session_id, req.id) from None
        session.record = record
        # Streams of older generations are never inherited: end them now.
        for h in list(session.handles.values()):
            if h.generation < record.generation and h.log.state is not StreamState.CLOSED:
                h.handle(StreamInput.ABORT)
        if isinstance(self.store, MemoryStore):
            kept = self.store.recent_results(session.record.principal, session.session_id, 100)
        else:
            kept = list(session.finished.values())
        results = [msgspec.json.decode(p) for p in kept]
        body = encode_result(
            req.id,
            {
                "generation": record.generation,
                "channelToken": record.channel_token,
                "results": results,
            },
        )
        headers = [
            ("content-type", "application/json"),
            ("mcp-session-id", session.session_id),
            ("mcp-channel-token", record.channel_token),
        ]
        await conn.send(conn.http.send_response(200, headers, body))

    async def _post_json(
        self, conn: Connection, session: Session, plans: list[_Plan], is_batch: bool
    ) -> None:
        headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
        if len(plans) == 1 and not is_batch and self._runs_now(plans[0]):
            try:
                body = await self._answer_now(session, plans[0], None)
            finally:
                session.done()
            await self._send_json(conn, session, headers, body)
            return

        async def feed(run: Callable[[int, _Plan], Awaitable[None]]) -> None:
            async with trio.open_nursery() as n:
                for i, plan in enumerate(plans):
                    n.start_soon(run, i, plan)

        bodies = await self._collect_json(session, len(plans), feed)
        plans.clear()  # the requests (and their arguments) are done with
        await self._answer_json(conn, session, bodies, is_batch)

    async def _collect_json(
        self,
        session: Session,
        n: int,
        feed: Callable[[Callable[[int, _Plan], Awaitable[None]]], Awaitable[None]],
    ) -> list[bytes]:
        """Run ``n`` requests in the handler nursery, and their responses, in order.

        ``feed(run)`` calls ``run(i, plan)`` for each request (at once, or as each is
        admitted).  Handlers run in the server's nursery, not the connection's: a
        dropped connection is not a cancellation.  Cancelled calls have no response.
        """
        results: list[bytes | None] = [None] * n
        finished = trio.Event()

        async def run(i: int, plan: _Plan) -> None:
            try:
                results[i] = await self._execute(session, plan, None)
            finally:
                session.done()

        async def all_of_them() -> None:
            try:
                await feed(run)
            finally:
                finished.set()

        assert self._handlers is not None
        self._handlers.start_soon(all_of_them)
        await finished.wait()
        return [r for r in results if r is not None]

    async def _answer_json(
        self, conn: Connection, session: Session, bodies: list[bytes], is_batch: bool
    ) -> None:
        """202 when nothing answers; else one body, or a batch's array of them."""
        if not bodies:
            await conn.send(conn.http.send_response(202, ()))
            return
        headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
        body = b"[" + b",".join(bodies) + b"]" if is_batch else bodies.pop()
        bodies.clear()
        await self._send_json(conn, session, headers, body)

    async def _send_json(
        self, conn: Connection, session: Session, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        """Write a JSON response under the session's drain credit (see :class:`JsonCharge`).

        The response takes credit for its exact size before it is written (waiting
        in FIFO order when there is none) and holds it until the peer acknowledges
        its last byte; a teardown cancels a write that is stuck on a stalled peer.
        """
        data = conn.http.send_response(200, headers, body)
        del body  # (the caller's reference may remain; this frame keeps only ``data``)
        n = len(data)
        session.flow.observe_frame(n)
        try:
            if not session.try_acquire_now(n):
                await session.acquire(n)
        except SessionClosed:
            conn.http.send_failed()
            raise PeerGone from None
        charge = JsonCharge(session, n)
        with trio.CancelScope() as scope:
            session.json_writers.add(scope)
            try:
                await conn.send(data, [(n, (charge, 0))])
            except BaseException:
                charge.drained(0)  # never written whole: nothing to wait for
                raise
            finally:
                session.json_writers.discard(scope)
        if scope.cancelled_caught:
            conn.http.send_failed()
            raise PeerGone

    async def _initialize(self, conn: Connection, post: PostMessages) -> None:
        req = post.messages[0]
        assert isinstance(req, Request)
        session = await self._initialize_session(req, None, conn.principal)
        result = self._initialize_result(session)
        headers = [
            ("content-type", "application/json"),
            ("mcp-session-id", session.session_id),
            ("mcp-channel-token", session.record.channel_token),
        ]
        try:
            await conn.send(conn.http.send_response(200, headers, encode_result(req.id, result)))
        except BaseException:
            # The client never learnt the session id: nobody can use the session.
            with trio.CancelScope(shield=True):
                await self._end_session(session)
            raise

    async def _initialize_session(
        self, req: Request, session: Session | None, principal: str
    ) -> Session:
        asked = parse_initialize(req)
        if session is None:
            session = await self._new_session(asked.version, principal, req.id)
        session.client_capabilities = asked.capabilities
        session.client_info = asked.client_info
        return session

    def _initialize_result(self, session: Session) -> dict[str, Any]:
        caps = capabilities(self.app)
        caps["experimental"] = {REBIND_METHOD: {"header": "Mcp-Channel-Token"}}
        return initialize_result(
            session.record.protocol_version,
            caps,
            name=self.app.name,
            server_version=self.app.version,
            instructions=self.app.instructions,
        )

    @staticmethod
    def _primes(session: Session, header_version: str) -> bool:
        return primes_streams(session.record.protocol_version, header_version)

    def _notification(self, session: Session, msg: Notification) -> None:
        if msg.method == "notifications/initialized":
            session.handle(SessionInput.INITIALIZED)
        elif msg.method == "notifications/cancelled":
            rid = (msg.params or {}).get("requestId")
            scope = session.running.get(rid) if isinstance(rid, int | str) else None
            if scope is not None:
                scope.cancel()

    # ---------------------------------------------------------------- execution
    def _runs_now(self, plan: _Plan) -> bool:
        """Can ``plan`` be answered in the connection's task, with no handler task?

        Yes for a replay (nothing executes) and for a ``tools/call`` of a tool that
        never suspends (:func:`weir.engine._app.never_suspends`), when the store is
        process-local (its calls never block either).  Such a call cannot be
        cancelled half-way, observe its task, or outlive a dropped connection, so
        running it here changes nothing a client can see -- except the latency.
        """
        if self.store.shared:
            return False
        return plan.replay is not None or inline_tool(self.app, plan.request) is not None

    async def _answer_or_context(
        self, session: Session, plan: _Plan, handle: StreamHandle | None
    ) -> bytes | Context:
        """What both execution paths do first: the answer that needs no handler, or
        the :class:`Context` to run it with (counted as an execution if it is a call).

        Needing no handler: a replay from the gate, or the refusal of a request id
        already running -- which releases the key this delivery claimed, so a retry
        under that key may run.
        """
        req = plan.request
        if plan.replay is not None:
            return plan.replay
        if req.id in session.running:
            if plan.key is not None:
                await self._finish_call(session, plan.key, None)
            return _id_in_use(req.id)
        if plan.key is not None:
            self.metrics.executions += 1
        meta = (req.params or {}).get("_meta")
        return Context(
            session, req.id, handle, meta if isinstance(meta, dict) else None, state=self.state
        )

    async def _answer_now(
        self, session: Session, plan: _Plan, handle: StreamHandle | None
    ) -> bytes:
        """Execute (or replay) a plan :meth:`_runs_now` accepted; record it in the gate."""
        ready = await self._answer_or_context(session, plan, handle)
        if isinstance(ready, bytes):
            return ready
        req = plan.request
        try:
            payload = encode_result(req.id, call_tool_now(self.app, req.params or {}, ready))
            payload = self._fit(req, payload, handle)
        except Exception as exc:
            payload = _failure(req, exc)
        if plan.key is not None:
            await self._finish_call(session, plan.key, payload)
        return payload

    async def _run_now(
        self, session: Session, plan: _Plan, handle: StreamHandle, *, primes: bool
    ) -> bool:
        """Answer a lone request on an SSE stream without a handler task, if it can be.

        Returns False (having done nothing) unless :meth:`_runs_now` accepts the
        plan.  Otherwise the answer is computed here and its frames (the priming
        event first, if ``primes``) go into the log at once when credit allows --
        so the writer finds the final frame on its first look and sends head,
        frames and terminator in one write.  When a frame would have to wait for
        credit, a task enqueues them instead, in order, and the writer waits.
        """
        if not self._runs_now(plan):
            return False
        try:
            text = (await self._answer_now(session, plan, handle)).decode()
        except BaseException:
            session.done()
            raise
        if primes and not handle.try_send_now(""):
            assert self._handlers is not None
            self._handlers.start_soon(self._deliver, session, handle, True, text)
        elif handle.try_respond_now(text):
            session.done()
        else:
            assert self._handlers is not None
            self._handlers.start_soon(self._deliver, session, handle, False, text)
        return True

    async def _deliver(
        self, session: Session, handle: StreamHandle, prime: bool, payload: str
    ) -> None:
        """Enqueue an answer computed by :meth:`_run_now` when it has to wait for credit."""
        try:
            if prime:
                await handle.send("")
            await handle.respond(payload)
        except StreamLost:
            pass
        finally:
            session.done()

    def _fit(self, req: Request, payload: bytes, handle: StreamHandle | None) -> bytes:
        """``payload``, or the ``result_too_large`` error if it would not fit the credit.

        One response larger than the session's whole byte credit could never be
        sent within it: it is refused (and that refusal is the call's recorded
        outcome, so a retry does not run it again) rather than queued past the bound.
        """
        limit = self.config.credit.bytes
        if len(payload) + 512 <= limit:
            return payload
        size = handle.log.size_of(payload.decode()) if handle is not None else len(payload)
        if size + (0 if handle is not None else 256) <= limit:
            return payload
        self.metrics.refused(str(Reason.RESULT_TOO_LARGE))
        return encode_error(
            req.id,
            INTERNAL_ERROR,
            f"the result ({size} bytes) is larger than this server's per-session credit "
            f"({limit} bytes); the server's operator can raise --credit-bytes",
            {"reason": str(Reason.RESULT_TOO_LARGE), "size": size, "limit": limit},
        )

    async def _execute(
        self, session: Session, plan: _Plan, handle: StreamHandle | None
    ) -> bytes | None:
        """Run one request's handler; the encoded response, or ``None`` if cancelled."""
        ready = await self._answer_or_context(session, plan, handle)
        if isinstance(ready, bytes):
            return ready
        req = plan.request
        payload: bytes | None = None
        with trio.CancelScope() as scope:
            session.running[req.id] = scope
            session.started[req.id] = trio.current_time()
            try:
                payload = encode_result(req.id, await dispatch(self.app, session, req, ready))
                payload = self._fit(req, payload, handle)
            except StreamLost:
                payload = None
            except Exception as exc:
                payload = _failure(req, exc)
            except BaseException:
                if not scope.cancel_called:
                    # Not the client's cancellation: this process is going away under
                    # the call (shutdown).  Say so, durably, before letting go.
                    await self._interrupted(session, plan, handle)
                raise
            finally:
                session.running.pop(req.id, None)
                session.started.pop(req.id, None)
        result = None if scope.cancelled_caught else payload
        if plan.key is not None:
            single = handle is not None and handle.sink is not None and handle.outstanding == 1
            if result is not None and single:
                plan.deferred = True  # the final append records it: one round trip less
            else:
                await self._finish_call(session, plan.key, result)
        return result

    async def _interrupted(
        self, session: Session, plan: _Plan, handle: StreamHandle | None
    ) -> None:
        """Answer a call this process abandons at shutdown, without ever re-running it.

        The call may have had effects, so releasing its key (and letting a retry run
        it again) would risk a duplicate; leaving the claim RUNNING would leave every
        retry hanging.  Instead its outcome becomes an error with reason
        ``interrupted``: stored in the gate (a retry on any replica gets it) and,
        where the stream is shared, appended as the stream's final event (a resume
        on another replica gets it).  Best effort, bounded, shielded from the
        cancellation that brought us here.
        """
        req = plan.request
        payload = encode_error(
            req.id,
            SERVER_ERROR,
            INTERRUPTED_MESSAGE,
            {"reason": str(Reason.INTERRUPTED)},
        )
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            if handle is not None and handle.sink is not None and handle.outstanding == 1:
                with contextlib.suppress(Exception):
                    await handle.respond(payload.decode(), call_key=plan.key)
            if plan.key is not None:
                await self._finish_call(session, plan.key, payload)

    async def _finish_call(
        self, session: Session, key: str, payload: bytes | None, *, stored: bool = False
    ) -> None:
        """Store the call's outcome in the gate (a cancelled call releases its key)."""
        if not stored and not self.store.shared:
            # The process-local store never blocks: no shield or timeout to set up.
            await self.store.finish_call(session.record.principal, session.session_id, key, payload)
        elif not stored:
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await self.store.finish_call(
                        session.record.principal, session.session_id, key, payload
                    )
            except (StoreUnavailable, SessionGone):
                log.warning("could not record the outcome of call %s in the store", key)
        if payload is not None and self.store.shared:
            session.keep_result(key, payload)
        done = session.calls.pop(key, None)
        if done is not None:
            done.set()

    async def _prime_then_run(
        self, session: Session, handle: StreamHandle, plans: list[_Plan]
    ) -> None:
        try:
            await handle.send("")  # the priming event: an id and empty data
        except BaseException as exc:
            # Neither call has started: their keys go back, so a retry runs them.
            await self._release_unstarted(session, plans)
            session.done(len(plans))
            if isinstance(exc, StreamLost):
                return
            raise
        assert self._handlers is not None
        for plan in plans:
            self._handlers.start_soon(self._run_request, session, plan, handle)

    async def _run_request(self, session: Session, plan: _Plan, handle: StreamHandle) -> None:
        try:
            payload = await self._execute(session, plan, handle)
            if plan.deferred and plan.key is not None and payload is not None:
                try:
                    await handle.respond(payload.decode(), call_key=plan.key)
                    await self._finish_call(session, plan.key, payload, stored=True)
                except BaseException:
                    # The final append failed: record the outcome on its own.
                    await self._finish_call(session, plan.key, payload)
                    raise
            else:
                await handle.respond(payload.decode() if payload is not None else None)
        except StreamLost:
            pass
        except Exception:
            # Never let one request take the handler nursery (the server) down.
            log.exception("delivering the response to %r failed", plan.request.id)
            if handle.log.state is not StreamState.CLOSED:
                handle.handle(StreamInput.ABORT)
        finally:
            session.done()

    # ---------------------------------------------------------------- GET / DELETE
    async def _get(self, conn: Connection, get: OpenStream) -> None:
        session = await self._session(conn.principal, get.ctx.session_id)
        token = self._channel(session, get.ctx)
        await self._prove_channel(session, token, "a GET stream")
        cursor = get.last_event_id
        headers = (*SSE_HEADERS, ("mcp-session-id", session.session_id))
        if cursor is not None and self.config.resume == "off":
            raise RemoteProtocolError(
                "this server does not resume streams (resumption policy 'off')",
                http_status=409,
                reason=Reason.CURSOR_UNKNOWN,
            )
        if cursor is None:
            handle = session.standalone
            if handle is None or handle.log.state is StreamState.CLOSED:
                # None yet, or the old one ended (e.g. fenced by a rebind): a new one.
                epoch = await self.store.allocate_epoch(
                    session.record.principal, session.session_id, token[0] if token else 0
                )
                handle = self._open_stream(session, epoch, StreamKind.STANDALONE, token)
            elif handle.log.state is StreamState.LIVE_ATTACHED:
                raise RemoteProtocolError(
                    "this session already has an open GET stream",
                    http_status=409,
                    reason=Reason.STREAM_CONFLICT,
                )
            next_seq = handle.log.next_seq
            if self._primes(session, get.ctx.protocol_version) and self.config.resume != "off":
                self._handlers_start(handle.send, "")
        else:
            try:
                log_ = session.streams.get(cursor)
            except RemoteProtocolError:
                if not (self.store.shared and self.config.resume == "shared"):
                    raise
                await self._replay_from_store(conn, session, cursor, token, headers)
                return
            if log_.binding != (token[0] if token else 0):
                raise channel_refusal(
                    ChannelVerdict.UNBOUND,
                    None,
                    "this cursor was issued on another channel; rebind to resume it",
                )
            handle = session.handle_for(log_)
            next_seq = log_.cursor_after(cursor)
            handle.close_retry_ms = None  # a close asked of an earlier connection is done with
            if handle.writer_scope is not None:
                # The old connection is presumed dead: the newest reader wins.
                handle.writer_scope.cancel()
                handle.writer_scope = None
                if handle.log.state in (StreamState.LIVE_ATTACHED, StreamState.FINAL_ATTACHED):
                    handle.handle(StreamInput.DETACH)
        await write_stream(
            conn, session, handle, next_seq, headers, keepalive=self.config.sse_keepalive
        )

    async def _replay_from_store(
        self,
        conn: Connection,
        session: Session,
        cursor: EventId,
        token: tuple[int, str] | None,
        headers: tuple[tuple[str, str], ...],
    ) -> None:
        """Serve a cursor of a stream another replica produced: replay, then tail (event ids).

        Exactly the events after the cursor, in order; then live events as the
        producing replica appends them, until the final one.  Unknown or trimmed
        cursors are refused (409 ``cursor_unknown``) -- never a resume from head.
        """
        store, principal, sid = self.store, session.record.principal, session.session_id
        info = await store.stream_info(principal, sid, cursor.epoch)
        if info is None:
            raise RemoteProtocolError(
                f"no stream with epoch {cursor.epoch} in this session",
                http_status=409,
                reason=Reason.CURSOR_UNKNOWN,
            )
        if info.binding != (token[0] if token else 0):
            raise channel_refusal(
                ChannelVerdict.UNBOUND,
                None,
                "this cursor was issued on another channel; rebind to resume it",
            )
        events = await store.read_events(principal, sid, cursor.epoch, cursor.seq)
        if events is None:
            raise RemoteProtocolError(
                f"event {cursor} is not held for this session",
                http_status=409,
                reason=Reason.CURSOR_UNKNOWN,
            )
        shape = StreamLog(cursor.epoch, StreamKind.REQUEST)
        http = conn.http
        await conn.send(http.start_stream(200, headers))
        after, delay = cursor.seq, 0.01
        done = info.finished and cursor.seq >= info.last_seq  # nothing more will come
        keepalive = self.config.sse_keepalive
        quiet_since = last_event = trio.current_time()
        lease, last_check = self.config.claim_lease, -math.inf
        with trio.move_on_after(self.config.credit.liveness_timeout * 10):
            while not done and not self._closing and not session.closed:
                if not events and keepalive is not None:
                    if trio.current_time() - quiet_since >= keepalive:
                        await conn.send(http.send_stream_data(KEEPALIVE_COMMENT))
                        quiet_since = trio.current_time()
                else:
                    quiet_since = trio.current_time()
                if events:
                    data = b"".join(
                        encode_comment(f"replica={e.replica or self.replica_id}", blank_line=False)
                        + shape.frame(e.seq, e.data.decode())
                        for e in events
                    )
                    await conn.send(http.send_stream_data(data))
                    after = events[-1].seq
                    delay = 0.01
                    last_event = trio.current_time()
                    if events[-1].final:
                        break
                else:
                    # Silence for a whole lease: is the replica producing this stream
                    # still alive?  If its claim's lease ran out, the call's outcome
                    # becomes ``interrupted`` and its final event arrives next read.
                    now = trio.current_time()
                    if now - last_event >= lease and now - last_check >= lease / 2:
                        last_check = now
                        with contextlib.suppress(StoreUnavailable):
                            await store.expire_claim(principal, sid, cursor.epoch)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.25)
                got = await store.read_events(principal, sid, cursor.epoch, after)
                if got is None:
                    break
                events = got
        await conn.send(http.end_stream())

    def _handlers_start(self, fn: Callable[..., Any], *args: Any) -> None:
        async def guarded() -> None:
            try:
                await fn(*args)
            except StreamLost:
                pass
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__qualname__", fn))

        assert self._handlers is not None
        self._handlers.start_soon(guarded)

    async def _delete(self, conn: Connection, delete: DeleteSession) -> None:
        session = await self._session(conn.principal, delete.ctx.session_id)
        await self._prove_channel(session, self._channel(session, delete.ctx), "DELETE")
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
            body = self.metrics.render(self.sessions, gate=self.gate, budget=self.budget).encode()
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
        session = await self._new_session("2024-11-05", conn.principal)
        epoch = await self.store.allocate_epoch(session.record.principal, session.session_id)
        handle = self._open_stream(session, epoch, StreamKind.LEGACY, None)
        handle.log.emit_ids = False  # 2024-11-05 has no resumption
        endpoint = f"{self.config.legacy_messages_path}?session_id={session.session_id}"
        await handle.send(endpoint, event="endpoint")
        try:
            await write_stream(
                conn, session, handle, 0, SSE_HEADERS, keepalive=self.config.sse_keepalive
            )
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
        messages, _ = decode_body(request.body, allow_batch=True, max_batch=self.config.max_batch)
        session = await self._session(conn.principal, sid)
        legacy = next(
            (h for h in session.handles.values() if h.log.kind is StreamKind.LEGACY), None
        )
        if legacy is None:
            raise session_refusal(sid)
        requests = await self._absorb(session, messages)

        async def run(_: int, plan: _Plan) -> None:
            if plan.request.method == "initialize" and plan.replay is None:
                await self._legacy_initialize(session, plan.request, legacy)
            else:
                legacy.outstanding += 1
                await self._run_request(session, plan, legacy)

        if len(requests) == 1:
            plans = await self._admit_and_plan(
                session, requests, headers.get("idempotency-key"), None
            )
            self._handlers_start(run, 0, plans[0])
        elif requests:
            # Every entry waits for admission on its own, after the 202.
            self._handlers_start(self._admit_each, session, requests, None, run)
        await conn.send(conn.http.send_response(202, ()))

    async def _legacy_initialize(
        self, session: Session, req: Request, handle: StreamHandle
    ) -> None:
        try:
            await self._initialize_session(req, session, session.record.principal)
            payload = encode_result(req.id, self._initialize_result(session))
        except RemoteProtocolError as exc:
            payload = encode_error(req.id, exc.code, exc.message, exc.error_data())
        try:
            with contextlib.suppress(StreamLost):
                await handle.send(payload.decode())
        finally:
            session.done()

    # ---------------------------------------------------------------- the writer


@dataclass(slots=True)
class _Plan:
    """What the idempotency gate decided for one request."""

    request: Request
    key: str | None = None  # set: this delivery executes; its outcome goes to the gate
    replay: bytes | None = None  # set: answer with this stored response, execute nothing
    epoch: str | None = None  # the epoch the store allocated with the claim
    deferred: bool = False  # the response's store append also records it in the gate


def _failure(req: Request, exc: Exception) -> bytes:
    """The JSON-RPC error for a handler that raised (logged unless it is an McpError)."""
    if isinstance(exc, McpError):
        return encode_error(req.id, exc.code, exc.message, exc.data)
    log.exception("handler for %s failed", req.method)
    return encode_error(req.id, INTERNAL_ERROR, f"internal error in {req.method}")


@contextlib.asynccontextmanager
async def _no_lifespan() -> AsyncIterator[None]:
    yield None


def _auth_refusal(
    auth: Authorization, status: int, reason: Reason, message: str, error: str | None = None
) -> RemoteProtocolError:
    challenge = auth.challenge(error, message if error else None)
    return RemoteProtocolError(
        message,
        http_status=status,
        reason=reason,
        code=SERVER_ERROR,
        headers=(("www-authenticate", challenge),),
    )


def _error_of(req: Request, exc: RemoteProtocolError) -> bytes:
    """A refusal as the JSON-RPC error answering ``req`` (inside a batch's response)."""
    return encode_error(req.id, exc.code, exc.message, exc.error_data())


def _store_unavailable(config: ServerConfig) -> RemoteProtocolError:
    return RemoteProtocolError(
        "the session store is unavailable; nothing was executed",
        http_status=503,
        reason=Reason.STORE_UNAVAILABLE,
        code=SERVER_ERROR,
        retry_after_ms=config.retry_ms,
    )


def _id_in_use(request_id: RequestId) -> bytes:
    return encode_error(
        request_id,
        INVALID_REQUEST,
        f"request id {request_id!r} is already in use",
        {"reason": str(Reason.INVALID_REQUEST)},
    )


def _only_disconnects(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in exc.exceptions)
    return isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | PeerGone)


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
