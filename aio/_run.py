"""Running the asyncio runtime as a server process: :func:`run` and its settings.

Theory of operation
-------------------
:func:`run` is what ``weir serve --runtime asyncio`` calls once it has parsed and
checked its options (the command line lives with the Trio engine, which this package
never imports).  It blocks:

1. **The loop.**  ``uvloop`` when it can be imported (``pip install 'weir[asyncio]'``),
   the standard library's loop otherwise; :func:`event_loop_name` says which, and
   ``started`` is told.
2. **The lifespan.**  The app's lifespan is entered within ``startup_timeout``
   seconds; what it raises on entry, or its overrunning, is a :class:`StartupFailed`
   whose message is one line saying so.
3. **Serving.**  ``asyncio.start_server`` around an :class:`AsyncioDriver`; then
   ``started(url, loop_name)`` (the command line prints the ``weir: serving`` line).
   A failure to listen (a port in use, a host that does not resolve) raises the
   ``OSError`` itself, before ``started``.
   Out of descriptors or memory, ``accept()`` fails: the loop backs off (asyncio
   retries after a second) and :class:`AcceptFailures` reports it in one line at
   most every ``ACCEPT_LOG_EVERY`` seconds -- back-pressure, not a traceback a try.
4. **Stopping.**  SIGINT or SIGTERM: the listener closes and the driver drains
   (:mod:`._drain`, as the Trio engine does): new requests are answered 503
   ``shutting_down``, running calls get ``shutdown_grace`` seconds to finish, each
   ``subscriptions/listen`` stream gets its final result (bounded) and every SSE
   stream ends with a ``retry:`` field; then every session ends (what still runs is
   cancelled, a keyed sessionless call recorded ``interrupted``), the app's
   session-close hooks run (bounded), the lifespan exits, and :func:`run` returns.
   A second signal cancels whatever is still running at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import signal
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from weir.app import App, load_app
from weir.common import Authorization, declared_authorization, principal_session_limit
from weir.common._metrics_share import PERIOD as PUBLISH_PERIOD
from weir.common._unix import bind_unix, remove_unix
from weir.engine._session_store import SessionStore
from weir.engine._store_errors import StoreUnavailable
from weir.engine._tasks import TaskSettings
from weir.protocol import LOOPBACK_HOSTS, CreditLimits, EndpointConfig, HttpLimits, ReadTimeouts

from ._drain import drain
from ._driver import AsyncioDriver
from ._metrics import publish, publish_every
from ._session import MEMORY_BUDGET, SESSION_RETAIN_BYTES
from ._shared import CLAIM_LEASE, open_store

#: Seconds an app's lifespan may take to start, by default.
STARTUP_TIMEOUT = 60.0
#: Seconds between two reports of failing ``accept()`` calls (as the Trio engine).
ACCEPT_LOG_EVERY = 10.0
#: What asyncio's loop reports, each time (with a traceback), when ``accept()`` fails
#: for want of descriptors or memory; it then pauses the listener and retries.
_ACCEPT_FAILED = "socket.accept() out of system resource"

log = logging.getLogger(__name__)


class StartupFailed(Exception):
    """The server did not start; the message is one line saying why (``weir: ...``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AsyncioConfig:
    """What :func:`run` serves and how much it lets clients hold.

    Attributes:
        host, port: where to listen (port 0: a free one).
        endpoint: the path, the accepted Host/Origin names, JSON answers, batch size.
        limits: request sizes (413, 431, 414).
        read_timeouts: idle keep-alive, head and body deadlines (408), linger.
        credit: each session's drain credit and timers.
        max_connections: connections served at once (503 ``overloaded`` beyond).
        max_sessions: live sessions (503 ``session_limit`` beyond).
        idle_timeout: a session unused this long, running nothing, is forgotten
            (``None``: never).
        initialize_timeout: a session that saw no request or notification this long
            after its ``initialize`` is forgotten (sooner than ``idle_timeout``).
        max_inbound_bytes: bytes of request heads and bodies all connections together
            may buffer before their requests are complete (503 ``overloaded`` beyond,
            and the connection is closed).
        max_outbound_bytes: unacknowledged response bytes every session's credit
            together may hold before new requests get 503 ``overloaded``.
        sse_keepalive: a ``:`` comment on a quiet SSE stream this often (``None``: never).
        startup_timeout: how long the app's lifespan may take to start.
        state_keys: the keys that seal sessionless request state (the first seals,
            all open; none: one drawn at start).
        auth: who verifies bearer tokens (None: the authorization an SDK app
            declares for itself, if any; else every request is anonymous).
        metrics_path: where the Prometheus text is served (None: not at all).
        shutdown_grace: seconds running calls get to finish at shutdown (new
            requests are refused 503 ``shutting_down`` meanwhile).
        retry_ms: the ``retry:`` every open SSE stream ends with at shutdown.
        max_sessions_per_principal: live sessions one principal may hold (429
            beyond; default: with ``auth``, a sixteenth of ``max_sessions``, at
            most 256; without, ``max_sessions``), as on the Trio engine.
        legacy_sse_path, legacy_messages_path: the 2024-11-05 HTTP+SSE transport's
            stream (None: that transport is off, both paths 404) and message paths.
        retry_window: seconds within which a sessionless call without an
            ``Idempotency-Key`` that repeats one of its principal's is replayed (0:
            off; needs ``auth``).
        store: where sessions and the idempotency gate live: ``"memory"`` (this
            process), or a ``redis://``, ``rediss://``, ``redis+cluster://`` URL (a
            store shared with other replicas, Trio or asyncio).
        replica_id: names this process in a shared store's claims (default: drawn).
        claim_lease: seconds a running call's claim in a shared store lives unless
            renewed (a replica that dies is answered ``interrupted`` after it).
        resume: ``"shared"`` (with a shared store, every event is stored before it is
            sent, and any replica replays it), ``"pinned"`` (this process's logs) or
            ``"off"`` (events carry no ids; every cursor is refused).
        reuse_port: listen with ``SO_REUSEPORT``, so that other processes may listen
            on the same port (``weir serve --workers``: the kernel spreads connections).
        session_retain_bytes: bytes of replay history and finished results one
            session may keep (over it its oldest history goes first).
        memory_budget: bytes of replay history and finished results all sessions
            together may keep (over it the oldest history, server-wide, goes first).
        ssl_context: serve HTTPS with this server-side context (None: plain HTTP).
        tasks: the tasks extension's bounds (its lease is ``claim_lease``).
        uds: listen on this Unix domain socket path instead of ``host``/``port``
            (see :mod:`weir.common._unix`: a stale socket file is replaced, a live
            server's is not; the file is removed at shutdown).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    endpoint: EndpointConfig = dataclasses.field(default_factory=EndpointConfig)
    limits: HttpLimits = dataclasses.field(default_factory=HttpLimits)
    read_timeouts: ReadTimeouts = dataclasses.field(default_factory=ReadTimeouts)
    credit: CreditLimits = dataclasses.field(default_factory=CreditLimits)
    max_connections: int = 1000
    max_sessions: int = 1000
    idle_timeout: float | None = 600.0
    initialize_timeout: float = 60.0
    max_inbound_bytes: int = 256 * 1024 * 1024
    max_outbound_bytes: int = 128 * 1024 * 1024
    sse_keepalive: float | None = 15.0
    startup_timeout: float = STARTUP_TIMEOUT
    state_keys: tuple[bytes, ...] = dataclasses.field(default=(), repr=False)
    auth: Authorization | None = None
    metrics_path: str | None = "/metrics"
    shutdown_grace: float = 10.0
    max_sessions_per_principal: int | None = None
    legacy_sse_path: str | None = "/sse"
    legacy_messages_path: str = "/messages"
    retry_window: float = 0.0
    retry_ms: int = 1000
    store: str = dataclasses.field(default="memory", repr=False)  # (a URL may hold a password)
    #: With a Redis store: replicas that must confirm a durable write (``WAIT``).
    store_replicas: int = 0
    store_replica_timeout: float = 0.5
    replica_id: str | None = None
    claim_lease: float = CLAIM_LEASE
    resume: str = "pinned"
    session_retain_bytes: int = SESSION_RETAIN_BYTES
    memory_budget: int = MEMORY_BUDGET
    reuse_port: bool = False
    ssl_context: ssl.SSLContext | None = dataclasses.field(default=None, repr=False)
    tasks: TaskSettings = dataclasses.field(default_factory=TaskSettings)
    uds: str | None = None

    def driver(
        self, app: App, state: Any = None, store: SessionStore | None = None
    ) -> AsyncioDriver:
        """An :class:`AsyncioDriver` serving ``app`` with these settings (on ``store``,
        opened by the caller; default: a memory store)."""
        return AsyncioDriver(
            app,
            self.endpoint,
            self.credit,
            max_sessions=self.max_sessions,
            max_connections=self.max_connections,
            idle_timeout=self.idle_timeout,
            initialize_timeout=self.initialize_timeout,
            max_inbound_bytes=self.max_inbound_bytes,
            max_outbound_bytes=self.max_outbound_bytes,
            read_timeouts=self.read_timeouts,
            state=state,
            limits=self.limits,
            always_json=self.endpoint.json_response,
            sse_keepalive=self.sse_keepalive,
            state_keys=self.state_keys,
            auth=self.auth,
            metrics_path=self.metrics_path,
            retry_ms=self.retry_ms,
            max_sessions_per_principal=principal_session_limit(
                self.max_sessions, self.max_sessions_per_principal, self.auth is not None
            ),
            legacy_sse_path=self.legacy_sse_path,
            legacy_messages_path=self.legacy_messages_path,
            retry_window=self.retry_window,
            store=store,
            replica_id=self.replica_id,
            claim_lease=self.claim_lease,
            resume=self.resume,
            session_retain_bytes=self.session_retain_bytes,
            memory_budget=self.memory_budget,
            ssl_context=self.ssl_context,
            tasks=self.tasks,
        )


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, if uvloop can be imported."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def event_loop_name() -> str:
    """``"uvloop"`` if :func:`run` will use it (it can be imported), else ``"asyncio"``."""
    return "uvloop" if _uvloop_factory() is not None else "asyncio"


class AcceptFailures:
    """The loop's exception handler while serving: a failing ``accept()`` (out of
    descriptors or memory, which the loop itself backs off from) is one line at most
    every ``ACCEPT_LOG_EVERY`` seconds, counting those not reported; everything else
    goes to the loop's default handler."""

    def __init__(self, driver: AsyncioDriver) -> None:
        self.driver = driver
        self.failures = 0
        self._last_log = -math.inf
        self._unlogged = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_FAILED:
            loop.default_exception_handler(context)
            return
        self.failures += 1
        now = loop.time()
        if now - self._last_log < ACCEPT_LOG_EVERY:
            self._unlogged += 1
            return
        exc = context.get("exception")
        more = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
        log.error(
            "accept() failed: %s; backing off while %d connections are open%s",
            getattr(exc, "strerror", None) or exc,
            self.driver.connections,
            more,
        )
        self._last_log, self._unlogged = now, 0


