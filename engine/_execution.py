"""Execution: running handlers, and recording their outcomes in the gate.

Theory of operation
-------------------
Handlers run in the server's handler nursery, not in the connection's task, so a
dropped connection does not cancel them (MCP: disconnection is not cancellation)
and their output stays replayable.  The exception is a ``tools/call`` of a tool
whose ``async def`` has no suspension point at all
(:func:`weir.app.never_suspends`), with the process-local store: it finishes
on its first step, so it runs right in the connection's task
(:meth:`Execution.run_now`) -- it can neither be cancelled half-way nor outlive
anything -- and its response goes out in the same write as the head.

What is stored in the gate, and when, is the request's
:class:`~weir.protocol.course.CallCourse`'s to say; this module performs it
(:meth:`Execution.finish_call`).  A call its client cancelled after it started is
stored as the ``cancelled`` error (it may have had effects: never run again under
its key); one that never started gives its key back.  A call this
process abandons at shutdown is never released (it may have had effects): its
outcome becomes an ``interrupted`` error, stored in the gate and, where the stream
is shared, appended as its final event.
"""

from __future__ import annotations

import contextlib

import trio

from weir.app import Context, dispatch, failure, id_in_use
from weir.common import call_inline, runs_inline
from weir.protocol import Reason
from weir.protocol.budget import fit_response
from weir.protocol.course import AppendRecords, CallCourse, CoursePhase, Record, interrupted
from weir.protocol.jsonrpc import Request, encode_result
from weir.protocol.states import StreamInput, StreamState

from ._auth import REQUEST_ACCESS
from ._context import CallBackend
from ._session import Session, StreamHandle, StreamLost
from ._shared import Shared, log
from ._store_errors import SessionGone, StoreUnavailable


