"""Running one request on the asyncio runtime: the app's handler and its way to the client.

Theory of operation
-------------------
The app layer (:mod:`weir.app`) owns every MCP method and every rule about what a
handler says (progress, logs, server-to-client requests); this module only gives a
handler's :class:`~weir.app.Context` its asyncio half, :class:`Backend`:

* a message goes into the log of the stream the response will travel on, within the
  session's drain credit (:meth:`Session.append` waits, in order), so it reaches the
  client before the response; a call answered with a JSON body has no stream, so its
  notifications are dropped and its server-to-client requests use the GET stream;
* a server-to-client request waits on a future the client's answer (a POSTed
  JSON-RPC response) resolves; teardown fails it;
* ``notifications/cancelled`` cancels the handler's task: it sends no response;
* a ``tools/call`` runs only after passing the idempotency gate (:func:`plan`): the
  core's :class:`~weir.protocol.course.CallCourse` orders claim, run and record over
  the session's :class:`~weir.protocol.gate.CallLedger` -- the same steps, rules and
  records as the Trio engine's.  A retry of a call (same ``Idempotency-Key``, or
  same id) replays its response instead of running it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from weir.app import (
    App,
    Caller,
    Context,
    McpError,
    dispatch,
    failure,
    id_in_use,
)
from weir.common import REQUEST_ACCESS, call_inline, runs_inline
from weir.protocol import INTERNAL_ERROR, Reason
from weir.protocol.budget import fit_response
from weir.protocol.course import AppendRecords, CallCourse, ClaimCall, HoldCall, Record, WaitForCall
from weir.protocol.jsonrpc import (
    ErrorResponse,
    Request,
    RequestId,
    Response,
    encode_request,
    encode_result,
)
from weir.protocol.states import StreamState
from weir.protocol.streams import StreamLog

from ._session import Gone, Session


class Backend:
    """:class:`weir.app.ContextBackend` for one call on one session."""

    __slots__ = ("_session", "_stream")

    def __init__(self, session: Session, stream: StreamLog | None) -> None:
        self._session = session
        self._stream = stream

    @property
    def session_id(self) -> str:
        return self._session.sid

    @property
    def caller(self) -> Caller:
        return self._session.caller

    async def send(self, payload: bytes) -> None:
        if self._stream is not None:
            await self._session.append(self._stream, payload.decode())

    def _carrier(self) -> StreamLog | None:
        if self._stream is not None:
            return self._stream
        standalone = self._session.streams.standalone
        if standalone is not None and standalone.state is not StreamState.CLOSED:
            return standalone
        return None

    async def request(
        self, method: str, params: dict[str, Any] | None, timeout: float
    ) -> Response | ErrorResponse | None:
        session, stream = self._session, self._carrier()
        if stream is None:
            raise McpError(INTERNAL_ERROR, f"cannot send {method}: no stream to the client is open")
        rid = session.next_request_id()
        answer = session.pending[rid] = session.loop.create_future()
        try:
            await session.append(stream, encode_request(rid, method, params).decode())
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            return None
        except Gone:
            raise McpError(INTERNAL_ERROR, f"session ended while waiting for {method}") from None
        finally:
            session.pending.pop(rid, None)

    def close_stream(self, retry_ms: int) -> None:
        if self._stream is not None:
            self._session.request_close(self._stream, retry_ms)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def changed(self, method: str, uri: str | None) -> None:
        self._session.driver.changed(method, uri)

    @property
    def protocol_version(self) -> str:
        return self._session.version

    def cancel_requested(self, request_id: RequestId) -> bool:
        return self._session.closed or request_id in self._session.cancelled

    def session_channel(self) -> Callable[[bytes], Awaitable[None]]:
        return functools.partial(_send_on_session, self._session)


async def _send_on_session(session: Session, payload: bytes) -> None:
    """A notification on ``session``'s GET stream, within credit; dropped without one."""
    stream = session.streams.standalone
    if stream is not None and stream.state is not StreamState.CLOSED:
        with contextlib.suppress(Gone):
            await session.append(stream, payload.decode())


async def gate_step(session: Session, effect: ClaimCall | WaitForCall | HoldCall) -> object:
    """Perform one step of the core's gate loop (:func:`weir.protocol.course.gate`)
    on the driver's store (see ``._shared``): a delivery running here can be awaited;
    one running on another replica is waited for by claiming again at ``until``.

    Raises:
        Gone: the session ended while the step waited.
        RemoteProtocolError: 404 (the session is gone), 503 ``store_unavailable``.
    """
    if isinstance(effect, HoldCall):
        session.driver.shared.hold(session, effect.key)
        return None
    if isinstance(effect, WaitForCall):
        wait = max(0.0, effect.until - session.loop.time())
        if effect.local:
            finished = session.call_done.setdefault(effect.key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), wait)
        else:
            await asyncio.sleep(wait)
        if session.closed:
            raise Gone
        return None
    return await session.driver.shared.claim(session, effect)


