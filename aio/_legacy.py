"""The 2024-11-05 HTTP+SSE transport on the asyncio runtime, as on the Trio engine.

Theory of operation
-------------------
``GET /sse`` opens a session whose one LEGACY stream (no event ids: 2024-11-05 has
no resumption) carries every response; its first event, ``endpoint``, names the URL
to POST to.  The session lives exactly as long as that stream: it ends when the
stream's connection does.  It belongs to the principal of the request that opened
it and counts against the session limits like any other.

Which requests are served, and every refusal that needs no state, is
:func:`weir.protocol.legacy.route_legacy`'s.  ``POST /messages?session_id=`` is
answered 202; the order of its steps is the core's
:class:`~weir.protocol.legacy.LegacyPostCourse` -- a lone request admitted and gated
before the 202, a batch's entries one by one after it -- and this module performs
its effects, sharing a session-era POST's where they are the same
(:meth:`~._post.PostEffects.effect`).  Answers go out on the LEGACY stream.
``initialize`` arrives as one of those messages, on the session the stream already
opened, and sets what the client declared; the session's version stays 2024-11-05.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

from weir.app import Caller, initialize_result_for
from weir.protocol import HttpRequest, RemoteProtocolError
from weir.protocol.course import CallCourse
from weir.protocol.jsonrpc import Request, encode_error, encode_result
from weir.protocol.legacy import (
    NEW_LEGACY_SESSION,
    AdmitLegacyBatch,
    LegacyMessages,
    LegacyOpen,
    LegacyPostCourse,
    LegacyStreamCourse,
    OpenLegacyStream,
    RunOnLegacy,
    route_legacy,
)
from weir.protocol.lifecycle import ForgetSession, parse_initialize
from weir.protocol.post import ATTACH_WRITER, AllocateEpoch, LoadSession
from weir.protocol.streams import StreamKind, StreamLog

from ._auth import Who
from ._calls import execute
from ._feeds import entries
from ._lifecycle import forget_session
from ._post import PostEffects
from ._session import Gone, Session

if TYPE_CHECKING:
    from ._connection import Connection

#: The one revision this transport speaks.
VERSION: Final = "2024-11-05"


def is_legacy(conn: Connection, request: HttpRequest) -> bool:
    """Whether ``request`` is for one of the legacy transport's two paths."""
    driver, path = conn.driver, request.path
    if path == driver.endpoint.path or driver.legacy_sse_path is None:
        return False  # (no stream path: no legacy session can exist, neither path is served)
    return path in (driver.legacy_messages_path, driver.legacy_sse_path)


async def serve_legacy(conn: Connection, request: HttpRequest, who: Who) -> None:
    """Serve one request for the legacy transport's paths, for ``who``."""
    driver = conn.driver
    legacy = route_legacy(
        request,
        driver.endpoint,
        sse_path=driver.legacy_sse_path,
        messages_path=driver.legacy_messages_path,
    )
    if isinstance(legacy, LegacyOpen):
        await _open(conn, who)
    else:
        await _post(conn, legacy, who)


async def _open(conn: Connection, who: Who) -> None:
    """``GET /sse``: carry out its :class:`~weir.protocol.legacy.LegacyStreamCourse` --
    a new session (in the store, like any), its LEGACY stream, written until it ends,
    and the session's end with it.  (It has no deadline: no clock.)"""
    driver = conn.driver
    course = LegacyStreamCourse(driver.legacy_messages_path)
    effect = course.start(0.0)
    session: Session | None = None
    stream: StreamLog | None = None
    while effect is not None:
        try:
            answer: object = None
            if effect is NEW_LEGACY_SESSION:
                session = await driver.shared.create(who.principal, VERSION, {}, {}, None)
                answer = session.sid
            elif isinstance(effect, AllocateEpoch):
                assert session is not None
                answer = await driver.shared.epoch(session, effect.generation)
            elif isinstance(effect, OpenLegacyStream):
                assert session is not None
                stream = session.open_stream(StreamKind.LEGACY, effect.epoch, emit_ids=False)
                await session.append(stream, effect.endpoint, event="endpoint")
            elif effect is ATTACH_WRITER:
                assert session is not None and stream is not None
                await conn.write_stream(session, stream, 0)
            else:  # the legacy session lives exactly as long as its stream
                assert isinstance(effect, ForgetSession) and session is not None
                await forget_session(conn, session)
        except BaseException as exc:
            effect = course.fail(exc, 0.0)
        else:
            effect = course.deliver(answer, 0.0)


async def _post(conn: Connection, post: LegacyMessages, who: Who) -> None:
    """Carry out a legacy POST's course: the core decides the order, this performs
    each effect it asks for."""
    driver = conn.driver
    course = LegacyPostCourse(post, driver.post_rules)
    clock = asyncio.get_running_loop().time
    effect = course.start(clock())
    session: Session | None = None
    shared: PostEffects | None = None  # (the effects it shares with a session-era POST)
    while effect is not None:
        try:
            answer: object = None
            if session is None:
                assert isinstance(effect, LoadSession)
                session = answer = await driver.shared.load(
                    who.principal, post.session_id, effect.request_id
                )
                shared = PostEffects(conn, session)
            elif isinstance(effect, RunOnLegacy):
                stream = session.streams.by_epoch(effect.epoch)
                session.spawn(_run(session, effect.course, stream))
            elif isinstance(effect, AdmitLegacyBatch):
                # Every entry waits for admission on its own, after the 202.
                session.spawn(_run_batch(session, effect.requests, effect.epoch))
            else:  # Mail, admission, the gate, Finished, GiveBack, ACCEPTED
                assert shared is not None
                answer = await shared.effect(effect)
        except BaseException as exc:
            effect = course.fail(exc, clock())
        else:
            effect = course.deliver(answer, clock())


async def _run_batch(session: Session, requests: list[Request], epoch: str) -> None:
    """Admit, gate and run a batch's entries one by one (the core's order), each
    answer going out on the LEGACY stream ``epoch``."""
    stream = session.streams.by_epoch(epoch)
    feed = entries(session, requests, None, session.driver.post_rules)
    with contextlib.suppress(Gone):
        await feed(lambda p: session.spawn(_run(session, p, stream)), epoch)


async def _run(session: Session, course: CallCourse, stream: StreamLog) -> None:
    """Run one admitted legacy request; its answer goes out on the LEGACY stream."""
    driver = session.driver
    try:
        req = course.request
        payload: bytes | None
        if req.method == "initialize" and course.replay is None:
            payload = _initialize(session, req)
        else:
            payload = await execute(driver.app, session, course, stream, driver.state)
        if payload is not None:
            await session.append(stream, payload.decode())
    except Gone:
        pass
    finally:
        session.done(stream.epoch)


def _initialize(session: Session, req: Request) -> bytes:
    """Initialize the legacy session: its answer (an error if the request is not one
    weir accepts)."""
    try:
        asked = parse_initialize(req)
    except RemoteProtocolError as exc:
        return encode_error(req.id, exc.code, exc.message, exc.error_data())
    session.caller = Caller(asked.capabilities, asked.client_info)
    return encode_result(req.id, initialize_result_for(session.driver.app, session.version))
