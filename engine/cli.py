"""The ``weir`` command line.

``weir serve [APP] [--runtime trio|asyncio] [--host H] [--port P] [--path /mcp]
[--json-response] [--log-level L]``

APP is ``module:attribute`` naming an :class:`weir.engine.App` (or a zero-argument
callable returning one, or a server written with the official MCP SDK, which
:func:`weir.app.sdk.from_sdk` wraps), or a built-in name: ``demo`` (default) or
``conformance``; the module is imported from ``--app-dir`` (default: the working
directory) first.  An SDK app that declares its own token verifier is served with
it (see :mod:`weir.engine._declared_auth`) unless ``--auth-*`` options replace it.
With ``--port 0`` a free port is chosen; the first line on stdout is always
``weir: serving http://HOST:PORT/PATH`` (``https://`` with ``--ssl-certfile``).  A
server that cannot start says why in one line on stderr and exits with status 1
(see :mod:`weir.engine._startup`).
SIGINT/SIGTERM shut down gracefully (see ``engine.Server.shutdown``); a second
signal exits at once.

Every option can come from a ``WEIR_*`` environment variable instead (``--max-sessions``:
``$WEIR_MAX_SESSIONS``; the command line wins), see :mod:`weir.engine._cli_env`;
``--reload`` runs the server under a supervisor (:mod:`weir.engine._reload`).

``--runtime asyncio`` serves the app with :mod:`weir.asyncio` instead of Trio (see
:mod:`weir.engine._cli_asyncio`, imported only then), with every option served as on
Trio.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import sys
from collections.abc import Sequence

import trio

import weir
from weir.app import App, load_app
from weir.common import parse_key
from weir.common._access import set_key as set_access_key
from weir.common._logs import configure as configure_logs
from weir.common._memory import tune_allocator
from weir.protocol import CreditLimits, HttpLimits
from weir.protocol.forwarded import TrustedProxies

from ._auth import DEFAULT_ALGORITHMS, Authorization, JwtVerifier
from ._cli_env import blame, document, overlay, typos
from ._cli_routes import add_route_options, route_paths
from ._cli_tls import add_tls_options, ssl_context_from_args
from ._declared_auth import declared_authorization
from ._jwks import screen_keys
from ._memory_store import MemoryStore
from ._reload import add_reload_options, check_reload, run_reloading
from ._server import Server, ServerConfig
from ._session_store import SessionStore
from ._startup import (
    STARTUP_TIMEOUT,
    StartupError,
    describe,
    explain,
    guard_lifespan,
    store_failure,
)
from ._store_errors import StoreUnavailable
from ._store_records import DEFAULT_TIMEOUT

log = logging.getLogger(__name__)


def _positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, not {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="weir", description="weir: an MCP transport engine on Trio")
    p.add_argument("--version", action="version", version=f"weir {weir.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve an MCP application over Streamable HTTP")
    s.add_argument(
        "app",
        nargs="?",
        default="demo",
        help="'demo' (default), 'conformance', or module:attribute (a weir App, a factory"
        " of one, or an official-SDK MCPServer / low-level Server)",
    )
    s.add_argument(
        "--runtime",
        default="trio",
        choices=["trio", "asyncio"],
        help="the event loop that serves the app: 'trio' (default: every option below) "
        "or 'asyncio' (weir.asyncio, on uvloop when installed: for apps whose tools need "
        "asyncio; serves both eras, on the same --store as Trio replicas, and refuses "
        "the options it does not serve)",
    )
    s.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="import APP's module from DIR first (default: the working directory)",
    )
    s.add_argument(
        "--startup-timeout",
        type=_positive_seconds,
        default=STARTUP_TIMEOUT,
        metavar="SECONDS",
        help=f"how long the app's lifespan may take to start (default {STARTUP_TIMEOUT:g})",
    )
    s.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    s.add_argument(
        "--port", type=int, default=8000, help="TCP port; 0 picks a free one (default 8000)"
    )
    s.add_argument("--path", default="/mcp", help="endpoint path (default /mcp)")
    s.add_argument(
        "--uds",
        metavar="PATH",
        help="listen on this Unix domain socket instead of --host/--port (one process; "
        "a stale socket file is replaced, a live server's is not)",
    )
    s.add_argument(
        "--json-response",
        action="store_true",
        help="answer requests with application/json instead of SSE streams",
    )
    s.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept this Host/Origin name (repeatable; '*' disables the check)",
    )
    s.add_argument(
        "--forwarded-allow-ips",
        default="",
        metavar="LIST",
        help="believe X-Forwarded-For/-Proto/-Host and Forwarded only from these peers: "
        "comma-separated IPs and CIDR networks, or '*' (default: nobody; see docs/proxies.md)",
    )
    s.add_argument(
        "--root-path",
        default="",
        metavar="PREFIX",
        help="the prefix a proxy mounts weir under (e.g. /tools): every path weir serves "
        "(--path, /sse, /messages, /metrics, the resource metadata) and every URL it "
        "sends starts with it (default: none)",
    )
    _log_options(s)
    s.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time running calls get to finish on SIGINT/SIGTERM (default 10)",
    )
    st = s.add_argument_group("sessions across processes (see docs/wire.md)")
    st.add_argument(
        "--store",
        default="memory",
        metavar="URL",
        help="'memory' (default: this process only) or a Redis-protocol server: "
        "redis://host:port/db, rediss://... (TLS), redis+cluster://host:port",
    )
    st.add_argument(
        "--resume",
        default="shared",
        choices=["shared", "pinned", "off"],
        help="resumption policy: shared (events in the store; any replica "
        "replays), pinned (this process only; other cursors are 409), off (no "
        "event ids). Default shared",
    )
    st.add_argument(
        "--store-replicas",
        type=int,
        default=0,
        metavar="N",
        help="with a Redis store: replicas that must confirm a claim, an outcome, an event "
        "or a task (WAIT) before weir acts on it; fewer in time is 503 store_unavailable "
        "and nothing runs (default 0: the primary's word)",
    )
    st.add_argument(
        "--store-replica-timeout",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how long to wait for --store-replicas (default 0.5)",
    )
    st.add_argument(
        "--replica-id",
        default=None,
        metavar="ID",
        help="names this replica in ': replica=<id>' SSE comments (default: random)",
    )
    st.add_argument(
        "--retry-window",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="2026-07-28 calls without an Idempotency-Key: the same request (id, method, "
        "params) from the same principal within SECONDS is a gateway retry, answered "
        "from the first run (default 0: off; needs --auth-* and fits only where each "
        "principal is one client)",
    )
    st.add_argument(
        "--state-key-file",
        default=None,
        metavar="PATH",
        help="keys that seal 2026-07-28 request state, one base64 32-byte key per "
        "line; the first seals, all open (rotation). Also: $WEIR_STATE_KEYS "
        "(comma-separated). Default: a random key per process (workers share one)",
    )
    st.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes sharing the port with SO_REUSEPORT (default 1); "
        "more than one needs a shared --store",
    )
    st.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    add_route_options(s)
    add_reload_options(s)
    d = CreditLimits()
    c = s.add_argument_group("drain credit (per session; see docs/half-open.md)")
    c.add_argument(
        "--credit-frames",
        type=int,
        default=d.frames,
        metavar="N",
        help=f"unacknowledged SSE frames a session may hold (default {d.frames})",
    )
    c.add_argument(
        "--credit-bytes",
        type=int,
        default=d.bytes,
        metavar="BYTES",
        help=f"unacknowledged bytes a session may hold (default {d.bytes})",
    )
    c.add_argument(
        "--drain-window",
        type=float,
        default=d.drain_window,
        metavar="SECONDS",
        help="no progress for this long while out of credit means half-open: "
        f"the session's requests get 429 (default {d.drain_window:g})",
    )
    c.add_argument(
        "--liveness-timeout",
        type=float,
        default=d.liveness_timeout,
        metavar="SECONDS",
        help="no progress for this long with frames pending: the session is torn "
        f"down (default {d.liveness_timeout:g})",
    )
    _limit_options(s)
    add_tls_options(s)
    a = s.add_argument_group("authorization (OAuth 2.1 resource server; see docs/authorization.md)")
    a.add_argument("--auth-issuer", metavar="URL", help="accept JWTs from this issuer (iss)")
    a.add_argument(
        "--auth-resource",
        metavar="URL",
        help="this server's resource identifier, the audience tokens must name "
        "(e.g. https://mcp.example.com/mcp)",
    )
    a.add_argument("--auth-jwks-url", metavar="URL", help="the issuer's JSON Web Key Set")
    a.add_argument("--auth-jwks-file", metavar="FILE", help="a static JSON Web Key Set")
    a.add_argument(
        "--auth-scope",
        action="append",
        default=[],
        metavar="SCOPE",
        help="a scope every token must carry (repeatable)",
    )
    a.add_argument(
        "--auth-server",
        action="append",
        default=[],
        metavar="URL",
        help="an authorization server advertised in the metadata (default: the issuer)",
    )
    document(s)
    return p


def _serve_parser(top: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``serve`` sub-command's parser within ``top`` (from :func:`_parser`)."""
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    serve: argparse.ArgumentParser = sub.choices["serve"]
    return serve


