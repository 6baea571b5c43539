"""The 2024-11-05 HTTP+SSE transport.

Theory of operation
-------------------
``GET /sse`` opens a session whose one LEGACY stream (no event ids: 2024-11-05 has
no resumption) carries every response; its first event, ``endpoint``, names the
URL to POST to.  The session lives exactly as long as that stream.

Which requests are served, and every refusal that needs no state, is
:func:`weir.protocol.legacy.route_legacy`'s.  ``POST /messages?session_id=`` answers
202; its requests are admitted and gated
like those of the current transport (``engine._calls``) -- a lone request before
the 202, a batch's entries one by one after it -- and their responses go out on
the LEGACY stream.  ``initialize`` arrives as one of those messages, on
the session the stream already opened.
"""

from __future__ import annotations

import contextlib

import trio

from weir.protocol import RemoteProtocolError, session_refusal
from weir.protocol.course import CallCourse
from weir.protocol.jsonrpc import Request, encode_error, encode_result
from weir.protocol.legacy import LegacyMessages
from weir.protocol.streams import StreamKind

from ._connection import Connection
from ._requester import Requester
from ._server_base import _ServerBase
from ._session import Session, StreamHandle, StreamLost
from ._writer import SSE_HEADERS, write_stream


class _Legacy(_ServerBase):
    """The 2024-11-05 HTTP+SSE transport (see the module docstring)."""

    async def _legacy_stream(self, conn: Connection, who: Requester) -> None:
        session = await self._new_session("2024-11-05", who.principal)
        epoch = await self.store.allocate_epoch(session.record.principal, session.session_id)
        handle = self._open_stream(session, epoch, StreamKind.LEGACY, None)
        handle.log.emit_ids = False  # 2024-11-05 has no resumption
        endpoint = f"{self.config.legacy_messages_path}?session_id={session.session_id}"
        await handle.send(endpoint, event="endpoint")
        try:
            await write_stream(
                conn, session, handle, 0, SSE_HEADERS, keepalive=self.config.sse_keepalive
            )
        finally:
            # The legacy session lives exactly as long as its stream.
            if not session.closed:
                with trio.CancelScope(shield=True):
                    await self._end_session(session)

    async def _legacy_post(self, conn: Connection, post: LegacyMessages, who: Requester) -> None:
        """Messages for a legacy session (already checked by ``route_legacy``)."""
        headers, sid, messages = post.headers, post.session_id, post.messages
        session = await self._session(who.principal, sid)
        legacy = next(
            (h for h in session.handles.values() if h.log.kind is StreamKind.LEGACY), None
        )
        if legacy is None:
            raise session_refusal(sid)
        requests = await self._absorb(session, messages)

        async def run(_: int, plan: CallCourse) -> None:
            if plan.request.method == "initialize" and plan.replay is None:
                await self._legacy_initialize(session, plan.request, legacy)
            else:
                legacy.outstanding += 1
                await self._run_request(session, plan, legacy)

        if len(requests) == 1:
            plans = await self._admit_and_plan(
                session, requests, headers.get("idempotency-key"), None, legacy.log.epoch
            )
            self._handlers_start(run, 0, plans[0])
        elif requests:
            # Every entry waits for admission on its own, after the 202.
            self._handlers_start(self._admit_each, session, requests, None, run, legacy.log.epoch)
        await conn.send(conn.http.send_response(202, ()))

    async def _legacy_initialize(
        self, session: Session, req: Request, handle: StreamHandle
    ) -> None:
        try:
            await self._initialize_session(req, session, session.record.principal)
            payload = encode_result(req.id, self._initialize_result(session))
        except RemoteProtocolError as exc:
            payload = encode_error(req.id, exc.code, exc.message, exc.error_data())
        try:
            with contextlib.suppress(StreamLost):
                await handle.send(payload.decode())
        finally:
            session.done(1, handle.log.epoch)
