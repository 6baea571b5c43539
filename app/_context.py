"""The per-call context handed to tools, resources, prompts and completions.

Theory of operation
-------------------
A :class:`Context` is what a handler may do while serving one request: report
progress, log, ask the client (sampling, elicitation, roots), end its stream early,
sleep.  It holds the MCP rules for those messages -- their shapes, the progress token,
the ``logging/setLevel`` threshold, what a client's error answer becomes -- and
nothing about I/O.  How a message reaches the client is the driver's business,
behind a :class:`ContextBackend`: the Trio engine and the asyncio runtime each give
one, so a handler written against :class:`Context` runs unchanged on either.

A driver's backend guarantees that everything a handler says during a call goes onto
the stream its response will travel on, *before* the response (MCP relates such
messages to the originating request), and that :meth:`ContextBackend.send` waits for
the session's drain credit: a handler whose client does not read is held there,
never allowed to queue without bound.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from weir.protocol.jsonrpc import ErrorResponse, RequestId, Response, encode_notification

from ._hooks import _change_method
from ._input import BecomeTask, InputRequired, check_capabilities, valid_answer
from ._registry import McpError

#: ``logging/setLevel`` levels, least to most severe (RFC 5424 names, as MCP uses).
LOG_LEVELS: dict[str, int] = {
    "debug": 0,
    "info": 1,
    "notice": 2,
    "warning": 3,
    "error": 4,
    "critical": 5,
    "alert": 6,
    "emergency": 7,
}


#: The threshold of a caller that asked for no log messages at all (a sessionless
#: request without a log level in its ``_meta``).
NO_LOGS: Final = "none"


def log_passes(level: str, threshold: str | None) -> bool:
    """Whether a message at ``level`` passes a ``logging/setLevel`` threshold (None: all;
    :data:`NO_LOGS`: none)."""
    if threshold is None:
        return True
    if threshold == NO_LOGS:
        return False
    return LOG_LEVELS.get(level, 0) >= LOG_LEVELS.get(threshold, 0)


@dataclass(slots=True)
class Caller:
    """What the app layer remembers about whoever sent a request.

    On the session era one lives as long as the session (``initialize`` fills in
    the client's capabilities and info; ``logging/setLevel`` and
    ``resources/subscribe`` change it).  A driver keeps it; the app layer reads and
    edits it through :attr:`ContextBackend.caller`.
    """

    client_capabilities: dict[str, Any] = field(default_factory=dict)
    client_info: dict[str, Any] = field(default_factory=dict)
    #: The ``logging/setLevel`` threshold (None: every level passes).
    log_level: str | None = None
    #: Resource URIs subscribed to (at most ``MAX_SUBSCRIPTIONS``; see ``dispatch``).
    subscriptions: set[str] = field(default_factory=set)
    #: Sessionless era: the revision this request declared (the session era's is
    #: the session's own, :attr:`ContextBackend.protocol_version`).
    protocol_version: str | None = None


@dataclass(frozen=True, slots=True)
class AccessToken:
    """What a token verifier vouches for about one request's bearer token.

    A handler sees it as :attr:`Context.access_token` (the token of the request that
    started the call).  The token itself is not kept: MCP forbids a server to pass a
    client's token on to other services, so there is nothing here to pass.

    Attributes:
        principal: who the token speaks for; it owns the sessions it opens.
        scopes: the scopes granted.
        expires_at: the ``exp`` claim (Unix time), if any: a verified token is
            cached until then.
        claims: every claim, for the application.
    """

    principal: str
    scopes: frozenset[str] = frozenset()
    expires_at: float | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)


#: ``await send(payload)``: one notification on a session's own stream (best effort).
SessionChannel = Callable[[bytes], Awaitable[None]]


class ContextBackend(Protocol):
    """The driver's half of one call: where its messages go and what state it reads.

    The session-era drivers back these with a session; a sessionless request backs
    them with what the request itself carries.
    """

    @property
    def session_id(self) -> str | None:
        """The caller's session, or None when the request has none."""
        ...

    @property
    def caller(self) -> Caller:
        """What is known about the caller (its session's, on the session era)."""
        ...

    async def send(self, payload: bytes) -> None:
        """Put one encoded notification on this call's stream, within drain credit.

        A call without a stream (a JSON response) drops it.
        """
        ...

    async def request(
        self, method: str, params: dict[str, Any] | None, timeout: float
    ) -> Response | ErrorResponse | None:
        """Send a server-to-client request; the client's answer, or None if none came
        within ``timeout`` seconds.

        Raises:
            McpError: no stream to the client can carry the request, or the session
                ended before the client answered.
        """
        ...

    def close_stream(self, retry_ms: int) -> None:
        """End this call's SSE response now with ``retry: <retry_ms>``; the stream
        lives on for a resumption to collect the rest."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep on the driver's clock (cancelled with the call)."""
        ...

    def changed(self, method: str, uri: str | None) -> None:
        """Announce a change to every client that listens for it: ``method`` is a
        ``notifications/*/list_changed`` or, with ``uri``, ``notifications/resources/updated``."""
        ...

    @property
    def protocol_version(self) -> str:
        """The revision the caller speaks (its session's, or the request's own)."""
        ...

    def cancel_requested(self, request_id: RequestId) -> bool:
        """Whether the client (or the session's end) has cancelled this call."""
        ...

    def session_channel(self) -> SessionChannel | None:
        """``send(payload)`` for the caller's session stream (the GET stream): it puts
        one encoded notification there within drain credit, or drops it when no such
        stream is open.  It outlives the call (it holds the session, not the call's
        stream) and is usable until the session ends; None without a session."""
        ...


