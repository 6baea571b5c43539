"""A sessionless (2026-07-28) POST's course, driven step by step with no runtime: every
effect sequence asserted as data (discover, plain and keyed calls, header and state
refusals, input-required rounds, listen, admission refused, the store down)."""

from __future__ import annotations

from typing import Any

import pytest

from weir.protocol import INVALID_PARAMS, Reason, RemoteProtocolError
from weir.protocol._gate import WindowKey
from weir.protocol._http_events import Headers
from weir.protocol._sessionless import HEADER_MISMATCH, RequestMeta
from weir.protocol._sessionless_post import same_request_key
from weir.protocol._sessionless_run import state_binding
from weir.protocol.course import ClaimCall, HoldCall, WaitForCall
from weir.protocol.gate import CallOutcome, CallStart
from weir.protocol.jsonrpc import Notification, Request
from weir.protocol.post import (
    ACCEPTED,
    ATTACH_WRITER,
    AdmitRequests,
    Finished,
    GiveBack,
)
from weir.protocol.sessionless import SessionlessMessage
from weir.protocol.sessionless_post import (
    ANSWER_DISCOVER,
    CHOOSE_OWNER,
    AnswerReplay,
    Listen,
    OpenAnswerStream,
    OpenRequestState,
    RespondJson,
    RunOnStream,
    SessionlessCourse,
    SessionlessRules,
    ToolSchema,
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

META = RequestMeta(version="2026-07-28", capabilities={}, client_info=None, log_level=None)
RULES = SessionlessRules()
SSE = "application/json, text/event-stream"
STORED = b'{"jsonrpc":"2.0","id":99,"result":{"content":[]}}'


def message(req: Request | Notification, **headers: str) -> SessionlessMessage:
    meta = META if isinstance(req, Request) else None
    return SessionlessMessage(headers=Headers.of(**headers), message=req, meta=meta)


def call(rid: int = 1, name: str = "echo", **params: Any) -> Request:
    return Request(id=rid, method="tools/call", params={"name": name, "arguments": {}, **params})


def course(
    req: Request | Notification,
    rules: SessionlessRules = RULES,
    principal: str = "alice",
    **headers: str,
) -> SessionlessCourse:
    return SessionlessCourse(message(req, **headers), principal, False, rules, wall=1000.0)


def started(outcome: CallOutcome, payload: bytes | None = None) -> tuple[CallStart, bool]:
    return CallStart(outcome, "ep1", payload), False


def kinds(effects: list[Any]) -> list[str]:
    return [type(e).__name__ for e in effects]


class Driver:
    """Delivers scripted answers; records every effect asked for (a course or a run)."""

    def __init__(self, c: SessionlessCourse | SessionlessRun) -> None:
        self.course: Any = c  # (a course or a run: the same three calls)
        self.effects: list[Any] = []
        self.now = 0.0
        self.effect: Any = c.start(self.now)

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

    def run(self, answers: dict[type, object] | None = None) -> list[Any]:
        """Answer every effect (from ``answers`` by type, else None) until the end."""
        answers = answers or {}
        for _ in range(64):
            if self.effect is None:
                return self.effects
            self.step(answers.get(type(self.effect)))
        raise AssertionError("the course did not end within 64 effects")


def the_run(effects: list[Any]) -> SessionlessRun:
    last = next(e for e in effects if isinstance(e, RespondJson | RunOnStream))
    return last.run


# ---------------------------------------------------------------- no handler
def test_a_notification_is_accepted_and_nothing_else() -> None:
    effects = Driver(course(Notification(method="notifications/cancelled"))).run()
    assert effects == [ACCEPTED]


def test_discover_is_answered_before_any_owner_or_admission() -> None:
    effects = Driver(course(Request(id=1, method="server/discover"))).run()
    assert effects == [ANSWER_DISCOVER]


@pytest.mark.parametrize("method", ["initialize", "ping", "no/such"])
def test_a_method_this_era_does_not_serve_is_404(method: str) -> None:
    with pytest.raises(RemoteProtocolError) as err:
        course(Request(id=3, method=method)).start(0.0)
    assert err.value.http_status == 404 and err.value.request_id == 3


def test_a_fallback_serves_unknown_methods_but_never_the_session_eras() -> None:
    rules = SessionlessRules(fallback=True)
    assert Driver(course(Request(id=1, method="x/y"), rules)).effect is CHOOSE_OWNER
    with pytest.raises(RemoteProtocolError):
        course(Request(id=1, method="ping"), rules).start(0.0)


# ---------------------------------------------------------------- plain calls
def test_a_plain_call_admitted_and_answered_as_json() -> None:
    d = Driver(course(call(), accept="application/json"))
    effects = d.run()
    assert effects == [
        ToolSchema("echo"),
        CHOOSE_OWNER,
        AdmitRequests(1, 1, d.course.lane),
        RespondJson(the_run(effects), d.course.lane),
    ]
    run = the_run(effects)
    assert run.call is None and not run.detached and run.inputs == {}
    # The run: the handler, its result encoded, the body; nothing recorded.
    r = Driver(run)
    assert r.effect is RUN_HANDLER
    assert r.step({"content": []}) == EncodeResult({"content": []})
    body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    assert r.step(body) == Respond(body) and r.step() is None


def test_once_the_handler_has_returned_nothing_keeps_the_requests_params() -> None:
    # The answer may wait a long time on a slow peer; the course, its message and its
    # run outlive the handler until then, so none of them may keep the arguments.
    d = Driver(course(call(arguments={"text": "y" * 100}), accept="application/json"))
    effects = d.run()
    run = the_run(effects)
    assert run.request.params is not None  # the handler gets them...
    assert d.course.msg.message.params is None  # ...the course no longer holds them
    assert d.course.msg.meta == META and d.course.msg.request_id == 1
    r = Driver(run)
    assert r.step({"content": []}) == EncodeResult({"content": []})
    assert run.request == Request(id=1, method="tools/call")  # id and method: encoding's
    with pytest.raises(RuntimeError):  # a binding of the bare request would be wrong
        _ = run.binding


def test_an_input_required_round_seals_the_binding_before_the_params_go() -> None:
    run = SessionlessRun(call(), {}, None, principal="alice", authorized=False, app_rounds=False)
    r = Driver(run)
    seal = r.step(InputAsked({}, {}))
    assert seal == SealState({"b": state_binding("alice", False, call()), "a": {}})
    assert run.request.params is not None  # (still there while the state is sealed)
    r.step("TOKEN")
    assert run.request.params is None and run.binding == seal.claims["b"]


def test_a_cancelled_or_failed_handler_responds_as_the_runtime_answered() -> None:
    r = Driver(
        SessionlessRun(call(), {}, None, principal="alice", authorized=False, app_rounds=False)
    )
    assert r.step(None) == Respond(None)  # cancelled: nothing to send
    r = Driver(
        SessionlessRun(call(), {}, None, principal="alice", authorized=False, app_rounds=False)
    )
    assert r.step(b"error body") == Respond(b"error body")  # the app's failure, as is


def test_a_plain_call_on_an_sse_stream() -> None:
    d = Driver(course(call(), accept=SSE))
    effects = d.run()
    assert kinds(effects) == [
        "ToolSchema",
        "ChooseOwner",
        "AdmitRequests",
        "OpenAnswerStream",
        "RunOnStream",
        "AttachWriter",
    ]
    assert effects[3] == OpenAnswerStream(d.course.lane) and effects[-1] is ATTACH_WRITER


def test_json_mode_and_list_methods_never_stream() -> None:
    d = Driver(course(call(), SessionlessRules(json_response=True), accept=SSE))
    assert kinds(d.run())[-1] == "RespondJson"
    d = Driver(course(Request(id=2, method="tools/list"), accept=SSE))
    assert kinds(d.run()) == ["ChooseOwner", "AdmitRequests", "RespondJson"]


def test_admission_refused_429_leaves_nothing_to_undo() -> None:
    d = Driver(course(call(), idempotency_key="k1"))
    d.step(None)  # ToolSchema: unknown tool
    d.step()  # CHOOSE_OWNER
    assert isinstance(d.effect, AdmitRequests)
    refusal = RemoteProtocolError(
        "half-open", http_status=429, reason=Reason.STREAM_HALF_OPEN, request_id=1
    )
    with pytest.raises(RemoteProtocolError) as err:
        d.fail(refusal)
    assert err.value is refusal  # nothing was admitted or claimed: no cleanup asked
    assert kinds(d.effects) == ["ToolSchema", "ChooseOwner", "AdmitRequests"]


# ---------------------------------------------------------------- header checks
SCHEMA = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}


