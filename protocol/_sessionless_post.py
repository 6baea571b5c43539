"""The course of a sessionless (2026-07-28) POST: every decision, in order, as effects.

Theory of operation
-------------------
A request of this era carries everything a session used to remember, so its course
needs no session: :class:`SessionlessCourse` owns the order of its decisions, and
the runtime performs each *effect* it asks for and delivers the answer back, as for
the session era's :class:`~._post.PostCourse` (the same loop, and the same effects
where they mean the same thing)::

    effect = course.start(now)
    while effect is not None:
        try:
            answer = await perform(effect)
        except BaseException as exc:
            effect = course.fail(exc, now)
        else:
            effect = course.deliver(answer, now)

The order, and what each step may refuse:

1. A notification is :data:`~._post.ACCEPTED` (202).  A method this era does not
   serve is 404, -32601 (an app's fallback serves unknown methods, never the
   session era's own); ``server/discover`` is :data:`ANSWER_DISCOVER`.
2. A ``tools/call``'s ``Mcp-Param-*`` headers against its tool's annotations
   (:class:`ToolSchema`; 400, -32020 on a mismatch).
3. The request state (MRTR) of a method that may ask for input: a
   ``requestState`` is opened by the runtime, which holds the keys
   (:class:`OpenRequestState`), and must be bound to this principal, method and
   arguments (400, -32602 ``request_state_invalid``).  Its answers and the
   round's ``inputResponses`` are the handler's inputs; an app that keeps its own
   rounds' state (a fallback for every method) gets its inner state back instead.
4. :data:`CHOOSE_OWNER` -- the credit owner the request's answer draws on, then
   :class:`~._post.AdmitRequests` under :attr:`SessionlessCourse.lane` (429 once
   the owner's peer stopped reading).
5. ``subscriptions/listen`` is handed over (:class:`Listen`).
6. A ``tools/call`` with an ``Idempotency-Key`` (or, with a retry window, the key
   of the same request's bytes) passes the gate in the principal's namespace:
   :func:`~._post.gate`'s :class:`~._post.ClaimCall`, :class:`~._post.WaitForCall`,
   :class:`~._post.HoldCall`.  A call that ran is replayed (:class:`AnswerReplay`).
7. The answer: :class:`OpenAnswerStream`, :class:`RunOnStream` and
   :data:`~._post.ATTACH_WRITER` for a method that may stream, when the client
   accepts SSE and the server is not in JSON mode; else :class:`RespondJson`.
   :class:`RunOnStream` and :class:`RespondJson` carry a
   :class:`~._sessionless_run.SessionlessRun`, the handler's own course (run,
   seal an ``input_required`` state, encode, record a keyed call's outcome,
   respond), which the runtime drives where the handler runs.

Between admission and the answer, a failure first asks for
:class:`~._post.Finished` (the reservation ends) and :class:`~._post.GiveBack` for
a key claimed but never run, then re-raises.  Once the answer is under way the
run and the stream account for the request.

The courses do no I/O, read no clock (``now`` comes with every answer; the wall
clock the retry window's bucket needs comes in once, as ``wall``) and hold nothing
global.  Effects without fields are preallocated singletons.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import msgspec

from ._course import CallCourse, ClaimCall, HoldCall, WaitForCall, gate
from ._endpoint import accepts
from ._errors import INVALID_PARAMS, Reason, RemoteProtocolError
from ._gate import WindowKey
from ._jsonrpc import Notification, Request, RequestId
from ._post import (
    ACCEPTED,
    ATTACH_WRITER,
    Accepted,
    AdmitRequests,
    AttachWriter,
    Finished,
    GiveBack,
)
from ._sessionless import (
    NAMED_TARGET,
    SessionlessMessage,
    check_param_headers,
    method_not_found,
    param_headers,
)
from ._sessionless_run import SessionlessRun, Tasking, state_binding
from ._steps import Singleton, Steps
from ._tasks import TASK_METHODS, TaskSupport, declared, not_declared

#: The methods this era serves.
SESSIONLESS_METHODS: Final = frozenset(
    {
        "server/discover",
        "subscriptions/listen",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "completion/complete",
    }
)
#: Methods of the session era only: 404 on this one, even for an app's fallback.
SESSION_ERA_ONLY: Final = frozenset(
    {"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)
#: Methods that may answer ``input_required``, and stream notifications first.
INPUT_METHODS: Final = frozenset(NAMED_TARGET)


@dataclass(frozen=True, slots=True)
class SessionlessRules:
    """How a runtime is configured, as far as the course's decisions go (one per server)."""

    #: Answer with one ``application/json`` body, never an SSE stream.
    json_response: bool = False
    #: The app has a fallback handler (it may serve methods this era does not name).
    fallback: bool = False
    #: The app's fallback serves every method and keeps its own rounds' state.
    fallback_every_method: bool = False
    #: Seconds of the retry window (an unkeyed call's bytes as its key); 0: off.
    retry_window: float = 0.0
    #: How long a duplicate delivery waits for a running call before 409 ``in_progress``.
    in_progress_wait: float = 10.0
    #: The ``Retry-After`` (ms) a gate refusal suggests.
    retry_ms: int = 1000
    #: The runtime serves the tasks extension (``tasks/*``, calls answered with tasks).
    tasks: bool = False


