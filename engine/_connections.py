"""Connections and HTTP requests: one task per connection, its deadlines, routing, refusals.

Theory of operation
-------------------
Each TCP connection gets one task running :meth:`Server._connection`: the small
``receive_some -> receive_data -> next_event -> respond -> send`` loop around an
:class:`~weir.engine._connection.Connection` (the :class:`weir.protocol.HttpConnection` plus
byte-exact send accounting).  One broken connection never takes the server down.

Every read waits under the deadline of its phase: between requests the keep-alive
timeout (and the connection may be shed, see :mod:`engine._listen`); then the whole
head within ``head_timeout`` of its first byte and the body within ``body_timeout``
of the head.  A head or body that misses its deadline gets 408 and the connection
is closed.  Bytes of requests not yet complete count against one process-wide cap
(``max_inbound_bytes``); past it the connection gets 503 ``overloaded`` and closes.
A connection closed on such a refusal (or a 413/431 from the parser) lingers first:
half-closed, discarding what the peer still sends for at most ``linger_timeout``,
so the peer reads the refusal rather than a reset.

:meth:`Server._respond` routes each request: resource metadata and ``/metrics``
need no token; everything else is authenticated (with authorization on) and goes
to POST (``engine._calls``), GET and DELETE (``engine._streams``) or the legacy
endpoints (``engine._legacy``).  A refusal raised before the response has begun
becomes that response (404 for a session that is gone, 503 while shutting down or
when the store is unavailable); once a response has begun, it ends the connection.
"""

from __future__ import annotations

import math
import re

import trio

from weir.protocol import (
    NEED_DATA,
    SERVER_ERROR,
    ConnectionClosed,
    DeleteSession,
    HttpError,
    HttpRequest,
    Inbound,
    OpenStream,
    PostMessages,
    ReadClock,
    Reason,
    RemoteProtocolError,
    check_host_and_origin,
    check_method,
    closing_refusal,
    refusal,
    route,
    session_refusal,
)
from weir.protocol.legacy import LegacyOpen, route_legacy

from ._auth import (
    METADATA_PATH,
    REQUEST_ACCESS,
    AccessToken,
    Authorization,
    InvalidToken,
    TokenExpired,
    bearer_token,
)
from ._connection import Connection
from ._listen import Slot
from ._requester import Requester
from ._server_base import _ServerBase, _store_unavailable, log
from ._store import SessionGone, StoreUnavailable
from ._timers import Timed
from ._writer import RECV_BYTES, PeerGone


class _ReadTimer:
    """A connection's read deadline, as the server's read-deadline heap sees it."""

    __slots__ = ("closed", "deadline", "scope", "timer_at", "timer_key")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        #: When the read in progress must have completed (inf: not reading).
        self.deadline = math.inf
        self.timer_at = math.inf
        self.timer_key = 0
        self.closed = False