class Execution:
    """Running handlers and recording their outcomes (see the module docstring).

    Guarantees: every call's outcome is recorded in the gate as its course says
    (a call cancelled by its client is stored as ``cancelled``, one abandoned at
    shutdown or whose stream was lost as ``interrupted``, never released; only a
    call that never started gives its key back); one handler's failure never reaches the
    handler nursery; no response exceeds the session's byte credit.
    """

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.app = shared.app
        self.config = shared.config
        self.store = shared.store
        self.metrics = shared.metrics

    def runs_now(self, plan: CallCourse) -> bool:
        """Can ``plan`` be answered in the connection's task, with no handler task?

        Yes for a replay (nothing executes) when the store is process-local, and for
        what :func:`weir.common.runs_inline` accepts.
        """
        if self.store.shared:
            return False
        return plan.replay is not None or runs_inline(self.app, False, plan.request)

    async def _answer_or_context(
        self, session: Session, plan: CallCourse, handle: StreamHandle | None
    ) -> bytes | Context:
        """What both execution paths do first: the answer that needs no handler, or
        the :class:`Context` to run it with (counted as an execution if it is a call).

        Needing no handler: a replay from the gate, or the refusal of a request id
        already running -- which releases the key this delivery claimed, so a retry
        under that key may run.
        """
        req = plan.request
        if plan.replay is not None:
            return plan.replay
        if req.id in session.running:
            given = plan.give_back()
            if given is not None:
                await self.finish_call(session, given.key, None)
            return id_in_use(req.id)
        if plan.key is not None:
            self.metrics.executions += 1
        plan.started()
        meta = (req.params or {}).get("_meta")
        return Context(
            CallBackend(session, handle),
            req.id,
            meta if isinstance(meta, dict) else None,
            state=self.shared.state,
            access_token=REQUEST_ACCESS.get(),
        )

    async def answer_now(
        self, session: Session, plan: CallCourse, handle: StreamHandle | None
    ) -> bytes:
        """Execute (or replay) a plan :meth:`runs_now` accepted; record it in the gate."""
        ready = await self._answer_or_context(session, plan, handle)
        if isinstance(ready, bytes):
            return ready
        req = plan.request
        try:
            result = call_inline(self.app, self.metrics, req, ready)
            payload = self.fit(req, encode_result(req.id, result), handle)
        except Exception as exc:
            payload = failure(req, exc)
        await self._store_outcome(session, plan.finished(payload, final_append=False))
        return payload

    async def run_now(
        self, session: Session, plan: CallCourse, handle: StreamHandle, *, primes: bool
    ) -> bool:
        """Answer a lone request on an SSE stream without a handler task, if it can be.

        Returns False (having done nothing) unless :meth:`runs_now` accepts the
        plan.  Otherwise the answer is computed here and its frames (the priming
        event first, if ``primes``) go into the log at once when credit allows --
        so the writer finds the final frame on its first look and sends head,
        frames and terminator in one write.  When a frame would have to wait for
        credit, a task enqueues them instead, in order, and the writer waits.
        """
        if not self.runs_now(plan):
            return False
        try:
            text = (await self.answer_now(session, plan, handle)).decode()
        except BaseException:
            session.done(1, handle.log.epoch)
            raise
        if primes and not handle.try_send_now(""):
            assert self.shared.handlers is not None
            self.metrics.inline_deferred["primed"] += 1
            self.shared.handlers.start_soon(self._deliver, session, handle, True, text)
        elif handle.try_respond_now(text):
            session.done(1, handle.log.epoch)
        else:
            assert self.shared.handlers is not None
            self.metrics.inline_deferred["plain"] += 1
            self.shared.handlers.start_soon(self._deliver, session, handle, False, text)
        return True

    async def _deliver(
        self, session: Session, handle: StreamHandle, prime: bool, payload: str
    ) -> None:
        """Enqueue an answer computed by :meth:`run_now` when it has to wait for credit."""
        try:
            if prime:
                await handle.send("")
            await handle.respond(payload)
        except StreamLost:
            pass
        finally:
            session.done(1, handle.log.epoch)

    def fit(self, req: Request, payload: bytes, handle: StreamHandle | None) -> bytes:
        """``payload``, or the ``result_too_large`` error if it would not fit the credit.

        One response larger than the session's whole byte credit could never be
        sent within it: it is refused (and that refusal is the call's recorded
        outcome, so a retry does not run it again) rather than queued past the bound.
        """
        log = handle.log if handle is not None else None
        fitted = fit_response(req.id, payload, self.config.credit.bytes, log)
        if fitted is not payload:
            self.metrics.refused(str(Reason.RESULT_TOO_LARGE))
        return fitted

    async def execute(
        self, session: Session, plan: CallCourse, handle: StreamHandle | None
    ) -> bytes | None:
        """Run one request's handler; the encoded response, or ``None`` if cancelled."""
        ready = await self._answer_or_context(session, plan, handle)
        if isinstance(ready, bytes):
            return ready
        req = plan.request
        payload: bytes | None = None
        with trio.CancelScope() as scope:
            session.running[req.id] = scope
            session.started[req.id] = trio.current_time()
            try:
                answer = await self.metrics.timed(
                    req.method, req.params, dispatch(self.app, req, ready)
                )
                payload = encode_result(req.id, answer)
                payload = self.fit(req, payload, handle)
            except StreamLost:
                # Its stream is gone under it (a shared store refused the events):
                # it may have had effects, so its key is never released.
                await self._store_outcome(session, plan.abandoned())
                return None
            except Exception as exc:
                payload = failure(req, exc)
            except BaseException:
                if not scope.cancel_called:
                    # Not the client's cancellation: this process is going away under
                    # the call (shutdown).  Say so, durably, before letting go.
                    await self._interrupted(session, plan, handle)
                raise
            finally:
                session.running.pop(req.id, None)
                session.started.pop(req.id, None)
                if session.on_activity is not None:
                    session.on_activity()
        if scope.cancelled_caught:
            # The client cancelled it after it started: stored as ``cancelled``, so a
            # retry under its key is told so instead of running it again.
            await self._store_outcome(session, plan.cancelled())
            return None
        single = handle is not None and handle.sink is not None and handle.outstanding == 1
        # Alone on a shared stream, the final append records it: one round trip less.
        await self._store_outcome(session, plan.finished(payload, final_append=single))
        return payload

    async def _store_outcome(self, session: Session, step: Record | AppendRecords | None) -> None:
        """Perform a :class:`Record` now; :class:`AppendRecords` is :meth:`run_request`'s."""
        if isinstance(step, Record):
            await self.finish_call(session, step.key, step.payload)

    async def _interrupted(
        self, session: Session, plan: CallCourse, handle: StreamHandle | None
    ) -> None:
        """Answer a call this process abandons at shutdown, without ever re-running it.

        The call may have had effects, so releasing its key (and letting a retry run
        it again) would risk a duplicate; leaving the claim RUNNING would leave every
        retry hanging.  Instead its outcome becomes an error with reason
        ``interrupted``: stored in the gate (a retry on any replica gets it) and,
        where the stream is shared, appended as the stream's final event (a resume
        on another replica gets it).  Best effort, bounded, shielded from the
        cancellation that brought us here.
        """
        key = plan.key
        record = plan.abandoned()
        payload = record.payload if record is not None else None
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            if handle is not None and handle.sink is not None and handle.outstanding == 1:
                with contextlib.suppress(Exception):
                    text = (payload or interrupted(plan.request)).decode()
                    await handle.respond(text, call_key=key)
            if record is not None:
                await self.finish_call(session, record.key, record.payload)

    async def finish_call(
        self, session: Session, key: str, payload: bytes | None, *, stored: bool = False
    ) -> None:
        """Store the call's outcome in the gate (a cancelled call releases its key)."""
        if not stored and not self.store.shared:
            # The process-local store never blocks: no shield or timeout to set up.
            await self.store.finish_call(session.record.principal, session.session_id, key, payload)
        elif not stored:
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await self.store.finish_call(
                        session.record.principal, session.session_id, key, payload
                    )
            except (StoreUnavailable, SessionGone):
                log.warning("could not record the outcome of call %s in the store", key)
        if payload is not None and self.store.shared:
            session.keep_result(key, payload)
        done = session.calls.pop(key, None)
        if done is not None:
            done.set()

    async def release_unstarted(self, session: Session, plans: list[CallCourse]) -> None:
        """Give back the keys of claimed calls that will never start here.

        Nothing ran, so a retry (on this replica or another) may run them: releasing
        is safe where it would not be for a call that had begun (see
        :meth:`_interrupted`).
        """
        for course in plans:
            given = course.give_back()
            if given is not None:
                await self.finish_call(session, given.key, None)

    async def prime_then_run(
        self, session: Session, handle: StreamHandle, plans: list[CallCourse]
    ) -> None:
        try:
            await handle.send("")  # the priming event: an id and empty data
        except BaseException as exc:
            # Neither call has started: their keys go back, so a retry runs them.
            await self.release_unstarted(session, plans)
            session.done(len(plans), handle.log.epoch)
            if isinstance(exc, StreamLost):
                return
            raise
        handlers = self.shared.handlers
        assert handlers is not None
        for plan in plans:
            handlers.start_soon(self.run_request, session, plan, handle)

    async def run_request(self, session: Session, plan: CallCourse, handle: StreamHandle) -> None:
        try:
            key = plan.key
            payload = await self.execute(session, plan, handle)
            if plan.phase is CoursePhase.RECORDING and key is not None and payload is not None:
                try:
                    await handle.respond(payload.decode(), call_key=key)
                except BaseException:
                    # The final append failed: record the outcome on its own.
                    again = plan.append_failed(payload)
                    await self.finish_call(session, again.key, again.payload)
                    raise
                plan.appended()
                await self.finish_call(session, key, payload, stored=True)
            else:
                await handle.respond(payload.decode() if payload is not None else None)
        except StreamLost:
            pass
        except Exception:
            # Never let one request take the handler nursery (the server) down.
            log.exception("delivering the response to %r failed", plan.request.id)
            if handle.log.state is not StreamState.CLOSED:
                handle.handle(StreamInput.ABORT)
        finally:
            session.done(1, handle.log.epoch)