# ---------------------------------------------------------------- effects
class AnswerDiscover(Singleton):
    """Answer ``server/discover`` (200, the server's description); the course is over."""


class ChooseOwner(Singleton):
    """Choose the credit owner of the request's answer (answer: None)."""


ANSWER_DISCOVER: Final = AnswerDiscover("ANSWER_DISCOVER")
CHOOSE_OWNER: Final = ChooseOwner("CHOOSE_OWNER")


@dataclass(slots=True)
class ToolSchema:
    """Answer with tool ``name``'s input schema (a mapping), or None if unknown."""

    name: str


@dataclass(slots=True)
class ToolTasking:
    """Answer with how tool ``name`` runs as a task: a :class:`Tasking` (None for
    an unknown tool, or one that never does)."""

    name: str


@dataclass(slots=True)
class ServeTask:
    """Answer ``tasks/get``, ``tasks/update`` or ``tasks/cancel`` (the request
    declared the extension; nothing is reserved for the answer); the course is over."""

    request: Request


@dataclass(slots=True)
class OpenRequestState:
    """Open the sealed ``state``: answer with its claims (a dict), or None when it
    does not open (forged, tampered with, expired)."""

    state: str


@dataclass(slots=True)
class Listen:
    """Serve ``subscriptions/listen`` for ``request``: its stream takes over what
    ``lane`` reserved; the course is over."""

    request: Request
    lane: object
    #: The request declared the tasks extension (it may follow tasks' status).
    tasks_declared: bool = False


@dataclass(slots=True)
class AnswerReplay:
    """Answer 200 with ``payload`` (a keyed call's stored answer, re-addressed), with
    nothing reserved for it; the course is over."""

    payload: bytes


@dataclass(slots=True)
class RespondJson:
    """Drive ``run`` here and answer with its body as one JSON response, drawing on
    ``lane``'s reservation; the course is over."""

    run: SessionlessRun
    lane: object


@dataclass(slots=True)
class OpenAnswerStream:
    """Open a stream for the request's answer (no event ids: nothing resumes); it
    takes over what ``lane`` reserved (answer: None)."""

    lane: object


@dataclass(slots=True)
class RunOnStream:
    """Drive ``run`` where handlers run, its answer the stream's last frame; answer
    None once it has output or a moment has passed, or raise its refusal if it was
    refused before any output (the POST's own status)."""

    run: SessionlessRun


SessionlessEffect = (
    Accepted
    | AnswerDiscover
    | ToolSchema
    | ToolTasking
    | ServeTask
    | OpenRequestState
    | ChooseOwner
    | AdmitRequests
    | Listen
    | ClaimCall
    | WaitForCall
    | HoldCall
    | Finished
    | GiveBack
    | AnswerReplay
    | RespondJson
    | OpenAnswerStream
    | RunOnStream
    | AttachWriter
)
_Steps = Generator[SessionlessEffect, Any, None]


