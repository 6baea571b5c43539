"""Server configuration, and the listening sockets it asks for."""

from __future__ import annotations

import math
import resource
import ssl
from dataclasses import dataclass, field

import trio

from weir.common import principal_session_limit
from weir.common._unix import bind_unix
from weir.protocol import LOOPBACK_HOSTS, CreditLimits, EndpointConfig, HttpLimits
from weir.protocol.forwarded import TrustedProxies
from weir.protocol.resume import RESUME_POLICIES

from ._auth import Authorization


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
        park_idle_after: idle seconds after which a keep-alive connection (plain TCP,
            accepted by the server's listener) is held without a task of its own
            until its next request, saving about 4.7 KiB per idle connection
            (``engine._parking``); 0: never.
        head_timeout: seconds a request head may take, from its first byte to its
            blank line (408 and close beyond; a trickled header is cut here).
        body_timeout: seconds a request body may take after its head (408 and close).
        linger_timeout: after a refusal that closes a connection whose peer is still
            sending (408, 413, 431, 503 ``overloaded``), seconds the server keeps
            reading and discarding before it closes, so the peer reads the refusal
            rather than a TCP reset (0: close at once).
        max_connections: connections served at once; past it the server stops
            accepting (the kernel's backlog holds the rest) after closing idle
            keep-alive connections to make room.  ``None``: the process's open-file
            limit less a reserve (:func:`default_max_connections`).
        max_sessions: live sessions in this process; ``initialize`` beyond it gets
            503 ``session_limit`` with ``Retry-After``.  Existing sessions are
            never refused on its account.
        max_sessions_per_principal: live sessions one principal may hold (429
            ``session_limit`` with ``data.scope`` ``principal`` beyond).  ``None``:
            with ``auth`` set, a sixteenth of ``max_sessions`` (at least 1, at most
            256), so one principal cannot fill the server; without ``auth`` every
            request is one principal, so ``max_sessions``.
        session_idle_timeout: seconds without traffic after which a session with
            nothing running is forgotten (``None``: never).
        initialize_timeout: a session that saw no request or notification after its
            ``initialize`` is forgotten after this many seconds (an abandoned
            ``initialize`` costs at most this long).
        max_batch: most messages in one JSON-RPC batch (2025-03-26); more is 400
            ``batch_too_large``.  Each entry is admitted on its own.
        session_retain_bytes: bytes of replay history and finished results one
            session may keep (over it the oldest history goes first).
        memory_budget: bytes of replay history and finished results all sessions
            together may keep (over it the oldest history, server-wide, goes first).
        max_inbound_bytes: bytes of request heads and bodies all connections
            together may have buffered before their requests are complete; a
            request that would pass it gets 503 ``overloaded`` and its connection
            is closed.
        max_outbound_bytes: bytes of responses every credit owner together may
            hold unacknowledged before new requests are refused 503 ``overloaded``
            (each owner stays within its own ``credit`` too; results of requests
            already admitted may pass it).
        sse_keepalive: seconds between ``:`` comments on a quiet SSE stream, so
            proxies that cut idle streams do not (``None``: never).
        max_stream_events: frames each stream retains for replay (at least the
            frame credit, so no unacknowledged frame is ever dropped).
        max_closed_streams: finished streams each session keeps for replay.
        in_progress_wait: seconds a duplicate of a running call waits before 409.
        claim_lease: with a shared store, seconds a running call's claim lives unless
            its replica renews it (every third of that); once it runs out (the
            replica died), retries and resumes get ``interrupted``.
        retry_ms: the ``retry:`` hint sent when the server ends a stream early.
        shutdown_grace: seconds running handlers get to finish at shutdown.
        principal: the principal of every request when ``auth`` is not set.
        retry_window: sessionless calls without an ``Idempotency-Key``: seconds within
            which the very same request (same JSON-RPC id, method and params) from the
            same principal is taken for a gateway's retry and answered from the first
            delivery instead of run again (0: off).  Only for deployments where each
            principal is one client: two clients of one principal sending the same
            request inside the window would share one answer.  Refused without
            ``auth`` (every anonymous client is the same principal).
        state_keys: keys (32 bytes each) that seal sessionless request state; the
            first seals, all open (rotation).  Empty: a random key per process, so
            replicas behind one balancer must share keys to continue each other's
            rounds.
        task_ttl: seconds a task stays readable after its last change (the tasks
            extension's ``ttlMs``).
        task_poll_ms: the ``pollIntervalMs`` suggested to clients polling a task.
        max_tasks_per_principal: tasks one principal may hold at once (unexpired,
            terminal ones included); a call past it is 429 ``task_limit``.
        max_task_result_bytes: the largest result a task keeps; a larger one ends
            the task ``failed`` with ``result_too_large``.
        auth: OAuth resource-server settings (:class:`~weir.engine.Authorization`);
            ``None``: no authentication, every request is ``principal``.
        resume: the resumption policy: ``shared`` (events go to the store before
            the wire; any replica replays), ``pinned`` (this process's buffer; a
            cursor not in it is 409) or ``off`` (no event ids; any cursor is 409).
        replica_id: names this process in ``: replica=<id>`` comments (default:
            random).
        reuse_port: listen with ``SO_REUSEPORT`` so several worker processes share
            the port (``weir serve --workers N``).
        uds: listen on this Unix domain socket path instead of ``host``/``port``
            (see :mod:`weir.common._unix`: a stale socket file is replaced, a live
            server's is not; the file is removed at shutdown).
        legacy_sse_path: the 2024-11-05 HTTP+SSE stream endpoint (``None``: that
            transport is off, and both its paths are routed as unknown paths: 404).
        legacy_messages_path: the 2024-11-05 POST endpoint.
        metrics_path: Prometheus metrics (``None``: off).
        ssl_context: serve HTTPS with this server-side context (``None``: plain
            HTTP); :func:`weir.engine.server_ssl_context` builds the one ``--ssl-*``
            ask for.  Each connection's handshake must finish within
            ``head_timeout``; drain tracking stays byte-exact at TLS record
            boundaries (see docs/serve.md, "TLS").
        forwarded_allow_ips: peers whose ``X-Forwarded-*`` and ``Forwarded`` headers
            are believed, per request (:mod:`weir.protocol.forwarded`; default:
            nobody).  What they say decides the ``Host`` the allow-list checks.
        root_path: the prefix a proxy mounts the server under (``--root-path``).  The
            paths above are the served ones (the command line prepends it to each);
            this names the prefix so the resource metadata is also served under it.
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
    park_idle_after: float = 2.0
    head_timeout: float = 30.0
    body_timeout: float = 60.0
    linger_timeout: float = 2.0
    max_connections: int | None = None
    max_sessions: int = 10_000
    max_sessions_per_principal: int | None = None
    session_idle_timeout: float | None = 3600.0
    initialize_timeout: float = 60.0
    max_batch: int = 64
    session_retain_bytes: int = 4 * 1024 * 1024
    memory_budget: int = 256 * 1024 * 1024
    max_inbound_bytes: int = 256 * 1024 * 1024
    max_outbound_bytes: int = 128 * 1024 * 1024
    sse_keepalive: float | None = 15.0
    max_stream_events: int = 4096
    max_closed_streams: int = 64
    in_progress_wait: float = 5.0
    claim_lease: float = 15.0
    retry_ms: int = 1000
    shutdown_grace: float = 10.0
    principal: str = "anonymous"
    auth: Authorization | None = None
    resume: str = "shared"
    replica_id: str | None = None
    reuse_port: bool = False
    uds: str | None = None
    legacy_sse_path: str | None = "/sse"
    legacy_messages_path: str = "/messages"
    metrics_path: str | None = "/metrics"
    state_keys: tuple[bytes, ...] = ()
    task_ttl: float = 3600.0
    task_poll_ms: int = 1000
    max_tasks_per_principal: int = 100
    max_task_result_bytes: int = 1024 * 1024
    retry_window: float = 0.0
    ssl_context: ssl.SSLContext | None = None
    forwarded_allow_ips: TrustedProxies = field(default_factory=TrustedProxies)
    root_path: str = ""

    def __post_init__(self) -> None:
        self._check_ranges()
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Options that each make sense alone but not together (``ValueError``)."""
        if self.uds is not None and self.reuse_port:
            raise ValueError("a Unix socket (uds) is one process's: not with reuse_port")
        if self.retry_window > 0 and self.auth is None:
            raise ValueError(
                "retry_window needs authorization: without it every client is the one "
                f"principal {self.principal!r}, and a client's request could be answered "
                "with another client's result"
            )
        auth = self.auth
        if self.ssl_context is not None and auth and not auth.resource.startswith("https://"):
            raise ValueError(
                f"the resource identifier {auth.resource!r} must be an https:// "
                "URL when serving TLS (clients compare it with the URL they use)"
            )
        if self.resume not in RESUME_POLICIES:
            raise ValueError(
                f"resume must be one of {', '.join(RESUME_POLICIES)}, got {self.resume!r}"
            )
        if self.max_stream_events < self.credit.frames:
            raise ValueError(
                f"max_stream_events ({self.max_stream_events}) must be >= the frame credit "
                f"({self.credit.frames}): a stream must retain every unacknowledged frame"
            )
        if self.session_retain_bytes > self.memory_budget:
            raise ValueError(
                f"session_retain_bytes ({self.session_retain_bytes}) must be <= "
                f"memory_budget ({self.memory_budget})"
            )

    def _check_ranges(self) -> None:
        """Each number within its own bounds (``ValueError`` naming the option)."""
        if not 0 <= self.retry_window < 86400:
            raise ValueError(
                f"retry_window must be 0 (off) to 86400 seconds, not {self.retry_window}"
            )
        for name in (
            "keepalive_timeout",
            "head_timeout",
            "body_timeout",
            "initialize_timeout",
            "claim_lease",
            "task_ttl",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "max_sessions",
            "max_batch",
            "session_retain_bytes",
            "memory_budget",
            "max_inbound_bytes",
            "max_outbound_bytes",
            "task_poll_ms",
            "max_tasks_per_principal",
            "max_task_result_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.park_idle_after < math.inf:
            raise ValueError(
                f"park_idle_after must be 0 (never) or a number of seconds, "
                f"got {self.park_idle_after!r}"
            )
        if not 0 <= self.linger_timeout <= 60:
            raise ValueError(f"linger_timeout must be 0 (off) to 60, got {self.linger_timeout!r}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.max_sessions_per_principal is not None and self.max_sessions_per_principal < 1:
            raise ValueError("max_sessions_per_principal must be >= 1")
        if self.session_idle_timeout is not None and not self.session_idle_timeout > 0:
            raise ValueError("session_idle_timeout must be > 0 (or None: never)")
        if self.sse_keepalive is not None and not self.sse_keepalive > 0:
            raise ValueError("sse_keepalive must be > 0 (or None: off)")

    @property
    def scheme(self) -> str:
        """``https`` with an :attr:`ssl_context`, else ``http``."""
        return "http" if self.ssl_context is None else "https"

    @property
    def connection_limit(self) -> int:
        """:attr:`max_connections`, or the default derived from the open-file limit."""
        if self.max_connections is not None:
            return self.max_connections
        return default_max_connections()

    @property
    def principal_session_limit(self) -> int:
        """:attr:`max_sessions_per_principal`, or its default (see the attribute)."""
        return principal_session_limit(
            self.max_sessions, self.max_sessions_per_principal, self.auth is not None
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
            max_batch=self.max_batch,
            trusted_proxies=self.forwarded_allow_ips,
            root_path=self.root_path,
        )


#: File descriptors kept free for everything but client connections (the
#: listening sockets, the store's connections, logs, imports).
FD_RESERVE = 64


def default_max_connections() -> int:
    """The open-file limit (``RLIMIT_NOFILE``, soft) less :data:`FD_RESERVE`, at least 16.

    So the process refuses connections by not accepting them, before ``accept``
    could fail with ``EMFILE`` and before the store or a log file could not open.
    """
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 1024 - FD_RESERVE
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(16, soft - FD_RESERVE)


async def _open_listeners(config: ServerConfig) -> list[trio.SocketListener]:
    if config.uds is not None:
        unix, _ = bind_unix(config.uds)
        return [trio.SocketListener(trio.socket.from_stdlib_socket(unix))]
    if not config.reuse_port:
        return await trio.open_tcp_listeners(config.port, host=config.host)
    # Several processes accept on one port; the kernel spreads connections among them.
    infos = await trio.socket.getaddrinfo(
        config.host, config.port, type=trio.socket.SOCK_STREAM, flags=trio.socket.AI_PASSIVE
    )
    family, kind, proto, _, addr = infos[0]
    sock = trio.socket.socket(family, kind, proto)
    try:
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEPORT, 1)
        await sock.bind(addr)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return [trio.SocketListener(sock)]
