"""A legacy (2024-11-05 HTTP+SSE) POST's course, driven step by step with no runtime:
every effect sequence asserted as data (admitted, refused at admission, refused by
the gate, gate replay, store down after the claim, notifications, batches, a session
without its LEGACY stream), and the course of the stream that opens a legacy session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._http_events import Headers
from weir.protocol.course import ClaimCall, HoldCall, WaitForCall
from weir.protocol.gate import CallOutcome, CallStart
from weir.protocol.jsonrpc import Notification, Request, Response
from weir.protocol.legacy import (
    NEW_LEGACY_SESSION,
    AdmitLegacyBatch,
    LegacyMessages,
    LegacyPostCourse,
    LegacyStreamCourse,
    OpenLegacyStream,
    RunOnLegacy,
)
from weir.protocol.lifecycle import ForgetSession
from weir.protocol.post import (
    ACCEPTED,
    ATTACH_WRITER,
    AdmitRequests,
    AllocateEpoch,
    Finished,
    GiveBack,
    LoadSession,
    Mail,
    PostRules,
)
from weir.protocol.streams import StreamKind, StreamLog, StreamTable

SID = "s" * 22
EP = "0000000c"


def load(rid: int | None = 1) -> LoadSession:
    """The legacy POST's first effect: its session, re-read (refusals answer ``rid``)."""
    return LoadSession(verify=True, request_id=rid)


def legacy_table(kind: StreamKind = StreamKind.LEGACY) -> StreamTable:
    table = StreamTable()
    table.add(StreamLog("0000000a", StreamKind.REQUEST))  # (not the one: a request stream)
    table.add(StreamLog(EP, kind, emit_ids=False))
    return table


@dataclass
class FakeSession:
    running: set[Any] = field(default_factory=set)
    pending: set[Any] = field(default_factory=set)
    streams: StreamTable = field(default_factory=legacy_table)


def post(*messages: Any, batch: bool = False, **headers: str) -> LegacyMessages:
    return LegacyMessages(
        session_id=SID, messages=list(messages), is_batch=batch, headers=Headers.of(**headers)
    )


def call(rid: int = 1) -> Request:
    return Request(id=rid, method="tools/call", params={"name": "echo", "arguments": {}})


def started(outcome: CallOutcome, payload: bytes | None = None) -> tuple[CallStart, bool]:
    return CallStart(outcome, "ep1", payload), False


class Driver:
    def __init__(self, course: LegacyPostCourse) -> None:
        self.course = course
        self.effects: list[Any] = []
        self.now = 0.0
        self.effect: Any = course.start(self.now)

    def step(self, answer: object = None) -> Any:
        assert self.effect is not None
        self.effects.append(self.effect)
        self.effect = self.course.deliver(answer, self.now)
        return self.effect

    def fail(self, exc: BaseException) -> Any:
        assert self.effect is not None
        self.effects.append(self.effect)
        self.effect = self.course.fail(exc, self.now)
        return self.effect


RULES = PostRules()


def test_an_admitted_call_runs_on_the_legacy_stream_before_the_202() -> None:
    d = Driver(LegacyPostCourse(post(call()), RULES))
    assert d.effect == load()
    assert d.step(FakeSession()) == AdmitRequests(1, 1, EP)  # under the LEGACY stream
    claim = d.step(True)
    assert isinstance(claim, ClaimCall) and claim.token is None
    hold = d.step(started(CallOutcome.EXECUTE))
    assert isinstance(hold, HoldCall) and hold.key == claim.claim.key
    run = d.step()
    assert isinstance(run, RunOnLegacy) and run.epoch == EP
    assert run.course.request.id == 1 and run.course.replay is None
    assert d.step() is ACCEPTED
    assert d.step() is None


def test_an_ungated_request_needs_no_claim() -> None:
    d = Driver(LegacyPostCourse(post(Request(id=2, method="initialize", params={})), RULES))
    d.step(FakeSession())
    run = d.step(True)
    assert isinstance(run, RunOnLegacy) and run.course.request.method == "initialize"


def test_refused_at_admission_nothing_runs_and_nothing_is_given_back() -> None:
    d = Driver(LegacyPostCourse(post(call()), RULES))
    d.step(FakeSession())
    refusal = RemoteProtocolError(
        "half-open", http_status=429, reason=Reason.STREAM_HALF_OPEN, request_id=1
    )
    with pytest.raises(RemoteProtocolError) as err:
        d.fail(refusal)
    assert err.value is refusal
    assert d.effects == [load(), AdmitRequests(1, 1, EP)]


def test_gate_replay_runs_nothing_and_is_handed_over() -> None:
    stored = b'{"jsonrpc":"2.0","id":99,"result":{"content":[]}}'
    d = Driver(LegacyPostCourse(post(call(rid=5)), RULES))
    d.step(FakeSession())
    d.step(True)
    run = d.step(started(CallOutcome.DONE, stored))
    assert isinstance(run, RunOnLegacy)  # no HoldCall: the key is not this delivery's
    assert run.course.replay is not None and b'"id":5' in run.course.replay
    assert d.step() is ACCEPTED


def test_a_call_still_running_elsewhere_waits_then_is_refused_409() -> None:
    d = Driver(LegacyPostCourse(post(call()), PostRules(in_progress_wait=1.0)))
    d.step(FakeSession())
    d.step(True)
    wait = d.step((CallStart(CallOutcome.RUNNING, "ep1"), True))
    assert isinstance(wait, WaitForCall) and wait.local and wait.until == 1.0
    d.now = 2.0
    assert isinstance(d.step(), ClaimCall)
    assert d.step((CallStart(CallOutcome.RUNNING, "ep1"), True)) == Finished(1, EP)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.reason is Reason.IN_PROGRESS and err.value.http_status == 409


