"""The Trio server: listeners, one task per connection, admission, handlers, SSE writers.

Theory of operation
-------------------
Each TCP connection gets one task running :meth:`Server._connection`: the small
``receive_some -> receive_data -> next_event -> respond -> send`` loop around an
:class:`~weir.engine._connection.Connection` (the :class:`weir.protocol.HttpConnection` plus
byte-exact send accounting).  All MCP endpoint rules come from
:func:`weir.protocol.route`; the server adds what needs state or I/O: sessions (the
:class:`~weir.engine.SessionStore` plus the live :class:`~weir.engine._session.Session`),
admission, handler tasks and SSE writers.

:class:`Server` is one class composed of a mixin per concern.  This module holds
the class itself -- construction, lifecycle (:meth:`Server.run`, shutdown and the
drain), and the session table (creating, adopting, looking up, sweeping and ending
sessions, and each session's teardown timer) -- and :func:`serve`.  The concerns,
each with its own theory of operation:

* ``engine._connections`` -- connections and HTTP requests: the read loop and its
  deadlines, routing, refusals, authorization, resource metadata, ``/metrics``;
* ``engine._calls`` -- POST: admission, the idempotency gate, batches, JSON mode,
  ``initialize``, notifications and the rebind handshake;
* ``engine._execution`` -- running handlers (in the handler nursery, or inline) and
  recording their outcomes in the gate;
* ``engine._streams`` -- SSE streams: GET, resumption and replay from a shared
  store, DELETE, and the channel-token checks;
* ``engine._legacy`` -- the 2024-11-05 HTTP+SSE transport;
* ``engine._replicas`` -- background work with a shared store (call leases,
  forwarded answers and cancellations);
* ``engine._server_base`` -- what the mixins share: the attributes and the
  cross-mixin methods they may use, declared for the type checker.

**Teardown.**  Every session's credit deadline sits in one heap served by one task
(``engine._timers``); when a session's credit reports DEAD (frames pending, no
progress for the liveness timeout) the session's streams are closed, its handlers
cancelled, its credit released and the session forgotten -- later requests get 404.

Pieces that live in their own modules: the writer (``engine._writer``), channel
tokens (``engine._channel``), configuration and listeners (``engine._config``),
byte-exact send accounting (``engine._connection``), the stores
(``engine._store``, ``engine._redis_store``).

**Shutdown** (:meth:`Server.shutdown`): stop accepting, refuse new requests with
503 ``shutting_down``, let running handlers finish within the grace period, end
every open stream with ``retry:``, then cancel what is left.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from weir.app import SESSION_CLOSE_WAIT, App, Caller
from weir.common import StateSealer, new_key
from weir.protocol import (
    SERVER_ERROR,
    HeadCache,
    ReadTimeouts,
    Reason,
    RemoteProtocolError,
    session_refusal,
)
from weir.protocol.budget import RetentionBudget
from weir.protocol.get import StreamRules
from weir.protocol.jsonrpc import RequestId
from weir.protocol.post import PostRules
from weir.protocol.sessionless_post import SessionlessRules
from weir.protocol.states import CreditState, SessionInput

from ._acks import AckPoller
from ._calls import REBIND_METHOD as REBIND_METHOD
from ._calls import _Calls
from ._changes import _Changes
from ._config import ServerConfig, _open_listeners
from ._connection import Connection
from ._connections import _Connections
from ._declared_auth import declared_authorization
from ._execution import _Execution
from ._keyed import _KeyedCalls
from ._legacy import _Legacy
from ._listen import AcceptGate
from ._memory import trim
from ._metrics import Metrics, redact
from ._owners import _Owners
from ._replicas import _Replicas
from ._server_base import log
from ._session import Session, StreamLost
from ._sessionless import _Sessionless
from ._store import (
    MemoryStore,
    SessionRecord,
    SessionStore,
    StoreUnavailable,
    client_of,
    is_session_id,
)
from ._streams import _Streams
from ._subscriptions import Listener
from ._timers import Deadlines, Timed

#: A session that held at least this much (history, results, credit) is followed by a
#: ``malloc_trim`` when it ends.
_TRIM_AFTER = 256 * 1024


class Server(
    _Connections,
    _Calls,
    _Execution,
    _Streams,
    _Legacy,
    _Replicas,
    _Sessionless,
    _Changes,
    _Owners,
    _KeyedCalls,
):
    """An MCP server for one :class:`~weir.engine.App` (see the module docstring).

    Args:
        app: the application.
        config: server configuration.
        store: the session store (default: a new :class:`~weir.engine.MemoryStore`).
        session_id_factory: makes session ids (default: 32 random bytes, base64url);
            every id it returns must match :data:`~weir.engine._store.SESSION_ID_FORMAT`
            (an id outside it is refused when minted: ``ValueError``).
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
        config = config or ServerConfig()
        if config.auth is None:
            # An app that declares its own authorization (an SDK app's token verifier)
            # is served with it, embedded by hand as by ``weir serve``: never open.
            declared = declared_authorization(app)  # (ValueError: cannot be enforced)
            if declared is not None:
                config = dataclasses.replace(config, auth=declared)
        self.config = config
        self.store: SessionStore = store if store is not None else MemoryStore()
        #: Replay history and kept results, in bytes, per session and in total.
        self.budget = RetentionBudget(
            total=self.config.memory_budget, per_owner=self.config.session_retain_bytes
        )
        if isinstance(self.store, MemoryStore) and self.store.budget is None:
            self.store.budget = self.budget
        self._endpoint = self.config.endpoint()
        #: What a session-era POST's course needs to know of this server's setup.
        self.post_rules = PostRules(
            json_response=self.config.json_response,
            shared=self.store.shared,
            priming=self.config.resume != "off",
            authorized=self.config.auth is not None,
            in_progress_wait=self.config.in_progress_wait,
            retry_ms=self.config.retry_ms,
        )
        #: ... and a sessionless one's (the app's fallback is read again per request).
        self.sessionless_rules = SessionlessRules(
            json_response=self.config.json_response,
            retry_window=self.config.retry_window,
            in_progress_wait=self.config.in_progress_wait,
            retry_ms=self.config.retry_ms,
        )
        self._new_session_id = session_id_factory or (lambda: secrets.token_urlsafe(32))
        self.replica_id = self.config.replica_id or secrets.token_hex(4)
        #: What a GET's and a DELETE's courses need to know of this server's setup.
        self.stream_rules = StreamRules(
            resume=self.config.resume,
            shared=self.store.shared,
            authorized=self.config.auth is not None,
            keepalive=self.config.sse_keepalive,
            lease=self.config.claim_lease,
            give_up_after=self.config.credit.liveness_timeout * 10,
            replica=self.replica_id,
        )
        self.sessions: dict[str, Session] = {}
        self.metrics = Metrics()
        #: Read deadlines by what a connection's peer owes (idle, head, body).
        self._read_timeouts = ReadTimeouts(
            keepalive=self.config.keepalive_timeout,
            head=self.config.head_timeout,
            body=self.config.body_timeout,
            linger=self.config.linger_timeout,
        )
        #: Every session's credit deadline, in one heap served by one task.
        self.deadlines = Deadlines(self._deadline_due)
        #: Every connection's read deadline, in one heap (see ``engine._connections``).
        self.read_deadlines = Deadlines(self._read_due)
        self._reads_on_heap = True
        self._activity_event: trio.Event | None = None
        self._last_seen: dict[str, float] = {}
        #: When this replica last told a shared store it served each session.
        self._last_touch: dict[str, float] = {}
        self._per_principal: dict[str, int] = {}
        #: Validated response heads, shared by every connection of this server.
        self._heads = HeadCache()
        self.acks = AckPoller()
        #: Bytes of incomplete requests buffered by all connections (see
        #: ``ServerConfig.max_inbound_bytes``).
        self.inbound = 0
        #: The connections being served right now (read-only, for introspection: each
        #: one's drain tracking, ``tracker.written``/``acked``, ``meter.exact``).
        self.open_connections: set[Connection] = set()
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
        #: Sessionless era: each connection's credit owner while it lives, the open
        #: ``subscriptions/listen`` streams, and the request-state sealer.
        self.owners: set[Session] = set()
        self.principal_owners: dict[str, Session] = {}
        self._owner_refs: dict[Session, int] = {}
        #: Sessionless keyed calls running here ((principal, key) -> who waits), and
        #: the principals whose gate namespace is known to exist.
        self.keyed_calls: dict[tuple[str, str], trio.Event | None] = {}
        self._known_namespaces: OrderedDict[str, None] = OrderedDict()
        self.subscribers: set[Listener] = set()
        keys = self.config.state_keys or (new_key(),)
        self.sealer = StateSealer(keys)
        self.described_info: dict[str, Any] | None = None
        self.notes_running = 0

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
            if self.store.shared and not self.config.state_keys:
                # Replicas must open each other's request state: one key, in the store.
                key = await self.store.shared_value("request-state-key", new_key())
                self.sealer = StateSealer([key])
            async with self.app.lifespan_context() as state:
                self.state = state
                if listen:
                    self.listeners = await _open_listeners(self.config)
                detach = self.app.attach_changes(self._changed)
                try:
                    await self._run(task_status)
                finally:
                    detach()
                    await self._close_hooks(list(self.sessions))
        finally:
            self.stopped.set()

    async def _close_hooks(self, session_ids: list[str]) -> None:
        """Run the app's session-close hooks for ``session_ids``, together, for at
        most :data:`SESSION_CLOSE_WAIT` seconds; a hook's failure is logged."""
        hooks = self.app.session_close_fns
        if not hooks or not session_ids:
            return

        async def one(hook: Callable[[str], Awaitable[None]], sid: str) -> None:
            try:
                await hook(sid)
            except Exception:
                log.exception("session-close hook %s failed", getattr(hook, "__qualname__", hook))

        # Shielded (a shutdown's cancellation must not skip them), ended by its own deadline.
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + SESSION_CLOSE_WAIT
            async with trio.open_nursery() as nursery:
                for sid in session_ids:
                    for hook in hooks:
                        nursery.start_soon(one, hook, sid)

    async def _run(self, task_status: trio.TaskStatus[Server]) -> None:
        async with trio.open_nursery() as handlers:
            self._handlers = handlers
            handlers.start_soon(self.deadlines.run)  # every session's credit timers
            handlers.start_soon(self._serve_read_deadlines)  # every connection's read deadline
            handlers.start_soon(self.acks.run)  # every connection's unacknowledged bytes
            async with trio.open_nursery() as conns:
                conns.start_soon(self._serve_listeners, conns)
                conns.start_soon(self._sweep_sessions)
                if self.store.shared:
                    conns.start_soon(self._relay_mail)
                    conns.start_soon(self._relay_changes)
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
        # Each wait below re-checks only when a handler ends, a response is enqueued
        # or a writer detaches.  Calls finish when their response is in the log.
        with trio.move_on_after(self.config.shutdown_grace):
            while any(s.running or s.inflight for s in (*self.sessions.values(), *self.owners)):
                await self._activity()
        self._end_subscriptions()
        for session in self.sessions.values():
            for h in session.handles.values():
                h.request_close(self.config.retry_ms)
        with trio.move_on_after(1.0):  # let writers send their retry: and end
            while any(
                h.writer_scope is not None
                for s in self.sessions.values()
                for h in s.handles.values()
            ):
                await self._activity()

    async def _activity(self) -> None:
        """Wait until some session's handler ends or a writer detaches."""
        event = self._activity_event = trio.Event()
        await event.wait()

    def _note_activity(self) -> None:
        event = self._activity_event
        if event is not None:
            self._activity_event = None
            event.set()

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

    # ---------------------------------------------------------------- sessions
    async def _sweep_sessions(self) -> None:
        """Forget idle sessions, and sessions whose ``initialize`` was never followed up.

        A session counts as busy (never idle) while a handler runs for it or a
        writer is attached to one of its streams.  With a shared store, idle here
        is not idle everywhere: the store decides (:meth:`_expire_shared`).
        """
        cfg = self.config
        idle = cfg.session_idle_timeout
        every = max(0.5, min(cfg.initialize_timeout / 4, (idle or 240.0) / 4, 60.0))
        while True:
            await trio.sleep(every)
            now = trio.current_time()
            try:
                await self._sweep_pass(now)
            except StoreUnavailable as exc:  # the rest waits for the next pass
                log.warning("session sweep: store unavailable: %s", exc)

    async def _sweep_pass(self, now: float) -> None:
        """One pass of :meth:`_sweep_sessions`.  Raises StoreUnavailable (shared store)."""
        cfg = self.config
        idle = cfg.session_idle_timeout
        for sid, session in list(self.sessions.items()):
            busy = session.running or any(
                h.writer_scope is not None for h in session.handles.values()
            )
            seen = self._last_seen.get(sid, now)
            if busy:
                self._last_seen[sid] = now
                if self.store.shared:
                    await self._touch_shared(session, now)
            elif self.store.shared:
                due = cfg.initialize_timeout if session.provisional else idle
                if due is not None and now - seen >= due:
                    await self._expire_shared(session)
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

    async def _end_session(self, session: Session, *, forget: bool = False) -> None:
        """End ``session`` here and delete it from the store (``forget``: only this
        process's copy ends; a shared store's record lives on)."""
        sid = session.session_id
        heavy = self.budget.owner_held(sid) + session.credit.bytes_in_use >= _TRIM_AFTER
        session.close()
        self.metrics.session_ended(session)
        now = trio.current_time()
        if heavy and now - self._last_trim >= 1.0:
            self._last_trim = now
            self._handlers_start(self._reclaim)
        if self.sessions.pop(session.session_id, None) is not None:
            if self.app.session_close_fns and self._handlers is not None:
                self._handlers.start_soon(self._close_hooks, [sid])
            principal = session.record.principal
            left = self._per_principal[principal] - 1
            if left > 0:
                self._per_principal[principal] = left
            else:
                self._per_principal.pop(principal, None)
        self._last_seen.pop(session.session_id, None)
        self._last_touch.pop(session.session_id, None)
        if not forget:
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
        session.schedule = self.deadlines.schedule
        session.on_activity = self._note_activity
        session.on_change = self._changed
        store = self.store
        if isinstance(store, MemoryStore):
            session.shed_results = partial(store.shed_results, session.record.principal, sid)

    async def _new_session(
        self,
        version: str,
        principal: str,
        request_id: RequestId | None = None,
        *,
        client: str = "",
    ) -> Session:
        now = trio.current_time()
        self._check_session_room(principal, request_id)
        sid = self._new_session_id()
        if not is_session_id(sid):
            raise ValueError(f"session_id_factory made {sid!r}, outside SESSION_ID_FORMAT")
        record = SessionRecord(
            session_id=sid,
            principal=principal,
            protocol_version=version,
            created_at=now,
            secret=secrets.token_urlsafe(16),
            salt=secrets.token_hex(8),
            client=client,
        )
        await self.store.create_session(record)
        self._last_touch[sid] = now  # the store's record was just born: as good as a touch
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

    def _deadline_due(self, timed: Timed, now: float) -> None:
        """The heap's handler: apply a session's credit timers at ``now``.

        Never blocks (one heap serves every session): a dead session's teardown
        runs in a handler task; a live one is scheduled again at its next deadline.
        """
        session = timed
        assert isinstance(session, Session)
        credit = session.credit
        if credit.handle_timer(now) is CreditState.DEAD:
            log.warning(
                "session %s: no progress for %.1f s with %d frames pending: torn down",
                redact(session.session_id),
                credit.limits.liveness_timeout,
                credit.frames_in_use,
            )
            self.metrics.teardowns += 1
            # A stalled connection here says nothing of the session elsewhere: with a
            # shared store only this copy ends (the record expires by the store's clock).
            self._handlers_start(partial(self._end_session, forget=self.store.shared), session)
            return
        self.deadlines.schedule(session, credit.deadline())

    async def _session(
        self,
        principal: str,
        session_id: str | None,
        request_id: RequestId | None = None,
        *,
        verify: bool = True,
    ) -> Session:
        """``principal``'s live session ``session_id``, or the 404 refusal.

        An id weir never mints (:func:`~._store.is_session_id`) is refused before
        anything is looked up.  A session of another principal is answered exactly
        like one that does not exist (and is left alone).  With a shared store the record is re-read
        (``verify``) so a session deleted or rebound on another replica is seen here;
        a session first seen on this replica is adopted from its record.
        """
        sid = session_id or ""
        if not is_session_id(sid):
            raise session_refusal(sid, request_id)  # not minted here: no store lookup
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
        now = trio.current_time()
        self._last_seen[session.session_id] = now
        session.provisional = False
        if self.store.shared:
            await self._touch_shared(session, now)
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
        capabilities, client_info = client_of(record)  # what its initialize declared
        session.caller = Caller(capabilities, client_info)
        session.handle(SessionInput.INITIALIZED)
        self._register(session, now)
        return session


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
