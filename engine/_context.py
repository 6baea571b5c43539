"""The Trio engine's :class:`~weir.app.ContextBackend`: one call's way to its client.

Theory of operation
-------------------
A handler talks to its client through a :class:`weir.app.Context`; this is the
Trio half behind it.  Messages go onto the stream the call's response will travel
on (its POST's SSE stream), so they arrive before the response and related to the
request; a call answered with a JSON body has no such stream, so notifications are
dropped and server-to-client requests go to the session's GET stream when one is
open.  :meth:`CallBackend.send` waits for the session's drain credit.

Cancellation is Trio cancellation: ``notifications/cancelled`` (or session
teardown) cancels the scope the handler runs in, including :meth:`sleep`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from weir.app import Caller, McpError
from weir.protocol.jsonrpc import ErrorResponse, RequestId, Response, encode_request
from weir.protocol.states import StreamState

from ._session import PendingRequest, SessionClosed, StreamLost

if TYPE_CHECKING:
    from ._session import Session, StreamHandle


async def _send_on_session(session: Session, payload: bytes) -> None:
    """A notification on ``session``'s GET stream, within credit; dropped without one."""
    stream = session.standalone
    if stream is None or stream.log.state is StreamState.CLOSED or session.closed:
        await trio.lowlevel.checkpoint()
        return
    with contextlib.suppress(StreamLost, SessionClosed):  # best effort, as ever
        await stream.send(payload.decode())


class CallBackend:
    """A session-era call on the Trio engine: its session and its stream (if any)."""

    __slots__ = ("_session", "_stream")

    def __init__(self, session: Session, stream: StreamHandle | None) -> None:
        self._session = session
        self._stream = stream

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def caller(self) -> Caller:
        return self._session.caller

    async def send(self, payload: bytes) -> None:
        stream = self._stream
        if stream is None:
            await trio.lowlevel.checkpoint()
            return
        await stream.send(payload.decode())

    def changed(self, method: str, uri: str | None) -> None:
        notify = self._session.on_change
        if notify is not None:
            notify(method, uri)

    @property
    def protocol_version(self) -> str:
        return self._session.record.protocol_version

    def cancel_requested(self, request_id: RequestId) -> bool:
        scope = self._session.running.get(request_id)
        return self._session.closed or (scope is not None and scope.cancel_called)

    def session_channel(self) -> Callable[[bytes], Awaitable[None]]:
        return partial(_send_on_session, self._session)

    async def request(
        self, method: str, params: dict[str, Any] | None, timeout: float
    ) -> Response | ErrorResponse | None:
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
        if isinstance(answer, Response | ErrorResponse):
            return answer
        if session.closed:
            raise McpError(-32603, f"session ended while waiting for {method}")
        return None

    def close_stream(self, retry_ms: int) -> None:
        if self._stream is not None:
            self._stream.request_close(retry_ms)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class SessionlessBackend(CallBackend):
    """A sessionless call (2026-07-28): its connection's credit owner and its stream.

    The caller is what this request declared (the owner may serve several
    requests at once, when it is a principal's).  A server-to-client request
    is not possible on this era's streams: asking the client is an input-required
    result (:class:`~weir.app.Context` raises it before the backend is reached).
    ``on_output`` is told when the handler first puts a message on its stream.
    """

    __slots__ = ("_caller", "_on_output", "detached", "run_key")

    def __init__(
        self,
        session: Session,
        stream: StreamHandle | None,
        caller: Caller,
        on_output: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(session, stream)
        self._caller = caller
        self._on_output = on_output
        #: A keyed call outlives its response (see ``engine._sessionless``): once the
        #: stream is gone, its messages go nowhere instead of ending the handler.
        self.detached = False
        #: Where the running handler is in the owner's ``running``: not the JSON-RPC
        #: id, which is the client's own -- two clients of one principal (one owner)
        #: may both send id 1.  (Unique while this backend lives.)
        self.run_key = id(self)

    @property
    def session_id(self) -> None:  # type: ignore[override]
        return None

    @property
    def caller(self) -> Caller:
        return self._caller

    @property
    def protocol_version(self) -> str:
        return self._caller.protocol_version or self._session.record.protocol_version

    def session_channel(self) -> None:  # type: ignore[override]
        return None  # no session on this era

    def cancel_requested(self, request_id: RequestId) -> bool:
        scope = self._session.running.get(self.run_key)  # (this request's, whatever its id)
        return self._session.closed or (scope is not None and scope.cancel_called)

    async def send(self, payload: bytes) -> None:
        if self._on_output is not None:
            self._on_output()
        try:
            await super().send(payload)
        except (StreamLost, SessionClosed):
            if not self.detached:
                raise

    async def request(
        self, method: str, params: dict[str, Any] | None, timeout: float
    ) -> Response | ErrorResponse | None:
        raise McpError(-32603, f"cannot send {method}: this revision has no server requests")

    def close_stream(self, retry_ms: int) -> None:
        return None  # nothing is resumable on this era: the stream stays open
