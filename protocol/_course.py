"""One request's course: the gate, the handler, and the gate again, as effects.

Theory of operation
-------------------
Every request a session admits takes one course, and the order of its steps is
what makes a ``tools/call`` run at most once.  :class:`CallCourse` owns that order
and nothing else; the driver performs each step it asks for (a store round trip, a
wait, running the handler) and reports back:

1. A ``tools/call`` is *gated*: the course first asks for a :class:`Claim` of its
   key in the store.  The store's answer goes to :meth:`CallCourse.claimed`, which
   says :class:`Run` (the key is this delivery's), :class:`Answer` (it ran before:
   the stored response, re-addressed, and nothing runs), :class:`ClaimAgain` (it
   is running elsewhere: wait, then claim again) or raises the refusal.  Any other
   method is not gated and may :class:`Run` at once.
2. Between the claim and the handler's start there are steps that can fail (the
   stream's epoch, the priming event, the connection dropping, an id already
   running).  A course that will never start gives its key back
   (:meth:`~CallCourse.give_back` says :class:`Record` with no payload): nothing
   ran, so a retry may run it.
3. Once :meth:`~CallCourse.started`, the key is never simply given back, because
   the call may have had effects.  :meth:`~CallCourse.finished` records the
   response; a call its client cancelled is recorded as the ``cancelled`` error
   (:meth:`~CallCourse.cancelled`), so a retry under its key is told, not run.
   On a shared store, a call that is the only one on its stream is recorded by
   the append of its final event (:class:`AppendRecords`): one round trip, and
   "stored" means "sent".  Should that append fail,
   :meth:`~CallCourse.append_failed` records it on its own.
4. A course the process abandons mid-run (shutdown) is recorded with an
   ``interrupted`` error (:meth:`~CallCourse.abandoned`): a retry on any replica
   gets that error, never a second run and never an endless ``in_progress``.

Each method is valid in one phase only and raises :class:`LocalProtocolError`
otherwise, so a driver that skips a step finds out at once.  Time comes in as
``now``; the course holds no clock and does no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, NoReturn, Protocol

from ._errors import SERVER_ERROR, LocalProtocolError, Reason
from ._gate import CallStart, Execute, GatePass, Refuse, Replay, replay_as
from ._jsonrpc import Request, encode_error

#: The message of the ``interrupted`` error a call gets when the process running it
#: went away (shut down, or -- with a shared store -- stopped renewing its claim).
INTERRUPTED_MESSAGE: Final = (
    "the server running this call went away before it finished; the call may have had "
    "effects, and it will not be run again"
)


#: The message of the ``cancelled`` error stored for a call its client cancelled
#: after it started: what a retry under the same key is told.
CANCELLED_MESSAGE: Final = (
    "this call was cancelled by its client after it started; it may have had effects, "
    "and it will not be run again under this key"
)


class CoursePhase(enum.Enum):
    """Where a :class:`CallCourse` is."""

    CLAIMING = "claiming"  # gated: waiting for the store's answer to a claim
    READY = "ready"  # may run: not gated, or the claim is this delivery's
    ANSWERED = "answered"  # answered without running (a replay or a refusal)
    RUNNING = "running"  # the handler started: the key is never simply given back
    RECORDING = "recording"  # finished; the final append is to record the outcome
    DONE = "done"  # the outcome is recorded, or the key given back (or never held)


@dataclass(frozen=True, slots=True)
class Claim:
    """Ask the store to claim ``key`` for a call with ``fingerprint``."""

    key: str
    fingerprint: bytes


@dataclass(frozen=True, slots=True)
class ClaimAgain:
    """Another delivery runs the call: wait until ``until`` (or until the local
    delivery finishes, when it is local), then ask for :attr:`claim` again."""

    until: float
    claim: Claim


@dataclass(frozen=True, slots=True)
class Run:
    """Run the handler (call :meth:`CallCourse.started` first)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer with ``payload`` (a stored response, re-addressed); nothing runs."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Record:
    """Store ``payload`` as the call's outcome under ``key``; ``None`` gives the key
    back, so a later delivery may run the call."""

    key: str
    payload: bytes | None


@dataclass(frozen=True, slots=True)
class AppendRecords:
    """Append ``payload`` as the stream's final event, recording it under ``key`` in
    the same store operation; then :meth:`CallCourse.appended` (or, should the append
    fail, :meth:`CallCourse.append_failed`)."""

    key: str
    payload: bytes


_RUN: Final = Run()