def _log_options(s: argparse.ArgumentParser) -> None:
    """``--log-level``, ``--log-format``, ``--access-log`` (see docs/operations.md)."""
    g = s.add_argument_group("logs (see docs/operations.md)")
    g.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error", "critical"],
        help="how much weir logs on stderr (default warning)",
    )
    g.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line (default text)",
    )
    g.add_argument(
        "--access-log",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="one line per HTTP request on logger weir.access at INFO (default on)",
    )


def _setup_logs(args: argparse.Namespace) -> None:
    """Logging as the ``--log-*`` options ask; the worker named on every line."""
    worker = "supervisor" if args.workers > 1 else args.replica_id or "main"
    configure_logs(args.log_level, fmt=args.log_format, worker=worker, access=args.access_log)


def auth_from_args(args: argparse.Namespace) -> Authorization | None:
    """The :class:`Authorization` the ``--auth-*`` options ask for, if any.

    Raises:
        SystemExit: an incomplete or contradictory set of options, or an unreadable
            key set, with what is missing.
    """
    given = [args.auth_issuer, args.auth_resource, args.auth_jwks_url, args.auth_jwks_file]
    if not any(given) and not args.auth_scope and not args.auth_server:
        return None
    if not args.auth_issuer or not args.auth_resource:
        raise SystemExit("weir: --auth-issuer and --auth-resource go together (both needed)")
    if bool(args.auth_jwks_url) == bool(args.auth_jwks_file):
        raise SystemExit("weir: give exactly one of --auth-jwks-url and --auth-jwks-file")
    jwks = None
    if args.auth_jwks_file:
        try:
            with open(args.auth_jwks_file, encoding="utf-8") as f:
                jwks = json.load(f)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"weir: cannot read --auth-jwks-file: {exc}") from None
        usable, dropped = screen_keys(jwks, DEFAULT_ALGORITHMS)
        if not usable:
            # Every token would be refused, forever: an operator's mistake, said now.
            why = f"ignoring {dropped}" if dropped else "it has none"
            raise SystemExit(
                f"weir: --auth-jwks-file holds no key that can verify "
                f"{'/'.join(DEFAULT_ALGORITHMS)} tokens ({why})"
            )
    verifier = JwtVerifier(
        issuer=args.auth_issuer,
        audience=args.auth_resource,
        jwks=jwks,
        jwks_url=args.auth_jwks_url,
    )
    return Authorization(
        verifier=verifier,
        resource=args.auth_resource,
        authorization_servers=tuple(args.auth_server) or (args.auth_issuer,),
        required_scopes=frozenset(args.auth_scope),
    )


