"""A session-era POST's course, driven step by step with no runtime: every effect
sequence asserted as data (admitted, refused, waiting, replayed, store down,
client gone, JSON mode, notifications only, fencing, batches)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from weir.protocol import PostMessages, Reason, RemoteProtocolError
from weir.protocol._endpoint import RequestContext
from weir.protocol._http_events import Headers
from weir.protocol.course import ClaimCall, HoldCall, WaitForCall
from weir.protocol.gate import CallOutcome, CallStart
from weir.protocol.jsonrpc import Notification, Request, Response
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
    Effect,
    Finished,
    GiveBack,
    LoadSession,
    Mail,
    OpenRequestStream,
    PostCourse,
    PostRules,
    Rebind,
    RunBatch,
    RunCalls,
    StartEntry,
)

SID = "s" * 22


@dataclass(frozen=True)
class Channel:
    generation: int = 1
    secret: str = "sekrit"
    bound: bool = False


@dataclass
class FakeSession:
    """A session as a runtime would answer :class:`LoadSession` with (plain data)."""

    running: set[Any] = field(default_factory=set)
    pending: set[Any] = field(default_factory=set)
    channel: Channel | None = None
    protocol_version: str = "2025-11-25"


def post(*messages: Any, batch: bool = False, **headers: str) -> PostMessages:
    ctx = RequestContext(
        session_id=SID, protocol_version="2025-11-25", headers=Headers.of(**headers)
    )
    return PostMessages(ctx=ctx, messages=list(messages), is_batch=batch)


def call(rid: int = 1, name: str = "echo") -> Request:
    return Request(id=rid, method="tools/call", params={"name": name, "arguments": {}})


def started(outcome: CallOutcome, payload: bytes | None = None) -> tuple[CallStart, bool]:
    return CallStart(outcome, "ep1", payload), False


def kinds(effects: list[Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


class Driver:
    """Delivers scripted answers; records every effect the course asks for."""

    def __init__(self, course: PostCourse, session: FakeSession | None = None) -> None:
        self.course = course
        self.session = session or FakeSession()
        self.effects: list[Effect] = []
        self.now = 0.0
        self.effect = course.start(self.now)

    def step(self, answer: object = None) -> Effect | None:
        assert self.effect is not None
        self.effects.append(self.effect)
        self.effect = self.course.deliver(answer, self.now)
        return self.effect

    def fail(self, exc: BaseException) -> Effect | None:
        assert self.effect is not None
        self.effects.append(self.effect)
        self.effect = self.course.fail(exc, self.now)
        return self.effect

    def run(self, answers: dict[type, object] | None = None) -> list[Effect]:
        """Answer every effect (a session for LoadSession) until the course ends."""
        answers = answers or {}
        for _ in range(64):
            e = self.effect
            if e is None:
                return self.effects
            if isinstance(e, LoadSession):
                self.step(self.session)
            elif type(e) in answers:
                self.step(answers[type(e)])
            elif isinstance(e, AdmitRequests):
                self.step(True)
            else:
                self.step(None)
        raise AssertionError("the course did not end within 64 effects")


RULES = PostRules()


def test_admitted_call_on_an_sse_stream() -> None:
    d = Driver(PostCourse(post(call()), RULES))
    effects = d.run({ClaimCall: started(CallOutcome.EXECUTE), AllocateEpoch: "ep9"})
    assert kinds(effects) == [
        "LoadSession",
        "EnterRequest",
        "AdmitRequests",
        "ClaimCall",
        "HoldCall",
        "OpenRequestStream",
        "RunCalls",
        "AttachWriter",
    ]
    load, admit, stream, run = effects[0], effects[2], effects[5], effects[6]
    assert load == LoadSession(verify=False, request_id=1)  # a lone call: its claim checks
    assert isinstance(admit, AdmitRequests) and admit.n == 1 and admit.lane is d.course.lane
    # The claim brought the epoch: no separate allocation; the stream takes the lane.
    assert isinstance(stream, OpenRequestStream)
    assert (stream.epoch, stream.lane, stream.outstanding) == ("ep1", d.course.lane, 1)
    assert isinstance(run, RunCalls) and run.courses[0].key is not None and run.primes


def test_an_ungated_request_allocates_its_epoch_and_is_verified() -> None:
    d = Driver(PostCourse(post(Request(id=7, method="tools/list")), RULES))
    effects = d.run({AllocateEpoch: "ep9"})
    assert kinds(effects) == [
        "LoadSession",
        "EnterRequest",
        "AdmitRequests",
        "AllocateEpoch",
        "OpenRequestStream",
        "RunCalls",
        "AttachWriter",
    ]
    assert effects[0] == LoadSession(verify=True, request_id=7)
    assert effects[3] == AllocateEpoch(0)
    stream = effects[4]
    assert isinstance(stream, OpenRequestStream) and stream.epoch == "ep9"


def test_half_open_refusal_at_admission_undoes_nothing() -> None:
    d = Driver(PostCourse(post(call()), RULES))
    d.step(d.session)
    d.step()  # ENTER_REQUEST
    assert isinstance(d.effect, AdmitRequests)
    refusal = RemoteProtocolError(
        "half-open", http_status=429, reason=Reason.STREAM_HALF_OPEN, request_id=1
    )
    with pytest.raises(RemoteProtocolError) as err:
        d.fail(refusal)
    assert err.value is refusal  # nothing was admitted, so nothing to give back


def test_waiting_for_credit_is_just_a_later_answer() -> None:
    # Admission that waits is the runtime's business: the course's next step is
    # the same whenever the answer comes.
    d = Driver(PostCourse(post(call()), RULES))
    d.step(d.session)
    d.step()
    d.now = 30.0
    assert isinstance(d.step(True), ClaimCall)


def test_gate_replay_runs_nothing() -> None:
    stored = b'{"jsonrpc":"2.0","id":99,"result":{"content":[]}}'
    d = Driver(PostCourse(post(call(rid=5)), RULES))
    effects = d.run({ClaimCall: started(CallOutcome.DONE, stored)})
    assert "HoldCall" not in kinds(effects)
    run = next(e for e in effects if isinstance(e, RunCalls))
    course = run.courses[0]
    assert course.replay is not None and b'"id":5' in course.replay  # re-addressed
    assert course.key is None


def test_gate_wait_then_replay() -> None:
    d = Driver(PostCourse(post(call()), PostRules(in_progress_wait=10.0)))
    d.step(d.session)
    d.step()
    d.step(True)  # admitted
    assert isinstance(d.effect, ClaimCall)
    waited = d.step((CallStart(CallOutcome.RUNNING, "ep1"), True))
    assert isinstance(waited, WaitForCall) and waited.local and waited.until == 10.0
    d.now = 2.0
    again = d.step()
    assert isinstance(again, ClaimCall) and again.claim.key == waited.key
    after = d.step(started(CallOutcome.DONE, b'{"jsonrpc":"2.0","id":1,"result":{}}'))
    assert isinstance(after, OpenRequestStream)


def test_gate_wait_runs_out_refuses_409_and_ends_the_reservation() -> None:
    d = Driver(PostCourse(post(call()), PostRules(in_progress_wait=1.0)))
    d.step(d.session)
    d.step()
    d.step(True)  # admitted
    d.step((CallStart(CallOutcome.RUNNING, "ep1"), False))  # -> WaitForCall
    d.now = 5.0
    d.step()  # -> ClaimCall again
    cleanup = d.step((CallStart(CallOutcome.RUNNING, "ep1"), False))
    assert cleanup == Finished(1, d.course.lane)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.reason is Reason.IN_PROGRESS and err.value.http_status == 409


def test_store_down_during_the_claim() -> None:
    d = Driver(PostCourse(post(call()), RULES))
    d.step(d.session)
    d.step()
    assert isinstance(d.step(True), ClaimCall)
    down = OSError("store unavailable")
    assert d.fail(down) == Finished(1, d.course.lane)
    with pytest.raises(OSError) as err:
        d.step()
    assert err.value is down  # no key was claimed: nothing to give back


def test_a_failure_after_the_claim_gives_the_key_back() -> None:
    d = Driver(PostCourse(post(call()), RULES))
    d.step(d.session)
    d.step()
    d.step(True)  # admitted
    hold = d.step(started(CallOutcome.EXECUTE))
    assert isinstance(hold, HoldCall)
    # Whatever fails between the claim and the stream (here: the runtime's own
    # step), nothing ran: the reservation ends and the key goes back for a retry.
    boom = RuntimeError("the runtime could not note the call")
    assert d.fail(boom) == Finished(1, d.course.lane)
    assert d.step() == GiveBack(hold.key)
    with pytest.raises(RuntimeError) as err:
        d.step()
    assert err.value is boom


def test_a_stream_that_cannot_open_gives_the_claimed_key_back() -> None:
    # A store that lost acknowledged writes can hand out an epoch the session
    # already used; the runtime refuses to open the stream (its StoreUnavailable),
    # and nothing ran: the reservation ends, the key goes back, the failure is raised.
    d = Driver(PostCourse(post(call()), RULES))
    d.step(d.session)
    d.step()
    d.step(True)  # admitted
    hold = d.step(started(CallOutcome.EXECUTE))
    assert isinstance(hold, HoldCall)
    opening = d.step()
    assert isinstance(opening, OpenRequestStream) and opening.epoch == "ep1"
    reused = OSError("the store issued stream epoch ep1 a second time")
    assert d.fail(reused) == Finished(1, d.course.lane)
    assert d.step() == GiveBack(hold.key)
    with pytest.raises(OSError) as err:
        d.step()
    assert err.value is reused


def test_connection_lost_before_the_stream_releases_the_key() -> None:
    d = Driver(PostCourse(post(Request(id=4, method="tools/list")), RULES))
    d.step(d.session)
    d.step()
    d.step(True)  # admitted
    assert isinstance(d.effect, AllocateEpoch)
    gone = ConnectionResetError()
    assert d.fail(gone) == Finished(1, d.course.lane)
    with pytest.raises(ConnectionResetError):
        d.step()


def test_json_mode_answers_with_one_body() -> None:
    d = Driver(PostCourse(post(call()), PostRules(json_response=True)))
    effects = d.run({ClaimCall: started(CallOutcome.EXECUTE)})
    assert kinds(effects)[-1] == "AnswerJson"
    answer = effects[-1]
    assert isinstance(answer, AnswerJson) and not answer.is_batch
    assert answer.lane is d.course.lane and len(answer.courses) == 1
    assert "OpenRequestStream" not in kinds(effects)


def test_notifications_only_is_202_after_the_mail() -> None:
    note = Notification(method="notifications/roots/list_changed")
    d = Driver(PostCourse(post(Notification(method="notifications/initialized"), note), RULES))
    effects = d.run()
    assert kinds(effects) == ["LoadSession", "Mail", "Accepted"]
    mail = effects[1]
    assert isinstance(mail, Mail) and mail.initialized and mail.notes == [note]
    assert effects[-1] is ACCEPTED


def test_answers_and_cancellations_are_routed_here_or_forwarded() -> None:
    session = FakeSession(running={10}, pending={"weir:r1:1"})
    msgs = [
        Notification(method="notifications/cancelled", params={"requestId": 10}),
        Notification(method="notifications/cancelled", params={"requestId": 11}),
        Response(id="weir:r1:1", result={}),
        Response(id="weir:r2:1", result={}),
    ]
    d = Driver(PostCourse(post(*msgs, batch=True), PostRules(shared=True)), session)
    effects = d.run()
    mail = effects[1]
    assert isinstance(mail, Mail)
    assert mail.cancel_here == [10] and [a.id for a in mail.answer_here] == ["weir:r1:1"]
    assert len(mail.forward) == 2  # the cancel of 11 and the answer for replica r2
    # Without a shared store, what is not here is dropped rather than forwarded.
    d = Driver(PostCourse(post(*msgs, batch=True), RULES), FakeSession(running={10}))
    mail = d.run()[1]
    assert isinstance(mail, Mail) and mail.forward == []


def test_a_stale_channel_token_is_refused_before_anything_is_absorbed() -> None:
    session = FakeSession(channel=Channel(generation=3))
    p = post(Request(id=1, method="tools/list"), mcp_channel_token="2.sekrit")
    d = Driver(PostCourse(p, RULES), session)
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CURSOR_STALE and d.effects == [LoadSession(True, 1)]


@pytest.mark.parametrize("entries", [1, 2])
def test_a_refused_batch_answers_no_entry_s_id(entries: int) -> None:
    # A refusal of the whole body (the store down, the session gone, a stale token)
    # answers with id null: no entry of a batch speaks for the others, however many.
    session = FakeSession(channel=Channel(generation=3))
    msgs = [Request(id=i + 1, method="tools/list") for i in range(entries)]
    d = Driver(PostCourse(post(*msgs, batch=True, mcp_channel_token="2.sekrit"), RULES), session)
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CURSOR_STALE and err.value.request_id is None
    assert d.effects == [LoadSession(True, None)]


def test_the_first_proving_token_binds_the_session() -> None:
    session = FakeSession(channel=Channel(generation=1, bound=False))
    p = post(Request(id=1, method="tools/list"), mcp_channel_token="1.sekrit")
    d = Driver(PostCourse(p, RULES), session)
    effects = d.run({AllocateEpoch: "e"})
    assert effects[1] is MARK_BOUND
    alloc = next(e for e in effects if isinstance(e, AllocateEpoch))
    assert alloc.generation == 1  # the stream is opened under the token's generation


def test_a_lone_call_leaves_a_wrong_token_to_its_claim() -> None:
    # The store's claim checks the channel in the same round trip (one fewer).
    session = FakeSession(channel=Channel(generation=1, bound=True))
    p = post(call(), mcp_channel_token="1.wrong")
    d = Driver(PostCourse(p, RULES), session)
    assert isinstance(d.step(session), ENTER_REQUEST.__class__)


def test_rebind_without_proof_is_refused_when_unauthorized() -> None:
    session = FakeSession(channel=Channel(bound=True))
    d = Driver(PostCourse(post(Request(id=1, method=REBIND_METHOD)), RULES), session)
    with pytest.raises(RemoteProtocolError) as err:
        d.step(session)
    assert err.value.reason is Reason.CHANNEL_UNBOUND


def test_rebind_with_proof_is_handed_over() -> None:
    session = FakeSession(channel=Channel())
    p = post(Request(id=1, method=REBIND_METHOD), mcp_channel_token="1.sekrit")
    effects = Driver(PostCourse(p, RULES), session).run()
    assert kinds(effects) == ["LoadSession", "Rebind"]
    assert isinstance(effects[1], Rebind) and effects[1].request.id == 1


def test_a_batch_is_handed_over_whole() -> None:
    p = post(Request(id=1, method="tools/list"), call(rid=2), batch=True)
    effects = Driver(PostCourse(p, RULES)).run()
    assert kinds(effects) == ["LoadSession", "EnterRequest", "RunBatch"]
    batch = effects[-1]
    assert isinstance(batch, RunBatch) and [r.id for r in batch.requests] == [1, 2]


def test_a_malformed_idempotency_key_after_admission_ends_the_reservation() -> None:
    d = Driver(PostCourse(post(call(), idempotency_key="k" * 10_000), RULES))
    d.step(d.session)
    d.step()
    assert d.step(True) == Finished(1, d.course.lane)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.http_status == 400


def test_priming_follows_the_rules_and_the_revision() -> None:
    old = FakeSession(protocol_version="2025-03-26")
    p = post(Request(id=1, method="tools/list"))
    p = PostMessages(
        ctx=RequestContext(session_id=SID, protocol_version="2025-03-26", headers=Headers.of()),
        messages=p.messages,
        is_batch=False,
    )
    run = next(
        e
        for e in Driver(PostCourse(p, RULES), old).run({AllocateEpoch: "e"})
        if isinstance(e, RunCalls)
    )
    assert not run.primes
    off = Driver(PostCourse(post(Request(id=1, method="tools/list")), PostRules(priming=False)))
    run = next(e for e in off.run({AllocateEpoch: "e"}) if isinstance(e, RunCalls))
    assert not run.primes


def test_initialize_has_no_post_course() -> None:
    with pytest.raises(ValueError):
        PostCourse(post(Request(id=1, method="initialize", params={})), RULES)


def test_effects_without_fields_are_singletons() -> None:
    d = Driver(PostCourse(post(Request(id=1, method="tools/list")), RULES))
    effects = d.run({AllocateEpoch: "e"})
    assert effects[1] is ENTER_REQUEST and effects[-1] is ATTACH_WRITER
    assert isinstance(GiveBack("k"), GiveBack)


def test_a_session_ended_while_waiting_for_admission_is_404() -> None:
    d = Driver(PostCourse(post(call()), RULES))
    d.step(d.session)
    d.step()
    with pytest.raises(RemoteProtocolError) as err:
        d.step(False)  # the runtime: the session closed while the request waited
    assert err.value.http_status == 404 and err.value.reason is Reason.SESSION_NOT_FOUND


# ------------------------------------------------------------------ batch entries


def entries_run(requests: list[Request], admit: list[object], claims: list[object]) -> list[Effect]:
    """Drive BatchEntries: ``admit`` answers (True/False, or an exception to raise),
    ``claims`` the gate's claim answers, in order."""
    lane = object()
    entries = BatchEntries(requests, None, lane, RULES)
    out: list[Effect] = []
    effect = entries.start(0.0)
    for _ in range(64):
        if effect is None:
            return out
        out.append(effect)
        answer: object = None
        if isinstance(effect, AdmitRequests):
            answer = admit.pop(0)
        elif isinstance(effect, ClaimCall):
            answer = claims.pop(0)
        if isinstance(answer, BaseException):
            effect = entries.fail(answer, 0.0)
        else:
            effect = entries.deliver(answer, 0.0)
    raise AssertionError("the batch did not end within 64 effects")


