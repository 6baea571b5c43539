"""SSE streams: opening them, GET, resumption and replay, DELETE, channel tokens.

Theory of operation
-------------------
A handler's only channel to the client is its stream's log; the connection task
holding the HTTP response is a *writer* copying frames from the log to the socket
from a cursor (``engine._writer``):

* POST with requests -> a REQUEST stream (epoch from the store), primed for
  2025-11-25 sessions, written until its final response is delivered;
* GET -> the session's STANDALONE stream (a second concurrent one is 409
  ``stream_conflict``); GET with ``Last-Event-ID`` -> whichever stream the cursor's
  epoch names, from the event after the cursor, then live;
* the legacy 2024-11-05 transport (``engine._legacy``): ``GET /sse`` opens a session
  whose one LEGACY stream carries every response.

A writer also watches the socket for EOF, so a vanished peer detaches it at once.

With a shared store and ``resume="shared"`` every event is appended to the store
before it is sent (not stored means not sent), so a cursor of a stream another
replica produced is served from the store: exactly the events after the cursor, in
order, then live ones until the final event.  Unknown or trimmed cursors are
refused (409 ``cursor_unknown``) -- never a resume from the head.

**Channel tokens** (fencing): a request's ``Mcp-Channel-Token`` is checked against
the session's record; once a session's client has presented its token, DELETE and
GET streams need it too (without authorization, a session id alone is not enough).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from weir.protocol import DeleteSession, OpenStream, RemoteProtocolError, RequestContext
from weir.protocol.binding import (
    ChannelVerdict,
    check_rebind,
    parse_channel_token,
    prove_channel,
)
from weir.protocol.event_ids import EventId
from weir.protocol.jsonrpc import RequestId
from weir.protocol.resume import (
    StoreTail,
    TailPause,
    TailSend,
    TailStep,
    check_cursor_channel,
    check_resume_policy,
    displaces_writer,
    standalone_plan,
)
from weir.protocol.states import SessionInput, StreamInput
from weir.protocol.streams import StreamKind

from ._channel import raise_channel
from ._connection import Connection
from ._requester import Requester
from ._server_base import _ServerBase
from ._session import Session, StreamHandle, StreamLost
from ._store import ChannelRejected, SessionGone, StoreUnavailable, check_channel
from ._writer import SSE_HEADERS, write_stream


class _Streams(_ServerBase):
    """SSE streams, resumption, DELETE and channel tokens (see the module docstring)."""

    def _open_stream(
        self, session: Session, epoch: str, kind: StreamKind, token: tuple[int, str] | None
    ) -> StreamHandle:
        cfg = self.config
        handle = session.open_stream(
            epoch,
            kind,
            max_events=cfg.max_stream_events,
            emit_ids=cfg.resume != "off",
            replica=self.replica_id,
            binding=token[0] if token else 0,
        )
        if self.store.shared and cfg.resume == "shared" and kind is not StreamKind.LEGACY:
            handle.sink = self._store_sink(session, handle)
        return handle

    def _store_sink(
        self, session: Session, handle: StreamHandle
    ) -> Callable[[int, str, bool, str | None], Any]:
        store, principal, sid = self.store, session.record.principal, session.session_id
        generation, epoch, binding = session.record.generation, handle.log.epoch, handle.log.binding
        replica = self.replica_id

        async def sink(seq: int, payload: str, final: bool, call_key: str | None) -> None:
            if seq == 0 and payload == "":
                return  # the priming event carries nothing to replay
            try:
                await store.append_event(
                    principal,
                    sid,
                    epoch,
                    seq,
                    payload.encode(),
                    final=final,
                    generation=generation,
                    binding=binding,
                    call_key=call_key,
                    replica=replica,
                )
            except (SessionGone, ChannelRejected, StoreUnavailable) as exc:
                # Not stored means not sent: the stream ends here (a rebind fenced
                # it, the session is gone, or the store failed -- fail closed).
                raise StreamLost(f"{epoch}:{seq} not appended: {exc!r}") from exc

        return sink

    async def _get(self, conn: Connection, get: OpenStream, who: Requester) -> None:
        session = await self._session(who.principal, get.ctx.session_id)
        token = self._channel(session, get.ctx)
        await self._prove_channel(session, token, "a GET stream")
        cursor = get.last_event_id
        headers = (*SSE_HEADERS, ("mcp-session-id", session.session_id))
        check_resume_policy(cursor, self.config.resume)
        if cursor is None:
            handle = session.standalone
            if standalone_plan(handle.log if handle is not None else None):
                # None yet, or the old one ended (e.g. fenced by a rebind): a new one.
                epoch = await self.store.allocate_epoch(
                    session.record.principal, session.session_id, token[0] if token else 0
                )
                handle = self._open_stream(session, epoch, StreamKind.STANDALONE, token)
            assert handle is not None
            next_seq = handle.log.next_seq
            if self._primes(session, get.ctx.protocol_version) and self.config.resume != "off":
                self._handlers_start(handle.send, "")
        else:
            try:
                log_ = session.streams.get(cursor)
            except RemoteProtocolError:
                if not (self.store.shared and self.config.resume == "shared"):
                    raise
                await self._replay_from_store(conn, session, cursor, token, headers)
                return
            check_cursor_channel(log_.binding, token)
            handle = session.handle_for(log_)
            next_seq = log_.cursor_after(cursor)
            handle.close_retry_ms = None  # a close asked of an earlier connection is done with
            if handle.writer_scope is not None:
                # The old connection is presumed dead: the newest reader wins.
                handle.writer_scope.cancel()
                handle.writer_scope = None
                if displaces_writer(handle.log):
                    handle.handle(StreamInput.DETACH)
        await write_stream(
            conn, session, handle, next_seq, headers, keepalive=self.config.sse_keepalive
        )

    async def _replay_from_store(
        self,
        conn: Connection,
        session: Session,
        cursor: EventId,
        token: tuple[int, str] | None,
        headers: tuple[tuple[str, str], ...],
    ) -> None:
        """Serve a cursor of a stream another replica produced: replay, then tail.

        The core's :class:`~weir.protocol.resume.StoreTail` decides what to send,
        when to poll and when to ask the store about a silent producer; this
        performs its steps.  Unknown or trimmed cursors are refused (409
        ``cursor_unknown``) -- never a resume from head.
        """
        store, principal, sid = self.store, session.record.principal, session.session_id
        info = await store.stream_info(principal, sid, cursor.epoch)
        tail = StoreTail(
            cursor,
            binding=info.binding if info is not None else None,
            last_seq=info.last_seq if info is not None else -1,
            finished=info.finished if info is not None else False,
            token=token,
            now=trio.current_time(),
            keepalive=self.config.sse_keepalive,
            lease=self.config.claim_lease,
            give_up_after=self.config.credit.liveness_timeout * 10,
            replica=self.replica_id,
        )
        events = await store.read_events(principal, sid, cursor.epoch, cursor.seq)
        steps = tail.feed(events, trio.current_time())  # may refuse: before the head
        http = conn.http
        await conn.send(http.start_stream(200, headers))
        # The tail's own bound, also over writes to a peer that stopped reading.
        with trio.move_on_after(self.config.credit.liveness_timeout * 10):
            await self._tail(conn, session, tail, steps)
        await conn.send(http.end_stream())

    async def _tail(
        self, conn: Connection, session: Session, tail: StoreTail, steps: list[TailStep]
    ) -> None:
        store, principal, sid = self.store, session.record.principal, session.session_id
        epoch = tail.cursor.epoch
        while True:
            for step in steps:
                if isinstance(step, TailSend):
                    await conn.send(conn.http.send_stream_data(step.data))
                elif isinstance(step, TailPause):
                    await trio.sleep_until(step.until)
                else:
                    with contextlib.suppress(StoreUnavailable):
                        await store.expire_claim(principal, sid, epoch)
            if tail.ended or self._closing or session.closed:
                return
            events = await store.read_events(principal, sid, epoch, tail.after)
            steps = tail.feed(events, trio.current_time())

    async def _delete(self, conn: Connection, delete: DeleteSession, who: Requester) -> None:
        session = await self._session(who.principal, delete.ctx.session_id)
        await self._prove_channel(session, self._channel(session, delete.ctx), "DELETE")
        session.handle(SessionInput.DELETE)
        await self._end_session(session)
        await conn.send(conn.http.send_response(200, ()))

    # ---------------------------------------------------------------- channel tokens
    def _check_rebind(self, session: Session, raw_token: str | None, rid: RequestId | None) -> None:
        """Who may rebind (:func:`~weir.protocol.binding.check_rebind`).

        Raises:
            RemoteProtocolError: 409 ``cursor_stale`` or ``channel_unbound``.
        """
        try:
            verdict = check_channel(session.record, parse_channel_token(raw_token))
        except RemoteProtocolError:
            verdict = ChannelVerdict.UNBOUND
        check_rebind(
            verdict, raw_token is not None, authorized=self.config.auth is not None, request_id=rid
        )

    async def _prove_channel(
        self, session: Session, token: tuple[int, str] | None, what: str
    ) -> None:
        """A session whose client has presented its token needs it from then on
        (:func:`~weir.protocol.binding.prove_channel`); the first token binds it.

        Raises:
            RemoteProtocolError: 409 ``channel_unbound``.
        """
        if prove_channel(
            bound=session.record.bound,
            presented=token is not None,
            authorized=self.config.auth is not None,
            what=what,
        ):
            await self._mark_bound(session)

    async def _mark_bound(self, session: Session) -> None:
        await self.store.mark_bound(session.record.principal, session.session_id)
        session.record = replace(session.record, bound=True)

    def _channel(self, session: Session, ctx: RequestContext) -> tuple[int, str] | None:
        """Parse and check ``Mcp-Channel-Token`` against the session (fencing).

        Raises:
            RemoteProtocolError: 409 ``cursor_stale`` (older generation) or
                ``channel_unbound`` (wrong secret, future generation, malformed).
        """
        token = parse_channel_token(ctx.headers.get("mcp-channel-token"))
        raise_channel(check_channel(session.record, token))
        return token