def _limit_options(s: argparse.ArgumentParser) -> None:
    d, h = ServerConfig(), HttpLimits()
    g = s.add_argument_group("limits (see docs/limits.md)")
    # (flag, type, default, metavar, help); every one a ServerConfig/HttpLimits field.
    table: list[tuple[str, type, object, str, str]] = [
        (
            "--max-connections",
            int,
            None,
            "N",
            "connections served at once (default: the open-file limit less 64)",
        ),
        (
            "--keepalive-timeout",
            float,
            d.keepalive_timeout,
            "SECONDS",
            "idle keep-alive connections are closed after this",
        ),
        (
            "--park-idle-after",
            float,
            d.park_idle_after,
            "SECONDS",
            "an idle keep-alive connection is held without a task after this; 0: never",
        ),
        (
            "--head-timeout",
            float,
            d.head_timeout,
            "SECONDS",
            "a request head must arrive within this, from its first byte (then 408)",
        ),
        (
            "--body-timeout",
            float,
            d.body_timeout,
            "SECONDS",
            "a request body must arrive within this, after its head (then 408)",
        ),
        (
            "--linger-timeout",
            float,
            d.linger_timeout,
            "SECONDS",
            "a refused connection still sending is drained this long before it closes",
        ),
        ("--max-body-bytes", int, h.max_body_bytes, "BYTES", "largest request body (413)"),
        ("--max-header-bytes", int, h.max_header_bytes, "BYTES", "largest request head (431)"),
        ("--max-header-fields", int, h.max_header_fields, "N", "most header fields (431)"),
        ("--max-target-bytes", int, h.max_target_bytes, "BYTES", "longest request target (414)"),
        (
            "--max-inbound-bytes",
            int,
            d.max_inbound_bytes,
            "BYTES",
            "request bytes all connections may buffer at once (503 beyond)",
        ),
        (
            "--max-outbound-bytes",
            int,
            d.max_outbound_bytes,
            "BYTES",
            "unacknowledged response bytes all clients may hold before new requests get 503",
        ),
        ("--max-sessions", int, d.max_sessions, "N", "live sessions in this process (503)"),
        (
            "--max-sessions-per-principal",
            int,
            None,
            "N",
            "sessions one principal may hold (429; default with auth: --max-sessions/16, max 256)",
        ),
        (
            "--session-idle-timeout",
            float,
            d.session_idle_timeout,
            "SECONDS",
            "sessions idle this long are forgotten; 0: never",
        ),
        (
            "--initialize-timeout",
            float,
            d.initialize_timeout,
            "SECONDS",
            "a session that saw nothing after its initialize is forgotten after this",
        ),
        ("--max-batch", int, d.max_batch, "N", "most messages in one JSON-RPC batch (400)"),
        (
            "--session-retain-bytes",
            int,
            d.session_retain_bytes,
            "BYTES",
            "replay history and results one session keeps",
        ),
        (
            "--memory-budget",
            int,
            d.memory_budget,
            "BYTES",
            "replay history and results all sessions keep",
        ),
        (
            "--claim-lease",
            float,
            d.claim_lease,
            "SECONDS",
            "with a shared store: a running call's claim lives this long unless renewed",
        ),
        (
            "--sse-keepalive",
            float,
            d.sse_keepalive,
            "SECONDS",
            "a ':' comment on quiet SSE streams this often; 0: never",
        ),
        (
            "--task-ttl",
            float,
            d.task_ttl,
            "SECONDS",
            "a task stays readable this long after a change",
        ),
        ("--task-poll-ms", int, d.task_poll_ms, "MS", "the polling interval tasks suggest"),
        (
            "--max-tasks-per-principal",
            int,
            d.max_tasks_per_principal,
            "N",
            "tasks one principal may hold, ended ones included (429)",
        ),
        (
            "--max-task-result-bytes",
            int,
            d.max_task_result_bytes,
            "BYTES",
            "the largest result a task keeps (larger: the task fails)",
        ),
    ]
    for flag, kind, default, metavar, help_ in table:
        shown = (
            ""
            if default is None
            else f" (default {default:g})"
            if kind is float
            else (f" (default {default})")
        )
        g.add_argument(flag, type=kind, default=default, metavar=metavar, help=help_ + shown)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build a :class:`ServerConfig` from parsed ``serve`` arguments (exits with a
    message naming the option when one is out of range or conflicts with another)."""
    credit = _checked_credit(args)
    root = _root_path(args.root_path)
    metrics_path, legacy_sse_path = route_paths(args)  # (under the root path, if any)
    hosts = None
    if args.allow_host:
        base = ServerConfig(host=args.host).endpoint().allowed_hosts
        hosts = frozenset(base | {h.lower() for h in args.allow_host})
    try:
        return ServerConfig(
            auth=auth_from_args(args),
            state_keys=_state_keys(args.state_key_file),
            retry_window=args.retry_window,
            limits=HttpLimits(
                max_header_bytes=args.max_header_bytes,
                max_body_bytes=args.max_body_bytes,
                max_header_fields=args.max_header_fields,
                max_target_bytes=args.max_target_bytes,
            ),
            keepalive_timeout=args.keepalive_timeout,
            park_idle_after=args.park_idle_after,
            head_timeout=args.head_timeout,
            body_timeout=args.body_timeout,
            linger_timeout=args.linger_timeout,
            max_connections=args.max_connections,
            max_sessions=args.max_sessions,
            max_sessions_per_principal=args.max_sessions_per_principal,
            session_idle_timeout=args.session_idle_timeout or None,
            initialize_timeout=args.initialize_timeout,
            max_batch=args.max_batch,
            session_retain_bytes=args.session_retain_bytes,
            memory_budget=args.memory_budget,
            max_inbound_bytes=args.max_inbound_bytes,
            max_outbound_bytes=args.max_outbound_bytes,
            claim_lease=args.claim_lease,
            task_ttl=args.task_ttl,
            task_poll_ms=args.task_poll_ms,
            max_tasks_per_principal=args.max_tasks_per_principal,
            max_task_result_bytes=args.max_task_result_bytes,
            sse_keepalive=args.sse_keepalive or None,
            host=args.host,
            port=args.port,
            path=root + args.path,
            root_path=root,
            legacy_sse_path=None if legacy_sse_path is None else root + legacy_sse_path,
            legacy_messages_path=root + "/messages",
            metrics_path=None if metrics_path is None else root + metrics_path,
            forwarded_allow_ips=_trusted_proxies(args),
            json_response=args.json_response,
            allowed_hosts=hosts,
            shutdown_grace=args.shutdown_grace,
            credit=credit,
            max_stream_events=max(4096, credit.frames),
            resume=args.resume,
            replica_id=args.replica_id,
            reuse_port=args.reuse_port or args.workers > 1,
            ssl_context=ssl_context_from_args(args),
            uds=args.uds,
        )
    except ValueError as exc:
        raise SystemExit(f"weir: {exc}") from None


def _trusted_proxies(args: argparse.Namespace) -> TrustedProxies:
    """``--forwarded-allow-ips``, with a warning when it trusts everyone off loopback."""
    try:
        trusted = TrustedProxies.parse(args.forwarded_allow_ips)
    except ValueError as exc:
        raise SystemExit(f"weir: --forwarded-allow-ips: {exc}") from None
    if trusted.everyone and not _is_loopback(args.host) and not args.reuse_port:
        log.warning(
            "--forwarded-allow-ips '*' on %s: every client that reaches this port chooses "
            "the Host weir checks and the address it logs; list your proxies instead",
            args.host,
        )
    return trusted


def _checked_credit(args: argparse.Namespace) -> CreditLimits:
    """The credit limits of ``serve``'s arguments, once the options that need no
    building are checked (path, port, grace, deployment, store replicas, socket)."""
    if not args.path.startswith("/"):
        raise SystemExit(f"weir: --path must start with '/', got {args.path!r}")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"weir: --port must be 0..65535, got {args.port}")
    try:
        credit = CreditLimits(
            frames=args.credit_frames,
            bytes=args.credit_bytes,
            drain_window=args.drain_window,
            liveness_timeout=args.liveness_timeout,
        )
    except ValueError as exc:
        raise SystemExit(f"weir: bad credit options: {exc}") from None
    if args.shutdown_grace < 0:
        raise SystemExit("weir: --shutdown-grace must be >= 0")
    check_deployment(args.store, args.resume, args.workers)
    if args.store_replicas and args.store == "memory":
        raise SystemExit("weir: --store-replicas needs a Redis store (--store redis://...)")
    if not 0 <= args.store_replicas <= 16 or not 0 < args.store_replica_timeout < DEFAULT_TIMEOUT:
        raise SystemExit(
            "weir: --store-replicas must be 0 to 16, --store-replica-timeout more than 0 and "
            f"less than the store's {DEFAULT_TIMEOUT:g} s deadline"
        )
    if args.uds is not None and (args.workers > 1 or args.reuse_port):
        raise SystemExit(
            "weir: --uds is one process's socket: not with --workers > 1 or --reuse-port"
        )
    return credit


_ROOT_PATH = re.compile(r"(?:/[!$&'()*+,;=:@A-Za-z0-9._~%-]+)+")


def _root_path(text: str) -> str:
    """``--root-path``: ``""``, or ``/segment[/segment...]`` (no trailing slash, no
    query, no spaces).

    Raises:
        SystemExit: anything else, in one line.
    """
    if text and _ROOT_PATH.fullmatch(text) is None:
        raise SystemExit(
            f"weir: --root-path must be empty or /segment[/segment...] without a trailing "
            f"slash, query or spaces (e.g. /tools), got {text!r}"
        )
    return text


def _state_keys(path: str | None) -> tuple[bytes, ...]:
    """The request-state keys from ``--state-key-file``, else ``$WEIR_STATE_KEYS``.

    Kept out of the command line, where ``ps`` would show them to every user.
    """
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                lines = [line.strip() for line in f if line.strip()]
        except OSError as exc:
            raise SystemExit(f"weir: --state-key-file: {exc}") from None
    else:
        lines = [k.strip() for k in os.environ.get("WEIR_STATE_KEYS", "").split(",") if k.strip()]
    try:
        return tuple(parse_key(line) for line in lines)
    except ValueError as exc:
        raise SystemExit(f"weir: request-state keys: {exc}") from None


def check_deployment(store: str, resume: str, workers: int) -> None:
    """Refuse, with the reason, a combination that would be silently wrong (event ids).

    Raises:
        SystemExit: the message says what is wrong and what to use instead.
    """
    if workers < 1:
        raise SystemExit("weir: --workers must be >= 1")
    if store != "memory" and not store.startswith(
        ("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")
    ):
        raise SystemExit(
            f"weir: --store must be 'memory' or a redis://, rediss:// or "
            f"redis+cluster:// URL, got {store.split('@')[-1]!r}"
        )
    check_store_url(store)
    if workers > 1 and store == "memory":
        why = (
            "each worker's memory store is its own: a session created on one worker is "
            "unknown to the others (404), and with --resume shared a cursor replayed "
            "elsewhere would be wrong"
        )
        raise SystemExit(
            f"weir: --workers {workers} with --store memory refused: {why}; "
            "use --store redis://... (or run one worker)"
        )


def check_store_url(url: str) -> None:
    """Refuse a ``--store`` URL whose port or database index cannot be right (a
    database index that is not a number would otherwise silently be 0).

    Raises:
        SystemExit: the message names the part that is wrong.
    """
    if url == "memory":
        return
    scheme, _, rest = url.partition("://")
    rest = rest.rpartition("@")[2]  # (never shown: the password)
    rest = rest.partition("#")[0].partition("?")[0]  # (the query: TLS options, say)
    netloc, slash, path = rest.partition("/")
    shown = f"{scheme}://{netloc}{slash}{path}"
    for node in netloc.split(","):
        host, colon, port = node.rpartition(":") if not node.endswith("]") else (node, "", "")
        if colon and not (port.isdigit() and 0 < int(port) <= 65535):
            raise SystemExit(
                f"weir: --store {shown!r}: the port must be a number from 1 to 65535, got {port!r}"
            )
        if not (host if colon else node):
            raise SystemExit(f"weir: --store {shown!r}: no host")
    db = path.strip("/")
    if db and not db.isdigit():
        raise SystemExit(
            f"weir: --store {shown!r}: the path must be a database index (/0, /1, ...), "
            f"got {'/' + db!r}"
        )
    if db and int(db) and "+cluster" in scheme:
        raise SystemExit(f"weir: --store {shown!r}: a cluster has only database 0")


async def _open_store(url: str, replicas: int = 0, replica_timeout: float = 0.5) -> SessionStore:
    if url == "memory":
        return MemoryStore()
    from ._redis_store import RedisStore

    scheme, _, rest = url.partition("://")
    where = f"{scheme}://{rest.rpartition('@')[2].partition('?')[0]}"  # (no secrets)
    try:
        return await RedisStore.connect(url, replicas=replicas, replica_timeout=replica_timeout)
    except ValueError as exc:
        raise StartupError(f"weir: --store: {' '.join(str(exc).split())}") from None
    except (StoreUnavailable, OSError) as exc:
        raise store_failure(exc, where) from None
    except Exception as exc:  # the store's own refusal (a password, a database index)
        raise store_failure(exc, where) from exc


def _tune_gc() -> None:
    """Collector settings for a long-running server (set by ``weir serve`` only).

    Everything built at start-up (modules, the app, the server) is moved out of the
    collector's sight (``gc.freeze``), and the youngest generation is collected
    less often: per-request garbage is mostly freed by reference counting, and
    fewer, smaller collections mean fewer pauses in the latency tail.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


