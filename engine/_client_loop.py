"""The session-era client's request loop: exchanges, resumption, refusals, rebinding.

Theory of operation
-------------------
:class:`SessionTransport` is the machinery under
:class:`weir.engine.client.SessionClient`: every request it sends (``call_tool``,
``request``, ``initialize``, ``weir/rebind``) is one
:class:`~weir.engine._client_exchange.Exchange` driven by :meth:`SessionTransport._run`,
with the session id, the negotiated ``Mcp-Protocol-Version`` and the channel token.

**HTTP.**  Each request borrows one keep-alive connection (h11 over a Trio stream)
from a small pool, :mod:`engine._client_http`, and gives it back once its response has
been read to the end; a connection whose response was abandoned is closed instead.
So concurrent requests use one connection each and sequential ones share.  A reused
connection that fails before a single response byte arrives (the server closed it
while idle) is replaced by a fresh one once; nothing else is re-sent implicitly.

The POST's answer is one JSON body or an SSE stream.  SSE events are decoded by
:class:`weir.protocol.sse.SseDecoder`; progress notifications go to the call's
``on_progress``, other notifications to the session's ``on_notification``,
server-to-client requests (sampling, elicitation, roots, ping) are answered by POST
from a background task (``-32601`` when no callback is configured), and the response
whose id is ours ends the exchange.

**Resumption.**  When the stream ends without our response (the server sent
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

**Refusals** are decided by ``error.data.reason``, never by the status alone:

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
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from weir.protocol.sse import SseComment, SseDecodeError, SseDecoder

from ._client_common import (
    _ACCEPT_BOTH,
    _DRAIN_SECONDS,
    REBIND_METHOD,
    BadResponse,
    CallTrace,
    ChannelUnbound,
    GatewayError,
    InProgress,
    JsonObject,
    NotificationHandler,
    Overloaded,
    RebindResult,
    RetryPolicy,
    ServerRequestHandler,
    TransportError,
    WeirError,
    _decode,
    _read_body,
    _refusal,
    _rpc_result,
)
from ._client_exchange import Exchange
from ._client_http import ConnectionDropped, Pool, Response
from ._client_sessionless import ask_handlers

__all__ = ["SessionTransport"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the loop
class SessionTransport:
    """The request loop of one session-era client (see the module docstring); the
    public methods are :class:`weir.engine.client.SessionClient`'s."""

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
        self._handlers = ask_handlers(sampling, elicitation, roots)
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

    async def notify(self, method: str, params: JsonObject | None = None) -> None:
        """Send a notification (the server answers 202).

        Raises:
            WeirError: the server refused it, or the connection failed.
        """
        msg: JsonObject = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._post_simple(msgspec.json.encode(msg))

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

    async def _run(self, ex: Exchange) -> JsonObject:
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
            except (ConnectionDropped, GatewayError) as exc:
                # Died before the first event id (or a proxy gave up on the server):
                # only a keyed call may be re-sent.
                if not ex.resendable or ex.key is None or reposts >= self.retry.max_reconnects:
                    if isinstance(exc, GatewayError):
                        raise
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

    async def _attempt(self, ex: Exchange) -> JsonObject:
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

    async def _follow(self, ex: Exchange, resp: Response) -> JsonObject:
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

    async def _resume(self, ex: Exchange, failures: int) -> Response:
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

    async def _read_stream(self, ex: Exchange, resp: Response) -> JsonObject | None:
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

    async def _on_message(self, ex: Exchange, msg: Any) -> JsonObject | None:
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
        ex = Exchange(REBIND_METHOD, None, None, None, CallTrace(), with_token=True)
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