def test_a_param_header_that_disagrees_with_the_body_is_refused_before_admission() -> None:
    req = Request(id=4, method="tools/call", params={"name": "geo", "arguments": {"region": "eu"}})
    d = Driver(course(req, mcp_param_region="us"))
    assert d.effect == ToolSchema("geo")
    with pytest.raises(RemoteProtocolError) as err:
        d.step(SCHEMA)
    assert err.value.code == HEADER_MISMATCH and err.value.http_status == 400
    assert err.value.request_id == 4
    # The same request with the header right goes on to the owner.
    d = Driver(course(req, mcp_param_region="eu"))
    assert d.step(SCHEMA) is CHOOSE_OWNER


# ---------------------------------------------------------------- request state
def test_a_state_that_does_not_open_is_400_before_admission() -> None:
    d = Driver(course(call(requestState="forged")))
    d.step(None)  # ToolSchema
    assert d.effect == OpenRequestState("forged")
    with pytest.raises(RemoteProtocolError) as err:
        d.step(None)  # it does not open (forged, tampered with, or expired)
    assert err.value.reason is Reason.REQUEST_STATE_INVALID and err.value.code == INVALID_PARAMS
    assert kinds(d.effects) == ["ToolSchema", "OpenRequestState"]


def test_a_state_of_another_principal_or_request_is_400() -> None:
    theirs = state_binding("mallory", False, call())
    d = Driver(course(call(requestState="s1")))
    d.step(None)
    with pytest.raises(RemoteProtocolError) as err:
        d.step({"b": theirs, "a": {}})
    assert err.value.reason is Reason.REQUEST_STATE_INVALID
    # A non-string state is never handed to the runtime to open.
    d = Driver(course(call(requestState=42)))
    with pytest.raises(RemoteProtocolError):
        d.step(None)
    assert kinds(d.effects) == ["ToolSchema"]


