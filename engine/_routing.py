"""Routing: one HTTP request to what answers it, and the refusals before a response.

Theory of operation
-------------------
:meth:`Router.respond` routes each request a connection read (``engine._connections``):
resource metadata and ``/metrics`` need no token; everything else is authenticated
(with authorization on: each request's own :class:`~._requester.Requester`, never
the connection's) and goes to POST (``engine._calls``), GET and DELETE
(``engine._streams``), the sessionless era (``engine._sessionless``) or the legacy
endpoints (``engine._legacy``).  A refusal raised before the response has begun
becomes that response (404 for a session that is gone, 503 while shutting down or
when the store is unavailable); once a response has begun, it ends the connection.
"""

from __future__ import annotations

import re
from typing import Any

from weir.common import (
    REQUEST_ACCESS,
    Authorization,
    as_seen,
    authenticate,
    is_metadata_path,
    metadata_answer,
)
from weir.common._access import speaks_for
from weir.protocol import (
    DeleteSession,
    HttpRequest,
    OpenStream,
    PostMessages,
    Reason,
    RemoteProtocolError,
    check_host_and_origin,
    check_method,
    refusal,
    route,
    session_refusal,
)
from weir.protocol.legacy import LegacyOpen, route_legacy
from weir.protocol.sessionless import SessionlessMessage

from ._calls import Calls
from ._changes import Changes
from ._connection import Connection
from ._legacy import Legacy
from ._listen import AcceptGate
from ._owners import Owners
from ._requester import Requester
from ._sessionless import Sessionless
from ._shared import Shared, log, store_unavailable
from ._store_errors import SessionGone, StoreUnavailable
from ._streams import Streams

#: What :func:`weir.protocol.route` makes of a request to the MCP endpoint.
Routed = PostMessages | OpenStream | DeleteSession | SessionlessMessage


