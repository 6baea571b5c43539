"""weir's MCP client: Streamable HTTP on Trio, built for the failures weir guards against.

Theory of operation
-------------------
:func:`open_client` picks the era: it probes ``server/discover`` and, if the server
serves 2026-07-28, returns a :class:`~weir.engine._client_sessionless.SessionlessClient`
(self-contained requests, input-required rounds, listen streams); otherwise, or with
``mode="session"``, the session-era client below.  The errors, the retry bounds and
the call traces are shared (:mod:`engine._client_common`).

:func:`open_session` opens a :class:`ClientSession`: it POSTs ``initialize``, keeps the
``Mcp-Session-Id`` and the ``Mcp-Channel-Token`` (``<generation>.<secret>``) the server
hands back, sends ``notifications/initialized``, and from then on puts the session id,
the negotiated ``Mcp-Protocol-Version`` and the channel token on every request.
Servers that issue no channel token (the official SDKs) are served the same way, minus
the token.

**HTTP.**  Each request borrows one keep-alive connection (h11 over a Trio stream)
from a small pool, :mod:`engine._client_http`, and gives it back once its response has
been read to the end; a connection whose response was abandoned is closed instead.
So concurrent requests use one connection each and sequential ones share.  A reused
connection that fails before a single response byte arrives (the server closed it
while idle) is replaced by a fresh one once; nothing else is re-sent implicitly.

**One logical request** (an :class:`_Exchange`) can take several HTTP exchanges:

* The POST's answer is one JSON body or an SSE stream.  SSE events are decoded by
  :class:`weir.protocol.sse.SseDecoder`; progress notifications go to the call's
  ``on_progress``, other notifications to the session's ``on_notification``,
  server-to-client requests (sampling, elicitation, roots, ping) are answered by POST
  from a background task (``-32601`` when no callback is configured), and the response
  whose id is ours ends the exchange.
* **Resumption.**  When the stream ends without our response (the server sent
  ``retry:`` and closed, or the connection dropped, or it went silent for ``timeout``),
  the client waits the ``retry`` hint (jittered) and resumes with
  ``GET`` + ``Last-Event-ID`` + its channel token, always from the **newest** cursor
  seen -- a stream cut twice resumes from where the second cut happened, never from
  where the first resumption began.  Reconnects are bounded: at most
  ``max_reconnects`` in a row that bring no new event.  With no cursor at all (the
  connection died before the first event id), a ``tools/call`` is re-POSTed with the
  *same* idempotency key -- the server's gate replays or waits, never re-executes --
  and any other request raises :class:`TransportError`.  In general a request without
  a key is never POSTed again once the server has accepted it (answered 200).
* **Contiguity (event ids).**  Every weir event is preceded by ``: replica=<id>`` and
  carries the id ``<epoch>:<seq>``.  Across all reconnects of one stream the client
  requires the first event to be ``seq`` 0 and each following one to be exactly the
  previous ``seq + 1`` on the same epoch.  The replica may change (any replica serves
  a shared store); a gap, a repeat, a decrease, another epoch or a switch between
  namespaced and foreign ids raises :class:`StreamResumeViolation`.  Every observed
  ``(replica, epoch, seq)`` is recorded in the call's :class:`CallTrace`.  Ids outside
  weir's namespace (other servers) are used as opaque cursors and not checked.
* **Refusals** are decided by ``error.data.reason``, never by the status alone:

  - 429 (``stream_half_open``) and 503 (``store_unavailable``, ``shutting_down``):
    nothing ran; wait at least ``Retry-After`` (``data.retryAfterMs`` when given),
    with jittered exponential backoff, and re-send -- at most ``max_attempts`` times,
    then raise.
  - 409 ``in_progress``: a duplicate of a call still running; wait ``Retry-After``
    and re-send the same request with the same key, so the duplicate gets the
    replayed result.
  - 409 ``channel_unbound``: rebind (``weir/rebind``), look for our response among
    the results the rebind hands back, and otherwise re-issue (at most
    ``max_rebinds`` times).  A call the server never accepted (its POST was refused,
    so nothing was dispatched) is re-issued with a **fresh** idempotency key, as the
    design asks.  A call that *was* accepted -- the refusal came on the resume GET,
    because a rebind ended its stream -- keeps its key: the handler may still be
    running, and only the old key lets the gate replay it instead of running it again.
  - 409 ``cursor_stale``: our generation was fenced by a newer rebind; raise
    :class:`CursorStale`, never retry.
  - anything else: raise the :class:`WeirError` subclass for its reason.

Every wait is bounded: connecting, each response head and each body read by
``timeout``; retries and reconnects by :class:`RetryPolicy`.  Delays never undercut
what the server asked for and are stretched by up to ``jitter`` so that a crowd of
clients does not come back in step.  Randomness (idempotency keys, jitter) comes from
injectable factories, time from Trio's clock.

**Rebinding** moves the session to a new generation; the server ends every stream of
the old one.  A rebind while other calls of the same client are in flight therefore
disturbs them: they may see ``cursor_stale``.  Concurrent ``channel_unbound`` recoveries
are serialised so that only one of them rebinds.

**Cancellation.**  Cancelling a call sends ``notifications/cancelled`` for it (from a
background task, bounded) and abandons its stream.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from weir.protocol.sse import SseComment, SseDecodeError, SseDecoder

from ._client_common import (
    _ACCEPT_BOTH,
    _DRAIN_SECONDS,
    _EVENT_ID,
    REBIND_METHOD,
    BadResponse,
    CallTrace,
    ChannelUnbound,
    CursorInvalid,
    CursorStale,
    CursorUnknown,
    HalfOpenError,
    IdempotencyKeyReused,
    InProgress,
    JsonObject,
    NotificationHandler,
    ObservedEvent,
    Overloaded,
    ProgressCallback,
    RebindResult,
    RetryPolicy,
    RpcError,
    ServerRequestHandler,
    SessionGone,
    StreamResumeViolation,
    TransportError,
    Unavailable,
    WeirError,
    _decode,
    _read_body,
    _refusal,
    _rpc_result,
    list_all,
)
from ._client_http import ConnectionDropped, Pool, Response
from ._client_sessionless import VERSION, SessionlessClient, capabilities_for, discover
from ._metrics import redact

__all__ = [
    "BadResponse",
    "CallTrace",
    "ChannelUnbound",
    "ClientSession",
    "CursorInvalid",
    "CursorStale",
    "CursorUnknown",
    "HalfOpenError",
    "IdempotencyKeyReused",
    "InProgress",
    "Overloaded",
    "RebindResult",
    "RetryPolicy",
    "RpcError",
    "SessionGone",
    "SessionlessClient",
    "StreamResumeViolation",
    "TransportError",
    "Unavailable",
    "WeirError",
    "open_client",
    "open_session",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- contiguity
class _Contiguity:
    """Checks the (replica, epoch, seq) of one logical stream across reconnects."""

    def __init__(self, observed: list[ObservedEvent]) -> None:
        self.observed = observed
        self.replica: str | None = None  # from the latest ``: replica=`` comment
        self.last: tuple[str, int] | None = None
        self.namespaced: bool | None = None

    def comment(self, text: str) -> None:
        if text.startswith("replica="):
            self.replica = text[len("replica=") :]

    def event(self, event_id: str | None) -> None:
        """Record one dispatched event.

        Raises:
            StreamResumeViolation: a gap, repeat, decrease, other epoch or mixed ids.
        """
        replica, self.replica = self.replica, None
        if event_id is None:
            if self.namespaced:
                self._violation("an event without an id on a stream with ids")
            return
        match = _EVENT_ID.fullmatch(event_id)
        if match is None:
            if self.namespaced:
                self._violation(f"event id {event_id!r} left the <epoch>:<seq> namespace")
            self.namespaced = False
            return
        if self.namespaced is False:
            self._violation(f"event id {event_id!r} after ids outside the namespace")
        self.namespaced = True
        epoch, seq = match.group(1), int(match.group(2))
        self.observed.append((replica, epoch, seq))
        expected = (epoch, 0) if self.last is None else (self.last[0], self.last[1] + 1)
        if (epoch, seq) != expected:
            kind = (
                "another epoch"
                if epoch != expected[0]
                else "a gap"
                if seq > expected[1]
                else "a repeat"
                if seq == expected[1] - 1
                else "a decrease"
            )
            self._violation(
                f"{kind}: got {epoch}:{seq} from replica {replica!r}, "
                f"expected {expected[0]}:{expected[1]}"
            )
        self.last = (epoch, seq)

    def _violation(self, message: str) -> None:
        raise StreamResumeViolation(message, list(self.observed))


# ---------------------------------------------------------------------------- exchanges
@dataclass(slots=True)
class _Exchange:
    """One logical request across its HTTP exchanges (POSTs, resume GETs)."""

    method: str
    params: JsonObject | None
    key: str | None
    on_progress: ProgressCallback | None
    trace: CallTrace
    with_token: bool = True  # False for the rebind handshake itself
    may_rebind: bool = True
    rid: int = 0
    accepted: bool = False  # a POST of it was answered 200: the server may have run it
    cursor: str | None = None
    retry_ms: int | None = None
    contiguity: _Contiguity | None = None
    head: dict[str, str] = field(default_factory=dict)  # headers of the POST's answer

    @property
    def progress_token(self) -> str | None:
        if self.key is not None:
            return self.key
        return f"weir-{self.rid}" if self.on_progress is not None else None

    @property
    def resendable(self) -> bool:
        """May it be POSTed again?  Not once accepted without a key: nothing would stop
        the server from running it twice."""
        return self.key is not None or not self.accepted

    def body(self) -> bytes:
        params = dict(self.params) if self.params is not None else None
        token = self.progress_token
        if token is not None:
            params = params or {}
            meta = dict(params.get("_meta") or {})
            meta["progressToken"] = token
            params["_meta"] = meta
        msg: JsonObject = {"jsonrpc": "2.0", "id": self.rid, "method": self.method}
        if params is not None:
            msg["params"] = params
        return msgspec.json.encode(msg)

    def new_stream(self) -> None:
        self.cursor = None
        self.retry_ms = None
        self.contiguity = _Contiguity(self.trace.observed_events)


# ---------------------------------------------------------------------------- the session
class ClientSession:
    """An MCP session over Streamable HTTP; make one with :func:`open_session`.

    Attributes:
        session_id: the ``Mcp-Session-Id`` (None if the server issued none).
        channel_token: the current ``Mcp-Channel-Token`` (None if the server issued none).
        protocol_version: the negotiated revision.
        server_info: ``initialize``'s result (``serverInfo``, ``capabilities``, ...).
        supports_rebind: the server advertises ``weir/rebind``.
    """

    def __init__(
        self,
        url: str,
        nursery: trio.Nursery,
        *,
        client_info: JsonObject,
        protocol_version: str,
        timeout: float,
        retry: RetryPolicy,
        key_factory: Callable[[], str],
        rng: Callable[[], float],
        sampling: ServerRequestHandler | None,
        elicitation: ServerRequestHandler | None,
        roots: ServerRequestHandler | None,
        on_notification: NotificationHandler | None,
    ) -> None:
        self.url = url
        self._nursery = nursery
        self._pool = Pool(url, timeout)
        self._client_info = client_info
        self.protocol_version = protocol_version
        self._timeout = timeout
        self.retry = retry
        self._new_key = key_factory
        self._rng = rng
        self._handlers: dict[str, ServerRequestHandler] = {}
        if sampling is not None:
            self._handlers["sampling/createMessage"] = sampling
        if elicitation is not None:
            self._handlers["elicitation/create"] = elicitation
        if roots is not None:
            self._handlers["roots/list"] = roots
        self._on_notification = on_notification
        self.session_id: str | None = None
        self.channel_token: str | None = None
        self.server_info: JsonObject = {}
        self.supports_rebind = False
        self._initialized = False  # from then on, Mcp-Protocol-Version goes on every request
        self._owned = False
        self._closed = False
        self._rebind_results: list[JsonObject] = []  # of the latest rebind
        self._next_rid = 0
        self._rebind_lock = trio.Lock()

    @property
    def connections_opened(self) -> int:
        """How many TCP connections this session has opened so far."""
        return self._pool.opened

    # ------------------------------------------------------------------ public API
    async def call_tool(
        self,
        name: str,
        arguments: JsonObject | None = None,
        *,
        idempotency_key: str | None = None,
        on_progress: ProgressCallback | None = None,
        trace: CallTrace | None = None,
    ) -> JsonObject:
        """Call a tool and return its result object (tool failures are results with
        ``isError: true``, as MCP has it).

        Args:
            name: the tool.
            arguments: its arguments.
            idempotency_key: the ``Idempotency-Key``; a fresh one from the key factory
                when None.  Re-sending a key with the same name and arguments gets the
                stored result; with different ones, :class:`IdempotencyKeyReused`.
                The key is also the call's ``progressToken``, so re-sends are
                byte-for-byte the same request.
            on_progress: awaited for each ``notifications/progress`` of this call.
            trace: filled in with what the call went through.

        Raises:
            WeirError: a subclass naming the refusal, :class:`StreamResumeViolation`,
                :class:`TransportError` or :class:`RpcError`.  The session stays usable
                (except after :class:`SessionGone` or :class:`CursorStale`).
        """
        params: JsonObject = {"name": name, "arguments": arguments or {}}
        key = idempotency_key if idempotency_key is not None else self._new_key()
        ex = _Exchange("tools/call", params, key, on_progress, trace or CallTrace())
        return await self._run(ex)

    async def list_tools(self) -> list[JsonObject]:
        """Every tool the server offers (following ``nextCursor``, at most 1000 pages)."""
        return await list_all(self.request, "tools/list", "tools")

    async def request(
        self,
        method: str,
        params: JsonObject | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        trace: CallTrace | None = None,
    ) -> JsonObject:
        """Send any request and return its ``result``.

        The retry rules of :meth:`call_tool` apply, but without an idempotency key the
        request is never POSTed again once the server has accepted it (its stream is
        still resumed); a refusal or failure after that point is raised.

        Raises:
            WeirError: as for :meth:`call_tool`.
        """
        return await self._run(_Exchange(method, params, None, on_progress, trace or CallTrace()))

    async def notify(self, method: str, params: JsonObject | None = None) -> None:
        """Send a notification (the server answers 202).

        Raises:
            WeirError: the server refused it, or the connection failed.
        """
        msg: JsonObject = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._post_simple(msgspec.json.encode(msg))

    async def rebind(self) -> RebindResult:
        """Perform the explicit rebind handshake (``weir/rebind``).

        The session moves to a new generation and this client to its new channel
        token; the server ends the streams of the old generation.  The handshake
        carries the current channel token: it is the proof that this client holds the
        channel (a server without authorization refuses a rebind without it).

        Raises:
            WeirError: the server refused it (:class:`RpcError` -32601 when it does
                not implement rebinding).
        """
        async with self._rebind_lock:
            return await self._rebind()

    async def close(self) -> None:
        """End the session (``DELETE``) and close every connection; idempotent.

        Errors are swallowed: the session is over for this client either way.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self.session_id is not None:
                with trio.move_on_after(min(self._timeout, 5.0)):
                    resp = await self._pool.request("DELETE", self._headers(accept=None))
                    await _read_body(resp)
        except (WeirError, ConnectionDropped) as exc:
            log.debug("DELETE of session %s failed: %s", redact(self.session_id or ""), exc)
        finally:
            await self._pool.aclose()

    # ------------------------------------------------------------------ lifecycle
    async def _initialize(self) -> None:
        caps: JsonObject = {}
        if "sampling/createMessage" in self._handlers:
            caps["sampling"] = {}
        if "elicitation/create" in self._handlers:
            caps["elicitation"] = {}
        if "roots/list" in self._handlers:
            caps["roots"] = {"listChanged": False}
        params: JsonObject = {
            "protocolVersion": self.protocol_version,
            "capabilities": caps,
            "clientInfo": self._client_info,
        }
        ex = _Exchange("initialize", params, None, None, CallTrace(), may_rebind=False)
        result = await self._run(ex)
        self.server_info = result
        version = result.get("protocolVersion")
        if isinstance(version, str):
            self.protocol_version = version
        self.session_id = ex.head.get("mcp-session-id")
        self.channel_token = ex.head.get("mcp-channel-token")
        self._owned = self._initialized = True
        experimental = (result.get("capabilities") or {}).get("experimental") or {}
        self.supports_rebind = isinstance(experimental, dict) and REBIND_METHOD in experimental
        await self.notify("notifications/initialized")

    def _attach(self, session_id: str, channel_token: str | None) -> None:
        self._initialized = True
        self.session_id = session_id
        self.channel_token = channel_token
        self.supports_rebind = True  # assumed: the caller knows which server it talks to

    async def _shutdown(self) -> None:
        with trio.CancelScope(shield=True):
            if self._owned:
                await self.close()
            else:
                self._closed = True
                await self._pool.aclose()

    # ------------------------------------------------------------------ the request loop
    def _headers(
        self, *, accept: str | None = _ACCEPT_BOTH, with_token: bool = True
    ) -> list[tuple[str, str]]:
        hdrs: list[tuple[str, str]] = []
        if accept is not None:
            hdrs.append(("accept", accept))
        if self.session_id is not None:
            hdrs.append(("mcp-session-id", self.session_id))
        if self._initialized:
            hdrs.append(("mcp-protocol-version", self.protocol_version))
        if with_token and self.channel_token is not None:
            hdrs.append(("mcp-channel-token", self.channel_token))
        return hdrs

    def _delay(self, attempt: int, floor: float | None) -> float:
        return self.retry.delay(attempt, floor, self._rng)

    async def _run(self, ex: _Exchange) -> JsonObject:
        if self._closed:
            raise TransportError(None, "closed", "this session is closed")
        if ex.key is not None:
            ex.trace.idempotency_keys.append(ex.key)
        attempts = reposts = 0
        while True:
            self._next_rid += 1
            ex.rid = self._next_rid
            ex.trace.request_ids.append(ex.rid)
            sent_token = self.channel_token
            try:
                msg = await self._attempt(ex)
            except ConnectionDropped as exc:
                # Died before the first event id: only a keyed call may be re-sent.
                if not ex.resendable or ex.key is None or reposts >= self.retry.max_reconnects:
                    raise TransportError(None, "transport", str(exc)) from None
                await trio.sleep(self._delay(reposts, None))
                reposts += 1
                ex.trace.reposts += 1
                continue
            except (Overloaded, InProgress) as err:
                too_long = (err.retry_after or 0.0) > self.retry.max_delay
                if attempts >= self.retry.max_attempts or too_long or not ex.resendable:
                    raise
                ex.trace.refusals.append(err)
                await trio.sleep(self._delay(attempts, err.retry_after))
                attempts += 1
                continue
            except ChannelUnbound as err:
                if not ex.may_rebind or ex.trace.rebinds >= self.retry.max_rebinds:
                    raise
                if not self.supports_rebind:
                    raise
                ex.trace.refusals.append(err)
                ex.trace.rebinds += 1
                found = await self._recover_channel(sent_token, ex.trace.request_ids)
                if found is not None:
                    ex.trace.replayed_by_rebind = True
                    return _rpc_result(found, None)
                if not ex.resendable:
                    raise
                if ex.key is not None and not ex.accepted:
                    # Never accepted anywhere: a fresh key, as the server asks.  Once
                    # accepted, the old key is the only thing that stops a second run.
                    ex.key = self._new_key()
                    ex.trace.idempotency_keys.append(ex.key)
                continue
            except trio.Cancelled:
                if ex.method != "initialize" and self.session_id is not None:
                    self._nursery.start_soon(self._send_cancelled, ex.rid)
                raise
            return _rpc_result(msg, 200)

    async def _attempt(self, ex: _Exchange) -> JsonObject:
        """POST once and follow the answer (and its resumes) to our response.

        Raises:
            ConnectionDropped: the connection died before any event id (nothing to resume from).
            WeirError: a refusal, violation or bad answer.
        """
        ex.new_stream()
        hdrs = [*self._headers(with_token=ex.with_token), ("content-type", "application/json")]
        if ex.key is not None:
            hdrs.append(("idempotency-key", ex.key))
        resp = await self._pool.request("POST", hdrs, ex.body())
        ex.head = resp.headers
        ex.accepted = ex.accepted or resp.status == 200
        if resp.status == 200 and resp.content_type == "text/event-stream":
            return await self._follow(ex, resp)
        body = await _read_body(resp)
        if 200 < resp.status < 300:
            raise BadResponse(resp.status, None, f"HTTP {resp.status} for a request")
        if resp.status != 200:
            raise _refusal(resp.status, resp.headers, body)
        if resp.content_type != "application/json":
            raise BadResponse(200, None, f"unexpected content type {resp.content_type!r}")
        msg = _decode(body, 200)
        if isinstance(msg, list):  # a batch answer (2025-03-26): find ours
            msg = next((m for m in msg if isinstance(m, dict) and m.get("id") == ex.rid), None)
        if not isinstance(msg, dict) or msg.get("id") != ex.rid:
            raise BadResponse(200, None, f"the JSON answer is not our response: {msg!r}")
        return msg

    async def _follow(self, ex: _Exchange, resp: Response) -> JsonObject:
        """Read a request's SSE stream to our response, resuming it whenever it ends early."""
        failures = 0
        while True:
            before = len(ex.trace.observed_events), ex.cursor
            msg = await self._read_stream(ex, resp)
            if msg is not None:
                return msg
            if ex.cursor is None:
                raise ConnectionDropped("the stream ended before its first event id")
            progressed = (len(ex.trace.observed_events), ex.cursor) != before
            failures = 0 if progressed else failures + 1
            resp = await self._resume(ex, failures)

    async def _resume(self, ex: _Exchange, failures: int) -> Response:
        """GET + ``Last-Event-ID`` from the newest cursor, after the server's ``retry``."""
        while True:
            if failures > self.retry.max_reconnects:
                raise TransportError(
                    None, "transport", f"stream not resumable after {failures - 1} reconnects"
                )
            floor = ex.retry_ms / 1000 if ex.retry_ms is not None else None
            floor = min(floor, self.retry.max_delay) if floor is not None else None
            await trio.sleep(self._delay(failures, floor) if failures or floor else 0.0)
            assert ex.cursor is not None
            ex.trace.resume_cursors.append(ex.cursor)
            hdrs = [*self._headers(accept="text/event-stream"), ("last-event-id", ex.cursor)]
            try:
                resp = await self._pool.request("GET", hdrs)
            except ConnectionDropped:
                failures += 1
                continue
            if resp.status == 200 and resp.content_type == "text/event-stream":
                return resp
            try:
                body = await _read_body(resp)
            except ConnectionDropped:
                body = b""
            err = _refusal(resp.status, resp.headers, body)
            if not isinstance(err, Overloaded) or failures >= self.retry.max_reconnects:
                raise err
            ex.trace.refusals.append(err)
            ex.retry_ms = int((err.retry_after or 0.0) * 1000)
            failures += 1

    async def _read_stream(self, ex: _Exchange, resp: Response) -> JsonObject | None:
        """Our response from one HTTP SSE response, or None if it ended without it."""
        decoder = SseDecoder()
        assert ex.contiguity is not None
        try:
            while True:
                try:
                    chunk = await resp.chunk()
                except ConnectionDropped:
                    break
                if not chunk:
                    break
                try:
                    items = decoder.feed(chunk)
                except SseDecodeError as exc:
                    raise BadResponse(200, None, f"bad event stream: {exc}") from exc
                for item in items:
                    if isinstance(item, SseComment):
                        ex.contiguity.comment(item.text)
                        continue
                    ex.contiguity.event(item.id)
                    if item.id is not None:
                        ex.cursor = item.id
                    if item.event != "message" or not item.data:
                        continue  # the priming event, or not MCP
                    msg = await self._on_message(ex, _decode(item.data, 200))
                    if msg is not None:
                        await resp.drain(_DRAIN_SECONDS)
                        return msg
        finally:
            if decoder.retry is not None:
                ex.retry_ms = decoder.retry
            await resp.aclose()
        return None

    async def _on_message(self, ex: _Exchange, msg: Any) -> JsonObject | None:
        """Route one message of a stream; our response is returned."""
        if not isinstance(msg, dict):
            raise BadResponse(200, None, f"not a JSON-RPC message: {msg!r}")
        method = msg.get("method")
        if not isinstance(method, str):
            return msg if msg.get("id") == ex.rid else None  # a stray answer is ignored
        raw_params = msg.get("params")
        params: JsonObject = raw_params if isinstance(raw_params, dict) else {}
        if "id" in msg:
            self._nursery.start_soon(self._answer, msg["id"], method, params)
        elif method == "notifications/progress" and ex.on_progress is not None:
            if params.get("progressToken") == ex.progress_token:
                total, message = params.get("total"), params.get("message")
                await ex.on_progress(
                    float(params.get("progress", 0)),
                    float(total) if isinstance(total, int | float) else None,
                    message if isinstance(message, str) else None,
                )
        elif self._on_notification is not None:
            await self._on_notification(method, params)
        return None

    # ------------------------------------------------------------------ channel
    async def _rebind(self) -> RebindResult:
        ex = _Exchange(REBIND_METHOD, None, None, None, CallTrace(), with_token=True)
        ex.may_rebind = False
        result = await self._run(ex)
        token = ex.head.get("mcp-channel-token") or result.get("channelToken")
        generation = result.get("generation")
        results = result.get("results")
        if not isinstance(token, str) or not isinstance(generation, int):
            raise BadResponse(200, None, f"a rebind answer without a token: {result!r}")
        self.channel_token = token
        self._rebind_results = (
            [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
        )
        return RebindResult(generation, token, self._rebind_results)

    async def _recover_channel(self, sent_token: str | None, ids: list[int]) -> JsonObject | None:
        """Rebind after ``channel_unbound`` unless a concurrent call already did;
        return our response if the latest rebind's results hold it."""
        async with self._rebind_lock:
            if self.channel_token == sent_token:
                await self._rebind()
            results = self._rebind_results
        wanted = set(ids)
        return next((r for r in results if r.get("id") in wanted), None)

    # ------------------------------------------------------------------ background
    async def _post_simple(self, body: bytes) -> None:
        hdrs = [*self._headers(), ("content-type", "application/json")]
        try:
            resp = await self._pool.request("POST", hdrs, body)
            data = await _read_body(resp)
        except ConnectionDropped as exc:
            raise TransportError(None, "transport", str(exc)) from None
        if resp.status not in (200, 202, 204):
            raise _refusal(resp.status, resp.headers, data)

    async def _answer(self, rid: Any, method: str, params: JsonObject) -> None:
        """Answer one server-to-client request by POST."""
        handler = self._handlers.get(method)
        error: JsonObject | None = None
        result: Any = {}
        if method == "ping":
            pass
        elif handler is None:
            error = {"code": -32601, "message": f"the client does not handle {method}"}
        else:
            try:
                result = await handler(params)
            except Exception as exc:
                log.warning("the %s callback failed: %r", method, exc)
                error = {"code": -32603, "message": f"{type(exc).__name__}: {exc}"}
        outcome = {"error": error} if error is not None else {"result": result}
        try:
            body = msgspec.json.encode({"jsonrpc": "2.0", "id": rid, **outcome})
        except (TypeError, msgspec.EncodeError) as exc:
            log.warning("the %s callback returned something not JSON: %r", method, exc)
            error = {"code": -32603, "message": "the client's answer was not JSON"}
            body = msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "error": error})
        try:
            with trio.fail_after(self._timeout):
                await self._post_simple(body)
        except (WeirError, trio.TooSlowError) as exc:
            log.warning("could not answer the server's %s: %s", method, exc)

    async def _send_cancelled(self, rid: int) -> None:
        params = {"requestId": rid, "reason": "cancelled by the client"}
        try:
            with trio.fail_after(min(self._timeout, 5.0)):
                await self.notify("notifications/cancelled", params)
        except (WeirError, trio.TooSlowError) as exc:
            log.debug("could not send notifications/cancelled for %s: %s", rid, exc)