def test_an_input_required_round_and_the_next() -> None:
    # Round one: the handler asks; its answer is input_required with a sealed state.
    d = Driver(course(call(), accept="application/json"))
    run = the_run(d.run())
    r = Driver(run)
    assert r.effect is RUN_HANDLER
    asks = {"name": {"method": "elicitation/create", "params": {}}}
    seal = r.step(InputAsked(asks, {"earlier": 1}))
    assert seal == SealState({"b": state_binding("alice", False, call()), "a": {"earlier": 1}})
    encode = r.step("TOKEN")
    assert encode == EncodeResult(
        {"resultType": "input_required", "inputRequests": asks, "requestState": "TOKEN"}
    )
    assert r.step(b"body") == Respond(b"body")
    # Round two: the state opens, is this request's, and its answers are the inputs
    # (then the round's own inputResponses, which win).
    nxt = call(requestState="TOKEN", inputResponses={"name": "Ada"})
    d = Driver(course(nxt, accept="application/json"))
    d.step(None)
    assert d.effect == OpenRequestState("TOKEN")
    claims = {"b": state_binding("alice", False, call()), "a": {"earlier": 1, "name": "x"}}
    assert d.step(claims) is CHOOSE_OWNER
    run = the_run(d.run())
    assert run.inputs == {"earlier": 1, "name": "Ada"}