@dataclasses.dataclass
class _Progress:
    """How far :func:`_run` got: a failure before ``serving`` is a start-up failure."""

    serving: bool = False


async def _run(
    app: App,
    config: ServerConfig,
    store_url: str = "memory",
    progress: _Progress | None = None,
    replicas: tuple[int, float] = (0, 0.5),
) -> None:
    store = await _open_store(store_url, *replicas)
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app, config, store=store).run)
        _tune_gc()
        tune_allocator()
        if progress is not None:
            progress.serving = True
        print(f"weir: serving {server.url}", flush=True)
        if not config.reuse_port:  # (a worker: the parent has warned)
            _warn_if_open(config)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if server.shutting_down:
                    nursery.cancel_scope.cancel()
                    return
                print("weir: shutting down", file=sys.stderr, flush=True)
                server.shutdown()
                nursery.start_soon(_wait_then_cancel, server, nursery)


async def _wait_then_cancel(server: Server, nursery: trio.Nursery) -> None:
    # run() returns once drained; the signal loop is the only other task.
    await server.stopped.wait()
    nursery.cancel_scope.cancel()


def _warn_if_open(config: ServerConfig) -> None:
    """Warn that a server reachable from other machines has no authorization."""
    warning = _open_warning(config)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _load(spec: str, app_dir: str) -> App:
    """The app ``spec`` names, its module imported from ``app_dir`` first (as
    ``python -m`` and uvicorn do: the console script's own ``sys.path`` does not hold
    the working directory)."""
    where = os.path.abspath(app_dir)
    if not os.path.isdir(where):
        # (else the import fails as if the module were missing from a real folder)
        raise SystemExit(f"weir: --app-dir {app_dir!r} is not a directory")
    if where not in sys.path:
        sys.path.insert(0, where)
    try:
        return load_app(spec)
    except LookupError as exc:
        raise SystemExit(f"weir: {exc}") from None
    except Exception as exc:  # the module itself raised on import
        log.debug("loading %s failed", spec, exc_info=exc)
        raise SystemExit(
            f"weir: loading {spec!r} failed: {describe(exc)} (--log-level debug shows where)"
        ) from None


