"""Server configuration, and the listening sockets it asks for."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from protocol import LOOPBACK_HOSTS, CreditLimits, EndpointConfig, HttpLimits

RESUME_POLICIES = ("shared", "pinned", "off")


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
        in_progress_wait: seconds a duplicate of a running call waits before 409.
        retry_ms: the ``retry:`` hint sent when the server ends a stream early.
        shutdown_grace: seconds running handlers get to finish at shutdown.
        principal: the owner recorded for sessions (no authentication yet).
        resume: the resumption policy: ``shared`` (events go to the store before
            the wire; any replica replays), ``pinned`` (this process's buffer; a
            cursor not in it is 409) or ``off`` (no event ids; any cursor is 409).
        replica_id: names this process in ``: replica=<id>`` comments (default:
            random).
        reuse_port: listen with ``SO_REUSEPORT`` so several worker processes share
            the port (``weir serve --workers N``).
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
    in_progress_wait: float = 5.0
    retry_ms: int = 1000
    shutdown_grace: float = 10.0
    principal: str = "anonymous"
    resume: str = "shared"
    replica_id: str | None = None
    reuse_port: bool = False
    legacy_sse_path: str | None = "/sse"
    legacy_messages_path: str = "/messages"
    metrics_path: str | None = "/metrics"

    def __post_init__(self) -> None:
        if self.resume not in RESUME_POLICIES:
            raise ValueError(
                f"resume must be one of {', '.join(RESUME_POLICIES)}, got {self.resume!r}"
            )
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


async def _open_listeners(config: ServerConfig) -> list[trio.SocketListener]:
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
