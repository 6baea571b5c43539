"""The asyncio runtime's server object and its limits.

Theory of operation
-------------------
:class:`AsyncioDriver` holds the sessions and counts the connections; everything a
client can make it hold has a limit (sessions, connections, idle time, each session's
credit and history).  :func:`weir.asyncio.serve` starts an ``asyncio`` server around it;
:func:`weir.asyncio.run` (``weir serve --runtime asyncio``) also runs the app's
lifespan around serving and stops on a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import ssl
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

from weir.app import MAX_NOTES_RUNNING, NOTE_WAIT, SESSION_CLOSE_WAIT, App
from weir.common import (
    Authorization,
    Metrics,
    StateSealer,
    listen_closing,
    new_key,
    server_identity,
)
from weir.common._listen import deliver_task
from weir.common._memory import ReclaimPacing, reclaim
from weir.common._metrics_share import MetricsShare
from weir.engine._memory_store import MemoryStore
from weir.engine._session_store import SessionStore, replicas_sealer
from weir.engine._tasks import TaskSettings
from weir.protocol import (
    SERVER_ERROR,
    CreditLimits,
    CreditPool,
    EndpointConfig,
    HttpLimits,
    ReadTimeouts,
    Reason,
    RemoteProtocolError,
    raw_error_response,
)
from weir.protocol.budget import RetentionBudget
from weir.protocol.get import StreamRules
from weir.protocol.jsonrpc import Notification, RequestId, encode_error, encode_notification
from weir.protocol.post import PostRules
from weir.protocol.sessionless_post import SessionlessRules
from weir.protocol.states import StreamState
from weir.protocol.tasks import TaskRecord

from ._auth import bind
from ._connection import Connection
from ._keyed import KeyedCalls
from ._listen import Listener
from ._metrics import view
from ._owners import SharedOwners
from ._session import MEMORY_BUDGET, SESSION_RETAIN_BYTES, Session
from ._shared import CLAIM_LEASE, SharedState, memory_store
from ._tasks import AsyncioTasks
from ._tls import accept_tls

log = logging.getLogger(__name__)
T = TypeVar("T")
#: Seconds a listen stream's peer has at shutdown to take its final result.
LISTEN_CLOSE_WAIT = 1.0


async def _bounded(hook: Awaitable[Any], wait: float = SESSION_CLOSE_WAIT) -> None:
    try:
        await asyncio.wait_for(hook, wait)
    except Exception:
        log.exception("an app hook failed or overran its %.0f s", wait)


class AsyncioDriver:
    """Serves one :class:`weir.app.App`; :meth:`connection` is the ``start_server`` callback.

    Everything a client can make the driver hold is bounded:
    ``max_sessions`` (503 ``session_limit`` beyond), ``max_connections`` (503
    ``overloaded``, then close), a session unused for ``idle_timeout`` seconds
    (and running nothing) is forgotten (``None``: never), so is one that saw no
    request or notification within ``initialize_timeout`` seconds of its
    ``initialize`` (an abandoned ``initialize`` costs at most that long), and each
    session holds at most its ``credit`` in unacknowledged frames, and new requests
    get 503 ``overloaded`` while every session's credit together holds
    ``max_outbound_bytes`` (the process's :class:`CreditPool`).  The bytes of
    requests not yet complete, over every connection, stay within
    ``max_inbound_bytes`` (the request whose bytes would pass it gets 503
    ``overloaded`` and its connection is closed).  Reads have the core's
    deadlines (``read_timeouts``: idle keep-alive, a whole head, a body; 408 past
    the last two) and the core's size limits (``limits``: 413, 431, 414).
    With ``always_json`` every request is answered with one JSON body, whatever
    the client's ``Accept`` also lists (``weir serve --json-response``); without
    it a client that accepts SSE gets a stream.  A quiet SSE stream gets a ``:``
    comment every ``sse_keepalive`` seconds (``None``: never).
    A retried ``tools/call`` that finds its first delivery still running waits up
    to ``in_progress_wait`` seconds to replay its response, then gets 409
    ``in_progress``.  ``state`` is what handlers see as ``Context.state`` (what the
    app's lifespan yielded, when :func:`main` runs one).

    The sessionless revision's request state is sealed with ``state_keys`` (the
    first seals, all open; none: on a shared store the one key its replicas agree
    on, see :meth:`request_sealer`; else one drawn now, so states do not outlive
    the process).  With a ``retry_window`` (seconds; authorization needed), a
    sessionless call without an ``Idempotency-Key`` that repeats one of its
    principal's within the window is taken for a retry and replayed (the core's
    rule, as on the Trio engine).

    With ``auth`` every request must carry a bearer token its verifier vouches
    for (see :mod:`._auth`); the principal owns the sessions it opens.  The
    Prometheus text is served at ``metrics_path`` (None: not at all).  One
    principal holds at most ``max_sessions_per_principal`` sessions (429
    ``session_limit`` beyond; None: ``max_sessions``).
    While it drains (:func:`._drain.drain`), requests are refused 503
    ``shutting_down`` and SSE streams end with ``retry: retry_ms``.  The
    2024-11-05 HTTP+SSE transport opens sessions at ``legacy_sse_path`` (None:
    that transport is not served, neither path) and takes their messages at
    ``legacy_messages_path``.

    Session records and the gate's claims and outcomes are kept in ``store``
    (default: a :class:`~weir.engine._memory_store.MemoryStore`, this process only); a
    shared one (:class:`weir.asyncio.AsyncioRedisStore`; :func:`weir.asyncio.open_store`
    opens one from a URL) lets this driver serve one cluster with other replicas,
    Trio or asyncio (``._shared``):
    ``replica_id`` names this one in its claims (default: drawn), whose leases
    last ``claim_lease`` seconds unless renewed; with ``resume="shared"`` every
    stream event is appended to a shared store before it is sent, and a cursor
    another replica issued is replayed from it (``"pinned"``: this process's own
    logs only; ``"off"``: events carry no ids and every cursor is refused 409
    ``cursor_unknown``).  The caller owns the store.

    Replay history and kept results are bounded in bytes, as on the Trio engine:
    ``session_retain_bytes`` per session, ``memory_budget`` across all sessions
    (and, on a memory store, every principal's sessionless gate); over either the
    oldest goes first (see ``._session``), and a new call whose key finds the
    budget full of keys that must stay is refused 503 ``overloaded`` (a
    ``ValueError`` if either is below 1 byte, or the first above the second).

    With ``ssl_context`` every connection speaks TLS, its handshake within the
    head deadline, its drain tracking exact at record boundaries (:mod:`._tls`).

    The tasks extension is served with ``tasks``' bounds (default
    :class:`~weir.engine._tasks.TaskSettings`; its lease is ``claim_lease``), its
    records in ``store`` beside the Trio engine's (see :mod:`._tasks`).
    """

    def __init__(
        self,
        app: App,
        endpoint: EndpointConfig,
        credit: CreditLimits | None = None,
        *,
        max_sessions: int = 1000,
        max_connections: int = 1000,
        idle_timeout: float | None = 600.0,
        read_timeouts: ReadTimeouts | None = None,
        state: Any = None,
        in_progress_wait: float = 5.0,
        limits: HttpLimits | None = None,
        always_json: bool = False,
        sse_keepalive: float | None = 15.0,
        state_keys: Sequence[bytes] = (),
        auth: Authorization | None = None,
        metrics_path: str | None = "/metrics",
        retry_ms: int = 1000,
        max_sessions_per_principal: int | None = None,
        legacy_sse_path: str | None = "/sse",
        legacy_messages_path: str = "/messages",
        retry_window: float = 0.0,
        store: SessionStore | None = None,
        replica_id: str | None = None,
        claim_lease: float = CLAIM_LEASE,
        resume: str = "pinned",
        initialize_timeout: float = 60.0,
        max_inbound_bytes: int = 256 * 1024 * 1024,
        max_outbound_bytes: int = 128 * 1024 * 1024,
        session_retain_bytes: int = SESSION_RETAIN_BYTES,
        memory_budget: int = MEMORY_BUDGET,
        ssl_context: ssl.SSLContext | None = None,
        tasks: TaskSettings | None = None,
    ) -> None:
        """Serve ``app`` within the bounds the class docstring lists.

        Raises:
            ValueError: a ``retry_window`` without ``auth``; a retention bound below 1
                byte, or ``session_retain_bytes`` above ``memory_budget``.
        """
        #: Replay history and kept results, in bytes, per session and in total.
        self.budget = RetentionBudget(total=memory_budget, per_owner=session_retain_bytes)
        #: Unacknowledged response bytes of every credit owner (admission's 503 past it).
        self.credit_pool = CreditPool(max_outbound_bytes)
        self.legacy_sse_path, self.legacy_messages_path = legacy_sse_path, legacy_messages_path
        #: The most sessions one principal holds (429 beyond), and how many each holds.
        self.principal_limit = max_sessions_per_principal or max_sessions
        self._per_principal: dict[str, int] = {}
        #: Draining: every new request is refused (see :mod:`._drain`).
        self.closing, self.retry_ms = False, retry_ms
        #: The counters ``GET metrics_path`` renders (see :mod:`._metrics`).
        self.metrics, self.metrics_path = Metrics(runtime="asyncio", tools=app.tools), metrics_path
        if retry_window > 0 and auth is None:
            raise ValueError(
                "retry_window needs authorization: without it every client is the one "
                "anonymous principal, and a client's request could be answered with "
                "another client's result"
            )
        #: Who verifies tokens (None: every request is anonymous).
        self.auth = auth
        bind(auth)
        self.app, self.endpoint, self.state = app, endpoint, state
        self.credit = credit or CreditLimits()
        self.max_sessions, self.max_connections = max_sessions, max_connections
        self.idle_timeout, self.initialize_timeout = idle_timeout, initialize_timeout
        self.ssl_context = ssl_context
        #: Bytes of incomplete requests buffered by all connections, and their cap.
        self.inbound, self.max_inbound_bytes = 0, max_inbound_bytes
        self.read_timeouts = read_timeouts or ReadTimeouts()
        self.limits = limits or HttpLimits()
        self.always_json, self.sse_keepalive = always_json, sse_keepalive
        self.in_progress_wait = in_progress_wait
        #: The session store, and this driver's side of it.
        store = store if store is not None else memory_store()  # (an empty one is falsy)
        if isinstance(store, MemoryStore) and store.budget is None:
            store.budget = self.budget  # (its gates' results count too, as on Trio)
        self.shared = SharedState(
            self,
            store,
            replica_id=replica_id,
            claim_lease=claim_lease,
            resume=resume,
        )
        self.metrics.share = MetricsShare.from_environment(self.shared.replica_id)
        #: Session streams' events carry ids (``resume="off"``: none, and no priming
        #: event: nothing is resumed, as on the Trio engine).
        self.event_ids = resume != "off"
        #: What a GET's and DELETE's, a POST's and a sessionless POST's courses need to
        #: know of this runtime (:meth:`_course_rules`).
        self.stream_rules, self.post_rules, self.sessionless_rules = self._course_rules(
            resume, retry_window, claim_lease
        )
        #: The tasks extension: records in the store, runs here (see :mod:`._tasks`).
        self.tasks = AsyncioTasks(
            app,
            dataclasses.replace(tasks or TaskSettings(), lease=claim_lease),
            store,
            self.shared.replica_id,
            lambda fn, *args: self.spawn(fn(*args), loop=True),
            on_change=self.task_changed,
        )
        self.sealer = StateSealer(tuple(state_keys) or (new_key(),))
        #: No key given on a shared store: the replicas' one key is fetched from the
        #: store when a request first needs it (:meth:`request_sealer`).
        self._key_from_store = store.shared and not state_keys
        self._key_fetch = asyncio.Lock()
        self._init_holdings()
        #: ``app.changed(...)`` from outside a request reaches this driver's sessions.
        self.detach = app.attach_changes(self.changed)

    def _init_holdings(self) -> None:
        """What the driver holds while it serves, empty at the start: sessions,
        sessionless owners, listeners and the tasks it keeps referenced."""
        #: The sessionless idempotency gate, listeners, and keyed calls' runs (a
        #: keyed call outlives its response and its connection; shutdown ends it).
        self.keyed = KeyedCalls(self.shared)
        self.listeners: set[Listener] = set()
        #: The sessionless credit owners: a connection's own, or an authorized
        #: principal's (each ends with the last connection holding it, or is torn
        #: down when its peer stalls).
        self.owners: set[Session] = set()
        #: Of those, the authorized principals' (each shared by its connections).
        self.shared_owners = SharedOwners()
        self._runs: set[asyncio.Task[Any]] = set()
        #: Of those, the loops that run as long as the driver (a shared store's relays
        #: and lease renewals): no work a drain waits for.
        self._loops: set[asyncio.Task[Any]] = set()
        self._reclaims = ReclaimPacing()
        self._identity: dict[str, Any] | None = None
        self.sessions: dict[str, Session] = {}
        self.connections = 0
        self._sweeper: asyncio.TimerHandle | None = None
        #: Session-close hooks still running (kept referenced until they end).
        self._closing: set[asyncio.Task[None]] = set()
        self._notes: set[asyncio.Task[None]] = set()
        #: The connection handlers running (shutdown ends them).
        self._handlers: set[asyncio.Task[Any]] = set()

    def _course_rules(
        self, resume: str, retry_window: float, lease: float
    ) -> tuple[StreamRules, PostRules, SessionlessRules]:
        """What the courses need to know of this runtime, set once: a GET's and a
        DELETE's (authorization proves the channel; a shared store's replays), a
        POST's (JSON for a client that does not accept SSE, or for every client with
        ``always_json``), a sessionless one's (its fallback is read per request)."""
        authorized, shared, json = self.auth is not None, self.shared.shared, self.always_json
        stream = StreamRules(
            resume=resume,
            shared=shared,
            authorized=authorized,
            keepalive=self.sse_keepalive,
            lease=lease,
            give_up_after=self.credit.liveness_timeout * 10,
            replica=self.shared.replica_id,
        )
        wait = self.in_progress_wait
        post = PostRules(
            json_response=json,
            json_unless_sse=True,
            shared=shared,
            priming=self.event_ids,
            authorized=authorized,
            in_progress_wait=wait,
        )
        sessionless = SessionlessRules(
            json_response=json, in_progress_wait=wait, retry_window=retry_window, tasks=True
        )
        return stream, post, sessionless

    async def request_sealer(self) -> StateSealer:
        """The sealer of sessionless request state.  Given no ``state_keys`` on a shared
        store, its key is the one every replica on the store agrees on (the first one
        stored wins, as the Trio engine's), fetched once, when the first request needs
        it: a round that began on another replica, Trio or asyncio, continues here.

        ``weir serve --runtime asyncio`` asks for it at start-up, so its requests
        never wait for it (nor fail for want of it while the store is down).

        Raises:
            StoreUnavailable: the store did not answer (the request is answered 503
                ``store_unavailable``; the next one asks again).
        """
        if self._key_from_store:
            async with self._key_fetch:
                if self._key_from_store:
                    self.sealer = await replicas_sealer(self.shared.store)
                    self._key_from_store = False
        return self.sealer

    def sessionless(self) -> SessionlessRules:
        """The sessionless course's rules: the runtime's, and whether the app has a
        fallback (an app may register one after the driver was made)."""
        rules, app = self.sessionless_rules, self.app
        fallback = app.fallback_fn is not None
        if rules.fallback != fallback or rules.fallback_every_method != app.fallback_every_method:
            rules = dataclasses.replace(
                rules, fallback=fallback, fallback_every_method=app.fallback_every_method
            )
            self.sessionless_rules = rules
        return rules

    def identity(self) -> dict[str, Any]:
        """The identity stamped on every sessionless result (asked of the app once)."""
        if self._identity is None:
            self._identity = server_identity(self.app)
        return self._identity

    def spawn(self, work: Coroutine[Any, Any, T], *, loop: bool = False) -> asyncio.Task[T]:
        """Run ``work`` as the runtime's task (shutdown cancels it; no connection's
        or owner's end does).  With ``loop`` it is a background loop, which a drain
        does not wait for (see :mod:`._drain`)."""
        task = asyncio.get_running_loop().create_task(work)
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        if loop:
            self._loops.add(task)
            task.add_done_callback(self._loops.discard)
        return task

    def end(self, session: Session, kept: int | None = None) -> None:
        """Tear a session down; it is 404 from now on.  The app's session-close
        hooks run in the background, each cancelled after ``SESSION_CLOSE_WAIT``.
        After a heavy session (``RECLAIM_AFTER`` bytes of credit and ``kept`` history
        and results, read before a store's deletion let go of them; None: read now),
        free memory goes back to the OS a second later (at most once a second)."""
        held = session.flow.credit.bytes_in_use
        held += self.budget.owner_held(session.sid) if kept is None else kept
        if self._reclaims.after_end(held, session.loop.time()):
            session.loop.call_later(1.0, self._reclaim)
        session.close()
        self.metrics.session_ended(view(session))
        self.owners.discard(session)  # (a sessionless owner: no hooks, never in the table)
        if self.sessions.pop(session.sid, None) is not None:
            held = self._per_principal.pop(session.principal, 1) - 1
            if held:
                self._per_principal[session.principal] = held
            self.shared.forget(session.sid)
            self._after(self.shared.discard(session))
            for hook in self.app.session_close_fns:
                self._after(_bounded(hook(session.sid)))

    def _reclaim(self) -> None:
        """Return free memory to the operating system, and count it."""
        reclaim()
        self.metrics.reclaims += 1

    def _after(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` of a session's end in the background (shutdown waits for it)."""
        task = asyncio.get_running_loop().create_task(work)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def hand_notes(self, session_id: str, notes: list[Notification]) -> None:
        """A client's notifications for the app: each to its hooks in a task of its own
        (at most ``MAX_NOTES_RUNNING`` at once, each for ``NOTE_WAIT`` s); past the
        bound a notification is dropped."""
        hooks = self.app.notification_fns
        for note in notes:
            if not hooks:
                continue
            if len(self._notes) >= MAX_NOTES_RUNNING:
                self.metrics.notifications_dropped += 1
                continue
            params = dict(note.params or {})
            work = asyncio.gather(*(hook(note.method, params, session_id) for hook in hooks))
            task = asyncio.get_running_loop().create_task(_bounded(work, NOTE_WAIT))
            self._notes.add(task)
            task.add_done_callback(self._notes.discard)

    def changed(self, method: str, uri: str | None) -> None:
        """A handler announced a change: deliver it here and, with a shared store, put
        it on the store's bus for the other replicas (``._shared``)."""
        self.deliver_change(method, uri)
        self.shared.publish_change(method, uri)

    def task_changed(self, principal: str, record: TaskRecord) -> None:
        """A task's record changed here: tell its principal's listeners here that
        follow it and, with a shared store, the other replicas (they read it again)."""
        self.deliver_task(principal, record)
        self.shared.publish_task_change(principal, record.id)

    def deliver_task(self, principal: str, record: TaskRecord) -> None:
        """Give ``record``'s state to each listener here following that task."""
        deliver_task(self.listeners, principal, record)

    def follows(self, task_id: str) -> bool:
        """Whether a listener here follows task ``task_id``."""
        return any(task_id in listener.marks.task_ids for listener in self.listeners)

    def deliver_change(self, method: str, uri: str | None) -> None:
        """Tell every ``subscriptions/listen`` stream here that asked for the change,
        and every session's open GET stream (a resource update only where the
        session subscribed), without waiting."""
        for listener in list(self.listeners):
            listener.notify(method, uri)
        payload = encode_notification(method, {"uri": uri} if uri is not None else None)
        for session in list(self.sessions.values()):
            stream = session.streams.standalone
            if stream is None or stream.state is StreamState.CLOSED:
                continue
            if uri is None or uri in session.caller.subscriptions:
                session.try_append(stream, payload.decode())

    def add_session(self, session: Session) -> None:
        """Register a new session (the caller checked :meth:`check_room`)."""
        self.sessions[session.sid] = session
        principal = session.principal
        self._per_principal[principal] = self._per_principal.get(principal, 0) + 1
        if self._sweeper is None:
            self._sweeper = session.loop.call_later(self._sweep_every(), self._sweep)

    def check_room(self, request_id: RequestId | None, principal: str) -> None:
        """Refuse a new session past ``max_sessions`` (503 ``session_limit``) or past
        ``principal``'s share (429 ``session_limit``; others are unaffected)."""
        if len(self.sessions) >= self.max_sessions:
            status, scope, limit, then = 503, "server", self.max_sessions, "retry later"
            who = "this server"
        elif self._per_principal.get(principal, 0) >= self.principal_limit:
            status, scope, limit, then = (
                429,
                "principal",
                self.principal_limit,
                "end one or retry later",
            )
            who = "this principal"
        else:
            return
        raise RemoteProtocolError(
            f"{who} holds its limit of {limit} sessions; {then}",
            http_status=status,
            reason=Reason.SESSION_LIMIT,
            code=SERVER_ERROR,
            request_id=request_id,
            # (abandoned initializes free their places within the initialize timeout)
            retry_after_ms=int(min(self.initialize_timeout, 30.0) * 1000),
            data={"limit": limit, "scope": scope},
        )

    def _sweep_every(self) -> float:
        """Seconds between sweeps: a quarter of the shorter timeout."""
        idle = self.idle_timeout if self.idle_timeout is not None else math.inf
        return min(idle, self.initialize_timeout) / 4

    def _sweep(self) -> None:
        """Forget sessions that run and write nothing and are idle for ``idle_timeout``,
        or (still provisional: nothing followed their ``initialize``) for
        ``initialize_timeout``.  With a shared store the store decides (``._shared``)."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for session in list(self.sessions.values()):
            busy = session.tasks or session.writers
            due = self.initialize_timeout if session.provisional else self.idle_timeout
            if busy and self.shared.shared:
                self.spawn(self.shared.touch_busy(session))  # busy here: not idle anywhere
            elif not busy and due is not None and now - session.last_seen >= due:
                self.spawn(self.shared.expire(session))  # the store decides
        if self.sessions:
            self._sweeper = loop.call_later(self._sweep_every(), self._sweep)

    async def close_all(self) -> None:
        """End every listen stream (its final result first), every session (their
        handlers are cancelled, their streams end) and every connection, and wait for
        the app's session-close hooks, each bounded by ``SESSION_CLOSE_WAIT``.  (The
        caller has stopped accepting connections.)"""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await self._end_subscriptions()
        for session in list(self.sessions.values()):
            self.end(session)
        for task in (*self._handlers, *self._runs):
            task.cancel()
        waiting = self._closing | self._handlers | self._runs
        if waiting:
            await asyncio.wait(waiting)
        unheard = self.shared.unheard
        if self.shared.shared and len(unheard):  # claims whose answer was lost
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(unheard.give_back(self.shared.store), 5.0)
        self.detach()

    async def _end_subscriptions(self) -> None:
        """End each ``subscriptions/listen`` stream gracefully: its final result, then
        the end of the stream, if its peer takes them within ``LISTEN_CLOSE_WAIT``
        (one whose peer does not read is cut with the rest)."""
        ending = [
            listener
            for listener in list(self.listeners)
            if listener.owner.try_append(
                listener.stream, listen_closing(listener.request.id), final=True
            )
        ]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LISTEN_CLOSE_WAIT
        while any(listener in self.listeners for listener in ending) and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The ``start_server`` callback: serve one connection until it closes (with
        ``ssl_context``, after its TLS handshake: :mod:`._tls`)."""
        if self.connections >= self.max_connections and self.ssl_context is not None:
            writer.transport.abort()  # (no plaintext refusal on a TLS port)
            return
        if self.connections >= self.max_connections:
            self.metrics.refused(str(Reason.OVERLOADED))
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
        self.shared.start()  # (a shared store's relays, on first need)
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
        try:
            if self.ssl_context is None:
                await Connection(self, writer).run(reader)
            else:
                await self._serve_tls(reader, writer, self.ssl_context)
        except asyncio.CancelledError:
            # The connection is over (shutdown, or its session ended while it wrote a
            # stream); the handler ends quietly, not cancelled -- Python 3.11's
            # start_server would log a cancelled handler as an unhandled error.
            writer.transport.abort()
        finally:
            self.connections -= 1
            if me is not None:
                self._handlers.discard(me)

    async def _serve_tls(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext
    ) -> None:
        tls = await accept_tls(reader, writer, context, timeout=self.read_timeouts.head)
        if tls is None:
            writer.transport.abort()
            return
        await Connection(self, tls[1]).run(tls[0])