async def execute(
    app: App,
    session: Session,
    course: CallCourse,
    stream: StreamLog | None,
    state: Any = None,
    *,
    final_append: bool = False,
    inline: bool = False,
) -> bytes | None:
    """The encoded JSON-RPC response of ``course``'s request, or None if the client
    cancelled it; a gated call's outcome is recorded as its course says (a cancelled
    call gives its key back, so a retry runs it; one torn down is ``interrupted``).

    ``inline``: :func:`runs_now` accepted the course; its tool runs synchronously in
    the caller's task (:func:`_run_now`).

    ``final_append``: the call is alone on a stream logged in a shared store, so its
    response's append records its outcome too -- left to the caller (the course is
    then RECORDING; see :meth:`CallCourse.appended`).

    A request whose id is still running in the session is refused (ids name the
    request a cancellation or an answer is for, so two at once would be ambiguous).
    """
    req = course.request
    metrics = session.driver.metrics
    if course.replay is not None:
        metrics.duplicates_replayed += 1
        return course.replay
    if req.id in session.running:
        await _store(session, course.give_back())
        return id_in_use(req.id)
    if course.key is not None:
        metrics.executions += 1  # (a gated call: tools/call)
    course.started()
    try:
        if inline:
            payload: bytes | None = _run_now(app, session, req, stream, state)
        else:
            payload = await _run(app, session, req, stream, state)
    except BaseException:
        record = course.abandoned()
        if record is not None and record.payload is not None and final_append:
            assert stream is not None
            await session.driver.shared.append_interrupted(
                session, stream, record.payload, record.key
            )
        await _store(session, record)
        raise
    if payload is None:
        # The client cancelled it after it started: stored as ``cancelled``, so a
        # retry under its key is told so instead of running it again.
        await _store(session, course.cancelled())
        return None
    await _store(session, course.finished(payload, final_append=final_append))
    return payload


def runs_now(app: App, session: Session, course: CallCourse) -> bool:
    """Can ``course`` be answered in the calling task, with no handler task?

    Yes for a replay (nothing runs) when the store is process-local, and for what
    :func:`weir.common.runs_inline` accepts -- as on the Trio engine.
    """
    if session.driver.shared.shared:
        return False
    return course.replay is not None or runs_inline(app, False, course.request)


async def give_back(session: Session, course: CallCourse) -> None:
    """``course`` will never run (its session ended first): give back its key."""
    await _store(session, course.give_back())


async def _store(session: Session, step: Record | AppendRecords | None) -> None:
    if isinstance(step, Record):
        await session.driver.shared.finish(session, step.key, step.payload)


def _fit(req: Request, payload: bytes, session: Session, stream: StreamLog | None) -> bytes:
    """``payload``, or ``result_too_large`` if it could never be sent within the
    session's byte credit (the core's rule, as on the Trio engine)."""
    fitted = fit_response(req.id, payload, session.flow.credit.limits.bytes, stream)
    if fitted is not payload:
        session.driver.metrics.refused(str(Reason.RESULT_TOO_LARGE))
    return fitted


def _context(session: Session, req: Request, stream: StreamLog | None, state: Any) -> Context:
    """The handler's :class:`Context` for ``req`` (its token: the request's own, which
    the handler's task copied, or the reading task's for an inline call)."""
    meta = (req.params or {}).get("_meta")
    return Context(
        Backend(session, stream),
        req.id,
        meta if isinstance(meta, dict) else None,
        state=state,
        access_token=REQUEST_ACCESS.get(),
    )


async def _run(
    app: App, session: Session, req: Request, stream: StreamLog | None, state: Any
) -> bytes | None:
    ctx = _context(session, req, stream, state)
    session.running[req.id] = task = asyncio.current_task()  # type: ignore[assignment]
    session.started[req.id] = session.loop.time()
    try:
        result = await session.driver.metrics.timed(req.method, req.params, dispatch(app, req, ctx))
        return _fit(req, encode_result(req.id, result), session, stream)
    except Exception as exc:
        return failure(req, exc)
    except asyncio.CancelledError:
        if req.id not in session.cancelled or task is None:
            raise  # teardown, not the client
        task.uncancel()
        return None
    finally:
        session.cancelled.discard(req.id)
        if session.running.get(req.id) is task:
            del session.running[req.id]
            session.started.pop(req.id, None)


def _run_now(
    app: App, session: Session, req: Request, stream: StreamLog | None, state: Any
) -> bytes:
    """:func:`_run` for a tool :func:`runs_now` accepted, run synchronously (nothing
    can cancel it, so it is never in ``session.running``); observed in the metrics
    as an inline call."""
    ctx = _context(session, req, stream, state)
    try:
        result = call_inline(app, session.driver.metrics, req, ctx)
        return _fit(req, encode_result(req.id, result), session, stream)
    except Exception as exc:
        return failure(req, exc)


async def append_recording(
    session: Session, stream: StreamLog, course: CallCourse, key: str, payload: bytes
) -> None:
    """A lone call's response as its shared stream's final event, recording its
    outcome in the same store step; should that fail, the outcome is recorded alone."""
    try:
        await session.append(stream, payload.decode(), final=True, call_key=key)
    except BaseException:
        again = course.append_failed(payload)
        await session.driver.shared.finish(session, again.key, again.payload)
        raise
    course.appended()
    session.finish_call(key)  # (stored: wake the deliveries waiting here)