def _runner(main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=_uvloop_factory()) as runner:
        runner.run(main)


def run(
    app: App,
    config: AsyncioConfig,
    *,
    started: Callable[[str, str], None] | None = None,
) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (see the module's theory of operation).

    ``started(url, loop_name)`` is called once the server listens.

    Raises:
        StartupFailed: the app's lifespan raised on entry or overran ``startup_timeout``,
            or the app declares authorization weir cannot enforce.
        OSError: the server could not listen.
    """
    _runner(_serve(app, with_declared_auth(app, config), started))


def with_declared_auth(app: App, config: AsyncioConfig) -> AsyncioConfig:
    """``config`` with the authorization ``app`` declares for itself (an SDK app's
    own token verifier), unless ``config`` has its own.

    Raises:
        StartupFailed: the app declares authorization weir cannot enforce (served
            open it would be silently wrong).
    """
    if config.auth is not None or getattr(app, "security", None) is None:
        return config
    try:
        declared = declared_authorization(app)
    except ValueError as exc:
        raise StartupFailed(f"weir: refusing to serve the app open: {exc}") from None
    return config if declared is None else dataclasses.replace(config, auth=declared)


async def _serve(
    app: App, config: AsyncioConfig, started: Callable[[str, str], None] | None
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()
    forced = False

    def on_signal() -> None:
        nonlocal forced
        if stop.is_set() and main is not None and not forced:
            forced = True
            main.cancel()  # a second signal: stop waiting for anything
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    try:
        async with contextlib.AsyncExitStack() as stack:
            store = await _open_store(
                config.store, config.store_replicas, config.store_replica_timeout
            )
            stack.push_async_callback(store.aclose)
            state = await _enter_lifespan(app, stack, config.startup_timeout)
            driver = config.driver(app, state, store)
            await driver.request_sealer()  # (a shared store's key: before the first request)
            loop.set_exception_handler(AcceptFailures(driver))
            server, url, inode = await _listen(driver, config)
            publisher = None
            if driver.metrics.share is not None:
                publisher = loop.create_task(publish_every(driver, PUBLISH_PERIOD))
            try:
                if started is not None:
                    started(url, event_loop_name())
                await stop.wait()
            finally:
                server.close()  # (not wait_closed: open streams end with their sessions)
                if config.uds is not None:
                    remove_unix(config.uds, inode)
                await drain(driver, config.shutdown_grace)
                await driver.close_all()
                if publisher is not None:
                    publisher.cancel()
                    publish(driver)  # (the last)
    except asyncio.CancelledError:
        if not forced:
            raise
        # The second signal cut the shutdown short (a hook or the lifespan's exit still
        # running was cancelled); the process exits now, as asked.


async def _listen(driver: AsyncioDriver, config: AsyncioConfig) -> tuple[asyncio.Server, str, int]:
    """The listening server, the URL it serves, and (with ``config.uds``) the inode of
    its socket file (else -1).

    Raises:
        OSError: it could not listen.
    """
    if config.uds is not None:
        sock, inode = bind_unix(config.uds)
        server = await asyncio.start_unix_server(driver.connection, sock=sock)
        return server, f"unix:{config.uds}", inode
    server = await asyncio.start_server(
        driver.connection, config.host, config.port, reuse_port=config.reuse_port
    )
    host, port = server.sockets[0].getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "http" if config.ssl_context is None else "https"
    return server, f"{scheme}://{shown}:{port}{config.endpoint.path}", -1


async def _open_store(url: str, replicas: int = 0, replica_timeout: float = 0.5) -> SessionStore:
    """The store ``url`` names, connected (``replicas``: see ``RedisStore.connect``).

    Raises:
        StartupFailed: a malformed URL, or a store that does not answer.
    """
    try:
        return await open_store(url, replicas, replica_timeout)
    except ValueError as exc:
        raise StartupFailed(f"weir: --store: {' '.join(str(exc).split())}") from None
    except (StoreUnavailable, OSError) as exc:
        raise StartupFailed(f"weir: --store: the store did not answer: {_one_line(exc)}") from exc


async def _enter_lifespan(app: App, stack: contextlib.AsyncExitStack, timeout: float) -> Any:
    """Enter ``app``'s lifespan within ``timeout`` seconds; its state.

    Raises:
        StartupFailed: it raised, or did not finish starting in time.
    """
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await stack.enter_async_context(app.lifespan_context())
    except TimeoutError as exc:
        if not deadline.expired():  # the lifespan's own TimeoutError
            raise StartupFailed(
                f"weir: the app's lifespan failed at start-up: {_one_line(exc)}"
            ) from exc
        raise StartupFailed(
            f"weir: the app's lifespan did not finish starting within {timeout:g} s;"
            " find what it waits for, or give it longer with --startup-timeout"
        ) from None
    except Exception as exc:
        raise StartupFailed(
            f"weir: the app's lifespan failed at start-up: {_one_line(exc)}"
        ) from exc


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` (of its first leaf, for a group), on one line."""
    first = exc
    while isinstance(first, BaseExceptionGroup) and first.exceptions:
        first = first.exceptions[0]
    text = " ".join(str(first).split())
    return f"{type(first).__name__}: {text}" if text else type(first).__name__


async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    app: App | None = None,
    path: str = "/mcp",
    credit: CreditLimits | None = None,
    json_only_clients: bool = True,
    state: Any = None,
    store: SessionStore | None = None,
) -> asyncio.Server:
    """Start serving ``app`` (the demo app by default) at ``http://host:port/path``
    (port 0: a free one).

    ``credit`` sets each session's drain credit and timers (the core's defaults
    otherwise).  With ``json_only_clients`` a client whose ``Accept`` lists only
    ``application/json`` is answered with JSON bodies; without it such a POST is 406,
    as the Streamable HTTP transport allows (``weir serve``'s default).  ``store``
    keeps sessions and the gate (see :class:`AsyncioDriver`; the caller closes it).
    """
    hosts = LOOPBACK_HOSTS | {host.lower()}
    endpoint = EndpointConfig(path=path, allowed_hosts=hosts, json_response=json_only_clients)
    driver = AsyncioDriver(app or load_app("demo"), endpoint, credit, state=state, store=store)
    await driver.request_sealer()  # (a shared store's key: before the first request)
    return await asyncio.start_server(driver.connection, host, port)
