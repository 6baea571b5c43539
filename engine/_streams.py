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

**The order is the core's.**  Every decision of a GET and a DELETE -- loading the
session, the channel proof, the resumption rules, which stream and from which event,
displacing an older writer, replaying from the store and tailing it -- is made by
:class:`~weir.protocol.get.GetCourse` / :class:`~weir.protocol.get.DeleteCourse`;
this module only performs the effects they ask for (:meth:`Streams._carry`), and
opens streams for every course (:meth:`Streams.open_stream`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from weir.protocol import DeleteSession, OpenStream
from weir.protocol.get import (
    DELETED,
    END_REPLAY,
    END_SESSION,
    KEEP_TAILING,
    ClaimReader,
    DeleteCourse,
    DeleteEffect,
    DetachStream,
    ExpireClaim,
    GetCourse,
    GetEffect,
    LookUpStream,
    OpenStandalone,
    PrimeStream,
    ReadEvents,
    StartReplay,
    StreamRules,
    TailCut,
    WriteStream,
)
from weir.protocol.post import MARK_BOUND, AllocateEpoch, LoadSession
from weir.protocol.resume import TailPause, TailSend
from weir.protocol.states import SessionInput, StreamInput
from weir.protocol.streams import StreamKind

from ._connection import Connection
from ._requester import Requester
from ._session import Session, StreamHandle, StreamLost
from ._session_table import SessionTable
from ._shared import Shared
from ._store_errors import ChannelRejected, SessionGone, StoreUnavailable
from ._store_records import APPEND_PATIENCE, APPEND_RETRY_DELAY
from ._writer import SSE_HEADERS, write_stream


class Streams:
    """SSE streams, resumption, DELETE and channel tokens (see the module docstring).

    Guarantees: with ``resume="shared"`` on a shared store, no event of a session-era
    stream is sent before it is appended to the store; a GET or DELETE performs
    only the effects its course asks for, in its order.
    """

    def __init__(self, shared: Shared, table: SessionTable) -> None:
        self.shared = shared
        self.config = shared.config
        self.store = shared.store
        self.replica_id = shared.replica_id
        self.table = table
        cfg = shared.config
        #: What a GET's and a DELETE's courses need to know of this server's setup.
        self.rules = StreamRules(
            resume=cfg.resume,
            shared=self.store.shared,
            authorized=cfg.auth is not None,
            keepalive=cfg.sse_keepalive,
            lease=cfg.claim_lease,
            give_up_after=cfg.credit.liveness_timeout * 10,
            replica=self.replica_id,
        )

    def open_stream(
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
            data = payload.encode()
            deadline = trio.current_time() + APPEND_PATIENCE
            delay = APPEND_RETRY_DELAY
            while True:
                try:
                    await store.append_event(
                        principal,
                        sid,
                        epoch,
                        seq,
                        data,
                        final=final,
                        generation=generation,
                        binding=binding,
                        call_key=call_key,
                        replica=replica,
                    )
                    return
                except StoreUnavailable as exc:
                    # A failover takes seconds: wait it out (bounded), so an answer
                    # already computed still reaches its client.
                    if trio.current_time() + delay > deadline:
                        raise StreamLost(f"{epoch}:{seq} not appended: {exc!r}") from exc
                except (SessionGone, ChannelRejected) as exc:
                    # Not stored means not sent: the stream ends here (a rebind fenced
                    # it, the session is gone) -- fail closed.
                    raise StreamLost(f"{epoch}:{seq} not appended: {exc!r}") from exc
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)

        return sink

    async def get(self, conn: Connection, get: OpenStream, who: Requester) -> None:
        """Carry out a GET's :class:`~weir.protocol.get.GetCourse`."""
        await self._carry(conn, GetCourse(get, self.rules), get.ctx.session_id, who)

    async def delete(self, conn: Connection, delete: DeleteSession, who: Requester) -> None:
        """Carry out a DELETE's :class:`~weir.protocol.get.DeleteCourse`."""
        await self._carry(conn, DeleteCourse(delete, self.rules), delete.ctx.session_id, who)

    async def _carry(
        self, conn: Connection, course: GetCourse | DeleteCourse, sid: str | None, who: Requester
    ) -> None:
        """The core decides the order; this performs each effect it asks for.

        A replay's tail is bounded (:class:`~weir.protocol.get.StartReplay`): an
        effect still running at the bound is cancelled and failed with
        :class:`~weir.protocol.get.TailCut`, and the course ends the stream.
        """
        clock = trio.lowlevel.current_clock().current_time  # (one call per reading)
        effect: GetEffect | DeleteEffect | None = course.start(clock())
        session: Session | None = None
        cut_at = math.inf  # the replay's bound, once it started
        while effect is not None:
            try:
                if session is None:
                    assert isinstance(effect, LoadSession)
                    session = await self.table.session(who.principal, sid)
                    answer: object = session
                else:
                    with trio.CancelScope(deadline=cut_at) as cut:
                        answer = await self._stream_effect(conn, session, effect)
                    if cut.cancelled_caught:
                        raise TailCut
                    if isinstance(effect, StartReplay):
                        cut_at = clock() + effect.bound
                    elif effect is END_REPLAY:
                        cut_at = math.inf
            except BaseException as exc:
                effect = course.fail(exc, clock())
            else:
                effect = course.deliver(answer, clock())

    async def _stream_effect(
        self, conn: Connection, session: Session, effect: GetEffect | DeleteEffect
    ) -> object:
        """Perform one effect of a GET's or DELETE's course; its answer."""
        store, principal, sid = self.store, session.record.principal, session.session_id
        if isinstance(effect, TailSend):
            await conn.send(conn.http.send_stream_data(effect.data))
        elif isinstance(effect, TailPause):
            await trio.sleep_until(effect.until)
        elif isinstance(effect, ReadEvents):
            return await store.read_events(principal, sid, effect.epoch, effect.after)
        elif effect is KEEP_TAILING:
            return not (self.shared.closing or session.closed)
        elif isinstance(effect, ExpireClaim):
            with contextlib.suppress(StoreUnavailable):
                await store.expire_claim(principal, sid, effect.epoch)
        elif isinstance(effect, WriteStream):
            headers = (*SSE_HEADERS, ("mcp-session-id", sid))
            handle = session.handles[effect.epoch]
            keepalive = self.config.sse_keepalive
            await write_stream(conn, session, handle, effect.seq, headers, keepalive=keepalive)
        elif isinstance(effect, ClaimReader):
            handle = session.handles[effect.epoch]
            handle.close_retry_ms = None  # a close asked of an earlier connection is done with
            if handle.writer_scope is None:
                return False
            handle.writer_scope.cancel()
            handle.writer_scope = None
            return True
        elif isinstance(effect, DetachStream):
            session.handles[effect.epoch].handle(StreamInput.DETACH)
        elif isinstance(effect, AllocateEpoch):
            return await store.allocate_epoch(principal, sid, effect.generation)
        elif isinstance(effect, OpenStandalone):
            return self.open_stream(session, effect.epoch, StreamKind.STANDALONE, effect.token).log
        elif isinstance(effect, PrimeStream):
            self.shared.start(session.handles[effect.epoch].send, "")
        elif effect is MARK_BOUND:
            await self.mark_bound(session)
        elif isinstance(effect, LookUpStream):
            return await store.stream_info(principal, sid, effect.epoch)
        elif isinstance(effect, StartReplay):
            headers = (*SSE_HEADERS, ("mcp-session-id", sid))
            await conn.send(conn.http.start_stream(200, headers))
        elif effect is END_REPLAY:
            await conn.send(conn.http.end_stream())
        elif effect is END_SESSION:
            session.handle(SessionInput.DELETE)
            await self.table.end_session(session)
        elif effect is DELETED:
            await conn.send(conn.http.send_response(200, ()))
        else:
            raise AssertionError(f"a GET or DELETE course asked for {effect!r} out of turn")
        return None

    async def mark_bound(self, session: Session) -> None:
        await self.store.mark_bound(session.record.principal, session.session_id)
        session.record = replace(session.record, bound=True)