def _with_app_security(app: App, config: ServerConfig, *, warn: bool = True) -> ServerConfig:
    """``config`` with the authorization the app declares for itself, unless the
    command line configures its own; with ``warn``, say what weir does not serve of
    the app (a worker does not: its parent has said it)."""
    for route in getattr(app, "unserved_routes", ()) if warn else ():
        log.warning("the app's route %s is not served by weir (serve it elsewhere)", route)
    try:
        declared = declared_authorization(app)
    except ValueError as exc:
        if config.auth is None:
            raise SystemExit(f"weir: refusing to serve the app open: {exc}") from None
        declared = config.auth
    if declared is None:
        return config
    if config.auth is not None:
        if warn:
            log.warning("the app's own authorization is replaced by the --auth-* options")
        return config
    try:
        return dataclasses.replace(config, auth=declared)
    except ValueError as exc:  # (e.g. an http:// resource served over TLS)
        raise SystemExit(f"weir: the app's own authorization: {exc}") from None


def _open_warning(config: ServerConfig) -> str | None:
    """The warning for a server reachable from other machines with no authorization."""
    if config.auth is None and config.uds is None and not _is_loopback(config.host):
        return (
            f"weir: WARNING: serving on {config.host} without --auth-*: anyone who can reach "
            "this port can use every session whose id they learn, and open sessions up to "
            "the server's limit. Configure authorization, or serve on 127.0.0.1 behind a "
            "proxy that authenticates."
        )
    return None


