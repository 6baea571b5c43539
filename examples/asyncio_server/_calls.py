"""Running one request on the asyncio driver: the app's handler and its way to the client.

Theory of operation
-------------------
The app layer (:mod:`weir.app`) owns every MCP method and every rule about what a
handler says (progress, logs, server-to-client requests); this module only gives a
handler's :class:`~weir.app.Context` its asyncio half, :class:`Backend`:

* a message goes into the log of the stream the response will travel on, within the
  session's drain credit (:meth:`Session.append` waits, in order), so it reaches the
  client before the response; a call answered with a JSON body has no stream, so its
  notifications are dropped and its server-to-client requests use the GET stream;
* a server-to-client request waits on a future the client's answer (a POSTed
  JSON-RPC response) resolves; teardown fails it;
* ``notifications/cancelled`` cancels the handler's task: it sends no response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from weir.app import App, Caller, Context, McpError, dispatch, failure, id_in_use
from weir.protocol import (
    INTERNAL_ERROR,
    ErrorResponse,
    Request,
    Response,
    StreamLog,
    StreamState,
    encode_request,
    encode_result,
)

from ._session import Gone, Session


class Backend:
    """:class:`weir.app.ContextBackend` for one call on one session."""

    __slots__ = ("_session", "_stream")

    def __init__(self, session: Session, stream: StreamLog | None) -> None:
        self._session = session
        self._stream = stream

    @property
    def session_id(self) -> str:
        return self._session.sid

    @property
    def caller(self) -> Caller:
        return self._session.caller

    async def send(self, payload: bytes) -> None:
        if self._stream is not None:
            await self._session.append(self._stream, payload.decode())

    def _carrier(self) -> StreamLog | None:
        if self._stream is not None:
            return self._stream
        standalone = self._session.streams.standalone
        if standalone is not None and standalone.state is not StreamState.CLOSED:
            return standalone
        return None

    async def request(
        self, method: str, params: dict[str, Any] | None, timeout: float
    ) -> Response | ErrorResponse | None:
        session, stream = self._session, self._carrier()
        if stream is None:
            raise McpError(INTERNAL_ERROR, f"cannot send {method}: no stream to the client is open")
        rid = session.next_request_id()
        answer = session.pending[rid] = session.loop.create_future()
        try:
            await session.append(stream, encode_request(rid, method, params).decode())
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            return None
        except Gone:
            raise McpError(INTERNAL_ERROR, f"session ended while waiting for {method}") from None
        finally:
            session.pending.pop(rid, None)

    def close_stream(self, retry_ms: int) -> None:
        if self._stream is not None:
            self._session.request_close(self._stream, retry_ms)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def execute(
    app: App, session: Session, req: Request, stream: StreamLog | None, state: Any = None
) -> bytes | None:
    """``req``'s encoded JSON-RPC response, or None if the client cancelled it.

    A request whose id is still running in the session is refused (ids name the
    request a cancellation or an answer is for, so two at once would be ambiguous).
    """
    if req.id in session.running:
        return id_in_use(req.id)
    meta = (req.params or {}).get("_meta")
    ctx = Context(
        Backend(session, stream), req.id, meta if isinstance(meta, dict) else None, state=state
    )
    session.running[req.id] = task = asyncio.current_task()  # type: ignore[assignment]
    try:
        return encode_result(req.id, await dispatch(app, req, ctx))
    except Exception as exc:
        return failure(req, exc)
    except asyncio.CancelledError:
        if req.id not in session.cancelled or task is None:
            raise  # teardown, not the client
        task.uncancel()
        return None
    finally:
        session.cancelled.discard(req.id)
        if session.running.get(req.id) is task:
            del session.running[req.id]
