"""The sessionless era (MCP 2026-07-28) on the Trio engine: one POST, one answer.

Theory of operation
-------------------
A request of this era carries its client's version, capabilities, info and log
level itself (checked by the core's :func:`~weir.protocol.route`), so nothing is
looked up and nothing outlives the response.  The order of a request's decisions
is the core's :class:`~weir.protocol.sessionless_post.SessionlessCourse` (and its
handler run's, :class:`~weir.protocol.sessionless_run.SessionlessRun`): this module
performs the effects they ask for, and decides nothing about their order.


* **Credit** still bounds what a client can make the server hold.  Every response
  takes the credit of its request's owner (:mod:`engine._owners`): the principal's
  when requests are authorized, else the connection's -- looked up from the
  request's own :class:`~engine._requester.Requester`, never from the connection, so
  a gateway's connection that carries Alice's request and then Bob's gives Bob Bob's
  owner.  An owner whose peer stops reading is refused 429 ``stream_half_open``
  before anything runs, and torn down after the liveness timeout.
* **Closing the response is cancellation** -- unless the call carries an
  ``Idempotency-Key``.  A streamed answer's handler runs in the handler nursery while
  the connection's task writes its stream; if the client goes away first, the handler
  is cancelled.  A keyed call is the exception: its client has said it will issue
  the call again under the same key if the answer is lost, so the call runs to its
  end (what it would have streamed goes nowhere), its outcome is recorded, and the
  re-issued call replays it instead of finding a half-run call whose effects nobody
  knows.  Nothing is resumable in this era, so frames carry no event ids.
* **Input-required results.**  A handler that asks the client for something
  (``ctx.elicit``, ``ctx.sample``, ``ctx.list_roots``, ``ctx.input``) gets the
  answer if the request carries it (``inputResponses``, and the earlier rounds'
  answers sealed in ``requestState``, :mod:`weir.common`); otherwise the answer
  is ``resultType: "input_required"`` with the asks and a new sealed state, and the
  client's next round runs the handler again.  A state that does not open -- forged,
  tampered with, expired, or another request's -- is 400, -32602
  ``request_state_invalid``.  A state is bound to the principal of the request that
  got it (and whether a token vouched for it), the method and its arguments; not to
  the connection, since clients (the official SDK's among them) send the next round
  on whichever connection and replica they have.  Without authorization every
  client is the one principal, and nothing an anonymous client could present tells
  it from another: a state is then a bearer capability, as secret as the response
  that carried it (sealed, so unreadable and unforgeable, and short-lived).  Where
  clients must not be able to continue each other's rounds, turn authorization on.
* **Refusals before the head.**  A streamed answer's head is held back until the
  handler's first message or its end (at most :data:`FIRST_OUTPUT_WAIT`), so that
  a refusal such as -32021 (a capability the request did not declare) is still a
  400 with a JSON body.
* **Results** get ``resultType``, the server's identity under ``_meta`` and, for
  cacheable methods, ``ttlMs`` and ``cacheScope`` (:func:`complete`).  A method this
  era does not have (``initialize``, ``ping``, ``logging/setLevel``,
  ``resources/subscribe``, anything unknown) is 404 with -32601; an unknown
  resource is -32602 (with ``data.uri``), as this revision numbers it.

``subscriptions/listen`` and the change bus are :mod:`engine._changes`'s; :class:`Sessionless`
performs the courses, with the credit owners (:class:`~._owners.Owners`), the
keyed gate (:class:`~._keyed.KeyedCalls`) and execution's size limit.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Final

import trio

from weir.app import (
    BecomeTask,
    Context,
    InputRequired,
    McpError,
    dispatch,
    failure,
)
from weir.common import (
    caller_for,
    discover_for,
    handler_error,
    request_meta,
    runs_inline,
    server_identity,
    sessionless_inline,
)
from weir.protocol import (
    Reason,
    RemoteProtocolError,
)
from weir.protocol.course import GATE_STEPS
from weir.protocol.jsonrpc import (
    Request,
    encode_result,
    error_body,
)
from weir.protocol.post import (
    ACCEPTED,
    ATTACH_WRITER,
    AdmitRequests,
    Finished,
    GiveBack,
)
from weir.protocol.sessionless import (
    SESSIONLESS_VERSIONS,
    SessionlessMessage,
    complete,
)
from weir.protocol.sessionless_post import (
    ANSWER_DISCOVER,
    CHOOSE_OWNER,
    AnswerReplay,
    Listen,
    OpenAnswerStream,
    OpenRequestState,
    RespondJson,
    RunOnStream,
    ServeTask,
    SessionlessCourse,
    SessionlessEffect,
    SessionlessRules,
    ToolSchema,
    ToolTasking,
)
from weir.protocol.sessionless_run import (
    RUN_HANDLER,
    EncodeResult,
    InputAsked,
    RecordOutcome,
    Respond,
    SealState,
    SessionlessRun,
)
from weir.protocol.states import StreamInput, StreamState

from ._auth import REQUEST_ACCESS
from ._changes import Changes
from ._connection import Connection
from ._context import SessionlessBackend
from ._execution import Execution
from ._json_reply import frame_json, send_framed, send_json
from ._keyed import KeyedCalls
from ._owners import Owners, open_answer_stream
from ._requester import Requester
from ._session import Session, SessionClosed, StreamHandle, StreamLost
from ._shared import Shared, log, store_unavailable
from ._store_errors import StoreUnavailable
from ._tasks import Tasks
from ._writer import SSE_HEADERS, PeerGone, write_stream

#: The revision this module serves.
VERSION: Final = SESSIONLESS_VERSIONS[-1]
#: Seconds a streamed answer's head waits for the handler's first message.
FIRST_OUTPUT_WAIT: Final = 1.0


class Sessionless:
    """Requests of the sessionless era (see the module docstring).

    Guarantees: a request performs exactly the effects its course asks for, in its
    order; its responses take its owner's credit; an unkeyed call's handler ends
    with its response; a keyed call's outcome is recorded before it is answered.
    """

    def __init__(
        self,
        shared: Shared,
        owners: Owners,
        keyed: KeyedCalls,
        changes: Changes,
        execution: Execution,
        tasks: Tasks,
    ) -> None:
        self.shared = shared
        self.app = shared.app
        self.config = shared.config
        self.metrics = shared.metrics
        self.owners = owners
        self.keyed = keyed
        self.changes = changes
        self.execution = execution
        self.tasks = tasks
        cfg = shared.config
        #: The courses' rules (the app's fallback is read again per request).
        self.rules = SessionlessRules(
            json_response=cfg.json_response,
            retry_window=cfg.retry_window,
            in_progress_wait=cfg.in_progress_wait,
            retry_ms=cfg.retry_ms,
            tasks=True,
        )
        #: An app's described ``serverInfo``, read once (the stamp on every result).
        self.described_info: dict[str, Any] | None = None

    async def post(self, conn: Connection, msg: SessionlessMessage, who: Requester) -> None:
        """Carry out a request's :class:`~weir.protocol.sessionless_post.SessionlessCourse`:
        the core decides the order, this performs each effect it asks for."""
        rules = self._rules()
        wall = time.time() if rules.retry_window > 0 else 0.0  # (only the window reads it)
        course = SessionlessCourse(msg, who.principal, who.authorized, rules, wall=wall)
        del msg  # (the course's: it lets go of the params once the handler has them)
        clock = trio.lowlevel.current_clock().current_time  # (one call per reading)
        now = clock()  # read again only after a step that may wait (the gate's deadlines)
        effect = course.start(now)
        owner: Session | None = None
        answering: _Answering | None = None
        try:
            while effect is not None:
                try:
                    answer: object = None
                    if owner is None:  # (the steps before the owner is chosen)
                        if effect is CHOOSE_OWNER:
                            owner = self.owners.owner(conn, who)
                        else:
                            answer = await self._before_owner(conn, course.msg, effect)
                    elif isinstance(effect, AdmitRequests):
                        try:  # 429 once this connection's peer stopped reading
                            await owner.admit(effect.n, effect.request_id, effect.lane)
                        except SessionClosed:
                            raise PeerGone from None
                        self.metrics.admissions += effect.n
                        now = clock()
                    elif isinstance(effect, RespondJson):
                        self._count_execution(effect.run)
                        await self._respond_json(conn, owner, course.msg, who, effect)
                    elif isinstance(effect, GATE_STEPS):
                        answer = await self.keyed.effect(who.principal, effect)
                        now = clock()
                    elif isinstance(effect, OpenAnswerStream):
                        handle = open_answer_stream(owner, self.config.max_stream_events)
                        owner.move_reservations(effect.lane, handle.log.epoch)
                        answering = _Answering(handle)
                    elif isinstance(effect, RunOnStream):
                        assert answering is not None
                        self._count_execution(effect.run)
                        await self._run_on_stream(owner, course.msg, who, effect.run, answering)
                    elif effect is ATTACH_WRITER:
                        assert answering is not None
                        ka, handle = self.config.sse_keepalive, answering.handle
                        await write_stream(conn, owner, handle, 0, SSE_HEADERS, keepalive=ka)
                    else:
                        await self._sessionless_effect(conn, owner, who, effect)
                except BaseException as exc:
                    effect = course.fail(exc, clock())
                else:
                    effect = course.deliver(answer, now)
        except RemoteProtocolError as exc:
            if exc.reason is Reason.IN_PROGRESS:
                self.metrics.duplicates_in_progress += 1
            raise
        finally:
            if answering is not None:
                assert owner is not None
                _end(owner, answering)

    def _rules(self) -> SessionlessRules:
        """The course's rules: the server's, and whether the app has a fallback (an
        app may register one after the server was made)."""
        rules, app = self.rules, self.app
        fallback = app.fallback_fn is not None
        if rules.fallback != fallback or rules.fallback_every_method != app.fallback_every_method:
            rules = dataclasses.replace(
                rules, fallback=fallback, fallback_every_method=app.fallback_every_method
            )
            self.rules = rules
        return rules

    async def _before_owner(
        self, conn: Connection, msg: SessionlessMessage, effect: SessionlessEffect
    ) -> object:
        """Perform one of the steps before the credit owner is chosen; its answer."""
        if isinstance(effect, ToolSchema):
            return self.app.input_schema(effect.name)
        if isinstance(effect, ToolTasking):
            return self.app.tasking(effect.name)
        if isinstance(effect, OpenRequestState):
            return self.shared.sealer.open(effect.state)
        if effect is ACCEPTED:
            await conn.send(conn.http.send_response(202, ()))
        elif effect is ANSWER_DISCOVER:
            req = msg.message
            assert isinstance(req, Request)
            found = encode_result(req.id, self._discover())
            await conn.send(conn.http.send_response(200, _JSON, found))
        else:
            raise AssertionError(f"a sessionless course asked for {effect!r} out of turn")
        return None

    async def _sessionless_effect(
        self, conn: Connection, owner: Session, who: Requester, effect: SessionlessEffect
    ) -> None:
        """Perform one of a sessionless course's less frequent effects."""
        if isinstance(effect, Finished):
            owner.done(effect.n, effect.lane)
        elif isinstance(effect, GiveBack):
            await self.keyed.record(who.principal, effect.key, None)
        elif isinstance(effect, AnswerReplay):
            self.metrics.duplicates_replayed += 1
            await send_json(conn, owner, list(_JSON), effect.payload)
        elif isinstance(effect, Listen):
            await self.changes.listen(
                conn,
                owner,
                effect.request,
                effect.lane,
                who.principal,
                self.tasks.owned,
                effect.tasks_declared,
            )
        elif isinstance(effect, ServeTask):
            req = effect.request
            answer = await self.tasks.serve(who.principal, req, REQUEST_ACCESS.get())
            body = encode_result(req.id, complete(req.method, answer, self._server_info()))
            await send_json(conn, owner, list(_JSON), body)
        else:
            raise AssertionError(f"a sessionless course asked for {effect!r} out of turn")

    def _count_execution(self, run: SessionlessRun) -> None:
        if run.request.method == "tools/call":
            self.metrics.executions += 1  # (a replay never gets here: AnswerReplay)

    async def _respond_json(
        self,
        conn: Connection,
        owner: Session,
        msg: SessionlessMessage,
        who: Requester,
        effect: RespondJson,
    ) -> None:
        """Run the handler here and answer with one JSON body."""
        lane = effect.lane
        try:
            try:
                backend = SessionlessBackend(owner, None, caller_for(msg))
                run = effect.run
                body = await self._drive_run(
                    owner, who, run, None, backend, inline=self._runs_now(run)
                )
            finally:
                owner.done(1, lane, keep=True)  # the reservation is the body's
            if body is None:
                raise PeerGone  # cancelled with the server going away: nothing to answer
            framed = [frame_json(conn, owner, list(_JSON), body)]
            del body  # (only the framed copy waits on a stalled peer)
            await send_framed(conn, owner, framed, lane)
        finally:
            owner.settle(lane)

    async def _run_on_stream(
        self,
        owner: Session,
        msg: SessionlessMessage,
        who: Requester,
        run: SessionlessRun,
        answering: _Answering,
    ) -> None:
        """Start the handler on the answer's stream; return once it has output (or
        after :data:`FIRST_OUTPUT_WAIT`), raising its refusal if it was refused first.
        The handler is cancelled if the client goes away (:func:`_end`)."""
        handle = answering.handle
        if self._runs_now(run):
            await self._run_now(owner, msg, who, run, answering)
            return
        first = trio.Event()
        backend = answering.backend = SessionlessBackend(
            owner, handle, caller_for(msg), on_output=first.set
        )

        async def run_it() -> None:
            try:
                try:
                    body = await self._drive_run(owner, who, run, handle, backend)
                except (RemoteProtocolError, StoreUnavailable) as failed:
                    exc = failed
                    if isinstance(exc, StoreUnavailable):  # (e.g. a task's record not written)
                        log.warning("store unavailable: %s", exc)
                        exc = store_unavailable(self.config, msg.request_id)
                    if not answering.started:
                        answering.refused.append(exc)  # answered as this POST's status
                        return
                    body = error_body(exc)  # the stream's final event: the call is answered
                first.set()
                await handle.respond(body.decode() if body is not None else None)
            except StreamLost:
                pass
            finally:
                first.set()
                owner.done(1, handle.log.epoch)

        self.shared.start(run_it)
        with trio.move_on_after(FIRST_OUTPUT_WAIT):
            await first.wait()
        if answering.refused:
            raise answering.refused[0]
        answering.started = True

    def _runs_now(self, run: SessionlessRun) -> bool:
        """Can ``run``'s handler run in the connection's task (:func:`weir.common.runs_inline`)?
        Not a keyed run (or one that may become a task) on a shared store: what it
        records waits on the network."""
        records = run.call is not None or run.task is not None
        return runs_inline(self.app, self.shared.store.shared and records, run.request)

    async def _run_now(
        self,
        owner: Session,
        msg: SessionlessMessage,
        who: Requester,
        run: SessionlessRun,
        answering: _Answering,
    ) -> None:
        """:meth:`_run_on_stream` for a run :meth:`_runs_now` accepts: the whole run
        here, its answer put into the stream at once when credit allows (so the
        writer sends head, frame and end in one write), else by a task that waits
        for the credit.  A refusal raises before anything was sent, as the POST's
        status."""
        handle = answering.handle
        backend = answering.backend = SessionlessBackend(owner, handle, caller_for(msg))
        try:
            body = await self._drive_run(owner, who, run, handle, backend, inline=True)
        except BaseException:
            owner.done(1, handle.log.epoch)
            raise
        answering.started = True
        text = body.decode() if body is not None else None
        if text is not None and handle.try_respond_now(text):
            owner.done(1, handle.log.epoch)
            return
        self.metrics.inline_deferred["plain"] += 1

        async def respond() -> None:
            try:
                await handle.respond(text)
            except StreamLost:
                pass
            finally:
                owner.done(1, handle.log.epoch)

        self.shared.start(respond)

    # ---------------------------------------------------------------- one run
    async def _drive_run(
        self,
        owner: Session,
        who: Requester,
        run: SessionlessRun,
        handle: StreamHandle | None,
        backend: SessionlessBackend,
        *,
        inline: bool = False,
    ) -> bytes | None:
        """Carry out a :class:`~weir.protocol.sessionless_run.SessionlessRun`: run the
        handler (``inline``: in this task, see :meth:`_runs_now`), seal, encode and
        record as it asks; the body it responds with."""
        backend.detached = run.detached  # a keyed call is not cancelled with its response
        body: bytes | None = None
        now = run.now  # (a run reads no clock: it records and responds in order)
        effect = run.start(now)
        while effect is not None:
            try:
                answer: object = None
                if effect is RUN_HANDLER:
                    answer = await self._run_handler(owner, run, backend, inline)
                elif isinstance(effect, EncodeResult):
                    answer = self._encode_result(run.request, effect.result, handle)
                elif isinstance(effect, SealState):
                    answer = self.shared.sealer.seal(dict(effect.claims))
                elif isinstance(effect, RecordOutcome):
                    await self.keyed.record(who.principal, effect.key, effect.payload)
                elif isinstance(effect, GiveBack):
                    await self.keyed.record(who.principal, effect.key, None)
                else:
                    assert isinstance(effect, Respond)
                    body = effect.body
            except BaseException as exc:
                effect = run.fail(exc, now)
            else:
                effect = run.deliver(answer, now)
        return body

    async def _run_handler(
        self, owner: Session, run: SessionlessRun, backend: SessionlessBackend, inline: bool
    ) -> object:
        """Run one request's handler: its result, :class:`InputAsked`, an error body,
        or None if cancelled.

        Raises:
            RemoteProtocolError: 404 -32601 for a method an app's fallback does not
                serve; 400, -32021 when the handler needs a capability the request
                did not declare.
        """
        req = run.request
        ctx = Context(
            backend,
            req.id,
            request_meta(req),
            state=self.shared.state,
            inputs=run.inputs,
            access_token=REQUEST_ACCESS.get(),
        )
        task = run.task
        if task is not None and task.upfront:  # the call is a task: create it, answer
            return await self.tasks.create(run.principal, req, ctx.access_token)
        ctx.tasks_possible = task is not None
        if inline:
            return sessionless_inline(self.app, self.metrics, req, ctx)
        with trio.CancelScope() as scope:
            if not backend.detached:  # a keyed call is not cancelled with its response
                owner.running[backend.run_key] = scope
            try:
                try:
                    handler = dispatch(self.app, req, ctx)
                    return await self.metrics.timed(
                        req.method, req.params, handler, pending=(InputRequired,)
                    )
                except InputRequired as asked:
                    return InputAsked(asked.requests, ctx.answered)
                except BecomeTask as escalated:  # the rounds are done: on as a task
                    access = ctx.access_token
                    return await self.tasks.create(run.principal, req, access, escalated.answered)
            except StreamLost:
                return None
            except McpError as exc:
                return handler_error(req, exc)
            except Exception as exc:
                return failure(req, exc)
            finally:
                owner.running.pop(backend.run_key, None)
        return None

    def _encode_result(
        self, req: Request, result: dict[str, Any], handle: StreamHandle | None
    ) -> bytes:
        """A result stamped with this era's fields, encoded within the size limit."""
        try:
            decorated = complete(req.method, result, self._server_info())
            return self.execution.fit(req, encode_result(req.id, decorated), handle)
        except Exception as exc:
            return failure(req, exc)

    # ---------------------------------------------------------------- results
    def _discover(self) -> dict[str, Any]:
        tasks = any(self.app.tasking(name) is not None for name in self.app.tools)
        return discover_for(self.app, self._server_info(), tasks=tasks)

    def _server_info(self) -> dict[str, Any]:
        """The identity stamped on every result (asked once: an identity does not
        change)."""
        if self.app.describe_fn is None:
            return server_identity(self.app)
        if self.described_info is None:
            self.described_info = server_identity(self.app)
        return self.described_info


_JSON: Final = (("content-type", "application/json"),)


class _Answering:
    """A streamed answer under way: its stream, its handler's backend, and whether
    the head went out (a refusal after that is the stream's last frame)."""

    __slots__ = ("backend", "handle", "refused", "started")

    def __init__(self, handle: StreamHandle) -> None:
        self.handle = handle
        self.backend: SessionlessBackend | None = None
        self.refused: list[RemoteProtocolError] = []
        self.started = False


def _end(owner: Session, answering: _Answering) -> None:
    """Closing the response is cancellation in this era: nothing is resumed.  (Of
    this request's handler: another client of the principal may use the same id.)"""
    backend, handle = answering.backend, answering.handle
    scope = owner.running.get(backend.run_key) if backend is not None else None
    if scope is not None:
        scope.cancel()
    if handle.log.state is not StreamState.CLOSED:
        handle.handle(StreamInput.ABORT)