class CallCourse:
    """One delivery of one request, from admission to its recorded outcome.

    ``key`` is the gate key while this delivery holds it (claimed and not yet
    recorded or given back), else ``None``; ``epoch`` is the stream epoch the store
    allocated with the claim (``None`` until then, and for ungated requests);
    ``replay`` is the answer of a course that runs nothing.  Once the handler has
    ended (:meth:`finished`, :meth:`cancelled`, :meth:`abandoned`) ``request`` keeps
    its id and method only: a course outlives its handler while its answer is
    written, and a slow peer must not keep the request's params alive meanwhile.
    """

    __slots__ = ("_claim_step", "_gate", "epoch", "key", "phase", "replay", "request")

    def __init__(
        self, req: Request, header_key: str | None, *, now: float, wait: float, retry_ms: int
    ) -> None:
        """Raises: RemoteProtocolError: 400 for a malformed ``Idempotency-Key``."""
        self.request = req
        self.epoch: str | None = None
        self.replay: bytes | None = None
        #: The gate key this delivery holds, if it holds one.
        self.key: str | None = None
        if req.method == "tools/call":
            gate = GatePass(req, header_key, now=now, wait=wait, retry_ms=retry_ms)
            self._gate: GatePass | None = gate
            self._claim_step: Claim | None = Claim(gate.key, gate.fingerprint)
            self.phase = CoursePhase.CLAIMING
        else:
            self._gate = self._claim_step = None
            self.phase = CoursePhase.READY

    @classmethod
    def answered(cls, req: Request, payload: bytes) -> CallCourse:
        """A course that runs nothing and answers ``payload`` (e.g. a batch entry's
        refusal, which the batch's response carries)."""
        course = cls.__new__(cls)
        course.request, course.epoch, course.replay = req, None, payload
        course._gate, course.key, course.phase = None, None, CoursePhase.ANSWERED
        course._claim_step = None
        return course

    @property
    def gated(self) -> bool:
        """Is this a ``tools/call``, which runs only after passing the gate?"""
        return self._gate is not None

    def first(self) -> Claim | Run:
        """The first step: claim the key (a ``tools/call``) or run."""
        if self.phase is CoursePhase.READY:
            return _RUN
        return self._claim()

    def claimed(self, start: CallStart, now: float, *, local: bool) -> Run | Answer | ClaimAgain:
        """The store answered the claim with ``start``; ``local``: the delivery
        running the call, if one is, is in this process (its end can be awaited).

        Raises:
            RemoteProtocolError: 409 ``in_progress`` past the wait, 422
                ``idempotency_key_reused``, 409 ``outcome_evicted``.
        """
        if self.phase is not CoursePhase.CLAIMING:
            self._misuse(CoursePhase.CLAIMING, "claimed")
        assert self._gate is not None
        decision = self._gate.decide(start, now, local=local)
        if isinstance(decision, Execute):
            self.epoch, self.key, self.phase = decision.epoch, self._gate.key, CoursePhase.READY
            return _RUN
        if isinstance(decision, Replay):
            self.epoch, self.phase = decision.epoch, CoursePhase.ANSWERED
            self.replay = replay_as(decision.payload, self.request.id)
            return Answer(self.replay)
        if isinstance(decision, Refuse):
            self.phase = CoursePhase.DONE
            raise decision.error
        return ClaimAgain(decision.until, self._claim())

    def give_back(self) -> Record | None:
        """This course will not start (its POST was refused, its stream never opened,
        its id is already running): the key to give back, if it holds one.

        Nothing ran, so a retry may run the call.  A course that already started
        is not given back (see :meth:`abandoned`); ``None`` then, and for a course
        that holds no key.
        """
        if self.phase in (CoursePhase.RUNNING, CoursePhase.RECORDING):
            return None
        key = self.key
        self.phase, self.key = CoursePhase.DONE, None
        return Record(key, None) if key is not None else None

    def started(self) -> None:
        """The handler is about to run: from now on the key is recorded, not given back."""
        if self.phase is not CoursePhase.READY:
            self._misuse(CoursePhase.READY, "started")
        self.phase = CoursePhase.RUNNING

    def finished(
        self, payload: bytes | None, *, final_append: bool
    ) -> Record | AppendRecords | None:
        """The handler ended with ``payload`` (``None``: the client cancelled it).

        ``final_append``: the response's stream is in a shared store and carries
        this call alone, so its final append can record the outcome too.  Returns
        what to store (``None`` for an ungated request).
        """
        if self.phase is not CoursePhase.RUNNING:
            self._misuse(CoursePhase.RUNNING, "finished")
        self._let_go_of_params()
        key = self.key
        if key is None:
            self.phase = CoursePhase.DONE
            return None
        if payload is not None and final_append:
            self.phase = CoursePhase.RECORDING
            return AppendRecords(key, payload)
        self.phase, self.key = CoursePhase.DONE, None
        return Record(key, payload)

    def appended(self) -> None:
        """The final append of :class:`AppendRecords` landed: the outcome is stored."""
        if self.phase is not CoursePhase.RECORDING:
            self._misuse(CoursePhase.RECORDING, "appended")
        self.phase, self.key = CoursePhase.DONE, None

    def append_failed(self, payload: bytes) -> Record:
        """The final append did not land: record ``payload`` on its own."""
        if self.phase is not CoursePhase.RECORDING:
            self._misuse(CoursePhase.RECORDING, "append_failed")
        key = self.key
        assert key is not None
        self.phase, self.key = CoursePhase.DONE, None
        return Record(key, payload)

    def abandoned(self) -> Record | None:
        """The process is going away under the running call (not the client's
        cancellation): record an ``interrupted`` error under its key, never release it.

        The payload is also the call's answer where it can still be sent (e.g. as a
        shared stream's final event).  ``None`` for an ungated request.
        """
        if self.phase is not CoursePhase.RUNNING:
            self._misuse(CoursePhase.RUNNING, "abandoned")
        self._let_go_of_params()
        key = self.key
        self.phase, self.key = CoursePhase.DONE, None
        return Record(key, interrupted(self.request)) if key is not None else None

    def cancelled(self) -> Record | None:
        """The client cancelled the running call (``notifications/cancelled``, or its
        session ended): record the ``cancelled`` error under its key, never release it.

        The handler ran, so it may have had effects: a retry under the same key is
        told so and never runs the call again (at most once per key).  No response
        goes to the cancelled request itself.  ``None`` for an ungated request.
        """
        if self.phase is not CoursePhase.RUNNING:
            self._misuse(CoursePhase.RUNNING, "cancelled")
        self._let_go_of_params()
        key = self.key
        self.phase, self.key = CoursePhase.DONE, None
        return Record(key, cancelled(self.request)) if key is not None else None

    def _let_go_of_params(self) -> None:
        self.request = self.request.without_params()

    def _claim(self) -> Claim:
        assert self._claim_step is not None
        return self._claim_step

    def _misuse(self, phase: CoursePhase, step: str) -> NoReturn:
        raise LocalProtocolError(f"{step}() in phase {self.phase.value}, not {phase.value}")


