"""weir's MCP client: Streamable HTTP on Trio, built for the failures weir guards against.

Theory of operation
-------------------
:func:`open_client` picks the era: it probes ``server/discover`` and, if the server
serves 2026-07-28, returns a :class:`~weir.engine._client_sessionless.SessionlessClient`
(self-contained requests, input-required rounds, listen streams); otherwise, or with
``mode="session"``, a :class:`SessionClient`.  Both offer the same typed methods
(:mod:`engine._client_methods`): ``call_tool`` returns a :class:`CallToolResult`,
``list_tools`` a list of :class:`Tool`, and so on (:mod:`engine._client_types`), while
``request(method, params)`` returns any method's ``result`` object as it came.  The
errors, the retry bounds and the call traces are shared (:mod:`engine._client_common`).

:func:`open_session` opens a :class:`SessionClient`: it POSTs ``initialize``, keeps the
``Mcp-Session-Id`` and the ``Mcp-Channel-Token`` (``<generation>.<secret>``) the server
hands back, sends ``notifications/initialized``, and ends the session (``DELETE``) on
exit.  Servers that issue no channel token (the official SDKs) are served the same
way, minus the token.  How each request is sent, resumed, retried and rebound is the
request loop's business (:mod:`engine._client_loop`).

**Errors.**  Every failure is a :class:`WeirError`: a refusal by its reason, a
server that is gone (refused, reset, killed mid-call, silent) a
:class:`TransportError`, an answer that does not decode a :class:`MalformedResponse`.
The session keeps a Trio nursery for its background tasks (answers to the server's
requests, cancellations); an error that passes through it comes out as itself, not
wrapped in an exception group, as long as it is the only one.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from ._client_common import (
    REBIND_METHOD,
    BadResponse,
    CallTrace,
    ChannelUnbound,
    CursorInvalid,
    CursorStale,
    CursorUnknown,
    GatewayError,
    HalfOpenError,
    IdempotencyKeyReused,
    InProgress,
    JsonObject,
    NotificationHandler,
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
    _read_body,
    unwrap_single,
)
from ._client_exchange import Exchange
from ._client_http import ConnectionDropped, Pool
from ._client_loop import SessionTransport
from ._client_methods import MAX_PAGES, McpMethods
from ._client_sessionless import (
    VERSION,
    SessionlessClient,
    TaskCancelled,
    ask_handlers,
    capabilities_for,
    discover,
)
from ._client_types import (
    Annotations,
    AudioContent,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    GetPromptResult,
    ImageContent,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    MalformedResponse,
    PaginationError,
    Prompt,
    PromptArgument,
    PromptMessage,
    ReadResourceResult,
    Resource,
    ResourceContents,
    ResourceLink,
    ResourceTemplate,
    TextContent,
    Tool,
    ToolAnnotations,
    UnknownContent,
    decode_result,
)
from ._metrics import redact

__all__ = [
    "MAX_PAGES",
    "Annotations",
    "AudioContent",
    "BadResponse",
    "CallToolResult",
    "CallTrace",
    "ChannelUnbound",
    "ContentBlock",
    "CursorInvalid",
    "CursorStale",
    "CursorUnknown",
    "EmbeddedResource",
    "GatewayError",
    "GetPromptResult",
    "HalfOpenError",
    "IdempotencyKeyReused",
    "ImageContent",
    "InProgress",
    "ListPromptsResult",
    "ListResourceTemplatesResult",
    "ListResourcesResult",
    "ListToolsResult",
    "MalformedResponse",
    "Overloaded",
    "PaginationError",
    "Prompt",
    "PromptArgument",
    "PromptMessage",
    "ReadResourceResult",
    "RebindResult",
    "Resource",
    "ResourceContents",
    "ResourceLink",
    "ResourceTemplate",
    "RetryPolicy",
    "RpcError",
    "SessionClient",
    "SessionGone",
    "SessionlessClient",
    "StreamResumeViolation",
    "TaskCancelled",
    "TextContent",
    "Tool",
    "ToolAnnotations",
    "TransportError",
    "Unavailable",
    "UnknownContent",
    "WeirError",
    "open_client",
    "open_session",
]

log = logging.getLogger(__name__)


class SessionClient(SessionTransport, McpMethods):
    """An MCP session over Streamable HTTP; make one with :func:`open_session`.

    Attributes:
        session_id: the ``Mcp-Session-Id`` (None if the server issued none).
        channel_token: the current ``Mcp-Channel-Token`` (None if the server issued none).
        protocol_version: the negotiated revision.
        server_info: ``initialize``'s result (``serverInfo``, ``capabilities``, ...).
        supports_rebind: the server advertises ``weir/rebind``.
    """

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
        """Call a tool and return its result (a tool that failed answers with
        ``is_error`` true, as MCP has it).

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
                :class:`TransportError`, :class:`RpcError` or
                :class:`MalformedResponse`.  The session stays usable (except after
                :class:`SessionGone` or :class:`CursorStale`).
        """
        params: JsonObject = {"name": name, "arguments": arguments or {}}
        key = idempotency_key if idempotency_key is not None else self._new_key()
        ex = Exchange("tools/call", params, key, on_progress, trace or CallTrace())
        return decode_result(CallToolResult, await self._run(ex), "tools/call")

    async def request(
        self,
        method: str,
        params: JsonObject | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        trace: CallTrace | None = None,
    ) -> JsonObject:
        """Send any request and return its ``result`` object as it came (the escape
        hatch for methods without a typed counterpart).

        The retry rules of :meth:`call_tool` apply, but without an idempotency key the
        request is never POSTed again once the server has accepted it (its stream is
        still resumed); a refusal or failure after that point is raised.

        Raises:
            WeirError: as for :meth:`call_tool`.
        """
        return await self._run(Exchange(method, params, None, on_progress, trace or CallTrace()))

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
        ex = Exchange("initialize", params, None, None, CallTrace(), may_rebind=False)
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
) -> AsyncIterator[SessionClient]:
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
        WeirError: ``initialize`` failed (:class:`TransportError` when nothing listens
            at ``url``).  Errors of the body pass through as themselves, never wrapped
            in an exception group (unless several happened at once).
    """
    with unwrap_single():
        async with trio.open_nursery() as nursery:
            session = SessionClient(
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
) -> AsyncIterator[SessionlessClient | SessionClient]:
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
    handlers = ask_handlers(sampling, elicitation, roots)
    if mode != "session":
        pool, found = await _probe(url, timeout, info, handlers)
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


async def _probe(
    url: str, timeout: float, info: JsonObject, handlers: dict[str, ServerRequestHandler]
) -> tuple[Pool, JsonObject | None]:
    """A connection pool for ``url`` and its ``server/discover`` result (None: the
    server does not serve 2026-07-28).  The pool is closed if the probe fails.

    Raises:
        TransportError: the connection failed.
    """
    pool = Pool(url, timeout)
    try:
        return pool, await discover(pool, info, capabilities_for(handlers))
    except ConnectionDropped as exc:
        await pool.aclose()
        raise TransportError(None, "transport", str(exc)) from None
    except BaseException:
        await pool.aclose()
        raise
