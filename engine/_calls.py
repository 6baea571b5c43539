"""POST: admission and the idempotency gate, before anything runs.

Theory of operation
-------------------
**Admission** happens here, before any handler is dispatched: a POST carrying
requests for a session whose credit is half-open is refused with 429
``stream_half_open`` and ``Retry-After``; nothing is enqueued, nothing runs.
``initialize`` and other sessions are never refused on its account.  Every request
admitted is accounted for exactly once later (:meth:`Session.done`), whether it
executes, replays or is cancelled.  A batch's entries are admitted one by one,
each like a lone request, and dispatched as they are admitted.

**The idempotency gate.**  Before a ``tools/call`` runs, the session's gate records
its key (``Idempotency-Key`` or the JSON-RPC id) in the store: a second delivery
while it runs waits a bounded time and then gets 409 ``in_progress``; after it
finished, the stored response is replayed and nothing executes again.  Each
request's steps -- claim, run, record -- are ordered by its
:class:`~weir.protocol.course.CallCourse` (the core's), which this module starts and
``engine._execution`` carries on; the store round trips are made here.

A POST's requests are answered on a REQUEST stream (``engine._streams``) or, in JSON
mode, as one JSON body written under the session's drain credit.  Notifications and
client responses are handled at once (with a shared store, those meant for another
replica are forwarded through the session's mailboxes).  Also here: ``initialize``
and the explicit rebind handshake (``weir/rebind``, fencing).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import msgspec
import trio

from weir.app import MAX_NOTES_RUNNING, NOTE_WAIT, Caller, initialize_result_for
from weir.protocol import PostMessages, Reason, RemoteProtocolError, session_refusal
from weir.protocol.binding import fenced
from weir.protocol.course import GATE_STEPS, CallCourse, ClaimCall, HoldCall, WaitForCall
from weir.protocol.gate import CallStart
from weir.protocol.jsonrpc import Notification, Request, encode_result
from weir.protocol.lifecycle import (
    AnswerInitialize,
    ForgetSession,
    InitializeCourse,
    OpenSession,
    parse_initialize,
)
from weir.protocol.post import (
    ACCEPTED,
    ATTACH_WRITER,
    ENTER_REQUEST,
    MARK_BOUND,
    REBIND_METHOD,
    AdmitRequests,
    AllocateEpoch,
    AnswerJson,
    BatchEntries,
    CountIn,
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
    StartEntry,
)
from weir.protocol.states import SessionInput, StreamInput, StreamState
from weir.protocol.streams import StreamKind

from ._channel import raise_channel
from ._connection import Connection
from ._execution import Execution
from ._json_reply import answer_json, frame_json, send_framed
from ._memory_store import MemoryStore
from ._requester import Requester
from ._session import Session, SessionClosed, StreamHandle
from ._session_table import SessionTable
from ._shared import Shared, log, retention_full, store_unavailable, wait_for_claim
from ._store_errors import ChannelRejected, RetentionFull, SessionGone, StoreUnavailable
from ._store_records import client_record
from ._streams import Streams
from ._writer import SSE_HEADERS, write_stream

__all__ = ["REBIND_METHOD"]  # (re-exported: weir.engine names it too)


class Calls:
    """POST: admission, the idempotency gate, JSON mode, initialize and rebind.

    Guarantees: a POST performs exactly the effects its course asks for, in its
    order; every admitted request is accounted for once (:meth:`Session.done`); a
    claim granted by a shared store is never lost to a cancellation; at most
    :data:`MAX_NOTES_RUNNING` client notifications are handled at once.
    """

    def __init__(
        self, shared: Shared, table: SessionTable, streams: Streams, execution: Execution
    ) -> None:
        self.shared = shared
        self.app = shared.app
        self.config = shared.config
        self.store = shared.store
        self.metrics = shared.metrics
        self.post_rules = shared.post_rules
        self.replica_id = shared.replica_id
        self.table = table
        self.streams = streams
        self.execution = execution
        #: Client notifications the app's hooks are handling right now.
        self.notes_running = 0

    async def post(self, conn: Connection, post: PostMessages, who: Requester) -> None:
        """Carry out a POST's :class:`~weir.protocol.post.PostCourse`: the core decides
        the order, this performs each effect it asks for (the most frequent first)."""
        if post.is_initialize:
            await self._initialize(conn, post, who)
            return
        course = PostCourse(post, self.post_rules)
        clock = trio.lowlevel.current_clock().current_time  # (one call per reading)
        now = clock()  # read again only after a step that may wait (the gate's deadlines)
        effect = course.start(now)
        session: Session | None = None
        handle: StreamHandle | None = None
        sid = post.ctx.session_id
        try:
            while effect is not None:
                answer: object = None
                try:
                    if session is None:
                        assert isinstance(effect, LoadSession)
                        session = answer = await self.table.session(
                            who.principal, sid, effect.request_id, verify=effect.verify
                        )
                    elif effect is ENTER_REQUEST:
                        session.handle(SessionInput.REQUEST)
                    elif isinstance(effect, AdmitRequests):
                        answer = await self.admit(session, effect)
                        now = clock()
                    elif isinstance(effect, ClaimCall):
                        answer = await self._claim_call(session, effect)
                        now = clock()
                    elif isinstance(effect, HoldCall):
                        session.calls[effect.key] = None  # an Event only once a duplicate waits
                    elif isinstance(effect, OpenRequestStream):
                        handle = self.streams.open_stream(
                            session, effect.epoch, StreamKind.REQUEST, effect.token
                        )
                        session.move_reservations(effect.lane, effect.epoch)
                        handle.outstanding = effect.outstanding
                    elif isinstance(effect, RunCalls):
                        assert handle is not None
                        await self._run_calls(session, handle, effect.courses, effect.primes)
                    elif effect is ATTACH_WRITER:
                        assert handle is not None
                        headers = (*SSE_HEADERS, ("mcp-session-id", session.session_id))
                        keepalive = self.config.sse_keepalive
                        await write_stream(conn, session, handle, 0, headers, keepalive=keepalive)
                    elif isinstance(effect, WaitForCall):
                        answer = await self.gate_effect(session, effect)
                        now = clock()
                    else:
                        answer = await self.post_effect(conn, session, effect)
                except BaseException as exc:
                    effect = course.fail(exc, clock())
                else:
                    effect = course.deliver(answer, now)
        except RemoteProtocolError as exc:
            if exc.reason is Reason.IN_PROGRESS:
                self.metrics.duplicates_in_progress += 1
            raise

    async def _run_calls(
        self, session: Session, handle: StreamHandle, courses: list[CallCourse], primes: bool
    ) -> None:
        """Start a stream's calls: right here when they never suspend (so the writer
        finds the answer on its first look), else as handler tasks (after the
        priming event, if the stream has one)."""
        handlers = self.shared.handlers
        assert handlers is not None
        course = courses[0]
        if course.replay is not None:
            self.metrics.duplicates_replayed += 1
        if len(courses) == 1 and await self.execution.run_now(
            session, course, handle, primes=primes
        ):
            return
        if primes:
            handlers.start_soon(self.execution.prime_then_run, session, handle, courses)
        else:
            handlers.start_soon(self.execution.run_request, session, course, handle)

    async def admit(self, session: Session, effect: AdmitRequests) -> bool:
        """Admission (the core's :class:`AdmitRequests`): False if the session ended."""
        try:
            await session.admit(effect.n, effect.request_id, effect.lane)
        except SessionClosed:
            return False
        self.metrics.admissions += effect.n
        return True

    async def post_effect(self, conn: Connection, session: Session, effect: Effect) -> object:
        """Perform one of a POST course's less frequent effects; its answer."""
        if isinstance(effect, AllocateEpoch):
            principal, sid = session.record.principal, session.session_id
            return await self.store.allocate_epoch(principal, sid, effect.generation)
        elif isinstance(effect, Finished):
            session.done(effect.n, effect.lane)
        elif isinstance(effect, GiveBack):
            await self.execution.finish_call(session, effect.key, None)
        elif isinstance(effect, AnswerJson):
            for course in effect.courses:
                if course.replay is not None:
                    self.metrics.duplicates_replayed += 1
            await self._post_json(conn, session, effect.courses, effect.is_batch, effect.lane)
        elif isinstance(effect, Mail):
            await self._mail(session, effect)
        elif effect is MARK_BOUND:
            await self.streams.mark_bound(session)
        elif effect is ACCEPTED:
            await conn.send(conn.http.send_response(202, ()))
        elif isinstance(effect, Rebind):
            session.credit.admit(trio.current_time(), effect.request.id)
            await self._rebind(conn, session, effect.request)
        elif isinstance(effect, RunBatch):
            await self._post_batch(
                conn, session, effect.requests, effect.token, primes=effect.primes
            )
        else:
            raise AssertionError(f"a POST course asked for {effect!r} out of turn")
        return None

    async def _post_batch(
        self,
        conn: Connection,
        session: Session,
        requests: list[Request],
        token: tuple[int, str] | None,
        *,
        primes: bool,
    ) -> None:
        """A batch (2025-03-26): its entries are admitted one by one, each like a lone
        request, and dispatched as they are admitted (:meth:`admit_each`).

        The response starts at once; entries wait for admission while it is open,
        so a batch never holds more in flight than a session may.
        """
        if self.config.json_response:
            lane = object()  # the batch's one body

            async def feed(run: Callable[[int, CallCourse], Awaitable[None]]) -> None:
                await self.admit_each(session, requests, token, run, lane)

            try:
                bodies = await self._collect_json(session, len(requests), feed, lane)
                await answer_json(conn, session, bodies, True, lane)
            finally:
                session.settle(lane)
            return
        epoch = await self.store.allocate_epoch(
            session.record.principal, session.session_id, token[0] if token else 0
        )
        handle = self.streams.open_stream(session, epoch, StreamKind.REQUEST, token)
        handle.outstanding = len(requests)

        async def run_sse(i: int, plan: CallCourse) -> None:
            await self.execution.run_request(session, plan, handle)

        async def all_sse() -> None:
            if primes:
                await handle.send("")  # the priming event: an id and empty data
            await self.admit_each(session, requests, token, run_sse, epoch)

        self.shared.start(all_sse)
        sse_headers = (*SSE_HEADERS, ("mcp-session-id", session.session_id))
        await write_stream(
            conn, session, handle, 0, sse_headers, keepalive=self.config.sse_keepalive
        )

    async def admit_each(
        self,
        session: Session,
        requests: list[Request],
        token: tuple[int, str] | None,
        run: Callable[[int, CallCourse], Any],
        lane: Hashable,
    ) -> None:
        """Admit, gate and dispatch a batch's requests one at a time, in order; each
        reserves room for its result in ``lane`` (the stream, or the JSON body).

        Each entry waits for admission as a lone request would (so the in-flight
        and credit limits hold for every entry), then passes the idempotency gate,
        then runs.  An entry refused on the way (half-open, a gate refusal) gets
        that refusal as its JSON-RPC error in the batch's response and executes
        nothing; ``run`` accounts for it like any other (:meth:`Session.done`).
        """
        entries = BatchEntries(requests, token, lane, self.post_rules)
        clock = trio.lowlevel.current_clock().current_time  # (one call per reading)
        async with trio.open_nursery() as nursery:
            effect = entries.start(clock())
            while effect is not None:
                answer: object = None
                try:
                    if isinstance(effect, StartEntry):
                        if effect.refused is not None:
                            self.metrics.refused(str(effect.refused.reason))
                        elif effect.course.replay is not None:
                            self.metrics.duplicates_replayed += 1
                        nursery.start_soon(run, effect.index, effect.course)
                    elif isinstance(effect, AdmitRequests):
                        answer = await self.admit(session, effect)
                    elif isinstance(effect, CountIn):
                        session.flow.count_in(1, effect.lane)
                    else:
                        assert isinstance(effect, GATE_STEPS)
                        try:
                            answer = await self.gate_effect(session, effect)
                        except StoreUnavailable:
                            raise store_unavailable(self.config) from None
                except BaseException as exc:
                    effect = entries.fail(exc, clock())
                else:
                    effect = entries.deliver(answer, clock())

    async def _mail(self, session: Session, mail: Mail) -> None:
        """Handle a POST's notifications, answers and cancellations: here, or (with a
        shared store) forwarded through the session's mailboxes to the replica that
        waits for them (see ``Replicas.relay_mail``)."""
        if mail.initialized:
            session.handle(SessionInput.INITIALIZED)
        if mail.notes and self.app.notification_fns:
            self._hand_notes(session, mail.notes)
        for rid in mail.cancel_here:
            session.running[rid].cancel()
        for answer in mail.answer_here:
            assert answer.id is not None  # absorb keeps only answers with an id
            pending = session.pending[answer.id]
            pending.answer = answer
            pending.done.set()
        for post in mail.forward:
            principal, sid = session.record.principal, session.session_id
            await self.store.post_message(principal, sid, post.box, post.data)

    def _hand_notes(self, session: Session, notes: list[Notification]) -> None:
        """The app's notifications, each to its hooks in a background task of its own,
        cancelled after :data:`NOTE_WAIT`; past :data:`MAX_NOTES_RUNNING` at once (over
        the server: a client cannot make it hold more), a notification is dropped."""
        for note in notes:
            if self.notes_running >= MAX_NOTES_RUNNING:
                log.debug("dropped %s: %d notifications running", note.method, MAX_NOTES_RUNNING)
                self.metrics.notifications_dropped += 1
                continue
            self.notes_running += 1
            self.shared.start(self._run_note, session.session_id, note)

    async def _run_note(self, session_id: str, note: Notification) -> None:
        try:
            with trio.move_on_after(NOTE_WAIT):
                for hook in self.app.notification_fns:
                    await hook(note.method, dict(note.params or {}), session_id)
        finally:
            self.notes_running -= 1

    # ---------------------------------------------------------------- the gate
    async def gate_effect(
        self, session: Session, effect: ClaimCall | WaitForCall | HoldCall
    ) -> object:
        """Perform one step of the core's gate loop for ``session``."""
        if isinstance(effect, HoldCall):
            session.calls[effect.key] = None  # an Event only once a duplicate waits
            return None
        if isinstance(effect, WaitForCall):
            await wait_for_claim(session.calls, effect.key, effect.until, effect.local)
            return None
        return await self._claim_call(session, effect)

    async def _claim_call(self, session: Session, effect: ClaimCall) -> tuple[CallStart, bool]:
        """Claim a call's key in the store: its answer, and whether the delivery that
        runs the call (if one does) is in this process."""
        claim, req = effect.claim, effect.request
        try:
            if self.store.shared:  # a claim another replica may have to interrupt
                start = await self._claim(session, req, claim.key, claim.fingerprint, effect.token)
            else:
                start = await self.store.begin_call(
                    session.record.principal,
                    session.session_id,
                    claim.key,
                    claim.fingerprint,
                    effect.token,
                )
        except SessionGone:
            await self.table.end_session(session)
            raise session_refusal(session.session_id, req.id) from None
        except RetentionFull:
            raise retention_full(self.config, req.id) from None
        except ChannelRejected as exc:
            raise_channel(exc.verdict, req.id)
            raise  # unreachable: raise_channel raises
        return start, claim.key in session.calls

    async def _claim(
        self, session: Session, req: Request, key: str, fp: bytes, token: tuple[int, str] | None
    ) -> CallStart:
        """``begin_call`` on a shared store, shielded from this process's cancellation.

        A cancellation landing while the claim is in flight would leave us not
        knowing whether the store granted it: a granted claim nobody releases holds
        every retry at 409 ``in_progress`` until its lease runs out.  So the round
        trip completes (bounded by the store's own timeout, and by 5 s here); a claim
        granted to a request that then never starts is given back by the caller.
        """
        principal, sid, claim = session.record.principal, session.session_id, secrets.token_hex(8)
        try:
            with trio.CancelScope(shield=True) as shield:
                shield.deadline = trio.current_time() + 5.0
                return await self.store.begin_call(
                    principal,
                    sid,
                    key,
                    fp,
                    token,
                    request_id=msgspec.json.encode(req.id),
                    owner=self.replica_id,
                    lease=self.config.claim_lease,
                    claim=claim,
                )
            raise StoreUnavailable("the store did not answer a claim within 5 s")
        except StoreUnavailable:
            # It may have applied: give back whatever this delivery was granted.
            self.shared.unheard.note(principal, sid, key, claim)
            raise

    # ---------------------------------------------------------------- JSON mode
    async def _post_json(
        self,
        conn: Connection,
        session: Session,
        plans: list[CallCourse],
        is_batch: bool,
        lane: Hashable,
    ) -> None:
        """Answer with one JSON body, which takes credit from what ``lane`` reserved."""
        headers = [("content-type", "application/json"), ("mcp-session-id", session.session_id)]
        try:
            if len(plans) == 1 and not is_batch and self.execution.runs_now(plans[0]):
                try:
                    body = await self.execution.answer_now(session, plans[0], None)
                finally:
                    session.done(1, lane, keep=True)
                framed = [frame_json(conn, session, headers, body)]
                del body  # (only the framed copy waits on a stalled peer)
                await send_framed(conn, session, framed, lane)
                return

            async def feed(run: Callable[[int, CallCourse], Awaitable[None]]) -> None:
                async with trio.open_nursery() as n:
                    for i, plan in enumerate(plans):
                        n.start_soon(run, i, plan)

            bodies = await self._collect_json(session, len(plans), feed, lane)
            plans.clear()  # the requests (and their arguments) are done with
            await answer_json(conn, session, bodies, is_batch, lane)
        finally:
            session.settle(lane)  # (a body that took its credit settled it already)

    async def _collect_json(
        self,
        session: Session,
        n: int,
        feed: Callable[[Callable[[int, CallCourse], Awaitable[None]]], Awaitable[None]],
        lane: Hashable,
    ) -> list[bytes]:
        """Run ``n`` requests in the handler nursery, and their responses, in order.

        ``feed(run)`` calls ``run(i, plan)`` for each request (at once, or as each is
        admitted).  Handlers run in the server's nursery, not the connection's: a
        dropped connection is not a cancellation.  Cancelled calls have no response.
        Their reservations in ``lane`` stay for the one body (the caller settles it).
        """
        results: list[bytes | None] = [None] * n
        finished = trio.Event()

        async def run(i: int, plan: CallCourse) -> None:
            try:
                results[i] = await self.execution.execute(session, plan, None)
            finally:
                session.done(1, lane, keep=True)

        async def all_of_them() -> None:
            try:
                await feed(run)
            finally:
                finished.set()

        handlers = self.shared.handlers
        assert handlers is not None
        handlers.start_soon(all_of_them)
        await finished.wait()
        return [r for r in results if r is not None]

    # ---------------------------------------------------------------- initialize and rebind
    async def _initialize(self, conn: Connection, post: PostMessages, who: Requester) -> None:
        """Carry out an ``initialize``'s :class:`~weir.protocol.lifecycle.InitializeCourse`
        (its clock is unused: it has no deadline)."""
        req = post.messages[0]
        assert isinstance(req, Request)
        course = InitializeCourse(req)
        effect = course.start(0.0)
        session: Session | None = None
        while effect is not None:
            try:
                if isinstance(effect, OpenSession):
                    asked = effect.asked
                    client = client_record(asked.capabilities, asked.client_info)
                    session = await self.table.new_session(
                        asked.version, who.principal, effect.request_id, client=client
                    )
                    session.caller = Caller(asked.capabilities, asked.client_info)
                    answer: object = (session.session_id, session.record.channel_token)
                elif isinstance(effect, AnswerInitialize):
                    assert session is not None
                    body = encode_result(effect.request_id, self.initialize_result(session))
                    await conn.send(conn.http.send_response(200, effect.headers, body))
                    answer = None
                else:  # nobody learnt the id, so nobody can use the session
                    assert isinstance(effect, ForgetSession) and session is not None
                    with trio.CancelScope(shield=True):
                        await self.table.end_session(session)
                    answer = None
            except BaseException as exc:
                effect = course.fail(exc, 0.0)
            else:
                effect = course.deliver(answer, 0.0)

    async def initialize_session(
        self, req: Request, session: Session | None, principal: str
    ) -> Session:
        asked = parse_initialize(req)
        if session is None:
            client = client_record(asked.capabilities, asked.client_info)
            session = await self.table.new_session(asked.version, principal, req.id, client=client)
        session.caller = Caller(asked.capabilities, asked.client_info)
        return session

    def initialize_result(self, session: Session) -> dict[str, Any]:
        rebind = {REBIND_METHOD: {"header": "Mcp-Channel-Token"}}
        return initialize_result_for(self.app, session.record.protocol_version, experimental=rebind)

    async def _rebind(self, conn: Connection, session: Session, req: Request) -> None:
        """The explicit rebind handshake (fencing): new generation, new token, past results."""
        secret = secrets.token_urlsafe(16)
        try:
            record = await self.store.rebind(session.record.principal, session.session_id, secret)
        except SessionGone:
            await self.table.end_session(session)
            raise session_refusal(session.session_id, req.id) from None
        session.record = record
        # Streams of older generations are never inherited: end them now.
        for h in list(session.handles.values()):
            if fenced(h.generation, record.generation) and h.log.state is not StreamState.CLOSED:
                h.handle(StreamInput.ABORT)
        if isinstance(self.store, MemoryStore):
            kept = self.store.recent_results(session.record.principal, session.session_id, 100)
        else:
            kept = list(session.finished.values())
        results = [msgspec.json.decode(p) for p in kept]
        body = encode_result(
            req.id,
            {
                "generation": record.generation,
                "channelToken": record.channel_token,
                "results": results,
            },
        )
        headers = [
            ("content-type", "application/json"),
            ("mcp-session-id", session.session_id),
            ("mcp-channel-token", record.channel_token),
        ]
        await conn.send(conn.http.send_response(200, headers, body))
