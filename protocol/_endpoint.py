"""The MCP endpoint rules: which HTTP requests the server serves, and how it refuses.

Theory of operation
-------------------
:func:`route` maps one complete :class:`~weir.protocol.HttpRequest` to one MCP-level
request -- :class:`PostMessages`, :class:`OpenStream` or :class:`DeleteSession` --
or raises :class:`~weir.protocol.RemoteProtocolError` carrying the exact refusal.  It
checks everything that needs no state, in this order (the first failure wins):

1. path (404), then ``Host`` and ``Origin`` against the allow-list (403; DNS
   rebinding protection, MCP 2025-11-25 "Security Warning");
2. method: POST, GET and DELETE only (405 with ``Allow``);
3. ``MCP-Protocol-Version``: absent means 2025-03-26; unsupported is 400, -32022
   (with the request's id when the body has one); a sessionless revision
   (2026-07-28) routes the request to :mod:`._sessionless`'s checks instead --
   POST only (405 otherwise), one request or notification, no session -- as a
   :class:`SessionlessMessage`;
4. POST: ``Content-Type: application/json`` (415), ``Accept`` listing
   ``application/json`` and ``text/event-stream`` (406), a JSON-RPC body (400 with
   -32700/-32600), batches only at 2025-03-26, ``initialize`` alone and without a
   session; everything else needs ``Mcp-Session-Id`` (400);
5. GET: ``Accept: text/event-stream`` (406), a session (400), and a well-formed
   ``Last-Event-ID`` if present (400 ``cursor_invalid``);
6. DELETE: a session (400).

Whether the session exists, and everything else that needs state, is the
driver's business (it owns the store); :func:`refusal` renders any refusal as
``(status, headers, body)`` so every layer answers in the same shape.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from ._errors import INVALID_REQUEST, Reason, RemoteProtocolError
from ._event_ids import EventId, parse_event_id
from ._forwarded import TrustedProxies
from ._http_events import Headers, HttpRequest
from ._http_response import raw_error_response
from ._jsonrpc import Message, Request, RequestId, decode_body, error_body, refusal_id
from ._lifecycle import ALL_VERSIONS, DEFAULT_VERSION, SUPPORTED_VERSIONS
from ._sessionless import (
    SessionlessMessage,
    check_sessionless,
    is_sessionless,
    unsupported_version,
)

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
ALLOWED_METHODS: Final = "GET, POST, DELETE"

_SESSION_ID_MAX: Final = 256
_SESSION_ID: Final = re.compile(rf"[!-~]{{1,{_SESSION_ID_MAX}}}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConfig:
    """Static endpoint configuration.

    Attributes:
        path: the MCP endpoint path.
        allowed_hosts: host names (without port) accepted in ``Host`` and in
            ``Origin``; ``"*"`` disables the check.  Defaults to loopback names.
        allowed_origins: exact origins (``scheme://host[:port]``) accepted in
            addition to those whose host is in ``allowed_hosts``.
        json_response: answer requests with ``application/json`` instead of SSE;
            then ``Accept`` need only list ``application/json``.
        max_batch: most messages in one batch (400 ``batch_too_large`` beyond).
        trusted_proxies: peers whose forwarding headers the runtimes believe
            (:mod:`weir.protocol.forwarded`; default: none).
        root_path: the prefix a proxy mounts the server under (``""``: none); the
            runtimes serve the resource metadata under it as well.  ``path`` already
            includes it.
    """

    path: str = "/mcp"
    allowed_hosts: frozenset[str] = LOOPBACK_HOSTS
    allowed_origins: frozenset[str] = frozenset()
    json_response: bool = False
    max_batch: int = 64
    trusted_proxies: TrustedProxies = field(default_factory=TrustedProxies)
    root_path: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestContext:
    """What every routed request carries besides its body."""

    session_id: str | None
    protocol_version: str
    headers: Headers


@dataclass(frozen=True, slots=True, kw_only=True)
class PostMessages:
    """A POST carrying one JSON-RPC message, or a batch (2025-03-26 only)."""

    ctx: RequestContext
    messages: list[Message]
    is_batch: bool

    @property
    def is_initialize(self) -> bool:
        """True for a POST whose single message is an ``initialize`` request."""
        m = self.messages
        return len(m) == 1 and isinstance(m[0], Request) and m[0].method == "initialize"

    @property
    def requests(self) -> list[Request]:
        """The messages that expect a response."""
        return [m for m in self.messages if isinstance(m, Request)]

    @property
    def refusal_id(self) -> RequestId | None:
        """The id a refusal of the whole POST answers (None for a batch)."""
        return refusal_id(self.messages, self.is_batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenStream:
    """A GET: open the standalone stream, or resume one with ``Last-Event-ID``."""

    ctx: RequestContext
    last_event_id: EventId | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSession:
    """A DELETE: the client ends its session."""

    ctx: RequestContext


McpRequest = PostMessages | OpenStream | DeleteSession | SessionlessMessage


def _refuse(status: int, reason: Reason, message: str, **kw: object) -> RemoteProtocolError:
    return RemoteProtocolError(message, http_status=status, reason=reason, **kw)  # type: ignore[arg-type]


def host_of(authority: str) -> str:
    """The host part of an ``authority`` (``host[:port]``, IPv6 in brackets), lower-cased."""
    a = authority.strip().lower()
    if a.startswith("["):
        end = a.find("]")
        return a[: end + 1] if end != -1 else a
    return a.rsplit(":", 1)[0] if a.count(":") == 1 else a


def check_host_and_origin(headers: Headers, config: EndpointConfig) -> None:
    """Refuse requests whose ``Host`` or ``Origin`` is not allowed (403).

    Raises:
        RemoteProtocolError: reason ``forbidden_host`` or ``forbidden_origin``.
    """
    allowed = config.allowed_hosts
    if "*" in allowed:
        return
    host = headers.get("host")
    if host is None or host_of(host) not in allowed:
        raise _refuse(403, Reason.FORBIDDEN_HOST, f"Host {host!r} is not allowed")
    origin = headers.get("origin")
    if origin is None or origin in config.allowed_origins:
        return
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or host_of(rest) not in allowed:
        raise _refuse(403, Reason.FORBIDDEN_ORIGIN, f"Origin {origin!r} is not allowed")


@functools.lru_cache(maxsize=256)
def _media_ranges(accept: str | None) -> frozenset[str]:
    # Cached: clients send the same few Accept values again and again.
    if accept is None:
        return frozenset()
    out: set[str] = set()
    for part in accept.split(","):
        fields = part.split(";")
        media = fields[0].strip().lower()
        q_zero = any(
            p.strip().replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in fields[1:]
        )
        if media and not q_zero:
            out.add(media)
    return frozenset(out)


def accepts(accept: str | None, media_type: str) -> bool:
    """Whether an ``Accept`` value admits ``media_type`` (wildcards honoured)."""
    ranges = _media_ranges(accept)
    major = media_type.split("/", 1)[0]
    return media_type in ranges or f"{major}/*" in ranges or "*/*" in ranges


def _session_id(headers: Headers) -> str | None:
    sid = headers.get("mcp-session-id")
    if sid is None:
        return None
    if _SESSION_ID.fullmatch(sid) is None:
        raise _refuse(
            400, Reason.SESSION_INVALID, "Mcp-Session-Id must be 1-256 visible ASCII characters"
        )
    return sid


def _protocol_version(request: HttpRequest, version: str | None) -> str:
    if version is None:
        return DEFAULT_VERSION
    version = version.strip()
    if version not in SUPPORTED_VERSIONS:
        raise unsupported_version(version, ALL_VERSIONS, _id_of(request))
    return version


def _id_of(request: HttpRequest) -> RequestId | None:
    """The id of the request a POST's body carries, if it is one (for a refusal)."""
    if request.method != "POST" or not request.body:
        return None
    try:
        messages, is_batch = decode_body(request.body, allow_batch=False)
    except RemoteProtocolError:
        return None
    return refusal_id(messages, is_batch)


def route(request: HttpRequest, config: EndpointConfig) -> McpRequest:
    """Classify and validate one request for the MCP endpoint.

    Raises:
        RemoteProtocolError: the refusal to send (see the module docstring).
    """
    if request.path != config.path:
        raise _refuse(404, Reason.NOT_FOUND, f"no MCP endpoint at {request.path!r}")
    headers = request.headers
    check_host_and_origin(headers, config)
    method = request.method
    header_version = headers.get("mcp-protocol-version")
    # (A session-era version -- nearly every request -- needs no further look.)
    if (
        header_version is not None
        and header_version not in SUPPORTED_VERSIONS
        and is_sessionless(header_version)
    ):
        return _route_sessionless(request, config)
    check_method(method, ALLOWED_METHODS)
    version = _protocol_version(request, header_version)
    ctx = RequestContext(session_id=_session_id(headers), protocol_version=version, headers=headers)
    if method == "POST":
        return _route_post(request, ctx, config)
    if ctx.session_id is None:
        raise _refuse(400, Reason.SESSION_REQUIRED, "Mcp-Session-Id header is required")
    if method == "DELETE":
        return DeleteSession(ctx=ctx)
    if not accepts(headers.get("accept"), "text/event-stream"):
        raise _refuse(406, Reason.NOT_ACCEPTABLE, "GET must accept text/event-stream")
    raw_cursor = headers.get("last-event-id")
    cursor = parse_event_id(raw_cursor) if raw_cursor is not None else None
    return OpenStream(ctx=ctx, last_event_id=cursor)


def _route_sessionless(request: HttpRequest, config: EndpointConfig) -> SessionlessMessage:
    """A request of the sessionless era: POST only, then its own checks.

    Raises:
        RemoteProtocolError: 405 (GET, DELETE), 415, 406, 400 (see
            :func:`~weir.protocol._sessionless.check_sessionless`).
    """
    check_method(request.method, "POST")
    headers = request.headers
    check_json_body(headers)
    _check_accept(headers.get("accept"), config)
    messages, is_batch = decode_body(request.body, allow_batch=False)
    return check_sessionless(headers, messages, is_batch, ALL_VERSIONS)


def _check_accept(accept: str | None, config: EndpointConfig) -> None:
    wants_sse = not config.json_response
    if not accepts(accept, "application/json") or (
        wants_sse and not accepts(accept, "text/event-stream")
    ):
        raise _refuse(
            406,
            Reason.NOT_ACCEPTABLE,
            "Accept must list both application/json and text/event-stream",
        )


def check_json_body(headers: Headers) -> None:
    """A POST's body must be declared ``application/json`` (parameters allowed).

    Raises:
        RemoteProtocolError: 415 ``unsupported_media_type``.
    """
    ctype = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise _refuse(415, Reason.UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json")


def check_method(method: str, allowed: str) -> None:
    """Refuse any method but ``allowed`` (a comma-separated list) with 405 and ``Allow``.

    Raises:
        RemoteProtocolError: 405 ``method_not_allowed``.
    """
    if method != allowed and method not in [m.strip() for m in allowed.split(",")]:
        raise _refuse(
            405,
            Reason.METHOD_NOT_ALLOWED,
            f"method {method} not allowed",
            headers=(("allow", allowed),),
        )


def _route_post(request: HttpRequest, ctx: RequestContext, config: EndpointConfig) -> PostMessages:
    headers = ctx.headers
    check_json_body(headers)
    _check_accept(headers.get("accept"), config)
    messages, is_batch = decode_body(
        request.body, allow_batch=ctx.protocol_version == "2025-03-26", max_batch=config.max_batch
    )
    post = PostMessages(ctx=ctx, messages=messages, is_batch=is_batch)
    if any(isinstance(m, Request) and m.method == "initialize" for m in messages):
        if is_batch:
            raise _refuse(
                400,
                Reason.INVALID_REQUEST,
                "initialize must not be part of a batch",
                code=INVALID_REQUEST,
            )
        return post
    if ctx.session_id is None:
        raise _refuse(
            400,
            Reason.SESSION_REQUIRED,
            "Mcp-Session-Id header is required",
            request_id=post.refusal_id,
        )
    return post


def refusal(exc: RemoteProtocolError) -> tuple[int, list[tuple[str, str]], bytes]:
    """Render a refusal as ``(status, headers, JSON-RPC error body)``."""
    headers = [("content-type", "application/json"), *exc.headers]
    if exc.retry_after_ms is not None:
        headers.append(("retry-after", str(max(1, -(-exc.retry_after_ms // 1000)))))
    return exc.http_status, headers, error_body(exc)


def closing_refusal(exc: RemoteProtocolError) -> bytes:
    """A whole HTTP/1.1 error response that also closes the connection.

    For refusals that do not answer a delivered request -- a request head or body
    that did not arrive in time (408) -- where the connection is abandoned
    mid-request, so nothing but this response may follow on it.
    """
    status, headers, body = refusal(exc)
    return raw_error_response(status, body, [h for h in headers if h[0] != "content-type"])


def session_refusal(session_id: str, request_id: int | str | None = None) -> RemoteProtocolError:
    """The 404 for an unknown or terminated session."""
    return _refuse(
        404, Reason.SESSION_NOT_FOUND, f"session {session_id!r} not found", request_id=request_id
    )


def supported_versions() -> Sequence[str]:
    """The revisions accepted in ``MCP-Protocol-Version``."""
    return SUPPORTED_VERSIONS