@asynccontextmanager
async def open_session(
    url: str,
    *,
    client_info: JsonObject | None = None,
    protocol_version: str = "2025-11-25",
    timeout: float = 60.0,
    retry: RetryPolicy | None = None,
    sampling: ServerRequestHandler | None = None,
    elicitation: ServerRequestHandler | None = None,
    roots: ServerRequestHandler | None = None,
    on_notification: NotificationHandler | None = None,
    key_factory: Callable[[], str] | None = None,
    rng: Callable[[], float] | None = None,
    session_id: str | None = None,
    channel_token: str | None = None,
) -> AsyncIterator[ClientSession]:
    """Open an MCP session and close it (``DELETE``) on exit.

    Args:
        url: the MCP endpoint, e.g. ``http://127.0.0.1:8000/mcp``.
        client_info: ``clientInfo`` for ``initialize``.
        protocol_version: the revision to ask for.
        timeout: seconds any single wait may take: connecting, a response head, the
            next bytes of a body.  A silent SSE stream is resumed after it.
        retry: bounds on retries, reconnects and rebinds.
        sampling, elicitation, roots: answer ``sampling/createMessage``,
            ``elicitation/create`` and ``roots/list`` (params in, result out); each
            one given is declared in the client's capabilities.  Requests without a
            callback get JSON-RPC error -32601.
        on_notification: receives notifications other than a call's own progress.
        key_factory: makes idempotency keys (default: ``uuid4``).
        rng: returns floats in [0, 1) for backoff jitter (default: ``random.random``).
        session_id: attach to this existing session instead of initializing one (it is
            then not deleted on exit); ``channel_token`` is its token, if known.

    Raises:
        WeirError: ``initialize`` failed.
    """
    async with trio.open_nursery() as nursery:
        session = ClientSession(
            url,
            nursery,
            client_info=client_info or {"name": "weir-client", "version": "0.1.0"},
            protocol_version=protocol_version,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            key_factory=key_factory or (lambda: str(uuid.uuid4())),
            rng=rng or random.random,
            sampling=sampling,
            elicitation=elicitation,
            roots=roots,
            on_notification=on_notification,
        )
        try:
            if session_id is None:
                await session._initialize()
            else:
                session._attach(session_id, channel_token)
            yield session
        finally:
            await session._shutdown()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_client(
    url: str,
    *,
    mode: str = "auto",
    client_info: JsonObject | None = None,
    timeout: float = 60.0,
    retry: RetryPolicy | None = None,
    sampling: ServerRequestHandler | None = None,
    elicitation: ServerRequestHandler | None = None,
    roots: ServerRequestHandler | None = None,
    on_notification: NotificationHandler | None = None,
    key_factory: Callable[[], str] | None = None,
    rng: Callable[[], float] | None = None,
) -> AsyncIterator[SessionlessClient | ClientSession]:
    """A client for ``url`` in the newest era it serves.

    ``mode``: ``"auto"`` (probe ``server/discover``; fall back to the session era),
    ``"sessionless"`` (2026-07-28 or fail) or ``"session"`` (``initialize``, as
    :func:`~weir.engine.client.open_session`).  Other arguments as for ``open_session``.

    Raises:
        ValueError: an unknown ``mode``.
        WeirError: ``"sessionless"`` and the server does not serve 2026-07-28, or
            the connection failed.
    """
    if mode not in ("auto", "session", "sessionless"):
        raise ValueError(f"mode must be 'auto', 'session' or 'sessionless', not {mode!r}")
    info = client_info or {"name": "weir-client", "version": "0.1.0"}
    handlers: dict[str, ServerRequestHandler] = {}
    for method, handler in (
        ("sampling/createMessage", sampling),
        ("elicitation/create", elicitation),
        ("roots/list", roots),
    ):
        if handler is not None:
            handlers[method] = handler
    if mode != "session":
        pool = Pool(url, timeout)
        caps = capabilities_for(handlers)
        try:
            found = await discover(pool, info, caps)
        except ConnectionDropped as exc:
            await pool.aclose()
            raise TransportError(None, "transport", str(exc)) from None
        except BaseException:
            await pool.aclose()
            raise
        if found is not None:
            client = SessionlessClient(
                pool,
                client_info=info,
                retry=retry or RetryPolicy(),
                key_factory=key_factory or (lambda: str(uuid.uuid4())),
                rng=rng or random.random,
                handlers=handlers,
                on_notification=on_notification,
                discovered=found,
            )
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True):
                    await client.close()
            return
        await pool.aclose()
        if mode == "sessionless":
            raise WeirError(None, None, f"{url} does not serve protocol revision {VERSION}", None)
    async with open_session(
        url,
        client_info=info,
        timeout=timeout,
        retry=retry,
        sampling=sampling,
        elicitation=elicitation,
        roots=roots,
        on_notification=on_notification,
        key_factory=key_factory,
        rng=rng,
    ) as session:
        yield session