class Context:
    """What a handler may do while serving one request.

    Attributes:
        session_id: the caller's session (None on a sessionless request).
        request_id: the JSON-RPC id of the request being served.
        progress_token: ``params._meta.progressToken`` if the client sent one.
        meta: the request's ``params._meta`` (empty if none).
        state: what the app's lifespan yielded (``None`` without one).
        access_token: what the verifier vouched for about the bearer token of the
            request that started this call; ``None`` without authorization.
    """

    def __init__(
        self,
        backend: ContextBackend,
        request_id: RequestId,
        meta: dict[str, Any] | None = None,
        *,
        state: Any = None,
        inputs: Mapping[str, Any] | None = None,
        access_token: AccessToken | None = None,
    ) -> None:
        self._backend = backend
        self.access_token = access_token
        #: Sessionless era: the answers this request carries, by key (None: the
        #: session era, where asking is a server-to-client request).
        self._inputs = inputs
        if inputs is not None:  # (the session era's hot path allocates neither)
            #: The answers this run consumed (the next round's request state keeps them).
            self.answered: dict[str, Any] = {}
            self._asks: dict[str, int] = {}
        self.state = state
        self.session_id = backend.session_id
        self.request_id = request_id
        self.meta = meta or {}
        self.progress_token: str | int | None = self.meta.get("progressToken")
        self._last_progress: float | None = None
        #: The task this run is (None: a request answered in its own response).
        self.task_id: str | None = None

    @property
    def backend(self) -> ContextBackend:
        """The driver's side of this call (for MCP methods that change its state)."""
        return self._backend

    def with_backend(self, backend: ContextBackend) -> Context:
        """This context with another backend (a shallow copy): for code that runs a
        handler elsewhere and forwards what it says, e.g. on another event loop."""
        other = copy.copy(self)
        other._backend = backend
        return other

    @property
    def client_capabilities(self) -> dict[str, Any]:
        """The capabilities the client declared at ``initialize``."""
        return self._backend.caller.client_capabilities

    @property
    def client_info(self) -> dict[str, Any]:
        """The ``clientInfo`` the client sent at ``initialize`` (name, version, …)."""
        return self._backend.caller.client_info

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Send ``notifications/progress`` if the client asked for progress.

        Progress must increase on the wire (MCP): a value that does not is dropped,
        not sent and not raised, so a handler that repeats a value keeps running.
        """
        if self.progress_token is None:
            return
        if self._last_progress is not None and progress <= self._last_progress:
            return
        self._last_progress = progress
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self._backend.send(encode_notification("notifications/progress", params))

    async def log(self, level: str, data: Any, logger: str | None = None) -> None:
        """Send ``notifications/message`` if ``level`` passes the ``logging/setLevel``."""
        if not log_passes(level, self._backend.caller.log_level):
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self._backend.send(encode_notification("notifications/message", params))

    async def debug(self, data: Any) -> None:
        """``log("debug", data)``."""
        await self.log("debug", data)

    async def info(self, data: Any) -> None:
        """``log("info", data)``."""
        await self.log("info", data)

    async def warning(self, data: Any) -> None:
        """``log("warning", data)``."""
        await self.log("warning", data)

    async def error(self, data: Any) -> None:
        """``log("error", data)``."""
        await self.log("error", data)

    async def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float = 300.0,
        key: str | None = None,
    ) -> dict[str, Any]:
        """Ask the client (see :mod:`weir.app._input`) and return its answer.

        On the session era, a server-to-client request; on the sessionless era, the
        answer this request carries under ``key`` (default: the method and how many
        asks of it came before, e.g. ``elicitation/create#0``), else an
        input-required result.

        Returns:
            the ``result`` object of the client's response.

        Raises:
            McpError: the client answered with an error, no stream can carry the
                request, the session ended, no answer came within ``timeout``, or
                (sessionless) the client did not declare the capability (-32021).
        """
        if self._inputs is not None:
            if key is None:
                n = self._asks.get(method, 0)
                self._asks[method] = n + 1
                key = f"{method}#{n}"
            return (await self.input({key: (method, params)}))[key]
        answer = await self._backend.request(method, params, timeout)
        if isinstance(answer, Response):
            return answer.result
        if isinstance(answer, ErrorResponse):
            raise McpError(answer.error.code, answer.error.message, answer.error.data)
        raise McpError(-32603, f"no answer to {method} within {timeout} s")

    async def input(
        self, asks: Mapping[str, tuple[str, dict[str, Any] | None]]
    ) -> dict[str, dict[str, Any]]:
        """Ask several things at once (key -> ``(method, params)``); the answers by key.

        On the sessionless era every missing answer is asked for in one
        input-required result; on the session era they are asked one by one.
        """
        if self._inputs is None:
            return {k: await self.request(m, p) for k, (m, p) in asks.items()}
        check_capabilities([m for m, _ in asks.values()], self.client_capabilities)
        answers: dict[str, dict[str, Any]] = {}
        missing: dict[str, dict[str, Any]] = {}
        for k, (m, p) in asks.items():
            got = self._inputs.get(k)
            if isinstance(got, dict) and valid_answer(m, got):
                answers[k] = self.answered[k] = got
            else:
                missing[k] = {"method": m, "params": p or {}}
        if missing:
            raise InputRequired(missing)
        return answers

    async def set_status(self, message: str) -> None:
        """In a task: its ``statusMessage`` (``tasks/get`` and status notifications show
        it; at most 1 KiB is kept).  Elsewhere it does nothing: a request's client
        hears progress through :meth:`report_progress` instead."""
        write = getattr(self._backend, "task_status", None)
        if self.task_id is not None and write is not None:
            await write(message)

    def become_task(self) -> None:
        """Continue as a task (the tasks extension), if not one already.

        For a tool registered with ``task="optional"`` or ``"required"`` and
        ``task_upfront=False``: the handler runs in its request -- its input
        rounds answered in the request as usual -- and at this call the request is
        answered with a task handle instead; the task then runs the handler again
        from its start, with every answer gathered so far, and this call returns
        at once.  In a task already, it does nothing.  Only on the sessionless era
        with a client that declared the extension is a request turned into a
        task; elsewhere it does nothing either and the handler goes on.
        """
        if self.task_id is None and self.tasks_possible:
            raise BecomeTask(dict(getattr(self, "answered", {})))

    #: Set by the runtime when this request may become a task.
    tasks_possible: bool = False

    async def sample(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        key: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Ask the client's model (``sampling/createMessage``)."""
        params = {"messages": messages, "maxTokens": max_tokens, **extra}
        return await self.request("sampling/createMessage", params, key=key)

    async def elicit(
        self, message: str, requested_schema: dict[str, Any], *, key: str | None = None
    ) -> dict[str, Any]:
        """Ask the user for input (``elicitation/create``, form mode)."""
        params = {"message": message, "requestedSchema": requested_schema}
        return await self.request("elicitation/create", params, key=key)

    async def list_roots(self, *, key: str | None = None) -> list[dict[str, Any]]:
        """The client's roots (``roots/list``)."""
        result = await self.request("roots/list", key=key)
        roots = result.get("roots", [])
        return roots if isinstance(roots, list) else []

    def close_stream(self, retry_ms: int = 1000) -> None:
        """End this request's SSE connection now (MCP 2025-11-25 polling).

        The writer sends ``retry: <retry_ms>`` and finishes the HTTP response; the
        stream itself lives on, and the client resumes it with ``GET`` and
        ``Last-Event-ID`` to receive the rest, including the response.  Without a
        stream (a JSON response) it does nothing.
        """
        self._backend.close_stream(retry_ms)

    def changed(self, what: str, uri: str | None = None) -> None:
        """Tell listening clients that this server's ``what`` (``"tools"``, ``"prompts"``
        or ``"resources"``) list changed, or -- with ``uri`` -- that a resource did.

        Session-era clients hear it on their GET stream (resource updates only if
        they subscribed); sessionless clients on their ``subscriptions/listen``
        streams.  It never waits: delivery happens within each client's credit.
        """
        self._backend.changed(_change_method(what, uri), uri)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send any notification on this call's stream, before its response (dropped
        without one, as for a JSON answer), within the session's drain credit."""
        await self._backend.send(encode_notification(method, params))

    @property
    def protocol_version(self) -> str:
        """The MCP revision of this request (its session's, or its own ``_meta``'s)."""
        return self._backend.protocol_version

    @property
    def cancel_requested(self) -> bool:
        """True once the client cancelled this call (``notifications/cancelled``, its
        stream closed on the sessionless era, or its session ended).  The handler is
        cancelled as well; this is for code that checks between steps."""
        return self._backend.cancel_requested(self.request_id)

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` on the driver's clock, so a handler that waits runs on any
        driver; the call's cancellation interrupts it."""
        await self._backend.sleep(seconds)
