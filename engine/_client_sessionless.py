"""weir's client on the sessionless revision (2026-07-28).

Theory of operation
-------------------
:func:`weir.engine.client.open_client` probes ``server/discover`` (:func:`discover`);
a server that lists 2026-07-28 gets a :class:`SessionlessClient`, any other the
session-era :class:`~weir.engine.client.SessionClient` (``initialize``).  Every request of a
:class:`SessionlessClient` carries what a session used to remember -- the version,
the client's capabilities and info in ``params._meta`` -- and the headers that say
what it is (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``, values outside
plain ASCII sent as ``=?base64?...?=``).

The guarantees the session-era client keeps, kept here:

* **Backoff.**  ``429`` (half-open, limits), ``503`` and ``409 in_progress`` are
  retried after ``Retry-After`` with jittered exponential backoff, within the
  :class:`RetryPolicy`'s bounds.
* **Exactly once.**  A ``tools/call`` always carries an ``Idempotency-Key``.  This
  revision cannot resume a lost response stream, so a call whose connection died
  is issued again -- new JSON-RPC id, same key -- and the server's gate answers it
  from the first run instead of running it twice.  A request without a key is
  never sent again once the server may have accepted it.
* **Input-required rounds.**  An ``input_required`` answer's asks go to the
  ``sampling``/``elicitation``/``roots`` handlers (all of one round at once), and the
  request is issued again with ``inputResponses`` and the ``requestState``, at most
  :data:`MAX_ROUNDS` times.
* **Tasks.**  The client declares the tasks extension; a call the server answers
  with a task handle is driven to its end: ``tasks/get`` at the server's
  ``pollIntervalMs`` (bounded below and above), questions answered through the
  same handlers and ``tasks/update``, the inlined result returned as the call's
  (a ``failed`` task is an :class:`RpcError`, a ``cancelled`` one a
  :class:`TaskCancelled`).  A caller that gives up (its own cancellation) sends
  ``tasks/cancel`` first.  ``trace.task_id`` is the handle, for callers who want it.
* **Listening.**  :meth:`SessionlessClient.listen` holds a ``subscriptions/listen``
  response and yields its change notifications, acknowledgement first.
* **Typed results, plain errors.**  ``call_tool`` and the methods of
  :class:`~weir.engine._client_methods.McpMethods` decode their answers into Structs; a
  connection that fails anywhere (the POST, its SSE stream, a listen stream) is a
  :class:`TransportError`, a stream that is not SSE a :class:`BadResponse`.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Final

import msgspec
import trio

from weir.protocol.sse import SseDecodeError, SseDecoder, SseEvent

from ._client_common import (
    BadResponse,
    CallTrace,
    GatewayError,
    InProgress,
    JsonObject,
    NotificationHandler,
    Overloaded,
    ProgressCallback,
    RetryPolicy,
    RpcError,
    ServerRequestHandler,
    TransportError,
    WeirError,
    _decode,
    _read_body,
    _refusal,
    _rpc_result,
    unwrap_single,
)
from ._client_http import ConnectionDropped, Pool, Response
from ._client_methods import McpMethods
from ._client_types import CallToolResult, decode_result

VERSION: Final = "2026-07-28"
#: The most input-required rounds one request may take.
MAX_ROUNDS: Final = 10
_NAMED: Final = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
#: The tasks extension this client drives.
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
#: Bounds on the interval between polls of a task (seconds), whatever the server says.
POLL_FLOOR: Final = 0.05
POLL_CEILING: Final = 30.0
CAPABILITY_OF: Final = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}


def ask_handlers(
    sampling: ServerRequestHandler | None,
    elicitation: ServerRequestHandler | None,
    roots: ServerRequestHandler | None,
) -> dict[str, ServerRequestHandler]:
    """The server-to-client requests a client answers, by method: those given."""
    given = zip(CAPABILITY_OF, (sampling, elicitation, roots), strict=True)
    return {method: handler for method, handler in given if handler is not None}


def capabilities_for(handlers: dict[str, ServerRequestHandler]) -> JsonObject:
    """The client capabilities that the given ask handlers stand for, and the tasks
    extension (this client drives tasks itself)."""
    caps: JsonObject = {cap: {} for method, cap in CAPABILITY_OF.items() if method in handlers}
    caps["extensions"] = {TASKS_EXTENSION: {}}
    return caps


def request_meta(
    caps: JsonObject, client_info: JsonObject, progress_token: str | None = None
) -> JsonObject:
    """What every request of this revision says about its client (``params._meta``)."""
    meta: JsonObject = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": client_info,
    }
    if progress_token is not None:
        meta["progressToken"] = progress_token
    return meta


def header_value(value: str) -> str:
    """A header value as this revision writes it: plain printable ASCII without edge
    whitespace as it is, anything else in the ``=?base64?...?=`` form."""
    plain = value.isascii() and value.isprintable() and value == value.strip()
    if plain and not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


class SessionlessClient(McpMethods):
    """weir's client on 2026-07-28 (see the module docstring)."""

    protocol_version = VERSION
    session_id = None

    def __init__(
        self,
        pool: Pool,
        *,
        client_info: JsonObject,
        retry: RetryPolicy,
        key_factory: Callable[[], str],
        rng: Callable[[], float],
        handlers: dict[str, ServerRequestHandler],
        on_notification: NotificationHandler | None,
        discovered: JsonObject,
    ) -> None:
        self._pool = pool
        self._client_info = client_info
        self.retry = retry
        self._new_key = key_factory
        self._rng = rng
        self._handlers = handlers
        self._on_notification = on_notification
        #: ``server/discover``'s result (versions, capabilities, identity).
        self.server_info = discovered
        #: What this client declares on every request.
        self.capabilities = capabilities_for(handlers)
        self._next_rid = 0
        self._closed = False

    # ------------------------------------------------------------------ public API
    async def call_tool(
        self,
        name: str,
        arguments: JsonObject | None = None,
        *,
        idempotency_key: str | None = None,
        on_progress: ProgressCallback | None = None,
        trace: CallTrace | None = None,
    ) -> CallToolResult:
        """Call a tool (exactly once: see the module docstring); its result.

        Raises:
            WeirError: a refusal, :class:`TransportError` (the server is gone),
                :class:`RpcError` or :class:`MalformedResponse`.
        """
        key = idempotency_key if idempotency_key is not None else self._new_key()
        params: JsonObject = {"name": name, "arguments": arguments or {}}
        result = await self._run("tools/call", params, key, on_progress, trace or CallTrace())
        return decode_result(CallToolResult, result, "tools/call")

    async def request(
        self,
        method: str,
        params: JsonObject | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        trace: CallTrace | None = None,
    ) -> JsonObject:
        """Send any request; its ``result`` object as it came (never re-sent once
        possibly accepted)."""
        return await self._run(method, dict(params or {}), None, on_progress, trace or CallTrace())

    @asynccontextmanager
    async def listen(self, **notifications: Any) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """Hold a ``subscriptions/listen`` stream; yields an iterator of its messages
        (the acknowledgement first).  ``notifications`` are the flags, e.g.
        ``toolsListChanged=True`` or ``resourceSubscriptions=["file:///a"]``."""
        self._next_rid += 1
        rid = f"listen-{self._next_rid}"
        params = {"notifications": notifications, "_meta": self._meta(None)}
        body = msgspec.json.encode(
            {"jsonrpc": "2.0", "id": rid, "method": "subscriptions/listen", "params": params}
        )
        hdrs = self._headers("subscriptions/listen", params, None)
        try:
            resp = await self._pool.request("POST", hdrs, body)
            if resp.status != 200:
                raise _refusal(resp.status, resp.headers, await _read_body(resp))
        except ConnectionDropped as exc:
            raise TransportError(None, "transport", str(exc)) from None

        async def messages() -> AsyncIterator[JsonObject]:
            try:
                async for msg in _sse_messages(resp):
                    yield msg
            except ConnectionDropped as exc:
                raise TransportError(None, "transport", str(exc)) from None

        try:
            yield messages()
        finally:
            await resp.aclose()

    async def close(self) -> None:
        """Close every connection (there is no session to end); idempotent."""
        self._closed = True
        await self._pool.aclose()

    # ------------------------------------------------------------------ the request loop
    def _meta(self, progress_token: str | None) -> JsonObject:
        return request_meta(self.capabilities, self._client_info, progress_token)

    def _headers(self, method: str, params: JsonObject, key: str | None) -> list[tuple[str, str]]:
        hdrs = [
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-protocol-version", VERSION),
            ("mcp-method", method),
        ]
        field = _NAMED.get(method)
        if field is not None and isinstance(params.get(field), str):
            hdrs.append(("mcp-name", header_value(params[field])))
        if key is not None:
            hdrs.append(("idempotency-key", key))
        return hdrs

    def _delay(self, attempt: int, floor: float | None) -> float:
        return self.retry.delay(attempt, floor, self._rng)

    async def _run(
        self,
        method: str,
        params: JsonObject,
        key: str | None,
        on_progress: ProgressCallback | None,
        trace: CallTrace,
    ) -> JsonObject:
        if self._closed:
            raise TransportError(None, "closed", "this client is closed")
        if key is not None:
            trace.idempotency_keys.append(key)
        token = key or (f"weir-{self._next_rid + 1}" if on_progress is not None else None)
        params = {**params, "_meta": self._meta(token)}
        for _ in range(MAX_ROUNDS):
            result = await self._deliver(method, params, key, on_progress, trace)
            if result.get("resultType") == "task" and isinstance(result.get("taskId"), str):
                trace.task_id = result["taskId"]
                return await self._drive_task(result, trace)
            if result.get("resultType") != "input_required":
                return result
            params = {**params, **(await self._answer_round(result))}
        raise TransportError(None, "input_required", f"{method} asked for input {MAX_ROUNDS} times")

    async def _drive_task(self, handle: JsonObject, trace: CallTrace) -> JsonObject:
        """Poll a task to its end, answering its questions; its result."""
        task_id = str(handle["taskId"])
        try:
            task = handle
            while True:
                status = task.get("status")
                if status == "completed":
                    result = task.get("result")
                    if not isinstance(result, dict):
                        raise BadResponse(200, None, f"a completed task without result: {task!r}")
                    return result
                if status == "failed":
                    sent = task.get("error")
                    error: JsonObject = sent if isinstance(sent, dict) else {}
                    data = error.get("data") if isinstance(error.get("data"), dict) else None
                    raise RpcError(
                        None,
                        (data or {}).get("reason"),
                        str(error.get("message", "the task failed")),
                        data,
                        code=error.get("code") if isinstance(error.get("code"), int) else None,
                    )
                if status == "cancelled":
                    raise TaskCancelled(None, "cancelled", f"task {task_id} was cancelled")
                if status == "input_required":
                    answered = await self._answer_round(task)
                    update = {"taskId": task_id, "inputResponses": answered["inputResponses"]}
                    await self._task_request("tasks/update", update, trace)
                else:
                    interval = task.get("pollIntervalMs")
                    wait = interval / 1000 if isinstance(interval, int | float) else 1.0
                    await trio.sleep(min(max(wait, POLL_FLOOR), POLL_CEILING))
                task = await self._task_request("tasks/get", {"taskId": task_id}, trace)
        except trio.Cancelled:
            with trio.CancelScope(shield=True) as shield:  # the caller gave up: stop it
                shield.deadline = trio.current_time() + 5.0
                with suppress(WeirError):
                    await self._task_request("tasks/cancel", {"taskId": task_id}, trace)
            raise

    async def get_task(self, task_id: str) -> JsonObject:
        """``tasks/get``: the task as it stands (its result or error inlined once it ended)."""
        return await self._task_request("tasks/get", {"taskId": task_id}, CallTrace())

    async def cancel_task(self, task_id: str) -> None:
        """``tasks/cancel`` (a task that already ended is left as it is)."""
        await self._task_request("tasks/cancel", {"taskId": task_id}, CallTrace())

    async def _task_request(self, method: str, params: JsonObject, trace: CallTrace) -> JsonObject:
        """A ``tasks/*`` request, sent again if its connection drops: each is safe to
        repeat (reading, cancelling, and answering a question that is already
        answered all leave the task as the first delivery did)."""
        params = {**params, "_meta": self._meta(None)}
        for attempt in range(self.retry.max_reconnects + 1):
            try:
                return await self._deliver(method, params, None, None, trace)
            except TransportError:
                if attempt >= self.retry.max_reconnects:
                    raise
                await trio.sleep(self._delay(attempt, None))
        raise AssertionError("unreachable")

    async def _answer_round(self, result: JsonObject) -> JsonObject:
        """Answer one round's asks (concurrently); the params of the next round."""
        asks = result.get("inputRequests") or {}
        answers: JsonObject = {}
        if not isinstance(asks, dict):
            raise BadResponse(200, None, f"inputRequests is not an object: {asks!r}")

        async def answer(key: str, ask: Any) -> None:
            method = ask.get("method") if isinstance(ask, dict) else None
            handler = self._handlers.get(method) if isinstance(method, str) else None
            if handler is None:
                raise RpcError(None, None, f"no handler for the server's ask {method!r}", None)
            answers[key] = await handler(ask.get("params") or {})

        with unwrap_single():
            async with trio.open_nursery() as nursery:
                for key, ask in asks.items():
                    nursery.start_soon(answer, key, ask)
        out: JsonObject = {"inputResponses": answers}
        if isinstance(result.get("requestState"), str):
            out["requestState"] = result["requestState"]
        return out

    async def _deliver(
        self,
        method: str,
        params: JsonObject,
        key: str | None,
        on_progress: ProgressCallback | None,
        trace: CallTrace,
    ) -> JsonObject:
        """One round: POST (again, as the retry rules allow) until it is answered."""
        attempts = reposts = 0
        while True:
            self._next_rid += 1
            rid = self._next_rid
            trace.request_ids.append(rid)
            body = msgspec.json.encode(
                {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            )
            accepted = False
            try:
                resp = await self._pool.request("POST", self._headers(method, params, key), body)
                accepted = resp.status == 200
                msg = await self._answer_of(resp, rid, on_progress)
            except GatewayError:
                # A proxy gave up on the server: it may have run; only a key makes a
                # re-send safe.
                if key is None or reposts >= self.retry.max_reconnects:
                    raise
                await trio.sleep(self._delay(reposts, None))
                reposts += 1
                trace.reposts += 1
                continue
            except ConnectionDropped as exc:
                # No resumption in this revision: re-issue, safely only under a key.
                if (accepted and key is None) or reposts >= self.retry.max_reconnects:
                    raise TransportError(None, "transport", str(exc)) from None
                await trio.sleep(self._delay(reposts, None))
                reposts += 1
                trace.reposts += 1
                continue
            except (Overloaded, InProgress) as err:
                too_long = (err.retry_after or 0.0) > self.retry.max_delay
                if attempts >= self.retry.max_attempts or too_long:
                    raise
                trace.refusals.append(err)
                await trio.sleep(self._delay(attempts, err.retry_after))
                attempts += 1
                continue
            return _rpc_result(msg, 200)

    async def _answer_of(
        self, resp: Response, rid: int, on_progress: ProgressCallback | None
    ) -> JsonObject:
        if resp.status != 200:
            raise _refusal(resp.status, resp.headers, await _read_body(resp))
        if resp.content_type == "application/json":
            msg = _decode(await _read_body(resp), 200)
            if isinstance(msg, dict) and msg.get("id") == rid:
                return msg
            raise BadResponse(200, None, f"the JSON answer is not our response: {msg!r}")
        try:
            async for msg in _sse_messages(resp):
                if msg.get("id") == rid and ("result" in msg or "error" in msg):
                    return msg
                await self._notification(msg, on_progress)
        finally:
            await resp.aclose()
        raise ConnectionDropped("the response stream ended before its answer")

    async def _notification(self, msg: JsonObject, on_progress: ProgressCallback | None) -> None:
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "notifications/progress" and on_progress is not None:
            await on_progress(
                float(params.get("progress", 0)), params.get("total"), params.get("message")
            )
        elif isinstance(method, str) and self._on_notification is not None:
            await self._on_notification(method, params)


class TaskCancelled(RpcError):
    """The call's task was cancelled (by another holder of its handle, or the server)."""


async def _sse_messages(resp: Response) -> AsyncIterator[JsonObject]:
    """The JSON messages of an SSE response, in order, until it ends."""
    decoder = SseDecoder()
    while chunk := await resp.chunk():
        try:
            items = decoder.feed(chunk)
        except SseDecodeError as exc:
            raise BadResponse(200, None, f"bad event stream: {exc}") from None
        for item in items:
            if isinstance(item, SseEvent) and item.data:
                msg = _decode(item.data, 200)
                if isinstance(msg, dict):
                    yield msg


async def discover(pool: Pool, client_info: JsonObject, caps: JsonObject) -> JsonObject | None:
    """``server/discover``'s result if the server serves 2026-07-28, else None."""
    params = {"_meta": request_meta(caps, client_info)}
    body = msgspec.json.encode(
        {"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": params}
    )
    hdrs = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
        ("mcp-protocol-version", VERSION),
        ("mcp-method", "server/discover"),
    ]
    resp = await pool.request("POST", hdrs, body)
    raw = await _read_body(resp)
    if resp.status != 200 or resp.content_type != "application/json":
        return None  # a session-era server (a refusal, or another shape)
    try:
        msg = _decode(raw, 200)
    except BadResponse:
        return None
    result = msg.get("result") if isinstance(msg, dict) else None
    versions = result.get("supportedVersions") if isinstance(result, dict) else None
    return result if isinstance(versions, list) and VERSION in versions else None
