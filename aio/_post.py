"""A session-era POST on the asyncio runtime: the course's effects, performed.

Theory of operation
-------------------
The core's :class:`~weir.protocol.post.PostCourse` decides the order of everything a
POST does (mail, 202, admission, the gate, JSON or a stream, the priming event);
:class:`PostEffects` performs each effect it asks for, for one POST on one
:class:`~._connection.Connection`, and answers it back.  The legacy transport's POST
shares most of these effects (:mod:`._legacy` hands them to :meth:`PostEffects.effect`).

Handlers run as the session's tasks, not the connection's: a client that hangs up
does not cancel its calls.  A request holds its admission until its handler ended
and its answer holds credit (or the connection that would carry it is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable
from typing import TYPE_CHECKING

from weir.protocol import PostMessages
from weir.protocol.course import GATE_STEPS, CallCourse, CoursePhase
from weir.protocol.post import (
    ACCEPTED,
    ATTACH_WRITER,
    ENTER_REQUEST,
    MARK_BOUND,
    AdmitRequests,
    AllocateEpoch,
    AnswerJson,
    Effect,
    Finished,
    GiveBack,
    LoadSession,
    Mail,
    OpenRequestStream,
    PostCourse,
    Rebind,
    RunBatch,
    RunCalls,
)
from weir.protocol.states import SessionInput, StreamInput, StreamState, session_transition
from weir.protocol.streams import StreamKind, StreamLog

from ._calls import append_recording, execute, gate_step, runs_now
from ._feeds import Feed, entries, given, never_run
from ._lifecycle import serve_rebind
from ._session import Gone, Session

if TYPE_CHECKING:
    from ._connection import Connection


class PostEffects:
    """Performs the effects of one POST's course on one connection, for one session.

    Holds what lives from one effect to the next: the request stream opened for
    the calls (until a writer is attached to it) and how many answers it waits for."""

    __slots__ = ("conn", "outstanding", "session", "stream")

    def __init__(self, conn: Connection, session: Session) -> None:
        self.conn = conn
        self.session = session
        #: The stream opened by ``OpenRequestStream``, until ``ATTACH_WRITER``.
        self.stream: StreamLog | None = None
        #: How many answers that stream waits for.
        self.outstanding = 0

    async def run(self, post: PostMessages) -> None:
        """Carry out the POST's :class:`~weir.protocol.post.PostCourse`: the core
        decides the order, this performs each effect it asks for."""
        session = self.session
        course = PostCourse(post, self.conn.driver.post_rules)
        clock = session.clock
        effect = course.start(clock())
        while effect is not None:
            try:
                answer = await self.effect(effect)
            except BaseException as exc:
                effect = course.fail(exc, clock())
            else:
                effect = course.deliver(answer, clock())

    async def effect(self, effect: Effect) -> object:
        """Perform one effect of a POST's course (a session-era POST's, or those a
        legacy POST shares with it); its answer."""
        session = self.session
        if isinstance(effect, LoadSession):
            return session  # (looked up by :meth:`respond`, which answers the 404)
        if isinstance(effect, GATE_STEPS):
            return await gate_step(session, effect)
        if isinstance(effect, AdmitRequests):
            try:
                await session.admit(effect.n, effect.request_id, effect.lane)  # 429 if half-open
            except Gone:
                return False
            self.conn.driver.metrics.admissions += effect.n
            return True
        if isinstance(effect, Mail):
            await self._mail(effect)
        elif effect is ENTER_REQUEST:
            session.state = session_transition(session.state, SessionInput.REQUEST)
        elif effect is ACCEPTED:
            await self.conn.send(self.conn.conn.send_response(202, ()))
        elif isinstance(effect, Finished):
            for _ in range(effect.n):
                session.done(effect.lane)
        elif isinstance(effect, GiveBack):
            await self.conn.driver.shared.finish(session, effect.key, None)
        elif isinstance(effect, AllocateEpoch):
            return await self.conn.driver.shared.epoch(session, effect.generation)
        elif effect is MARK_BOUND:
            await self.conn.driver.shared.mark_bound(session)
        elif isinstance(effect, Rebind):
            session.flow.credit.admit(session.clock(), effect.request.id)  # (429 if half-open)
            await serve_rebind(self.conn, session, effect.request)
        elif isinstance(effect, OpenRequestStream):
            binding = effect.token[0] if effect.token else 0
            self.stream = session.open_stream(StreamKind.REQUEST, effect.epoch, binding=binding)
            session.flow.move(effect.lane, effect.epoch)
            self.outstanding = effect.outstanding
        elif isinstance(effect, RunCalls):
            assert self.stream is not None
            if self._lone_now(effect.courses):
                await self._run_now(self.stream, effect.courses[0], effect.primes)
            else:
                self._run_on_stream(self.stream, given(effect.courses), effect.primes)
        elif effect is ATTACH_WRITER:
            stream, self.stream = self.stream, None
            assert stream is not None
            await self.conn.write_stream(session, stream, 0)
        elif isinstance(effect, AnswerJson):
            if not effect.is_batch and self._lone_now(effect.courses):
                await self._json_now(effect.courses[0], effect.lane)
            else:
                await self._json(effect.is_batch, given(effect.courses), effect.lane)
        elif isinstance(effect, RunBatch):
            await self._batch(effect)
        else:
            raise AssertionError(f"a POST course asked for {effect!r} out of turn")
        return None

    async def _mail(self, mail: Mail) -> None:
        """A POST's notifications, answers and cancellations (the core's :class:`Mail`):
        each handled here, or forwarded to the replica that runs what it names."""
        session = self.session
        if mail.initialized:
            session.state = session_transition(session.state, SessionInput.INITIALIZED)
        if mail.notes:
            session.driver.hand_notes(session.sid, mail.notes)
        for answer in mail.answer_here:
            session.answer(answer)  # to a server-to-client request
        for rid in mail.cancel_here:
            session.cancel(rid)
        for item in mail.forward:  # (a shared store: for another replica)
            await self.conn.driver.shared.post(session, item.box, item.data)

    async def _batch(self, batch: RunBatch) -> None:
        """A batch (2025-03-26): one JSON body, or one stream its entries are run on
        as they are admitted, one at a time (:func:`entries`)."""
        session = self.session
        feed = entries(session, batch.requests, batch.token, self.conn.driver.post_rules)
        if batch.json:
            await self._json(True, feed, object())  # (the body's own lane)
            return
        binding = batch.token[0] if batch.token else 0
        epoch = await self.conn.driver.shared.epoch(session, binding)
        stream = session.open_stream(StreamKind.REQUEST, epoch, binding=binding)
        self.outstanding = len(batch.requests)
        self._run_on_stream(stream, feed, batch.primes)
        await self.conn.write_stream(session, stream, 0)

    def _lone_now(self, courses: list[CallCourse]) -> bool:
        """Is this a lone request :func:`~._calls.runs_now` accepts (run in this task)?"""
        return len(courses) == 1 and runs_now(self.conn.driver.app, self.session, courses[0])

    async def _json_now(self, course: CallCourse, lane: Hashable) -> None:
        """:meth:`_json` for a lone request answered in this task: no session task."""
        session, driver = self.session, self.conn.driver
        try:
            body = await execute(driver.app, session, course, None, driver.state, inline=True)
            assert body is not None  # (an inline call cannot be cancelled)
            if session.closed:
                raise Gone
            await session.take_credit(len(body), lane)  # JSON bodies hold credit like frames
        finally:
            session.done(lane)
        headers = [("content-type", "application/json"), ("mcp-session-id", session.sid)]
        answer = [body]
        del body  # (only the transport's buffer waits on a stalled peer)
        await self.conn.send_answer(session, headers, answer)

    async def _run_now(self, stream: StreamLog, course: CallCourse, primes: bool) -> None:
        """:meth:`_run_on_stream` for a lone request answered in this task: its frames
        (the priming event first, if ``primes``) go into the stream at once when credit
        allows, so the writer finds them on its first look; when a frame would wait for
        credit, a session task appends them instead, in order."""
        session, driver = self.session, self.conn.driver
        try:
            payload = await execute(driver.app, session, course, stream, driver.state, inline=True)
        except BaseException:
            session.done(stream.epoch)
            raise
        assert payload is not None  # (an inline call cannot be cancelled)
        text = payload.decode()
        if primes and not session.try_append(stream, ""):
            driver.metrics.inline_deferred["primed"] += 1
            session.spawn(_deliver(session, stream, text, prime=True))
        elif session.try_append(stream, text, final=True):
            session.done(stream.epoch)
        else:
            driver.metrics.inline_deferred["plain"] += 1
            session.spawn(_deliver(session, stream, text, prime=False))

    async def _json(self, is_batch: bool, feed: Feed, lane: Hashable) -> None:
        """Run the requests as session tasks; one body (a batch's array) when all end.

        The body takes credit drawing on what the requests reserved in ``lane``;
        their reservations end once it holds credit of its own."""
        session = self.session
        app, state = self.conn.driver.app, self.conn.driver.state
        # Session tasks, not this connection's: a hang-up does not cancel a call.
        # (asyncio.wait, unlike gather, does not cancel them if this task is cancelled.)
        tasks: list[asyncio.Task[bytes | None]] = []
        try:
            await feed(
                lambda p: tasks.append(session.spawn(execute(app, session, p, None, state))), lane
            )
            await asyncio.wait(tasks)
            if session.closed:
                raise Gone
            answered = [b for t in tasks if not t.cancelled() and (b := t.result()) is not None]
            if not answered:
                await self.conn.send(self.conn.conn.send_response(202, ()))
                return
            body = b"[" + b",".join(answered) + b"]" if is_batch else answered[0]
            await session.take_credit(len(body), lane)  # JSON bodies hold credit like frames
        finally:
            # A request is in flight until its handler ended and its answer holds
            # credit (or the connection that would carry it is gone).
            for task in tasks:
                if task.done():
                    session.done(lane)
                else:
                    task.add_done_callback(lambda _: session.done(lane))
        tasks.clear()  # (a task keeps its result: the answer's body)
        answered.clear()
        headers = [("content-type", "application/json"), ("mcp-session-id", session.sid)]
        answer = [body]
        del body  # (only the transport's buffer waits on a stalled peer)
        await self.conn.send_answer(session, headers, answer)

    def _run_on_stream(self, stream: StreamLog, feed: Feed, primes: bool) -> None:
        """Run the requests ``feed`` gives as session tasks, each appending its answer
        to ``stream`` (after the priming event, if ``primes``); the head is not held
        back for them.  The stream has already taken over what they reserved."""
        session = self.session
        app, state = self.conn.driver.app, self.conn.driver.state
        remaining = [self.outstanding]
        alone = session.logged and self.outstanding == 1  # its final append records it

        async def run(p: CallCourse) -> None:
            try:
                key = p.key
                payload = await execute(app, session, p, stream, state, final_append=alone)
                remaining[0] -= 1
                last = remaining[0] == 0
                if payload is not None and p.phase is CoursePhase.RECORDING and key is not None:
                    await append_recording(session, stream, p, key, payload)
                elif payload is not None:
                    await session.append(stream, payload.decode(), final=last)
                elif last and stream.state is not StreamState.CLOSED:
                    stream.handle(StreamInput.ABORT)  # cancelled: no response to send
                    session.wake(stream)
            except Gone:
                pass
            finally:
                session.done(stream.epoch)

        async def prime_then_run() -> None:
            # In a task, as the calls are: waiting for credit must not hold the head back.
            try:
                if primes:
                    await session.append(stream, "")  # the priming event: an id, empty data
            except Gone:
                # Nothing will run: give back what a lone request was admitted with
                # (a batch's entries, not admitted yet, stop at the closed session).
                with contextlib.suppress(Gone):
                    await feed(lambda p: never_run(session, p, stream.epoch), stream.epoch)
                return
            with contextlib.suppress(Gone):
                await feed(lambda p: session.spawn(run(p)), stream.epoch)

        session.spawn(prime_then_run())  # the session owns them: a hang-up is no cancel


async def _deliver(session: Session, stream: StreamLog, text: str, *, prime: bool) -> None:
    """Append an answer computed in a connection's task that had to wait for credit
    (after its priming event, if ``prime``); the request is done either way."""
    try:
        if prime:
            await session.append(stream, "")
        await session.append(stream, text, final=True)
    except Gone:
        pass
    finally:
        session.done(stream.epoch)
