"""The run of a sessionless (2026-07-28) request's handler, as effects.

Theory of operation
-------------------
:class:`~._sessionless_post.SessionlessCourse` decides whether and where a request
runs; once it does, it hands the runtime a :class:`SessionlessRun` (inside
:class:`~._sessionless_post.RespondJson` or :class:`~._sessionless_post.RunOnStream`),
and the runtime drives that run where handlers run, with the same loop as every
course (``start``, then ``deliver`` or ``fail`` each answer).  The run's order is
fixed whatever the handler does:

1. :data:`RUN_HANDLER` -- the handler's result, :class:`InputAsked`, an error body,
   or None (cancelled); a keyed call is marked started first.
2. For an ``input_required`` answer, :class:`SealState`: the round's answers (or the
   app's own inner state) sealed into a request state bound by
   :func:`state_binding` to the principal, the method and the arguments -- never to
   the connection, since the next round may arrive on any connection or replica.
3. :class:`EncodeResult`, then for a keyed call :class:`RecordOutcome` (it
   finished) or :class:`~._post.GiveBack` (an ``input_required`` answer, a refusal,
   the client's cancellation: nothing finished); a run the process abandons is
   recorded ``interrupted``.
4. :class:`Respond` with the body (None: nothing to send).

No I/O, no clock (``now`` comes with every answer), nothing global; the effect
without fields is a preallocated singleton.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from ._course import CallCourse
from ._errors import INVALID_PARAMS, RemoteProtocolError
from ._jsonrpc import Request, encode_error
from ._post import GiveBack
from ._steps import Singleton, Steps
from ._tasks import TaskSupport

#: Params that are the round's, not the request's (left out of a state's binding).
_ROUND_PARAMS: Final = ("_meta", "inputResponses", "requestState")


class RunHandler(Singleton):
    """Run the handler of :attr:`SessionlessRun.request` with its inputs.

    Answer: the result (a dict), :class:`InputAsked`, an encoded error body (the
    app's failure), or None (cancelled); raise the refusal of a handler that needs
    what this request cannot give (404 -32601, 400 -32021)."""


RUN_HANDLER: Final = RunHandler("RUN_HANDLER")


@dataclass(frozen=True, slots=True)
class Tasking:
    """A tool's task support, and whether its task starts with the call (else the
    handler escalates into one itself, after its input rounds)."""

    support: TaskSupport
    upfront: bool = True


@dataclass(slots=True)
class InputAsked:
    """A handler's answer to :data:`RUN_HANDLER`: it asked the client for input.

    ``requests``: what it asks (``inputRequests``); ``answered``: the answers it was
    given so far (they go into the new request state)."""

    requests: Mapping[str, Any]
    answered: Mapping[str, Any]


@dataclass(slots=True)
class SealState:
    """Seal ``claims`` as a request state: answer with the token, or raise
    ``ValueError`` (too large to seal)."""

    claims: Mapping[str, Any]


@dataclass(slots=True)
class EncodeResult:
    """Stamp ``result`` with this era's fields (:func:`~._sessionless.complete`) and
    encode it, within the result size limit: answer with the body."""

    result: dict[str, Any]


@dataclass(slots=True)
class RecordOutcome:
    """Store ``payload`` as the keyed call's outcome under ``key`` (answer: None)."""

    key: str
    payload: bytes


@dataclass(slots=True)
class Respond:
    """The run's answer: send ``body`` (None: cancelled, nothing to send); the run is over."""

    body: bytes | None


RunEffect = RunHandler | SealState | EncodeResult | RecordOutcome | GiveBack | Respond
_RunSteps = Generator[RunEffect, Any, None]


