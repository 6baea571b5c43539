"""Tests for weir.protocol._gate: keys, fingerprints and the gate's decisions."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.protocol import Reason, RemoteProtocolError
from weir.protocol._gate import (
    MAX_IDEMPOTENCY_KEY,
    Execute,
    GatePass,
    Refuse,
    Replay,
    Wait,
    call_key,
    fingerprint,
    gate_decision,
    replay_as,
)
from weir.protocol.gate import CallOutcome, CallStart
from weir.protocol.jsonrpc import Request, RequestId, encode_result

ids = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=20))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)


def _call(rid: RequestId, params: dict[str, Any]) -> Request:
    return Request(id=rid, method="tools/call", params=params)


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


# ------------------------------------------------------------------------ keys
def test_the_header_key_wins_over_the_request_id() -> None:
    assert call_key("pay-42", 7) == "h:pay-42"
    assert call_key(None, 7) == "i:7"
    # An integer id and a string id that look alike are different requests.
    assert call_key(None, "7") == 'i:"7"'


@pytest.mark.parametrize("header", ["", "k" * (MAX_IDEMPOTENCY_KEY + 1)])
def test_an_empty_or_oversized_key_is_refused_with_its_limit(header: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        call_key(header, 1)
    err = info.value
    assert (err.http_status, err.reason, err.request_id) == (400, Reason.INVALID_REQUEST, 1)
    assert err.error_data()["limit"] == MAX_IDEMPOTENCY_KEY


def test_the_longest_key_is_accepted() -> None:
    assert call_key("k" * MAX_IDEMPOTENCY_KEY, 1) == "h:" + "k" * MAX_IDEMPOTENCY_KEY


# ----------------------------------------------------------------- fingerprints
@given(ids, ids, json_values)
def test_the_fingerprint_ignores_the_id_and_the_order_of_object_keys(
    a: RequestId, b: RequestId, args: Any
) -> None:
    params = {"name": "charge", "arguments": args}
    assert fingerprint(_call(a, params)) == fingerprint(_call(b, _reversed_keys(params)))


def test_the_fingerprint_tells_different_calls_apart() -> None:
    one = _call(1, {"name": "charge", "arguments": {"amount": 1}})
    other = _call(1, {"name": "charge", "arguments": {"amount": 2}})
    listing = Request(id=1, method="tools/list", params=one.params)
    assert len({fingerprint(one), fingerprint(other), fingerprint(listing)}) == 3


# -------------------------------------------------------------------- decisions
def _decide(start: CallStart, now: float = 0.0, give_up_at: float = 1.0) -> Any:
    return gate_decision(start, "h:k", 5, now=now, give_up_at=give_up_at, retry_ms=250)


def test_an_unclaimed_key_executes_in_the_stores_epoch() -> None:
    assert _decide(CallStart(CallOutcome.EXECUTE, "0000abcd")) == Execute("0000abcd")


def test_a_done_call_replays_its_response() -> None:
    payload = encode_result(1, {"content": []})
    assert _decide(CallStart(CallOutcome.DONE, "e", payload)) == Replay(payload, "e")


@pytest.mark.parametrize(
    ("outcome", "status", "reason"),
    [
        (CallOutcome.MISMATCH, 422, Reason.IDEMPOTENCY_KEY_REUSED),
        (CallOutcome.EVICTED, 409, Reason.OUTCOME_EVICTED),
    ],
)
def test_a_reused_or_forgotten_key_is_refused_and_never_runs(
    outcome: CallOutcome, status: int, reason: Reason
) -> None:
    decision = _decide(CallStart(outcome, "e"))
    assert isinstance(decision, Refuse)
    assert (decision.error.http_status, decision.error.reason) == (status, reason)
    assert decision.error.request_id == 5


@pytest.mark.parametrize(
    "start", [CallStart(CallOutcome.RUNNING, "e"), CallStart(CallOutcome.DONE, "e", None)]
)
def test_a_running_call_is_waited_for_then_refused_in_progress(start: CallStart) -> None:
    assert _decide(start, now=0.0, give_up_at=1.0) == Wait(1.0)
    assert _decide(start, now=0.999, give_up_at=1.0) == Wait(1.0)
    late = _decide(start, now=1.0, give_up_at=1.0)
    assert isinstance(late, Refuse)
    assert (late.error.http_status, late.error.reason) == (409, Reason.IN_PROGRESS)
    assert late.error.error_data()["retryAfterMs"] == 250


@given(st.sampled_from(list(CallOutcome)), st.floats(0, 10), st.floats(0, 10))
def test_only_an_unclaimed_key_ever_executes(outcome: CallOutcome, now: float, end: float) -> None:
    decision = _decide(CallStart(outcome, "e", b'{"jsonrpc":"2.0","id":1,"result":{}}'), now, end)
    assert isinstance(decision, Execute) == (outcome is CallOutcome.EXECUTE)
    if isinstance(decision, Wait):
        assert now < end and decision.until == end


# ----------------------------------------------------------------------- replay
@given(ids, ids, json_values)
def test_a_replay_answers_the_new_id_with_the_stored_result(
    old: RequestId, new: RequestId, result: Any
) -> None:
    replayed = msgspec.json.decode(replay_as(encode_result(old, result), new))
    assert replayed == {"jsonrpc": "2.0", "id": new, "result": result}


# ---------------------------------------------------------------- GatePass
def _pass(now: float = 100.0, wait: float = 1.0) -> GatePass:
    return GatePass(_call(7, {"name": "t"}), None, now=now, wait=wait, retry_ms=500)


RUNNING = CallStart(CallOutcome.RUNNING, "e")


def test_a_pass_keys_and_fingerprints_like_the_functions() -> None:
    req = _call(7, {"name": "t"})
    gate = GatePass(req, "k-1", now=0.0, wait=1.0, retry_ms=500)
    assert (gate.key, gate.fingerprint) == (call_key("k-1", 7), fingerprint(req))
    with pytest.raises(RemoteProtocolError) as bad:
        GatePass(req, "", now=0.0, wait=1.0, retry_ms=500)
    assert bad.value.http_status == 400


def test_waiting_on_a_local_delivery_lasts_until_the_deadline() -> None:
    assert _pass().decide(RUNNING, 100.0, local=True) == Wait(101.0)


def test_re_asking_a_remote_claim_backs_off_and_never_passes_the_deadline() -> None:
    gate, now, waits = _pass(), 100.0, []
    for _ in range(12):
        decision = gate.decide(RUNNING, now, local=False)
        if not isinstance(decision, Wait):
            break
        waits.append(round(decision.until - now, 6))
        now = decision.until
    assert waits[:6] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.25]
    assert max(waits) <= GatePass.MAX_POLL and now == pytest.approx(101.0)
    assert isinstance(decision, Refuse)
    assert decision.error.reason is Reason.IN_PROGRESS and decision.error.http_status == 409


def test_a_pass_hands_through_execute_and_replay() -> None:
    gate = _pass()
    assert gate.decide(CallStart(CallOutcome.EXECUTE, "e"), 100.0, local=False) == Execute("e")
    done = CallStart(CallOutcome.DONE, "e", b"{}")
    assert gate.decide(done, 100.0, local=True) == Replay(b"{}", "e")