def test_a_state_too_large_to_seal_is_the_calls_own_error() -> None:
    r = Driver(
        SessionlessRun(call(), {}, None, principal="alice", authorized=False, app_rounds=False)
    )
    r.step(InputAsked({}, {}))
    assert isinstance(r.effect, SealState)
    respond = r.fail(ValueError("too large"))
    assert isinstance(respond, Respond) and respond.body is not None
    assert b'"code":-32602' in respond.body and b"too large" in respond.body


def test_an_app_keeping_its_own_rounds_gets_its_inner_state_back_and_sealed_again() -> None:
    rules = SessionlessRules(fallback=True, fallback_every_method=True)
    d = Driver(course(call(requestState="OUTER"), rules))
    d.step(None)
    d.step({"b": state_binding("alice", False, call()), "x": "inner"})
    run = the_run(d.run())
    assert run.inputs is None and run.app_rounds
    assert run.request.params == {"name": "echo", "arguments": {}, "requestState": "inner"}
    r = Driver(run)
    seal = r.step({"resultType": "input_required", "requestState": "inner2"})
    assert isinstance(seal, SealState) and seal.claims["x"] == "inner2"
    assert r.step("OUTER2") == EncodeResult(
        {"resultType": "input_required", "requestState": "OUTER2"}
    )


# ---------------------------------------------------------------- listen
def test_listen_is_admitted_then_handed_over() -> None:
    req = Request(id=9, method="subscriptions/listen", params={"notifications": {}})
    d = Driver(course(req, accept=SSE))
    effects = d.run()
    assert effects == [CHOOSE_OWNER, AdmitRequests(1, 9, d.course.lane), Listen(req, d.course.lane)]


# ---------------------------------------------------------------- keyed calls
def keyed(rid: int = 1, key: str = "k1", **rules: Any) -> Driver:
    d = Driver(course(call(rid), SessionlessRules(**rules), idempotency_key=key, accept=SSE))
    d.step(None)  # ToolSchema
    d.step()  # CHOOSE_OWNER
    d.step()  # AdmitRequests
    assert isinstance(d.effect, ClaimCall)
    return d


def test_a_keyed_call_runs_and_records_its_outcome() -> None:
    d = keyed()
    claim = d.effect
    assert claim.token is None and claim.request.id == 1
    hold = d.step(started(CallOutcome.EXECUTE))
    assert hold == HoldCall(claim.claim.key)
    effects = d.run()
    assert kinds(effects)[-3:] == ["OpenAnswerStream", "RunOnStream", "AttachWriter"]
    run = the_run(effects)
    assert run.detached  # a keyed call is not cancelled with its response
    r = Driver(run)
    r.step({"content": []})
    r.step(b"body")
    assert r.effect == RecordOutcome(hold.key, b"body")
    assert r.step() == Respond(b"body") and r.step() is None


def test_a_keyed_call_that_ran_is_replayed_and_nothing_runs() -> None:
    d = keyed(rid=5)
    effects = d.run({ClaimCall: started(CallOutcome.DONE, STORED)})
    assert kinds(effects)[-2:] == ["Finished", "AnswerReplay"]
    assert effects[-2] == Finished(1, d.course.lane)
    replay = effects[-1]
    assert isinstance(replay, AnswerReplay) and b'"id":5' in replay.payload  # re-addressed
    assert "HoldCall" not in kinds(effects) and "RunOnStream" not in kinds(effects)


def test_a_keyed_call_waits_for_the_running_delivery_then_replays() -> None:
    d = keyed(in_progress_wait=10.0)
    waited = d.step((CallStart(CallOutcome.RUNNING, "ep1"), True))
    assert isinstance(waited, WaitForCall) and waited.local and waited.until == 10.0
    d.now = 2.0
    again = d.step()
    assert isinstance(again, ClaimCall) and again.claim.key == waited.key
    assert d.step(started(CallOutcome.DONE, STORED)) == Finished(1, d.course.lane)
    assert isinstance(d.step(), AnswerReplay) and d.step() is None