class _Connections(_ServerBase):
    """Connections and HTTP requests (see the module docstring)."""

    async def _serve_read_deadlines(self) -> None:
        """Serve the read-deadline heap; when it stops (the server stopped), hand every
        read still waiting a Trio deadline of its own, and later reads use one too --
        a connection served by :meth:`serve_connection` may outlive the server's tasks."""
        try:
            await self.read_deadlines.run()
        finally:
            self._reads_on_heap = False
            for timed in self.read_deadlines.pending():
                assert isinstance(timed, _ReadTimer)
                timed.scope.deadline = timed.deadline

    def _read_due(self, timed: Timed, now: float) -> None:
        """The read-deadline heap's handler: cancel a read that missed its deadline;
        a connection reading under a later deadline gets its entry back at that one."""
        assert isinstance(timed, _ReadTimer)
        if timed.deadline <= now:
            timed.scope.cancel()
        elif timed.deadline != math.inf:
            self.read_deadlines.schedule(timed, timed.deadline)

    async def _connection(self, stream: trio.abc.Stream, slot: Slot | None = None) -> None:
        conn = Connection(
            stream,
            self.config.limits,
            notsent_lowat=self.config.notsent_lowat,
            heads=self._heads,
            poller=self.acks,
        )
        self.open_connections.add(conn)
        try:
            await self._connection_loop(conn, slot)
        except (trio.BrokenResourceError, trio.ClosedResourceError, PeerGone):
            pass
        except StoreUnavailable as exc:
            # Only mid-response (before one, _respond answers 503): it cannot be
            # finished, so the connection ends -- one line, no traceback.
            log.warning("store unavailable mid-response, connection closed: %s", exc)
        except Exception as exc:
            # One broken connection must never take the server down.
            if not _only_disconnects(exc):
                log.exception("connection handler failed")
        finally:
            if slot is not None:
                slot.unpark()
            # Last look before the socket goes: what the peer acknowledged counts.
            conn.check_acks()
            conn.closed = True
            conn.abandon()
            self._release_owner(conn)
            self.open_connections.discard(conn)
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
            refused = await self._serve_requests(conn, slot)
        finally:
            self.inbound -= conn.inbound
            conn.inbound = 0
        if refused and self._read_timeouts.linger:
            await self._linger(conn.stream)

    async def _serve_requests(self, conn: Connection, slot: Slot | None) -> bool:
        """Serve requests until the connection is done; True if it ends on a refusal
        sent while the peer may still be sending (408, 413, 431, 503 ``overloaded``)."""
        http = conn.http
        cfg = self.config
        keepalive, receive = cfg.keepalive_timeout, conn.stream.receive_some
        clock = ReadClock(self._read_timeouts)
        timers = self.read_deadlines
        # One scope is cancelled when a read misses its deadline (or the connection is
        # shed).  The deadline itself is a float in ``timer``: the server's one heap of
        # read deadlines wakes at the earliest, and a connection asks for an entry only
        # when its deadline moves earlier than the one it has -- so a busy keep-alive
        # connection, whose deadline slides later with every request, costs two stores
        # per request instead of re-arming a Trio deadline twice.
        reads = trio.CancelScope()
        timer = _ReadTimer(reads)
        try:
            with reads:
                conn.scope = reads
                if slot is not None:
                    slot.scope = reads
                while True:
                    event = http.next_event()
                    if event is NEED_DATA:
                        if http.has_data_to_send:
                            await conn.send(http.data_to_send())  # e.g. 100 Continue
                        now = trio.current_time()
                        inbound = http.inbound
                        deadline = timer.deadline = clock.deadline(inbound, now)
                        if not self._reads_on_heap:
                            reads.deadline = deadline  # (the heap's task has stopped)
                        elif deadline < timer.timer_at:
                            timers.schedule(timer, deadline)
                        if inbound is Inbound.IDLE and slot is not None:
                            slot.idle_since = now  # parked: it may be shed
                        try:
                            data = await receive(RECV_BYTES)
                        finally:
                            timer.deadline = math.inf
                            if not self._reads_on_heap:
                                reads.deadline = math.inf
                        if slot is not None:
                            slot.idle_since = None
                        if conn.tracker.outstanding:
                            conn.check_acks()  # a new request: the peer has likely read our last
                        if reads.cancel_called:
                            # Shed (or timed out) just as bytes arrived: the cancellation
                            # is pending in this scope.  Answer what came, shielded, then close.
                            with trio.CancelScope(shield=True) as last:
                                last.deadline = now + keepalive
                                await self._last_requests(conn, data)
                            return False
                        # Bytes of requests not yet complete count against one process-wide cap.
                        n = len(data)
                        conn.inbound += n
                        self.inbound += n
                        if self.inbound > cfg.max_inbound_bytes:
                            await self._overloaded(conn)
                            return True
                        http.receive_data(data)
                    elif isinstance(event, HttpRequest):
                        clock.request_done()
                        # Handed over, not kept: a long response (an SSE stream) must not
                        # keep the request's body alive for as long as it lasts.
                        handoff, event = [event], NEED_DATA
                        self.inbound -= conn.inbound
                        conn.inbound = 0
                        await self._respond(conn, handoff)
                        if http.should_close:
                            return False
                    elif isinstance(event, HttpError):
                        self.metrics.refused(str(event.reason))
                        await conn.send(http.data_to_send())
                        return True
                    elif isinstance(event, ConnectionClosed):
                        return False
        finally:
            timer.closed = True  # its heap entry, if any, is skipped
        if reads.cancelled_caught and clock.owed:
            await self._time_out(conn, clock)
            return True
        return False

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

    async def _linger(self, stream: trio.abc.Stream) -> None:
        """Half-close, then read and discard what the peer still sends, for at most the
        linger timeout: closing with unread bytes would reset the connection, and a
        reset can destroy the refusal just sent before the peer reads it."""
        if not isinstance(stream, trio.abc.HalfCloseableStream):
            return  # (e.g. TLS: no half-close to make; close at once)
        with trio.move_on_after(self._read_timeouts.linger):
            await stream.send_eof()
            while await stream.receive_some(RECV_BYTES):
                pass

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

    async def _time_out(self, conn: Connection, clock: ReadClock) -> None:
        self.metrics.refused(str(Reason.REQUEST_TIMEOUT))
        exc = clock.refusal()
        conn.http.send_failed()  # nothing else may follow on this connection
        with trio.move_on_after(1):
            await conn.send(closing_refusal(exc))

    async def _refuse(self, conn: Connection, exc: RemoteProtocolError) -> None:
        self.metrics.refused(str(exc.reason))
        status, headers, body = refusal(exc)
        if not all(_SAFE_VALUE.fullmatch(value) for _, value in headers):
            # A refusal must always be sendable: a header that is not visible ASCII
            # (a bug: no refusal may carry client bytes) is left out, not written.
            log.error("refusal %s: dropping header(s) that are not visible ASCII", exc.reason)
            headers = [(name, value) for name, value in headers if _SAFE_VALUE.fullmatch(value)]
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
            # Who this request speaks for: handed to everything below, never kept on
            # the connection (its next request may speak for someone else).
            if cfg.auth is not None:
                access = await self._authenticate(request, cfg.auth)
                REQUEST_ACCESS.set(access)  # (handlers started for this request see it)
                who = Requester(access.principal, True, conn.secret)
            else:
                who = Requester(cfg.principal, False, conn.secret)
            if not endpoint and path in (cfg.legacy_sse_path, cfg.legacy_messages_path):
                await self._legacy(conn, request, who)
                return
            mcp = route(request, self._endpoint)
            del request  # the body is decoded: from here on only the messages count
            if isinstance(mcp, PostMessages):
                await self._post(conn, mcp, who)
            elif isinstance(mcp, OpenStream):
                await self._get(conn, mcp, who)
            elif isinstance(mcp, DeleteSession):
                await self._delete(conn, mcp, who)
            else:
                await self._sessionless(conn, mcp, who)
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

    async def _authenticate(self, request: HttpRequest, auth: Authorization) -> AccessToken:
        """What the verifier vouches for about ``request``'s bearer token.

        Raises:
            RemoteProtocolError: 401 (no token, or a refused one), 403 (a scope is
                missing) or 400 (a malformed ``Authorization`` header), each with
                ``WWW-Authenticate`` pointing at the resource metadata.
        """
        # Every refusal text here is fixed: nothing the client sent (nor what the
        # verifier said about it) reaches the response, so its head stays valid and
        # the cached refusal heads are a handful, however many tokens are refused.
        try:
            token = bearer_token(request.headers.get("authorization"))
        except ValueError:
            bad = _auth_refusal(auth, 400, Reason.INVALID_REQUEST, _BAD_HEADER, "invalid_request")
            raise bad from None
        if token is None:
            raise _auth_refusal(auth, 401, Reason.UNAUTHORIZED, "a bearer token is required")
        try:
            access = await auth.verifier.verify(token)
        except InvalidToken as exc:
            text = "token expired" if isinstance(exc, TokenExpired) else "invalid token"
            raise _auth_refusal(auth, 401, Reason.UNAUTHORIZED, text, "invalid_token") from None
        except Exception as exc:
            # A verifier that fails (a bug, its backend down) has not judged the token:
            # not a 401, which tells the client to drop a token that may be good, but
            # a 503 to retry, and one log line rather than a dropped connection.
            log.warning("the token verifier failed: %s: %s", type(exc).__name__, exc)
            raise RemoteProtocolError(
                "the token verifier is unavailable; nothing was executed",
                http_status=503,
                reason=Reason.VERIFIER_UNAVAILABLE,
                code=SERVER_ERROR,
                retry_after_ms=self.config.retry_ms,
            ) from None
        if not auth.required_scopes <= access.scopes:
            raise _auth_refusal(
                auth, 403, Reason.INSUFFICIENT_SCOPE, "insufficient scope", "insufficient_scope"
            )
        return access

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

    async def _auxiliary(self, conn: Connection, request: HttpRequest) -> None:
        """``/metrics`` (the endpoint's Host/Origin rules)."""
        check_host_and_origin(request.headers, self._endpoint)
        check_method(request.method, "GET")
        body = self.metrics.render(
            self.sessions,
            gate=self.gate,
            budget=self.budget,
            owners=self.owners,
            listen_streams=len(self.subscribers),
        ).encode()
        headers = [("content-type", "text/plain; version=0.0.4; charset=utf-8")]
        await conn.send(conn.http.send_response(200, headers, body))

    async def _legacy(self, conn: Connection, request: HttpRequest, who: Requester) -> None:
        """The 2024-11-05 HTTP+SSE endpoints, for ``who`` (the request's requester)."""
        cfg = self.config
        legacy = route_legacy(
            request,
            self._endpoint,
            sse_path=cfg.legacy_sse_path,
            messages_path=cfg.legacy_messages_path,
        )
        if isinstance(legacy, LegacyOpen):
            await self._legacy_stream(conn, who)
        else:
            await self._legacy_post(conn, legacy, who)


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


#: The one text a malformed ``Authorization`` header gets.
_BAD_HEADER = "the Authorization header must be 'Bearer <token>'"
#: A header value a refusal may carry: visible ASCII, single spaces or tabs inside.
_SAFE_VALUE = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")


def _only_disconnects(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in exc.exceptions)
    return isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | PeerGone)