def _main_asyncio(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``weir serve --runtime asyncio``: the same options, served on asyncio."""
    from ._cli_asyncio import asyncio_config, serve_on_asyncio

    app = _load(args.app, args.app_dir)
    config = _with_app_security(app, config_from_args(args), warn=not args.reuse_port)
    set_access_key(config.state_keys[0] if config.state_keys else secrets.token_bytes(32))
    if args.workers > 1:  # (each worker is `weir serve --runtime asyncio` again)
        from ._workers import run_workers

        _warn_if_open(config)
        return run_workers(args, config, argv)
    warning = None if config.reuse_port else _open_warning(config)  # (a worker: the parent has)
    warnings = [warning] if warning else []
    try:
        settings = asyncio_config(config, args.startup_timeout, args.store)
    except ValueError as exc:
        print(f"weir: {exc}", file=sys.stderr)
        return 2
    settings = dataclasses.replace(
        settings,
        store_replicas=args.store_replicas,
        store_replica_timeout=args.store_replica_timeout,
    )
    return serve_on_asyncio(app, settings, warnings)


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    """``argv`` parsed, with the ``WEIR_*`` variables of the options it does not give
    (see :mod:`weir.engine._cli_env`); also ``{option: variable}`` for those."""
    top = _parser()
    args = top.parse_args(argv)
    serve = _serve_parser(top)
    applied = overlay(top, serve, args, argv, os.environ)
    misspelt = typos(serve, os.environ)
    if not args.reuse_port:  # (a worker: its parent has warned)
        for line in misspelt.values():
            print(line, file=sys.stderr, flush=True)
    args.misspelt_variables = sorted(misspelt)  # (not handed to a --reload child)
    return args, applied


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``weir`` console script."""
    given = list(sys.argv[1:] if argv is None else argv)
    args, applied = _parse(given)
    try:
        return _serve(args, given)
    except SystemExit as exc:
        raise blame(exc, applied) from None


def _serve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    _setup_logs(args)
    check_reload(args)
    if args.reload:
        config_from_args(args)  # (a bad option is said once, here, not by each child)
        return run_reloading(args, argv)
    if args.runtime == "asyncio":
        return _main_asyncio(args, argv)
    app = _load(args.app, args.app_dir)
    config = _with_app_security(app, config_from_args(args), warn=not args.reuse_port)
    set_access_key(config.state_keys[0] if config.state_keys else secrets.token_bytes(32))
    if args.workers > 1:
        from ._workers import run_workers

        _warn_if_open(config)
        return run_workers(args, config, argv)
    guard_lifespan(app, args.startup_timeout)
    progress = _Progress()
    try:
        replicas = (args.store_replicas, args.store_replica_timeout)
        trio.run(_run, app, config, args.store, progress, replicas)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # (ExceptionGroup included)
        if progress.serving:
            raise  # not a start-up failure: a bug, with its traceback
        log.debug("start-up failed", exc_info=exc)
        line = explain(exc, config.host, config.port) or f"weir: could not start: {describe(exc)}"
        print(line, file=sys.stderr, flush=True)
        return 1
    return 0