class SessionlessCourse(Steps[SessionlessEffect]):
    """One sessionless POST's course (see the module docstring).

    ``principal`` and ``authorized``: who the request speaks for (a request state is
    bound to them); ``wall``: the wall clock (seconds) as the request arrived, for
    the retry window's bucket (shared by replicas, so not the runtime's clock).

    ``msg`` is the message the course was made with until it hands the request to a
    :class:`SessionlessRun`; from then on it is that message without the request's
    params (:meth:`SessionlessMessage.without_params`), so a course that lasts while a
    slow peer takes the answer does not keep the arguments.  A runtime reads it from
    here, not from a reference of its own.
    """

    __slots__ = ("authorized", "lane", "msg", "principal", "rules", "wall")

    def __init__(
        self,
        msg: SessionlessMessage,
        principal: str,
        authorized: bool,
        rules: SessionlessRules,
        *,
        wall: float,
    ) -> None:
        self.msg = msg
        self.principal = principal
        self.authorized = authorized
        self.rules = rules
        self.wall = wall
        #: The key the request's answer is reserved under until its stream opens.
        self.lane = object()
        # (The base's fields set here, not through its methods: one course per request.)
        self.now = 0.0
        self._steps = steps = _course(self)
        self._send = steps.send


def same_request_key(req: Request, window: float, wall: float) -> WindowKey | None:
    """With a retry window (``window`` seconds > 0): the key an unkeyed call gets,
    the same for the same request (id, method and params) within the window -- a
    gateway's retry of the same bytes.  No client's ``Idempotency-Key`` names it."""
    if window <= 0:
        return None
    canonical = msgspec.json.encode([req.id, req.method, req.params], order="sorted")
    bucket = int(wall // window)
    return WindowKey(f"same:{hashlib.sha256(canonical).hexdigest()[:32]}:{bucket}")


def _state_refusal(req: Request) -> RemoteProtocolError:
    return RemoteProtocolError(
        "requestState is invalid, expired, or not this request's",
        http_status=400,
        reason=Reason.REQUEST_STATE_INVALID,
        code=INVALID_PARAMS,
        request_id=req.id,
    )


def _course(c: SessionlessCourse) -> _Steps:
    msg, rules = c.msg, c.rules
    message = msg.message
    if isinstance(message, Notification):
        yield ACCEPTED
        return
    req = message
    method = req.method
    served = method in SESSIONLESS_METHODS or (rules.tasks and method in TASK_METHODS)
    if not served and (not rules.fallback or method in SESSION_ERA_ONLY | TASK_METHODS):
        raise method_not_found(method, req.id)
    if method == "server/discover":
        yield ANSWER_DISCOVER
        return
    declared_tasks = msg.meta is not None and declared(msg.meta.capabilities)
    if method in TASK_METHODS:
        if not declared_tasks:
            raise not_declared(req.id)
        yield CHOOSE_OWNER
        yield AdmitRequests(1, req.id, c.lane)
        yield Finished(1, c.lane)
        yield ServeTask(req)
        return
    params = req.params if isinstance(req.params, dict) else {}
    tasking: Tasking | None = None
    if method == "tools/call":
        tasking = yield from _tool_checks(c, req, params, declared_tasks)
    inputs: dict[str, Any] | None = None
    app_rounds = rules.fallback_every_method and method in INPUT_METHODS
    if method in INPUT_METHODS:
        req, inputs = yield from _round_inputs(c, req, params, app_rounds)
    yield CHOOSE_OWNER
    lane = c.lane
    yield AdmitRequests(1, req.id, lane)
    if method == "subscriptions/listen":
        yield Listen(req, lane, declared_tasks)
        return
    call = (yield from _gate_keyed(c, req, lane)) if method == "tools/call" else None
    if call is not None and call.replay is not None:  # it ran: its answer, nothing runs
        yield Finished(1, lane)
        yield AnswerReplay(call.replay)
        return
    run = SessionlessRun(
        req, inputs, call, principal=c.principal, authorized=c.authorized, app_rounds=app_rounds
    )
    run.task = tasking
    sse = method in INPUT_METHODS and not rules.json_response
    json = not (sse and accepts(msg.headers.get("accept"), "text/event-stream"))
    # The run has the request now: the course keeps only what it still reads.
    c.msg = msg.without_params()
    del msg, message, req, params
    yield from _answer(run, lane, json=json)


def _answer(run: SessionlessRun, lane: object, *, json: bool) -> _Steps:
    """Answer with the run: one JSON body, or a stream it writes to.  A stream that
    cannot open ends the reservation and gives a keyed call's key back."""
    if json:
        yield RespondJson(run, lane)
        return
    call = run.call
    try:
        yield OpenAnswerStream(lane)
    except GeneratorExit:
        raise
    except BaseException:
        yield Finished(1, lane)
        given = call.give_back() if call is not None else None
        if given is not None:
            yield GiveBack(given.key)
        raise
    yield RunOnStream(run)
    yield ATTACH_WRITER


def _gate_keyed(
    c: SessionlessCourse, req: Request, lane: object
) -> Generator[SessionlessEffect, Any, CallCourse | None]:
    """A ``tools/call`` under an ``Idempotency-Key`` (or the retry window's key of the
    same bytes) through the gate in the principal's namespace: its course (None:
    not keyed).  A refusal or failure ends the reservation first, then goes on."""
    key = c.msg.headers.get("idempotency-key")
    if key is None:
        key = same_request_key(req, c.rules.retry_window, c.wall)
    if key is None:
        return None
    rules = c.rules
    try:
        call = CallCourse(req, key, now=c.now, wait=rules.in_progress_wait, retry_ms=rules.retry_ms)
        yield from gate(call, None, c)
    except GeneratorExit:
        raise  # abandoned by its runtime: nothing more may be asked
    except BaseException:
        yield Finished(1, lane)
        raise
    return call


def _tool_checks(
    c: SessionlessCourse, req: Request, params: Mapping[str, Any], declared_tasks: bool
) -> Generator[SessionlessEffect, Any, Tasking | None]:
    """A ``tools/call``'s ``Mcp-Param-*`` headers against its tool's schema, then how
    it may become a task (None: it runs inline)."""
    name = params.get("name")
    if not isinstance(name, str):
        return None
    arguments = params.get("arguments")
    schema: Mapping[str, Any] | None = yield ToolSchema(name)
    if schema is not None and isinstance(arguments, dict):
        annotated = param_headers(schema)
        if annotated:
            check_param_headers(c.msg.headers, annotated, arguments, req.id)
    if not c.rules.tasks:  # (a runtime without tasks runs every tool inline)
        return None
    tasking = yield ToolTasking(name)
    return _task_decision(tasking, declared_tasks, req.id)


def _round_inputs(
    c: SessionlessCourse, req: Request, params: Mapping[str, Any], app_rounds: bool
) -> Generator[SessionlessEffect, Any, tuple[Request, dict[str, Any] | None]]:
    """Open and check the round's ``requestState``: the request the handler gets and
    its inputs (the sealed answers and this round's ``inputResponses``), or, for an
    app that keeps its own rounds' state, the request carrying that inner state."""
    claims: dict[str, Any] | None = None
    state = params.get("requestState")
    if state is not None:
        opened = (yield OpenRequestState(state)) if isinstance(state, str) else None
        claims = cast(dict[str, Any] | None, opened)
        if claims is None or claims.get("b") != state_binding(c.principal, c.authorized, req):
            raise _state_refusal(req)
    if app_rounds:
        if claims is not None:  # the app's inner state, once weir's seal opened
            rewritten = dict(params)
            inner = claims.get("x")
            if isinstance(inner, str):
                rewritten["requestState"] = inner
            else:
                rewritten.pop("requestState", None)
            req = msgspec.structs.replace(req, params=rewritten)
        return req, None
    inputs: dict[str, Any] = {}
    if claims is not None:
        answers = claims.get("a")
        if isinstance(answers, dict):
            inputs.update(answers)
    responses = params.get("inputResponses")
    if isinstance(responses, dict):
        inputs.update(responses)
    return req, inputs


def _task_decision(
    tasking: Tasking | None, declared_tasks: bool, request_id: RequestId
) -> Tasking | None:
    """Whether (and how) a call becomes a task: only for a tool that supports it,
    called by a request that declared the extension.

    Raises:
        RemoteProtocolError: 400 -32021 for a tool that runs only as a task, called
            without the extension declared.
    """
    if tasking is None or tasking.support is TaskSupport.FORBIDDEN:
        return None
    if not declared_tasks:
        if tasking.support is TaskSupport.REQUIRED:
            raise not_declared(request_id)
        return None
    return tasking
