"""The 2024-11-05 HTTP+SSE transport.

Theory of operation
-------------------
``GET /sse`` opens a session whose one LEGACY stream (no event ids: 2024-11-05 has
no resumption) carries every response; its first event, ``endpoint``, names the
URL to POST to.  The session lives exactly as long as that stream.

Which requests are served, and every refusal that needs no state, is
:func:`weir.protocol.legacy.route_legacy`'s.  ``POST /messages?session_id=`` answers
202; its requests are admitted and gated like those of the current transport --
a lone request before the 202, a batch's entries one by one after it -- and their
responses go out on the LEGACY stream.  ``initialize`` arrives as one of those
messages, on the session the stream already opened.

**The order of a POST is the core's**
(:class:`~weir.protocol.legacy.LegacyPostCourse`): this module performs the
effects it asks for, the ones it shares with a session-era POST through
``engine._calls``'s :meth:`~weir.engine._calls.Calls.post_effect`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import trio

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol.course import GATE_STEPS, CallCourse
from weir.protocol.jsonrpc import Request, encode_error, encode_result
from weir.protocol.legacy import (
    NEW_LEGACY_SESSION,
    AdmitLegacyBatch,
    LegacyMessages,
    LegacyPostCourse,
    LegacyStreamCourse,
    OpenLegacyStream,
    RunOnLegacy,
)
from weir.protocol.lifecycle import ForgetSession
from weir.protocol.post import ATTACH_WRITER, AdmitRequests, AllocateEpoch, LoadSession
from weir.protocol.streams import StreamKind

from ._calls import Calls
from ._connection import Connection
from ._execution import Execution
from ._requester import Requester
from ._session import Session, StreamHandle, StreamLost
from ._session_table import SessionTable
from ._shared import Shared
from ._streams import Streams
from ._writer import SSE_HEADERS, write_stream


class Legacy:
    """The 2024-11-05 HTTP+SSE transport (see the module docstring).

    Guarantees: a legacy session lives exactly as long as its stream; its POSTs'
    requests are admitted and gated like the current transport's.
    """

    def __init__(
        self,
        shared: Shared,
        table: SessionTable,
        streams: Streams,
        calls: Calls,
        execution: Execution,
    ) -> None:
        self.shared = shared
        self.config = shared.config
        self.store = shared.store
        self.metrics = shared.metrics
        self.table = table
        self.streams = streams
        self.calls = calls
        self.execution = execution

    async def stream(self, conn: Connection, who: Requester) -> None:
        """Carry out a ``GET <sse path>``'s
        :class:`~weir.protocol.legacy.LegacyStreamCourse` (it has no deadline: no clock)."""
        course = LegacyStreamCourse(self.config.legacy_messages_path)
        effect = course.start(0.0)
        session: Session | None = None
        handle: StreamHandle | None = None
        while effect is not None:
            try:
                if effect is NEW_LEGACY_SESSION:
                    session = await self.table.new_session("2024-11-05", who.principal)
                    answer: object = session.session_id
                elif isinstance(effect, AllocateEpoch):
                    assert session is not None
                    record = session.record
                    answer = await self.store.allocate_epoch(record.principal, record.session_id)
                elif isinstance(effect, OpenLegacyStream):
                    assert session is not None
                    handle = self.streams.open_stream(
                        session, effect.epoch, StreamKind.LEGACY, None
                    )
                    handle.log.emit_ids = False  # 2024-11-05 has no resumption
                    await handle.send(effect.endpoint, event="endpoint")
                    answer = None
                elif effect is ATTACH_WRITER:
                    assert session is not None and handle is not None
                    keepalive = self.config.sse_keepalive
                    await write_stream(conn, session, handle, 0, SSE_HEADERS, keepalive=keepalive)
                    answer = None
                else:  # the legacy session ends with its stream
                    assert isinstance(effect, ForgetSession) and session is not None
                    if not session.closed:
                        with trio.CancelScope(shield=True):
                            await self.table.end_session(session)
                    answer = None
            except BaseException as exc:
                effect = course.fail(exc, 0.0)
            else:
                effect = course.deliver(answer, 0.0)

    async def post(self, conn: Connection, post: LegacyMessages, who: Requester) -> None:
        """Carry out a legacy POST's :class:`~weir.protocol.legacy.LegacyPostCourse`
        (its messages already checked by ``route_legacy``): the core decides the
        order, this performs each effect it asks for."""
        course = LegacyPostCourse(post, self.shared.post_rules)
        clock = trio.lowlevel.current_clock().current_time  # (one call per reading)
        now = clock()  # read again only after a step that may wait (the gate's deadlines)
        effect = course.start(now)
        session: Session | None = None
        try:
            while effect is not None:
                try:
                    if session is None:
                        assert isinstance(effect, LoadSession)
                        session = await self.table.session(
                            who.principal, post.session_id, effect.request_id
                        )
                        answer: object = session
                    elif isinstance(effect, RunOnLegacy):
                        if effect.course.replay is not None:
                            self.metrics.duplicates_replayed += 1
                        run = self._runner(session, effect.epoch)
                        self.shared.start(run, 0, effect.course)
                        answer = None
                    elif isinstance(effect, AdmitLegacyBatch):
                        # Every entry waits for admission on its own, after the 202.
                        run = self._runner(session, effect.epoch)
                        requests, epoch = effect.requests, effect.epoch
                        self.shared.start(
                            self.calls.admit_each, session, requests, None, run, epoch
                        )
                        answer = None
                    elif isinstance(effect, AdmitRequests):
                        answer = await self.calls.admit(session, effect)
                        now = clock()
                    elif isinstance(effect, GATE_STEPS):
                        answer = await self.calls.gate_effect(session, effect)
                        now = clock()
                    else:  # Mail, Finished, GiveBack, ACCEPTED: as for a session-era POST
                        answer = await self.calls.post_effect(conn, session, effect)
                except BaseException as exc:
                    effect = course.fail(exc, clock())
                else:
                    effect = course.deliver(answer, now)
        except RemoteProtocolError as exc:
            if exc.reason is Reason.IN_PROGRESS:
                self.metrics.duplicates_in_progress += 1
            raise

    def _runner(self, session: Session, epoch: str) -> Callable[[int, CallCourse], Awaitable[None]]:
        """How a legacy request runs: its answer goes out on the LEGACY stream."""
        legacy = session.handles[epoch]

        async def run(_: int, plan: CallCourse) -> None:
            if plan.request.method == "initialize" and plan.replay is None:
                await self._initialize(session, plan.request, legacy)
            else:
                legacy.outstanding += 1
                await self.execution.run_request(session, plan, legacy)

        return run

    async def _initialize(self, session: Session, req: Request, handle: StreamHandle) -> None:
        try:
            await self.calls.initialize_session(req, session, session.record.principal)
            payload = encode_result(req.id, self.calls.initialize_result(session))
        except RemoteProtocolError as exc:
            payload = encode_error(req.id, exc.code, exc.message, exc.error_data())
        try:
            with contextlib.suppress(StreamLost):
                await handle.send(payload.decode())
        finally:
            session.done(1, handle.log.epoch)