def test_a_keyed_call_still_running_past_the_wait_is_409_in_progress() -> None:
    d = keyed(in_progress_wait=1.0)
    d.step((CallStart(CallOutcome.RUNNING, "ep1"), False))  # -> WaitForCall
    d.now = 5.0
    d.step()  # -> ClaimCall again
    assert d.step((CallStart(CallOutcome.RUNNING, "ep1"), False)) == Finished(1, d.course.lane)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.reason is Reason.IN_PROGRESS and err.value.http_status == 409


def test_a_key_reused_for_other_arguments_is_422() -> None:
    d = keyed()
    reused = CallStart(CallOutcome.MISMATCH, "ep1")
    assert d.step((reused, False)) == Finished(1, d.course.lane)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.http_status == 422 and err.value.reason is Reason.IDEMPOTENCY_KEY_REUSED


def test_a_malformed_key_ends_the_reservation_and_claims_nothing() -> None:
    d = Driver(course(call(), idempotency_key="k" * 10_000))
    d.step(None)
    d.step()
    assert d.step() == Finished(1, d.course.lane)
    with pytest.raises(RemoteProtocolError) as err:
        d.step()
    assert err.value.http_status == 400


def test_store_down_during_the_claim_ends_the_reservation() -> None:
    d = keyed()
    down = OSError("store unavailable")
    assert d.fail(down) == Finished(1, d.course.lane)
    with pytest.raises(OSError) as err:
        d.step()
    assert err.value is down
    assert "GiveBack" not in kinds(d.effects)  # the claim never landed: no key to give


def test_a_failure_after_the_claim_ends_the_reservation_and_gives_the_key_back() -> None:
    d = keyed()
    hold = d.step(started(CallOutcome.EXECUTE))
    assert isinstance(d.step(), OpenAnswerStream)  # (the hold was noted)
    down = OSError("the answer's stream could not be opened")
    assert d.fail(down) == Finished(1, d.course.lane)
    assert d.step() == GiveBack(hold.key)  # nothing ran: a retry may run it
    with pytest.raises(OSError) as err:
        d.step()
    assert err.value is down


def test_a_refused_keyed_run_gives_its_key_back_and_an_abandoned_one_is_interrupted() -> None:
    d = keyed()
    hold = d.step(started(CallOutcome.EXECUTE))
    run = the_run(d.run())
    r = Driver(run)
    refusal = RemoteProtocolError("needs sampling", http_status=400, request_id=1)
    assert r.fail(refusal) == GiveBack(hold.key)
    with pytest.raises(RemoteProtocolError):
        r.step()
    d = keyed()
    d.step(started(CallOutcome.EXECUTE))
    r = Driver(the_run(d.run()))
    recorded = r.fail(KeyboardInterrupt())
    assert isinstance(recorded, RecordOutcome) and b"interrupted" in recorded.payload
    with pytest.raises(KeyboardInterrupt):
        r.step()


def test_an_input_required_answer_is_not_a_keyed_calls_outcome() -> None:
    d = keyed()
    hold = d.step(started(CallOutcome.EXECUTE))
    r = Driver(the_run(d.run()))
    r.step(InputAsked({}, {}))
    r.step("TOKEN")
    assert r.step(b"asks") == GiveBack(hold.key)  # its next round runs it again
    assert r.step() == Respond(b"asks")


def test_an_unkeyed_call_is_gated_only_within_a_retry_window() -> None:
    d = Driver(course(call(), SessionlessRules(retry_window=30.0)))
    d.run({ClaimCall: started(CallOutcome.EXECUTE)})
    claim = next(e for e in d.effects if isinstance(e, ClaimCall))
    expected = same_request_key(call(), 30.0, 1000.0)
    assert isinstance(expected, WindowKey) and claim.claim.key.endswith(expected)
    assert same_request_key(call(), 30.0, 1000.0) != same_request_key(call(), 30.0, 1031.0)
    assert same_request_key(call(), 0.0, 1000.0) is None
    assert "ClaimCall" not in kinds(Driver(course(call())).run())
