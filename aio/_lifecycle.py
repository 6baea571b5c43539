"""A session's opening and its channel's renewal on the asyncio runtime.

Theory of operation
-------------------
:func:`serve_initialize` carries out an ``initialize``'s
:class:`~weir.protocol.lifecycle.InitializeCourse`: the session is created in the
store first, its id and channel token answered together (the rebind handshake
advertised as on Trio), and a session whose answer never left is deleted at once --
nobody learnt its id.  :func:`serve_rebind` answers the explicit rebind handshake:
the store bumps the channel's generation (the old token is stale on every replica,
its streams end) and the client gets the new token and the session's recently
finished results.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import msgspec

from weir.app import initialize_result_for
from weir.engine._memory_store import MemoryStore
from weir.protocol import PostMessages, RemoteProtocolError
from weir.protocol.jsonrpc import Request, encode_result
from weir.protocol.lifecycle import AnswerInitialize, ForgetSession, InitializeCourse, OpenSession
from weir.protocol.post import REBIND_METHOD

from ._auth import Who
from ._session import MAX_FINISHED, Session

if TYPE_CHECKING:
    from ._connection import Connection


async def serve_initialize(conn: Connection, post: PostMessages, who: Who) -> None:
    """Carry out an ``initialize``'s :class:`~weir.protocol.lifecycle.InitializeCourse`
    (the same checks and negotiation as the Trio runtime): the session's channel
    token, from its record, is answered with its id, and the rebind handshake is
    advertised as on Trio."""
    req, driver = post.messages[0], conn.driver
    assert isinstance(req, Request)
    course = InitializeCourse(req)
    effect = course.start(0.0)
    session: Session | None = None
    while effect is not None:
        try:
            if isinstance(effect, OpenSession):
                asked = effect.asked
                session = await driver.shared.create(
                    who.principal,
                    asked.version,
                    asked.capabilities,
                    asked.client_info,
                    effect.request_id,
                )
                assert session.record is not None
                answer: object = (session.sid, session.record.channel_token)
            elif isinstance(effect, AnswerInitialize):
                rebind = {REBIND_METHOD: {"header": "Mcp-Channel-Token"}}  # (as on Trio)
                result = initialize_result_for(driver.app, effect.version, experimental=rebind)
                body = encode_result(effect.request_id, result)
                await conn.send(conn.conn.send_response(200, effect.headers, body))
                answer = None
            else:  # nobody learnt the id, so nobody can use the session
                assert isinstance(effect, ForgetSession) and session is not None
                await forget_session(conn, session)
                answer = None
        except BaseException as exc:
            effect = course.fail(exc, 0.0)
        else:
            effect = course.deliver(answer, 0.0)


async def forget_session(conn: Connection, session: Session) -> None:
    """A :class:`~weir.protocol.lifecycle.ForgetSession`: ``session``, which nobody
    can reach (its id never left, or its legacy stream ended), is deleted from the
    store -- if the store does not answer, its record expires there -- and ends here,
    with what it kept read before the deletion let go of it."""
    kept = None  # (store down: end() reads what the session kept itself)
    with contextlib.suppress(RemoteProtocolError):
        kept = await conn.driver.shared.delete(session)
    conn.driver.end(session, kept)


async def serve_rebind(conn: Connection, session: Session, req: Request) -> None:
    """The explicit rebind handshake (fencing), answered as on Trio: a new
    generation and token (the old one is stale on every replica, its streams
    end), and the session's recently finished results."""
    record = await conn.driver.shared.rebind(session, req.id)
    store = conn.driver.shared.store
    kept = (
        store.recent_results(record.principal, record.session_id, MAX_FINISHED)
        if isinstance(store, MemoryStore)
        else list(session.finished.values())  # (a shared store: those finished here)
    )
    body = encode_result(
        req.id,
        {
            "generation": record.generation,
            "channelToken": record.channel_token,
            "results": [msgspec.json.decode(p) for p in kept],
        },
    )
    headers = [
        ("content-type", "application/json"),
        ("mcp-session-id", session.sid),
        ("mcp-channel-token", record.channel_token),
    ]
    await conn.send(conn.conn.send_response(200, headers, body))
