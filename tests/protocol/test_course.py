"""CallCourse: the order of a request's steps, and the at-most-once promise it keeps.

Unit tests walk each path (run, replay, wait, refusal, give back, the final append,
abandonment).  The state machine runs several deliveries of one call at once over a
real :class:`CallLedger`, in any interleaving a driver could produce, and checks what
a client may rely on: a call's handler starts again only after the key was given
back with nothing recorded (never started, or cancelled by the client); a delivery
that replays gets the recorded outcome, re-addressed; and once every delivery is
done, no claim is left running.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._course import Answer, ClaimAgain, Run
from weir.protocol._errors import LocalProtocolError
from weir.protocol.course import (
    INTERRUPTED_MESSAGE,
    AppendRecords,
    CallCourse,
    Claim,
    CoursePhase,
    Record,
)
from weir.protocol.gate import CallLedger, CallOutcome, CallStart
from weir.protocol.jsonrpc import Request

CALL = {"name": "echo", "arguments": {"text": "hi"}}


def _req(rid: int | str = 1, method: str = "tools/call", params: object = CALL) -> Request:
    return Request(method=method, id=rid, params=params)  # type: ignore[arg-type]


def _course(rid: int | str = 1, key: str | None = None, **kw: object) -> CallCourse:
    return CallCourse(_req(rid, **kw), key, now=0.0, wait=5.0, retry_ms=1000)  # type: ignore[arg-type]


def _phase(course: CallCourse) -> CoursePhase:
    return course.phase  # (read afresh: mypy narrows the attribute across calls)


def _response(rid: int | str, text: str) -> bytes:
    return msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "result": {"text": text}})


def test_an_ungated_request_runs_at_once_and_records_nothing() -> None:
    course = _course(method="tools/list", params=None)
    assert not course.gated
    assert isinstance(course.first(), Run)
    course.started()
    assert course.finished(b"{}", final_append=True) is None
    assert course.phase is CoursePhase.DONE


def test_a_granted_claim_runs_then_records_the_response() -> None:
    course = _course(key="k1")
    claim = course.first()
    assert isinstance(claim, Claim) and claim.key == "h:k1" and len(claim.fingerprint) == 32
    assert course.key is None  # asked for, not yet held
    step = course.claimed(CallStart(CallOutcome.EXECUTE, "e7"), 0.0, local=False)
    assert isinstance(step, Run)
    assert course.key == "h:k1" and course.epoch == "e7"
    course.started()
    assert course.finished(b"resp", final_append=False) == Record("h:k1", b"resp")
    assert course.key is None and course.phase is CoursePhase.DONE


@pytest.mark.parametrize("end", ["finished", "cancelled", "abandoned"])
def test_a_course_whose_handler_ended_keeps_only_the_requests_id_and_method(end: str) -> None:
    # A course outlives its handler while its answer is written (a slow peer: up to
    # the liveness timeout); the arguments are not needed and must not stay with it.
    course = _course(rid=7, key="k1")
    course.claimed(CallStart(CallOutcome.EXECUTE, "e7"), 0.0, local=False)
    course.started()
    assert course.request.params == CALL  # the handler's, while it runs
    if end == "finished":
        step = course.finished(b"resp", final_append=False)
    else:
        step = course.cancelled() if end == "cancelled" else course.abandoned()
    assert course.request == Request(id=7, method="tools/call")
    assert isinstance(step, Record) and step.payload is not None
    if end != "finished":  # the error stored in its place answers the same id
        assert msgspec.json.decode(step.payload)["id"] == 7


def test_a_done_call_replays_re_addressed_and_never_runs() -> None:
    course = _course(rid="retry-2")
    course.first()
    stored = _response(1, "once")
    step = course.claimed(CallStart(CallOutcome.DONE, "e1", stored), 0.0, local=False)
    assert isinstance(step, Answer)
    assert msgspec.json.decode(step.payload)["id"] == "retry-2"
    assert course.replay == step.payload and course.key is None
    with pytest.raises(LocalProtocolError):
        course.started()
    assert course.give_back() is None  # holds nothing to give back


def test_a_running_call_elsewhere_is_claimed_again_with_backoff_then_409() -> None:
    course = _course()
    claim = course.first()
    running = CallStart(CallOutcome.RUNNING, "e1")
    waits = []
    now = 0.0
    for _ in range(100):  # bounded: the wait is 5 s, the backoff at most 250 ms
        try:
            step = course.claimed(running, now, local=False)
        except RemoteProtocolError as exc:
            assert exc.http_status == 409 and exc.reason is Reason.IN_PROGRESS
            assert exc.retry_after_ms == 1000
            break
        assert isinstance(step, ClaimAgain) and step.claim == claim
        waits.append(step.until - now)
        now = step.until
    else:
        pytest.fail("never gave up")
    assert waits[0] == pytest.approx(0.01) and max(waits) <= 0.25 + 1e-9
    assert now == pytest.approx(5.0)
    assert course.phase is CoursePhase.DONE


def test_a_local_running_call_is_awaited_until_the_give_up_instant() -> None:
    course = _course()
    course.first()
    step = course.claimed(CallStart(CallOutcome.RUNNING, "e1"), 1.0, local=True)
    assert isinstance(step, ClaimAgain) and step.until == 5.0


@pytest.mark.parametrize(
    ("outcome", "status", "reason"),
    [
        (CallOutcome.MISMATCH, 422, Reason.IDEMPOTENCY_KEY_REUSED),
        (CallOutcome.EVICTED, 409, Reason.OUTCOME_EVICTED),
    ],
)
def test_refusals_raise_and_hold_nothing(outcome: CallOutcome, status: int, reason: Reason) -> None:
    course = _course()
    course.first()
    with pytest.raises(RemoteProtocolError) as caught:
        course.claimed(CallStart(outcome, "e1"), 0.0, local=False)
    assert caught.value.http_status == status and caught.value.reason is reason
    assert course.key is None and course.give_back() is None


def test_a_claimed_course_that_never_starts_gives_its_key_back_once() -> None:
    course = _course()
    course.first()
    course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)
    assert course.give_back() == Record("i:1", None)
    assert course.give_back() is None  # and only once
    with pytest.raises(LocalProtocolError):
        course.started()


def test_a_started_course_is_never_given_back() -> None:
    course = _course()
    course.first()
    course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)
    course.started()
    assert course.give_back() is None
    assert course.key == "i:1"  # still held: its outcome is still to be recorded


def test_a_client_cancellation_releases_the_key() -> None:
    course = _course()
    course.first()
    course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)
    course.started()
    assert course.finished(None, final_append=True) == Record("i:1", None)


def test_the_final_append_records_and_a_failed_one_records_alone() -> None:
    for fails in (False, True):
        course = _course()
        course.first()
        course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)
        course.started()
        assert course.finished(b"r", final_append=True) == AppendRecords("i:1", b"r")
        assert course.key == "i:1"
        assert course.phase is CoursePhase.RECORDING
        if fails:
            assert course.append_failed(b"r") == Record("i:1", b"r")
        else:
            course.appended()
        assert course.key is None
        assert _phase(course) is CoursePhase.DONE
        with pytest.raises(LocalProtocolError):
            course.appended()


def test_an_abandoned_call_records_interrupted_never_a_release() -> None:
    course = _course(rid=9)
    course.first()
    course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)
    course.started()
    record = course.abandoned()
    assert record is not None and record.key == "i:9" and record.payload is not None
    error = msgspec.json.decode(record.payload)
    assert error["id"] == 9 and error["error"]["message"] == INTERRUPTED_MESSAGE
    assert error["error"]["data"]["reason"] == "interrupted"


def test_steps_out_of_order_are_the_drivers_bug() -> None:
    course = _course()
    with pytest.raises(LocalProtocolError, match="started"):
        course.started()  # before the claim was granted
    with pytest.raises(LocalProtocolError):
        course.finished(b"x", final_append=False)
    course.first()
    course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)
    with pytest.raises(LocalProtocolError):
        course.claimed(CallStart(CallOutcome.EXECUTE, "e1"), 0.0, local=False)


def test_an_answered_course_carries_its_payload_and_nothing_else() -> None:
    course = CallCourse.answered(_req(3), b"refusal")
    assert course.replay == b"refusal" and course.phase is CoursePhase.ANSWERED
    assert course.key is None and course.give_back() is None


def test_a_malformed_idempotency_key_is_a_400() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        _course(key="")
    assert caught.value.http_status == 400


class Deliveries(RuleBasedStateMachine):
    """Up to five deliveries of one call (one key), driven in any order over a ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = CallLedger()
        self.courses: list[CallCourse] = []
        self.steps: dict[int, Claim | ClaimAgain | Run | Answer] = {}
        self.now = 0.0
        self.running = 0  # handlers running right now
        self.recorded: bytes | None = None  # the outcome in the ledger, once recorded
        self.runs_since_release = 0

    def _open(self, state: CoursePhase) -> list[int]:
        return [i for i, c in enumerate(self.courses) if c.phase is state]

    @precondition(lambda self: len(self.courses) < 5)
    @rule()
    def deliver(self) -> None:
        course = CallCourse(_req(len(self.courses)), "k", now=self.now, wait=1.0, retry_ms=10)
        self.steps[len(self.courses)] = course.first()
        self.courses.append(course)

    @rule(data=st.data())
    def ask_the_store(self, data: st.DataObject) -> None:
        waiting = self._open(CoursePhase.CLAIMING)
        if not waiting:
            return
        i = data.draw(st.sampled_from(waiting))
        step = self.steps[i]
        claim = step.claim if isinstance(step, ClaimAgain) else step
        assert isinstance(claim, Claim)
        outcome, payload = self.ledger.begin(claim.key, claim.fingerprint)
        try:
            self.steps[i] = self.courses[i].claimed(
                CallStart(outcome, "e", payload), self.now, local=True
            )
        except RemoteProtocolError as exc:
            assert exc.reason is Reason.IN_PROGRESS  # the only refusal one call can get
            return
        got = self.steps[i]
        if isinstance(got, Answer):
            assert self.recorded is not None
            expected = msgspec.json.decode(self.recorded)
            expected["id"] = i
            assert msgspec.json.decode(got.payload) == expected

    @rule(seconds=st.sampled_from([0.0, 0.1, 0.6]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    def _store(self, step: Record | AppendRecords | None) -> None:
        if isinstance(step, Record):
            self.ledger.finish(step.key, step.payload)
            if step.payload is not None:
                self.recorded = step.payload
            else:
                self.runs_since_release = 0

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        ready = self._open(CoursePhase.READY)
        if ready:
            self.courses[data.draw(st.sampled_from(ready))].started()
            self.running += 1
            self.runs_since_release += 1

    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        # Also asked of started courses: a driver may not know, and it must do nothing.
        some = self._open(CoursePhase.READY) + self._open(CoursePhase.RUNNING)
        if some:
            self._store(self.courses[data.draw(st.sampled_from(some))].give_back())

    @rule(data=st.data(), how=st.sampled_from(["ok", "cancelled", "append", "abandoned"]))
    def end(self, data: st.DataObject, how: str) -> None:
        running = self._open(CoursePhase.RUNNING)
        if not running:
            return
        i = data.draw(st.sampled_from(running))
        course = self.courses[i]
        self.running -= 1
        if how == "abandoned":
            self._store(course.abandoned())
            return
        payload = None if how == "cancelled" else _response(i, "ran")
        step = course.finished(payload, final_append=how == "append")
        if isinstance(step, AppendRecords):
            # The final append stores the outcome (or fails, and it is recorded alone).
            if data.draw(st.booleans()):
                self.ledger.finish(step.key, step.payload)
                self.recorded = step.payload
                course.appended()
            else:
                self._store(course.append_failed(step.payload))
        else:
            self._store(step)

    @invariant()
    def at_most_once(self) -> None:
        # Between two releases the handler starts at most once, and never after an
        # outcome was recorded.
        assert self.runs_since_release <= 1
        assert self.running <= 1

    @invariant()
    def no_claim_outlives_its_deliveries(self) -> None:
        if all(c.phase in (CoursePhase.DONE, CoursePhase.ANSWERED) for c in self.courses):
            outcome, _ = self.ledger.begin("k", b"probe")
            assert outcome is not CallOutcome.RUNNING
            if outcome is CallOutcome.EXECUTE:
                self.ledger.finish("k", None)  # undo the probe's claim


TestDeliveries = Deliveries.TestCase