class Router:
    """Routes each request (see the module docstring).

    Guarantees: no request reaches a course unauthenticated (with authorization
    on); a refusal before the response is always sendable (its headers visible
    ASCII, nothing the client sent); after the drain began every request is 503
    ``shutting_down``.
    """

    def __init__(
        self,
        shared: Shared,
        *,
        calls: Calls,
        streams: Streams,
        legacy: Legacy,
        sessionless: Sessionless,
        owners: Owners,
        changes: Changes,
        gate: AcceptGate,
    ) -> None:
        self.shared = shared
        self.config = shared.config
        self.metrics = shared.metrics
        self.endpoint = shared.endpoint
        self.calls = calls
        self._post = calls.post  # (every POST: one lookup less)
        self.streams = streams
        self.legacy = legacy
        self.sessionless = sessionless
        self.owners = owners
        self.changes = changes
        self.gate = gate

    async def _refuse(self, conn: Connection, exc: RemoteProtocolError) -> None:
        self.metrics.refused(str(exc.reason))
        status, headers, body = refusal(exc)
        if not all(_SAFE_VALUE.fullmatch(value) for _, value in headers):
            # A refusal must always be sendable: a header that is not visible ASCII
            # (a bug: no refusal may carry client bytes) is left out, not written.
            log.error("refusal %s: dropping header(s) that are not visible ASCII", exc.reason)
            headers = [(name, value) for name, value in headers if _SAFE_VALUE.fullmatch(value)]
        await conn.send(conn.http.send_response(status, headers, body))

    async def respond(self, conn: Connection, handoff: list[HttpRequest]) -> None:
        """Answer (or refuse) the request in ``handoff`` (taken out of it: the caller
        keeps no reference to a body that a long response would keep alive)."""
        request = handoff.pop()
        sid_header = request.headers.get("mcp-session-id") or ""
        try:
            if self.shared.closing:
                raise RemoteProtocolError(
                    "server is shutting down",
                    http_status=503,
                    reason=Reason.SHUTTING_DOWN,
                    retry_after_ms=self.config.retry_ms,
                )
            cfg = self.config
            # As its client sent it (what trusted proxies say about this request alone).
            request = as_seen(request, conn.peer, self.endpoint.trusted_proxies, cfg.scheme)
            path = request.path
            endpoint = path == cfg.path
            # Metadata and metrics need no token; the legacy endpoints and the MCP
            # endpoint do, and anything else is routed (and refused) like the endpoint.
            if cfg.auth is not None and is_metadata_path(path, cfg.path, self.endpoint.root_path):
                await self._resource_metadata(conn, request, cfg.auth)
                return
            if not endpoint and path == cfg.metrics_path:
                await self._auxiliary(conn, request)
                return
            # Who this request speaks for: handed to everything below, never kept on
            # the connection (its next request may speak for someone else).
            if cfg.auth is not None:
                header = request.headers.get("authorization")
                access = await authenticate(header, cfg.auth, cfg.retry_ms)
                REQUEST_ACCESS.set(access)  # (handlers started for this request see it)
                who = Requester(access.principal, True, conn.secret)
            else:
                who = Requester(cfg.principal, False, conn.secret)
            speaks_for(who.principal, who.authorized)  # (the access log's line)
            legacy = cfg.legacy_sse_path is not None  # (None: neither path is served)
            if not endpoint and legacy and path in (cfg.legacy_sse_path, cfg.legacy_messages_path):
                await self._legacy(conn, request, who)
                return
            routed = [route(request, self.endpoint)]
            del request  # the body is decoded: from here on only the messages count
            await self._serve(conn, routed, who)
        except SessionGone:
            if conn.http.response_in_progress:
                raise
            await self._refuse(conn, session_refusal(sid_header))
        except StoreUnavailable as exc:
            if conn.http.response_in_progress:
                raise
            log.warning("store unavailable: %s", exc)
            await self._refuse(conn, store_unavailable(self.config))
        except RemoteProtocolError as exc:
            if conn.http.response_in_progress:
                raise
            await self._refuse(conn, exc)

    async def _serve(self, conn: Connection, routed: list[Routed], who: Requester) -> None:
        """Hand the routed request (taken out of ``routed``) to its course, keeping no
        reference to it here: what a course stops needing (a call's params, once its
        handler has them) must not stay alive in this frame while a slow peer takes
        the answer."""
        mcp = routed.pop()
        if isinstance(mcp, PostMessages):
            course = self._post(conn, mcp, who)
        elif isinstance(mcp, OpenStream):
            course = self.streams.get(conn, mcp, who)
        elif isinstance(mcp, DeleteSession):
            course = self.streams.delete(conn, mcp, who)
        else:
            course = self.sessionless.post(conn, mcp, who)
        del mcp
        await course

    async def _resource_metadata(
        self, conn: Connection, request: HttpRequest, auth: Authorization
    ) -> None:
        """RFC 9728 protected resource metadata (no token needed)."""
        answer = metadata_answer(
            request.path, request.method, self.config.path, auth, self.endpoint.root_path
        )
        await conn.send(conn.http.send_response(*answer))

    async def _auxiliary(self, conn: Connection, request: HttpRequest) -> None:
        """``/metrics`` (the endpoint's Host/Origin rules; GET, or HEAD: no body)."""
        check_host_and_origin(request.headers, self.endpoint)
        check_method(request.method, "GET, HEAD")
        body = self.metrics.render(self.shared.sessions, **self.metered()).encode()
        headers = [("content-type", "text/plain; version=0.0.4; charset=utf-8")]
        await conn.send(conn.http.send_response(200, headers, body))

    def metered(self) -> dict[str, Any]:
        """What :meth:`Metrics.families` reads of this server, besides its sessions."""
        return {
            "gate": self.gate,
            "budget": self.shared.budget,
            "pool": self.shared.credit_pool,
            "owners": self.owners.owners,
            "listen_streams": len(self.changes.subscribers),
        }

    async def _legacy(self, conn: Connection, request: HttpRequest, who: Requester) -> None:
        """The 2024-11-05 HTTP+SSE endpoints, for ``who`` (the request's requester)."""
        cfg = self.config
        legacy = route_legacy(
            request,
            self.endpoint,
            sse_path=cfg.legacy_sse_path,
            messages_path=cfg.legacy_messages_path,
        )
        if isinstance(legacy, LegacyOpen):
            await self.legacy.stream(conn, who)
        else:
            await self.legacy.post(conn, legacy, who)


#: A header value a refusal may carry: visible ASCII, single spaces or tabs inside.
_SAFE_VALUE = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
