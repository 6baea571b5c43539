"""The sessionless era (MCP 2026-07-28) on the asyncio runtime: one POST, one answer.

Theory of operation
-------------------
The order of a request's decisions is the core's
:class:`~weir.protocol.sessionless_post.SessionlessCourse` (and its handler run's,
:class:`~weir.protocol.sessionless_run.SessionlessRun`), as on the Trio engine; this
module performs each effect they ask for and decides nothing about their order.
What the answers say (``server/discover``, capabilities, an app's errors, listen
frames, sealed request state) is :mod:`weir.common`'s, shared with the Trio engine.

* **Who.**  Each request speaks for its own principal (:class:`~._auth.Who`, from
  its own token, or ``anonymous``): its request state is bound to it and its
  ``Idempotency-Key`` lives in its namespace.
* **Credit owner.**  A request's answer takes the credit of its owner, a private
  :class:`~._session.Session` (never in the session table), as on the Trio engine:
  an authorized principal's, shared by every connection that carried its requests
  (:class:`~._owners.SharedOwners`: a principal that stalls one is refused on the others, and
  nobody else is), or for anonymous requests their *connection's* (anonymous
  clients are told apart only by their connections).  A connection holds at most
  :data:`MAX_OWNERS`, the least recently used given back first.  A peer that stops
  reading is refused 429 ``stream_half_open`` before anything runs, and its owner is
  torn down after the liveness timeout, closing the connections writing its
  streams (an anonymous owner's: its connection); a connection's own owner ends
  with it, a shared one with the last connection holding it.
* **Closing the response is cancellation** -- unless the call carries an
  ``Idempotency-Key``: such a call runs to its end as a task of the runtime, not of
  the owner, its outcome is recorded, and the re-issued call replays it.  The gate's
  records live in the principal's namespace of the driver's session store
  (:class:`~._keyed.KeyedCalls`; shared with the other replicas, Trio or asyncio, when the
  store is).
* **Input-required results**: answers carried in ``inputResponses`` and in the
  sealed ``requestState`` (:class:`weir.common.StateSealer`; its keys are the
  runtime's, ``--state-key-file``/``$WEIR_STATE_KEYS``, or one drawn at start).
* **Refusals before the head.**  A streamed answer's head waits for the handler's
  first message or its end (at most :data:`FIRST_OUTPUT_WAIT`), so -32021 is still
  a 400 with a JSON body.
* **``subscriptions/listen``**: acknowledged at once, then fed the changes it asked
  for (:meth:`AsyncioDriver.changed`), within its owner's credit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final

from weir.app import (
    BecomeTask,
    Caller,
    Context,
    InputRequired,
    McpError,
    dispatch,
    failure,
)
from weir.common import (
    REQUEST_ACCESS,
    VERSION,
    caller_for,
    discover_for,
    handler_error,
    request_meta,
    runs_inline,
    sessionless_inline,
)
from weir.engine._store_errors import StoreUnavailable
from weir.protocol import RemoteProtocolError
from weir.protocol.course import GATE_STEPS
from weir.protocol.jsonrpc import ErrorResponse, Request, RequestId, Response, encode_result
from weir.protocol.jsonrpc import error_body as encode_refusal
from weir.protocol.post import (
    ACCEPTED,
    ATTACH_WRITER,
    AdmitRequests,
    Finished,
    GiveBack,
)
from weir.protocol.sessionless import SessionlessMessage, complete
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
from weir.protocol.streams import StreamKind, StreamLog

from ._auth import Who
from ._calls import _fit
from ._listen import serve_listen
from ._owners import new_owner
from ._session import Gone, Session
from ._shared import store_unavailable

if TYPE_CHECKING:
    from ._connection import Connection
    from ._driver import AsyncioDriver

log = logging.getLogger("weir.asyncio")
#: Seconds a streamed answer's head waits for the handler's first message.
FIRST_OUTPUT_WAIT: Final = 1.0
#: The most credit owners one connection holds at once (a gateway's carries many
#: principals).
MAX_OWNERS: Final = 16
_JSON: Final = (("content-type", "application/json"),)


class SessionlessBackend:
    """:class:`weir.app.ContextBackend` for one sessionless call: its owner's credit,
    its stream (None: a JSON answer), and the caller its request describes."""

    __slots__ = ("_caller", "_driver", "_on_output", "_owner", "_stream", "detached")

    def __init__(
        self,
        owner: Session,
        stream: StreamLog | None,
        caller: Caller,
        driver: AsyncioDriver,
        on_output: Callable[[], object] | None = None,
    ) -> None:
        self._owner, self._stream, self._caller = owner, stream, caller
        self._driver, self._on_output = driver, on_output
        #: A keyed call outlives its response: once the stream is gone, its messages
        #: go nowhere instead of ending the handler.
        self.detached = False

    @property
    def session_id(self) -> None:
        return None

    @property
    def caller(self) -> Caller:
        return self._caller

    @property
    def protocol_version(self) -> str:
        return self._caller.protocol_version or VERSION

    async def send(self, payload: bytes) -> None:
        if self._on_output is not None:
            self._on_output()
        if self._stream is None:
            return
        try:
            await self._owner.append(self._stream, payload.decode())
        except Gone:
            if not self.detached:
                raise

    async def request(
        self, method: str, params: dict[str, Any] | None, timeout: float
    ) -> Response | ErrorResponse | None:
        raise McpError(-32603, f"cannot send {method}: this revision has no server requests")

    def close_stream(self, retry_ms: int) -> None:
        return None  # nothing is resumable on this era: the stream stays open

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def changed(self, method: str, uri: str | None) -> None:
        self._driver.changed(method, uri)

    def cancel_requested(self, request_id: RequestId) -> bool:
        task = asyncio.current_task()
        return self._owner.closed or (task is not None and task.cancelling() > 0)

    def session_channel(self) -> None:
        return None  # no session on this era


class _Answering:
    """A streamed answer under way: its stream, its run's task, and whether the head
    went out (a refusal after that is the stream's last frame)."""

    __slots__ = ("detached", "refused", "started", "stream", "task")

    def __init__(self, stream: StreamLog) -> None:
        self.stream = stream
        self.detached = False
        self.task: asyncio.Task[None] | None = None
        self.refused: list[RemoteProtocolError] = []
        self.started = False


class SessionlessPosts:
    """The sessionless requests of one connection, and the credit owners they use:
    its own for anonymous requests, each authorized principal's shared one (at most
    :data:`MAX_OWNERS` held, the least recently used given back first)."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.driver = conn, conn.driver
        #: The owners this connection holds, by (principal, authorized), oldest first.
        self.owners: dict[tuple[str, bool], Session] = {}

    def close(self) -> None:
        """The connection is gone: it gives back every owner it holds (its own ends:
        its handlers are cancelled; a keyed call is the runtime's, and runs on)."""
        held, self.owners = self.owners, {}
        for owner in held.values():
            self._give_back(owner)

    def _give_back(self, owner: Session) -> None:
        if owner.carrier is None:  # a principal's, shared
            self.driver.shared_owners.give_back(self.driver, owner)
            return
        owner.carrier = None  # (the connection is ending already, or lets it go)
        owner.close()
        self.driver.owners.discard(owner)

    def _owner(self, who: Who) -> Session:
        """The credit owner of ``who``'s request on this connection (see the module
        docstring)."""
        scope = (who.principal, who.authorized)
        held = self.owners.pop(scope, None)
        if held is not None and not held.closed:
            self.owners[scope] = held  # (now the most recently used)
            return held
        if held is not None:  # torn down after the liveness timeout
            self._give_back(held)
        if who.authorized:
            owner = self.driver.shared_owners.take(self.driver, who.principal)
        else:
            owner = new_owner(self.driver, who.principal)
            owner.carrier = asyncio.current_task()  # (the connection's: it ends with it)
        self.owners[scope] = owner
        while len(self.owners) > MAX_OWNERS:
            self._give_back(self.owners.pop(next(iter(self.owners))))
        return owner

    async def serve(self, msg: SessionlessMessage, who: Who) -> None:
        """Carry out the request's :class:`SessionlessCourse` for ``who`` (the
        request's own identity): the core decides the order, this performs each
        effect it asks for."""
        driver, principal = self.driver, who.principal
        course = SessionlessCourse(
            msg, principal, who.authorized, driver.sessionless(), wall=time.time()
        )
        clock = asyncio.get_running_loop().time
        effect = course.start(clock())
        owner: Session | None = None
        answering: _Answering | None = None
        try:
            while effect is not None:
                try:
                    answer: object = None
                    if owner is None:  # (the steps before the owner is chosen)
                        if effect is CHOOSE_OWNER:
                            owner = self._owner(who)
                        else:
                            answer = await self._before_owner(msg, effect)
                    elif isinstance(effect, AdmitRequests):
                        try:  # 429 once this connection's peer stopped reading
                            await owner.admit(effect.n, effect.request_id, effect.lane)
                        except Gone:
                            raise ConnectionResetError from None
                        driver.metrics.admissions += effect.n
                    elif isinstance(effect, GATE_STEPS):
                        answer = await driver.keyed.step(principal, effect)
                    elif isinstance(effect, RespondJson):
                        _count_execution(driver, effect.run)
                        await self._respond_json(owner, msg, effect, principal)
                    elif isinstance(effect, OpenAnswerStream):
                        stream = owner.open_stream(StreamKind.REQUEST, emit_ids=False)
                        owner.flow.move(effect.lane, stream.epoch)
                        answering = _Answering(stream)
                    elif isinstance(effect, RunOnStream):
                        assert answering is not None
                        _count_execution(driver, effect.run)
                        await self._run_on_stream(owner, msg, effect.run, answering, principal)
                    elif effect is ATTACH_WRITER:
                        assert answering is not None
                        await self.conn.write_stream(owner, answering.stream, 0)
                    else:
                        await self._effect(owner, effect, principal)
                except BaseException as exc:
                    effect = course.fail(exc, clock())
                else:
                    effect = course.deliver(answer, clock())
        finally:
            if answering is not None:
                _end(answering)

    async def _before_owner(self, msg: SessionlessMessage, effect: SessionlessEffect) -> object:
        """Perform one of the steps before the credit owner is chosen; its answer."""
        conn, driver = self.conn, self.driver
        if isinstance(effect, ToolSchema):
            return driver.app.input_schema(effect.name)
        if isinstance(effect, ToolTasking):
            return driver.app.tasking(effect.name)
        if isinstance(effect, OpenRequestState):
            return (await driver.request_sealer()).open(effect.state)
        if effect is ACCEPTED:
            await conn.send(conn.conn.send_response(202, ()))
        elif effect is ANSWER_DISCOVER:
            req = msg.message
            assert isinstance(req, Request)
            tasks = any(driver.app.tasking(name) is not None for name in driver.app.tools)
            found = encode_result(req.id, discover_for(driver.app, driver.identity(), tasks=tasks))
            await conn.send(conn.conn.send_response(200, _JSON, found))
        else:
            raise AssertionError(f"a sessionless course asked for {effect!r} out of turn")
        return None

    async def _effect(self, owner: Session, effect: SessionlessEffect, principal: str) -> None:
        """Perform one of a sessionless course's less frequent effects."""
        if isinstance(effect, Finished):
            for _ in range(effect.n):
                owner.done(effect.lane)
        elif isinstance(effect, GiveBack):
            await self.driver.keyed.record(principal, effect.key, None)
        elif isinstance(effect, AnswerReplay):
            self.driver.metrics.duplicates_replayed += 1
            await self._send_json(owner, [effect.payload], None)
        elif isinstance(effect, Listen):
            await serve_listen(self.driver, self.conn, owner, effect, principal)
        elif isinstance(effect, ServeTask):
            req = effect.request
            answer = await self.driver.tasks.serve(principal, req, REQUEST_ACCESS.get())
            body = [encode_result(req.id, complete(req.method, answer, self.driver.identity()))]
            await self._send_json(owner, body, None)
        else:
            raise AssertionError(f"a sessionless course asked for {effect!r} out of turn")

    async def _send_json(self, owner: Session, body: list[bytes], lane: Hashable | None) -> None:
        """One JSON body (taken over from ``body``), holding the owner's credit until
        the peer acknowledges it."""
        try:
            await owner.take_credit(len(body[0]), lane)
        except Gone:
            body.clear()
            raise ConnectionResetError from None
        finally:
            if lane is not None:
                owner.done(lane)  # the body holds credit of its own now
        await self.conn.send_answer(owner, list(_JSON), body)

    async def _respond_json(
        self, owner: Session, msg: SessionlessMessage, effect: RespondJson, principal: str
    ) -> None:
        """Run the handler here and answer with one JSON body."""
        backend = SessionlessBackend(owner, None, caller_for(msg), self.driver)
        try:
            run = effect.run
            inline = self._runs_now(run)
            body = await self._drive_run(owner, run, None, backend, principal, inline=inline)
        except BaseException:
            owner.done(effect.lane)
            raise
        if body is None:
            owner.done(effect.lane)
            raise ConnectionResetError  # cancelled with the server going away
        answer = [body]
        del body  # (only the transport's buffer waits on a stalled peer)
        await self._send_json(owner, answer, effect.lane)

    async def _run_on_stream(
        self,
        owner: Session,
        msg: SessionlessMessage,
        run: SessionlessRun,
        answering: _Answering,
        principal: str,
    ) -> None:
        """Start the handler on the answer's stream; return once it has output (or
        after :data:`FIRST_OUTPUT_WAIT`), raising its refusal if it was refused first.
        The handler is cancelled if the client goes away (:func:`_end`), unless the
        call is keyed: then it is the runtime's task, and runs to its end."""
        stream = answering.stream
        if self._runs_now(run):
            await self._run_now(owner, msg, run, answering, principal)
            return
        first = asyncio.Event()
        backend = SessionlessBackend(owner, stream, caller_for(msg), self.driver, first.set)

        async def run_it() -> None:
            try:
                try:
                    body = await self._drive_run(owner, run, stream, backend, principal)
                except (RemoteProtocolError, StoreUnavailable) as failed:
                    exc = failed
                    if isinstance(exc, StoreUnavailable):  # (e.g. a task's record not written)
                        log.warning("store unavailable: %s", exc)
                        exc = store_unavailable(msg.request_id)
                    if not answering.started:
                        answering.refused.append(exc)  # answered as this POST's status
                        return
                    body = encode_refusal(exc)  # the stream's final event: the call is answered
                first.set()
                if body is not None:
                    await owner.append(stream, body.decode(), final=True)
                elif stream.state is not StreamState.CLOSED:
                    stream.handle(StreamInput.ABORT)  # cancelled: nothing to send
                    owner.wake(stream)
            except Gone:
                pass
            finally:
                first.set()
                owner.done(stream.epoch)

        answering.detached = run.detached
        spawn = self.driver.spawn if run.detached else owner.spawn
        answering.task = spawn(run_it())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(first.wait(), FIRST_OUTPUT_WAIT)
        if answering.refused:
            raise answering.refused[0]
        answering.started = True

    def _runs_now(self, run: SessionlessRun) -> bool:
        """Can ``run``'s handler run in the connection's task (:func:`weir.common.runs_inline`)?
        Not a keyed run (or one that may become a task) on a shared store: what it
        records waits on the network."""
        records = run.call is not None or run.task is not None
        return runs_inline(self.driver.app, self.driver.shared.shared and records, run.request)

    async def _run_now(
        self,
        owner: Session,
        msg: SessionlessMessage,
        run: SessionlessRun,
        answering: _Answering,
        principal: str,
    ) -> None:
        """:meth:`_run_on_stream` for a run :meth:`_runs_now` accepts: the whole run
        here, its answer put into the stream at once when credit allows, else by a task
        that waits for it.  A refusal raises before anything was sent (the POST's status)."""
        stream = answering.stream
        backend = SessionlessBackend(owner, stream, caller_for(msg), self.driver)
        try:
            body = await self._drive_run(owner, run, stream, backend, principal, inline=True)
        except BaseException:
            owner.done(stream.epoch)
            raise
        answering.started = True
        assert body is not None  # (an inline run cannot be cancelled)
        text = body.decode()
        if owner.try_append(stream, text, final=True):
            owner.done(stream.epoch)
            return
        self.driver.metrics.inline_deferred["plain"] += 1

        async def append() -> None:
            try:
                await owner.append(stream, text, final=True)
            except Gone:
                pass
            finally:
                owner.done(stream.epoch)

        owner.spawn(append())

    # ---------------------------------------------------------------- one run
    async def _drive_run(
        self,
        owner: Session,
        run: SessionlessRun,
        stream: StreamLog | None,
        backend: SessionlessBackend,
        principal: str,
        *,
        inline: bool = False,
    ) -> bytes | None:
        """Carry out a :class:`SessionlessRun`: run the handler (``inline``: in this
        task, see :meth:`_runs_now`), seal, encode and record as it asks; the body it
        responds with."""
        backend.detached = run.detached  # a keyed call is not cancelled with its response
        driver, req = self.driver, run.request
        body: bytes | None = None
        clock = asyncio.get_running_loop().time
        effect = run.start(clock())
        while effect is not None:
            try:
                answer: object = None
                if effect is RUN_HANDLER:
                    answer = await self._run_handler(run, backend, inline)
                elif isinstance(effect, EncodeResult):
                    answer = self._encode_result(owner, req, effect.result, stream)
                elif isinstance(effect, SealState):
                    answer = (await driver.request_sealer()).seal(dict(effect.claims))
                elif isinstance(effect, RecordOutcome):
                    await driver.keyed.record(principal, effect.key, effect.payload)
                elif isinstance(effect, GiveBack):
                    await driver.keyed.record(principal, effect.key, None)
                else:
                    assert isinstance(effect, Respond)
                    body = effect.body
            except BaseException as exc:
                effect = run.fail(exc, clock())
            else:
                effect = run.deliver(answer, clock())
        return body

    async def _run_handler(
        self, run: SessionlessRun, backend: SessionlessBackend, inline: bool
    ) -> object:
        """Run one request's handler: its result, :class:`InputAsked`, an error body,
        or None if its stream went away.

        Raises:
            RemoteProtocolError: 404 -32601 for a method an app's fallback does not
                serve; 400, -32021 when the handler needs a capability the request
                did not declare.
        """
        req, driver = run.request, self.driver
        ctx = Context(
            backend,
            req.id,
            request_meta(req),
            state=driver.state,
            inputs=run.inputs,
            access_token=REQUEST_ACCESS.get(),  # (the request's own: its task's context)
        )
        task = run.task
        if task is not None and task.upfront:  # the call is a task: create it, answer
            return await driver.tasks.create(run.principal, req, ctx.access_token)
        ctx.tasks_possible = task is not None
        if inline:
            return sessionless_inline(driver.app, driver.metrics, req, ctx)
        try:
            try:
                handler = dispatch(driver.app, req, ctx)
                return await driver.metrics.timed(
                    req.method, req.params, handler, pending=(InputRequired,)
                )
            except InputRequired as asked:
                return InputAsked(asked.requests, ctx.answered)
            except BecomeTask as escalated:  # the rounds are done: on as a task
                access = ctx.access_token
                return await driver.tasks.create(run.principal, req, access, escalated.answered)
        except Gone:
            return None
        except McpError as exc:
            return handler_error(req, exc)
        except Exception as exc:
            return failure(req, exc)

    def _encode_result(
        self, owner: Session, req: Request, result: dict[str, Any], stream: StreamLog | None
    ) -> bytes:
        """A result stamped with this era's fields, encoded within the size limit."""
        try:
            decorated = complete(req.method, result, self.driver.identity())
            return _fit(req, encode_result(req.id, decorated), owner, stream)
        except Exception as exc:
            return failure(req, exc)

    # ---------------------------------------------------------------- listen


def _count_execution(driver: AsyncioDriver, run: SessionlessRun) -> None:
    if run.request.method == "tools/call":
        driver.metrics.executions += 1  # (a replay never gets here: AnswerReplay)


def _end(answering: _Answering) -> None:
    """Closing the response is cancellation in this era: nothing is resumed (a keyed
    call's run is the runtime's task, and runs on)."""
    if answering.task is not None and not answering.detached:
        answering.task.cancel()
    if answering.stream.state is not StreamState.CLOSED:
        answering.stream.handle(StreamInput.ABORT)