def test_a_failure_after_the_claim_ends_the_reservation_and_gives_the_key_back() -> None:
    d = Driver(LegacyPostCourse(post(call()), RULES))
    d.step(FakeSession())
    d.step(True)
    hold = d.step(started(CallOutcome.EXECUTE))
    boom = OSError("store unavailable")
    assert d.fail(boom) == Finished(1, EP)
    assert d.step() == GiveBack(hold.key)
    with pytest.raises(OSError) as err:
        d.step()
    assert err.value is boom


def test_a_reused_key_is_refused_422_after_the_reservation_ends() -> None:
    d = Driver(LegacyPostCourse(post(call(), idempotency_key="k1"), RULES))
    d.step(FakeSession())
    claim = d.step(True)
    assert (
        isinstance(claim, ClaimCall) and claim.claim.key == "h:k1"
    )  # the header's key, not the id
    assert d.step(started(CallOutcome.MISMATCH)) == Finished(1, EP)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.reason is Reason.IDEMPOTENCY_KEY_REUSED


def test_notifications_and_answers_are_mail_then_202() -> None:
    note = Notification(method="notifications/roots/list_changed")
    session = FakeSession(pending={"weir:r1:1"})
    msgs: list[Any] = [Notification(method="notifications/initialized"), note]
    msgs.append(Response(id="weir:r1:1", result={}))
    d = Driver(LegacyPostCourse(post(*msgs, batch=True), RULES))
    assert d.effect == load(None)  # (no request: a refusal answers no id)
    mail = d.step(session)
    assert isinstance(mail, Mail) and mail.initialized and mail.notes == [note]
    assert [a.id for a in mail.answer_here] == ["weir:r1:1"] and mail.forward == []
    assert d.step() is ACCEPTED


def test_a_batch_is_admitted_entry_by_entry_after_the_202() -> None:
    d = Driver(LegacyPostCourse(post(call(1), Request(id=2, method="tools/list")), RULES))
    batch = d.step(FakeSession())
    assert isinstance(batch, AdmitLegacyBatch) and batch.epoch == EP
    assert [r.id for r in batch.requests] == [1, 2]
    assert d.step() is ACCEPTED


def test_a_session_without_its_legacy_stream_is_404() -> None:
    d = Driver(LegacyPostCourse(post(call()), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(FakeSession(streams=legacy_table(StreamKind.STANDALONE)))
    assert err.value.http_status == 404 and err.value.request_id == 1
    assert d.effects == [load()]


def test_a_refused_batch_answers_no_entry_s_id() -> None:
    d = Driver(LegacyPostCourse(post(call(1), call(2), batch=True), RULES))
    with pytest.raises(RemoteProtocolError) as err:
        d.step(FakeSession(streams=legacy_table(StreamKind.STANDALONE)))
    assert err.value.http_status == 404 and err.value.request_id is None
    assert d.effects == [load(None)]  # (so a refusal for want of the store is id null too)


def test_a_session_that_ends_during_admission_is_404_and_nothing_is_accounted() -> None:
    d = Driver(LegacyPostCourse(post(call(rid=3)), RULES))
    d.step(FakeSession())
    with pytest.raises(RemoteProtocolError) as err:
        d.step(False)  # admission answers: the session ended while the request waited
    assert err.value.http_status == 404 and err.value.request_id == 3
    assert d.effects == [load(3), AdmitRequests(1, 3, EP)]  # nothing admitted: no Finished


# ---------------------------------------------------------------- the stream's course
def test_a_legacy_stream_opens_a_session_names_its_post_url_and_ends_it_with_the_stream() -> None:
    course = LegacyStreamCourse("/messages")
    assert course.start(0.0) is NEW_LEGACY_SESSION
    assert course.deliver(SID, 0.0) == AllocateEpoch(0)
    assert course.deliver(EP, 0.0) == OpenLegacyStream(EP, f"/messages?session_id={SID}")
    assert course.deliver(None, 0.0) is ATTACH_WRITER
    # The writer returned (the client went away, or the session was torn down):
    # the session goes with its stream.
    assert course.deliver(None, 5.0) == ForgetSession(SID)
    assert course.deliver(None, 5.0) is None


@pytest.mark.parametrize("failing", ["epoch", "open", "writer"])
def test_a_legacy_stream_that_fails_on_the_way_forgets_its_session_then_fails(
    failing: str,
) -> None:
    course = LegacyStreamCourse("/messages")
    course.start(0.0)
    answers: list[object] = [SID, EP, None]
    steps = {"epoch": 1, "open": 2, "writer": 3}[failing]
    for answer in answers[: steps - 1]:
        course.deliver(answer, 0.0)
    course.deliver(answers[steps - 1], 0.0)
    gone = ConnectionResetError("peer went away")
    assert course.fail(gone, 1.0) == ForgetSession(SID)
    with pytest.raises(ConnectionResetError):
        course.deliver(None, 1.0)


def test_a_legacy_stream_whose_session_is_refused_has_nothing_to_forget() -> None:
    course = LegacyStreamCourse("/messages")
    course.start(0.0)
    full = RemoteProtocolError("full", http_status=503, reason=Reason.SESSION_LIMIT)
    with pytest.raises(RemoteProtocolError) as refused:
        course.fail(full, 0.0)
    assert refused.value is full
