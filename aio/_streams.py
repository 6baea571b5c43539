"""GET and DELETE on the asyncio runtime: the core's courses, performed.

Theory of operation
-------------------
:func:`serve_get` carries out a GET's :class:`~weir.protocol.get.GetCourse`: the
session's own stream (opened on first need, primed when the revision asks for it),
a resumption from this process's logs -- the newest reader winning over a writer
still attached elsewhere -- or, with a shared store and ``resume="shared"``, a
cursor another replica issued, replayed from the store and tailed until its final
event within the course's bound (past it, the effect running is cut:
:class:`~weir.protocol.get.TailCut`).  :func:`serve_delete` carries out a DELETE's
:class:`~weir.protocol.get.DeleteCourse`.  The order of every step is the course's;
here each effect is done with asyncio and the session store.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

from weir.engine._store_errors import StoreUnavailable
from weir.protocol import DeleteSession, OpenStream
from weir.protocol.get import (
    DELETED,
    END_REPLAY,
    END_SESSION,
    KEEP_TAILING,
    ClaimReader,
    DeleteCourse,
    DetachStream,
    ExpireClaim,
    GetCourse,
    LookUpStream,
    OpenStandalone,
    PrimeStream,
    ReadEvents,
    StartReplay,
    TailCut,
    WriteStream,
)
from weir.protocol.post import MARK_BOUND, AllocateEpoch, LoadSession
from weir.protocol.resume import TailPause, TailSend
from weir.protocol.states import StreamInput
from weir.protocol.streams import StreamKind, StreamLog

from ._session import Gone, Session

if TYPE_CHECKING:
    from ._connection import Connection

#: (``x-accel-buffering: no``: a buffering proxy, nginx's say, passes frames on at once.)
SSE_HEADERS = (
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
)
#: The effects of a replay from a shared store (with END_REPLAY and KEEP_TAILING),
#: bounded by the course's bound.
REPLAY_EFFECTS: Final = (TailSend, TailPause, ReadEvents, ExpireClaim, LookUpStream, StartReplay)


async def serve_get(conn: Connection, session: Session, get: OpenStream) -> None:
    """Carry out the GET's :class:`~weir.protocol.get.GetCourse`: this process's own
    logs, or (a shared store, ``resume="shared"``) a cursor another replica issued,
    replayed from the store and tailed until its final event, within the
    course's bound (past it the effect running is cut: :class:`TailCut`)."""
    course = GetCourse(get, conn.driver.stream_rules)
    clock = session.loop.time
    effect = course.start(clock())
    cut_at: float | None = None  # the replay's bound, once it started
    while effect is not None:
        answer: object = None
        try:
            if isinstance(effect, REPLAY_EFFECTS) or effect is END_REPLAY or effect is KEEP_TAILING:
                try:
                    async with asyncio.timeout_at(cut_at):
                        answer = await _replay_effect(conn, session, effect)
                except TimeoutError:
                    raise TailCut from None
                if isinstance(effect, StartReplay):
                    cut_at = clock() + effect.bound
                elif effect is END_REPLAY:
                    cut_at = None
            elif isinstance(effect, LoadSession):
                answer = session  # (looked up by ``Connection.respond``, which answers the 404)
            elif isinstance(effect, WriteStream):
                stream = session.streams.by_epoch(effect.epoch)
                await conn.write_stream(session, stream, effect.seq)
            elif isinstance(effect, AllocateEpoch):
                answer = await conn.driver.shared.epoch(session, effect.generation)
            elif isinstance(effect, OpenStandalone):
                binding = effect.token[0] if effect.token else 0
                answer = session.open_stream(StreamKind.STANDALONE, effect.epoch, binding=binding)
            elif effect is MARK_BOUND:
                await conn.driver.shared.mark_bound(session)
            elif isinstance(effect, PrimeStream):
                stream = session.streams.by_epoch(effect.epoch)
                session.spawn(_prime(session, stream))
            elif isinstance(effect, ClaimReader):
                # The newest reader wins: the old connection is given up at once, and
                # from here to this reader's attaching nothing waits, so resumptions
                # that arrive together are settled in the order they claim.
                session.close_requests.pop(effect.epoch, None)  # an earlier close is done
                old = session.stream_writers.pop(effect.epoch, None)
                if old is not None:
                    old.cancel()  # (it unwinds later, leaving the stream to this reader)
                answer = old is not None
            elif isinstance(effect, DetachStream):
                session.streams.by_epoch(effect.epoch).handle(StreamInput.DETACH)
            else:
                raise AssertionError(f"a GET course asked for {effect!r} out of turn")
        except BaseException as exc:
            effect = course.fail(exc, clock())
        else:
            effect = course.deliver(answer, clock())


async def _replay_effect(conn: Connection, session: Session, effect: object) -> object:
    """Perform one effect of a replay from the shared store; its answer."""
    store, sid = conn.driver.shared.store, session.sid
    if isinstance(effect, TailSend):
        await conn.send(conn.conn.send_stream_data(effect.data))
    elif isinstance(effect, TailPause):
        await asyncio.sleep(max(0.0, effect.until - session.loop.time()))
    elif isinstance(effect, ReadEvents):
        return await store.read_events(session.principal, sid, effect.epoch, effect.after)
    elif effect is KEEP_TAILING:
        return not session.closed
    elif isinstance(effect, ExpireClaim):
        with contextlib.suppress(StoreUnavailable):
            await store.expire_claim(session.principal, sid, effect.epoch)
    elif isinstance(effect, LookUpStream):
        return await store.stream_info(session.principal, sid, effect.epoch)
    elif isinstance(effect, StartReplay):
        headers = (*SSE_HEADERS, ("mcp-session-id", sid))
        await conn.send(conn.conn.start_stream(200, headers))
    else:  # END_REPLAY
        await conn.send(conn.conn.end_stream())
    return None


async def serve_delete(conn: Connection, session: Session, delete: DeleteSession) -> None:
    """Carry out the DELETE's :class:`~weir.protocol.get.DeleteCourse`."""
    course = DeleteCourse(delete, conn.driver.stream_rules)
    clock = session.loop.time
    effect = course.start(clock())
    while effect is not None:
        answer: object = None
        try:
            if isinstance(effect, LoadSession):
                answer = session
            elif effect is MARK_BOUND:
                await conn.driver.shared.mark_bound(session)
            elif effect is END_SESSION:
                kept = await conn.driver.shared.delete(session)
                conn.driver.end(session, kept)
            elif effect is DELETED:
                await conn.send(conn.conn.send_response(200, ()))
            else:
                raise AssertionError(f"a DELETE course asked for {effect!r} out of turn")
        except BaseException as exc:
            effect = course.fail(exc, clock())
        else:
            effect = course.deliver(answer, clock())


async def _prime(session: Session, stream: StreamLog) -> None:
    """A stream's priming event (an id, empty data), within credit."""
    with contextlib.suppress(Gone):
        await session.append(stream, "")