def test_batch_entries_are_admitted_gated_and_started_in_order() -> None:
    half_open = RemoteProtocolError(
        "half-open", http_status=429, reason=Reason.STREAM_HALF_OPEN, request_id=2
    )
    effects = entries_run(
        [Request(id=1, method="tools/list"), call(rid=2), call(rid=3)],
        admit=[True, half_open, True],
        claims=[started(CallOutcome.EXECUTE)],
    )
    assert kinds(effects) == [
        "AdmitRequests",
        "StartEntry",
        "AdmitRequests",
        "CountIn",  # the refused entry is accounted for like an admitted one
        "StartEntry",
        "AdmitRequests",
        "ClaimCall",
        "HoldCall",
        "StartEntry",
    ]
    starts = [e for e in effects if isinstance(e, StartEntry)]
    assert [e.index for e in starts] == [0, 1, 2]
    refused = starts[1]
    assert refused.refused is half_open
    assert refused.course.replay is not None and b"stream_half_open" in refused.course.replay
    assert starts[2].refused is None and starts[2].course.key is not None


def test_a_gate_refusal_answers_its_entry_and_the_rest_go_on() -> None:
    effects = entries_run(
        [call(rid=1), Request(id=2, method="ping")],
        admit=[True, True],
        claims=[started(CallOutcome.MISMATCH)],
    )
    starts = [e for e in effects if isinstance(e, StartEntry)]
    assert starts[0].refused is not None
    assert starts[0].refused.reason is Reason.IDEMPOTENCY_KEY_REUSED
    assert "CountIn" not in kinds(effects)  # it was admitted: no extra count
    assert starts[1].refused is None and starts[1].index == 1


def test_the_session_ending_stops_the_batch() -> None:
    effects = entries_run(
        [Request(id=1, method="ping"), Request(id=2, method="ping")], admit=[False], claims=[]
    )
    assert kinds(effects) == ["AdmitRequests"]


def test_a_store_outage_in_a_batch_is_the_entry_s_refusal() -> None:
    down = RemoteProtocolError(
        "store down", http_status=503, reason=Reason.STORE_UNAVAILABLE, request_id=1
    )
    effects = entries_run([call(rid=1)], admit=[True], claims=[down])
    start = effects[-1]
    assert isinstance(start, StartEntry) and start.refused is down