def cancelled(req: Request) -> bytes:
    """The ``cancelled`` error stored for ``req``: its client cancelled it mid-run."""
    return encode_error(req.id, SERVER_ERROR, CANCELLED_MESSAGE, {"reason": str(Reason.CANCELLED)})


def interrupted(req: Request) -> bytes:
    """The ``interrupted`` error answering ``req``: its process went away mid-run."""
    return encode_error(
        req.id, SERVER_ERROR, INTERRUPTED_MESSAGE, {"reason": str(Reason.INTERRUPTED)}
    )


# ---------------------------------------------------------------- the gate's loop
@dataclass(slots=True)
class ClaimCall:
    """Ask the store to claim ``claim.key`` for ``request`` (under ``token``).

    Answer: ``(CallStart, local)`` -- the store's answer, and whether a delivery of
    this key runs in this process.  Raise the refusal for a store that refuses
    (the session is gone, no room for the key, a fenced channel)."""

    claim: Claim
    request: Request
    token: tuple[int, str] | None


@dataclass(slots=True)
class HoldCall:
    """``key`` is this delivery's: note that it runs here (answer: None)."""

    key: str


@dataclass(slots=True)
class WaitForCall:
    """Wait until ``until`` at most for the delivery running ``key`` (its end, if
    ``local``); answer: None.  The course then claims again."""

    key: str
    until: float
    local: bool


#: The gate loop's steps (:func:`gate`), for a runtime's ``isinstance`` dispatch.
GATE_STEPS: Final = (ClaimCall, WaitForCall, HoldCall)


class _Clock(Protocol):
    @property
    def now(self) -> float: ...


def gate(
    course: CallCourse, token: tuple[int, str] | None, clock: _Clock
) -> Generator[ClaimCall | WaitForCall | HoldCall, Any, None]:
    """The idempotency gate's loop as effects: claim, wait while another delivery
    runs the call, claim again -- until the course may run or has its answer.

    The one place the loop around :meth:`CallCourse.claimed` is written; every
    course that gates a call (session-era and sessionless) delegates to it.

    Raises:
        RemoteProtocolError: the gate's refusal (409 ``in_progress`` past the wait,
            422 ``idempotency_key_reused``, 409 ``outcome_evicted``, …).
    """
    step: Claim | ClaimAgain | Run | Answer = course.first()
    local = False  # the delivery running the call is in this process
    while True:
        if isinstance(step, Run):
            if course.key is not None:
                yield HoldCall(course.key)
            return
        if isinstance(step, Answer):
            return
        if isinstance(step, ClaimAgain):
            yield WaitForCall(step.claim.key, step.until, local)
            step = step.claim
        start: CallStart
        start, local = yield ClaimCall(step, course.request, token)
        step = course.claimed(start, clock.now, local=local)