class SessionlessRun(Steps[RunEffect]):
    """One run of a sessionless request's handler: run it, seal the state of an
    ``input_required`` answer, encode the result, record a keyed call's outcome,
    and respond -- in that order, whatever happens to the handler.

    ``call``: the gate's course of a keyed ``tools/call`` (None: not keyed; the
    handler then ends with its response).  A keyed call records its answer; an
    ``input_required`` answer, a refusal or the client's cancellation gives the
    key back (nothing finished); a run the process abandons is recorded
    ``interrupted``.
    """

    __slots__ = (
        "_binding",
        "_params_gone",
        "app_rounds",
        "authorized",
        "call",
        "inputs",
        "principal",
        "request",
        "task",
    )

    def __init__(
        self,
        request: Request,
        inputs: dict[str, Any] | None,
        call: CallCourse | None,
        *,
        principal: str,
        authorized: bool,
        app_rounds: bool,
    ) -> None:
        self.request = request
        #: The answers this round carries, for the handler (None: the app's own rounds).
        self.inputs = inputs
        self.call = call
        #: Who the request speaks for (a new request state is bound to them).
        self.principal = principal
        self.authorized = authorized
        self._binding: str | None = None
        self._params_gone = False
        #: The app keeps its own rounds' state: its ``requestState`` goes out sealed.
        self.app_rounds = app_rounds
        #: How the call may become a task (None: it cannot): ``upfront``, the runtime
        #: creates it instead of running the handler here and answers with its
        #: handle; else the handler may escalate into one (the runtime then answers
        #: :data:`RUN_HANDLER` with the handle as the result).
        self.task: Tasking | None = None
        self.now = 0.0
        self._steps = steps = _run(self)
        self._send = steps.send

    @property
    def binding(self) -> str:
        """What a new request state is bound to (:func:`state_binding`; computed once,
        and only when a state is sealed)."""
        if self._binding is None:
            if self._params_gone:  # (a binding of the bare request would be wrong)
                raise RuntimeError("a run's binding was read after its params were let go")
            self._binding = state_binding(self.principal, self.authorized, self.request)
        return self._binding

    def _let_go_of_params(self) -> None:
        """The handler has returned and any state is sealed: keep the request's id and
        method (what encoding and recording read), not its params, which can be as
        large as a request may be and would otherwise stay while a slow peer takes
        the answer."""
        if self.request.params is not None:
            self.request = self.request.without_params()
            self._params_gone = True

    @property
    def detached(self) -> bool:
        """A keyed call outlives its response: it is not cancelled when it goes."""
        return self.call is not None


def state_binding(principal: str, authorized: bool, req: Request) -> str:
    """What a request state is bound to: the request's principal (and whether a token
    vouched for it), its method, and its params other than the round's own (a
    digest).  Not the connection: clients send the next round on whichever
    connection (and replica) they have."""
    params = req.params if isinstance(req.params, dict) else {}
    kept = {k: v for k, v in params.items() if k not in _ROUND_PARAMS}
    bound = [principal, authorized, req.method, kept]
    canonical = msgspec.json.encode(bound, order="sorted")
    return hashlib.sha256(canonical).hexdigest()


def _run(r: SessionlessRun) -> _RunSteps:
    call, rid = r.call, r.request.id  # (not the request: its params are let go of)
    if call is not None:
        call.started()
    try:
        outcome = yield RUN_HANDLER
        asked = isinstance(outcome, InputAsked)
        body: bytes | None = None
        if outcome is None or isinstance(outcome, bytes):
            body = outcome
            r._let_go_of_params()
        else:
            result: dict[str, Any]
            if isinstance(outcome, InputAsked):
                result = {"resultType": "input_required", "inputRequests": outcome.requests}
                seal = True
            else:
                result = outcome
                asked = result.get("resultType") == "input_required"  # the app's own round
                seal = asked and r.app_rounds
            if seal:  # (the binding's digest is computed only for a state to seal)
                claims: dict[str, Any] = {"b": r.binding}
                if isinstance(outcome, InputAsked):
                    claims["a"] = dict(outcome.answered)
                elif isinstance(inner := result.get("requestState"), str):
                    claims["x"] = inner
                try:
                    state: str = yield SealState(claims)
                except ValueError as exc:  # too large to seal: the call's own error
                    body = encode_error(rid, INVALID_PARAMS, str(exc))
                else:
                    result["requestState"] = state
            r._let_go_of_params()
            if body is None:
                body = yield EncodeResult(result)
    except GeneratorExit:
        raise
    except RemoteProtocolError:
        if call is not None:
            step = call.finished(None, final_append=False)  # a refusal: nothing finished
            if step is not None:
                yield GiveBack(step.key)
        raise
    except BaseException:
        if call is not None:
            abandoned = call.abandoned()
            if abandoned is not None and abandoned.payload is not None:
                yield RecordOutcome(abandoned.key, abandoned.payload)
        raise
    if call is not None:
        step = call.finished(body if body is not None and not asked else None, final_append=False)
        if step is not None and step.payload is not None:
            yield RecordOutcome(step.key, step.payload)
        elif step is not None:
            yield GiveBack(step.key)
    yield Respond(body)
