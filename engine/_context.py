"""The per-call context handed to tools, resources, prompts and completions.

Theory of operation
-------------------
A :class:`Context` binds one incoming request to the stream its response will
travel on.  Everything a handler says to the client during the call -- progress,
log messages, server-to-client requests (sampling, elicitation, roots) -- is
appended to that stream *before* the response, so it arrives in order and is
related to the originating request, as the MCP transports require.  In JSON
response mode there is no per-request stream: notifications are dropped and
server-to-client requests go to the session's GET stream when one is open.

Cancellation is Trio cancellation: ``notifications/cancelled`` (or session
teardown) cancels the scope the handler runs in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from weir.protocol import ErrorResponse, RequestId, Response, encode_notification, encode_request

from ._app import McpError
from ._session import PendingRequest

if TYPE_CHECKING:
    from ._session import Session, StreamHandle


class Context:
    """What a handler may do while serving one request.

    Attributes:
        session_id: the caller's session.
        request_id: the JSON-RPC id of the request being served.
        progress_token: ``params._meta.progressToken`` if the client sent one.
        meta: the request's ``params._meta`` (empty if none).
        state: what the app's lifespan yielded (``None`` without one).
    """

    def __init__(
        self,
        session: Session,
        request_id: RequestId,
        stream: StreamHandle | None,
        meta: dict[str, Any] | None = None,
        *,
        state: Any = None,
    ) -> None:
        self._session = session
        self.state = state
        self._stream = stream
        self.session_id = session.session_id
        self.request_id = request_id
        self.meta = meta or {}
        self.progress_token: str | int | None = self.meta.get("progressToken")
        self._last_progress: float | None = None

    @property
    def client_capabilities(self) -> dict[str, Any]:
        """The capabilities the client declared at ``initialize``."""
        return self._session.client_capabilities

    async def _send(self, payload: bytes) -> None:
        # Waits for the session's drain credit: a handler whose client does not
        # read is held here, never allowed to queue without bound.
        stream = self._stream
        if stream is None:
            await trio.lowlevel.checkpoint()
            return
        await stream.send(payload.decode())

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Send ``notifications/progress`` if the client asked for progress.

        Progress must increase (MCP); a non-increasing value raises ``ValueError``.
        """
        if self.progress_token is None:
            return
        if self._last_progress is not None and progress <= self._last_progress:
            raise ValueError(f"progress must increase ({progress} after {self._last_progress})")
        self._last_progress = progress
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self._send(encode_notification("notifications/progress", params))

    async def log(self, level: str, data: Any, logger: str | None = None) -> None:
        """Send ``notifications/message`` if ``level`` passes the session's ``logging/setLevel``."""
        if not self._session.log_enabled(level):
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self._send(encode_notification("notifications/message", params))

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
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 300.0
    ) -> dict[str, Any]:
        """Send a server-to-client request and wait for the client's answer.

        Returns:
            the ``result`` object of the client's response.

        Raises:
            McpError: the client answered with an error, no stream can carry the
                request, the session ended, or no answer came within ``timeout``.
        """
        session = self._session
        stream = self._stream or session.standalone
        if stream is None:
            raise McpError(-32603, f"cannot send {method}: no stream to the client is open")
        rid = session.next_request_id()
        pending = session.pending[rid] = PendingRequest()
        try:
            await stream.send(encode_request(rid, method, params).decode())
            with trio.move_on_after(timeout):
                await pending.done.wait()
        finally:
            session.pending.pop(rid, None)
        answer = pending.answer
        if isinstance(answer, Response):
            return answer.result
        if isinstance(answer, ErrorResponse):
            raise McpError(answer.error.code, answer.error.message, answer.error.data)
        if session.closed:
            raise McpError(-32603, f"session ended while waiting for {method}")
        raise McpError(-32603, f"no answer to {method} within {timeout} s")

    async def sample(
        self, messages: list[dict[str, Any]], *, max_tokens: int, **extra: Any
    ) -> dict[str, Any]:
        """Ask the client's model (``sampling/createMessage``)."""
        return await self.request(
            "sampling/createMessage", {"messages": messages, "maxTokens": max_tokens, **extra}
        )

    async def elicit(self, message: str, requested_schema: dict[str, Any]) -> dict[str, Any]:
        """Ask the user for input (``elicitation/create``, form mode)."""
        return await self.request(
            "elicitation/create", {"message": message, "requestedSchema": requested_schema}
        )

    async def list_roots(self) -> list[dict[str, Any]]:
        """The client's roots (``roots/list``)."""
        result = await self.request("roots/list")
        roots = result.get("roots", [])
        return roots if isinstance(roots, list) else []

    def close_stream(self, retry_ms: int = 1000) -> None:
        """End this request's SSE connection now (MCP 2025-11-25 polling).

        The writer sends ``retry: <retry_ms>`` and finishes the HTTP response; the
        stream itself lives on, and the client resumes it with ``GET`` and
        ``Last-Event-ID`` to receive the rest, including the response.
        """
        if self._stream is not None:
            self._stream.request_close(retry_ms)
