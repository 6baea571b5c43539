"""JSON mode's one response body, written under the session's drain credit.

Theory of operation
-------------------
A JSON response takes credit for its exact size before it is written -- when there
is none, waiting until it fits, behind no other response or stream, drawing first
on what its requests reserved -- and keeps it until the peer acknowledges its last
byte (:class:`~weir.engine._session.JsonCharge`); a teardown cancels a write that
is stuck on a stalled peer.  Used by session-era POSTs in JSON mode, batches, and
the sessionless era's JSON answers and replays.

A stalled peer keeps the write waiting, and whatever the waiting frames reference
stays in memory with it: callers that can frame the body themselves
(:func:`frame_json`), drop their own reference and hand the framed bytes over in a
list that :func:`send_framed` empties, so one copy of the answer is held, the one its
credit counts -- and held by the write alone, which lets go of what the kernel has
taken of it (:meth:`Connection.send`).
"""

from __future__ import annotations

from collections.abc import Hashable

import trio

from ._connection import Connection
from ._session import JsonCharge, Session, SessionClosed
from ._writer import PeerGone


async def answer_json(
    conn: Connection,
    session: Session,
    bodies: list[bytes],
    is_batch: bool,
    lane: Hashable | None = None,
) -> None:
    """202 when nothing answers; else one body, or a batch's array of them."""
    if not bodies:
        await conn.send(conn.http.send_response(202, ()))
        return
    headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
    body = b"[" + b",".join(bodies) + b"]" if is_batch else bodies.pop()
    bodies.clear()
    framed = [frame_json(conn, session, headers, body)]
    del body  # (only the framed copy waits on a stalled peer)
    await send_framed(conn, session, framed, lane)


async def send_json(
    conn: Connection,
    session: Session,
    headers: list[tuple[str, str]],
    body: bytes,
    lane: Hashable | None = None,
) -> None:
    """Write a JSON response under the session's drain credit (see :class:`JsonCharge`).

    The response takes credit for its exact size before it is written (when there
    is none, waiting until it fits, behind no other response or stream; drawing
    on what ``lane``, its requests' reservations, holds) and keeps it until the
    peer acknowledges its last byte; a teardown cancels a write that is stuck on
    a stalled peer.
    """
    framed = [frame_json(conn, session, headers, body)]
    del body  # (the caller's reference may remain; this frame keeps none)
    await send_framed(conn, session, framed, lane)


def frame_json(
    conn: Connection, session: Session, headers: list[tuple[str, str]], body: bytes
) -> bytes:
    """The bytes of a ``200`` with ``body`` (the next thing ``conn`` sends); the
    session learns their size (its typical frame)."""
    data = conn.http.send_response(200, headers, body)
    session.flow.observe_frame(len(data))
    return data


async def send_framed(
    conn: Connection, session: Session, framed: list[bytes], lane: Hashable | None = None
) -> None:
    """Write what :func:`frame_json` made under the session's drain credit, as
    :func:`send_json` does.  ``framed`` holds the one framed response and is taken
    over: emptied once the write begins (or fails before it)."""
    n = len(framed[0])
    try:
        if not session.try_acquire_now(n, lane):
            await session.acquire(n, lane)
    except SessionClosed:
        framed.clear()
        conn.http.send_failed()
        raise PeerGone from None
    if lane is not None:
        session.settle(lane)  # the body holds credit of its own now
    charge = JsonCharge(session, n, lane)
    with trio.CancelScope() as scope:
        session.json_writers[scope] = None
        try:
            await conn.send(framed, [(n, (charge, 0))])
        except BaseException:
            charge.drained(0)  # never written whole: nothing to wait for
            raise
        finally:
            session.json_writers.pop(scope, None)
    if scope.cancelled_caught:
        conn.http.send_failed()
        raise PeerGone
