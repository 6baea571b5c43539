"""Mail between replicas: what a POST's answers and cancellations become, which
mailboxes a poll reads, and what mail that does not parse becomes (nothing)."""

from __future__ import annotations

import msgspec
import pytest

from weir.protocol._jsonrpc import decode_body
from weir.protocol._messages import (
    CANCEL_AFTER,
    CHANGE_LOOKBACK,
    Absorbed,
    Post,
    absorb,
    answers_box,
    route_mail,
)
from weir.protocol.jsonrpc import ErrorResponse, Response
from weir.protocol.messages import (
    CANCEL_BOX,
    boxes_due,
    encode_change,
    first_change_cursor,
    read_answer,
    read_cancel,
    read_change,
    renew_interval,
    server_request_id,
)


def _absorbed(*messages: str) -> Absorbed:
    msgs, _ = decode_body(("[" + ",".join(messages) + "]").encode(), allow_batch=True)
    return absorb(msgs)


CANCEL_7 = '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}'
CANCEL_0 = '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":0}}'
ANSWER_HERE = '{"jsonrpc":"2.0","id":"weir:r1:1","result":{}}'
ANSWER_THERE = '{"jsonrpc":"2.0","id":"weir:r2:5","result":{"x":1}}'
ANSWER_FOREIGN = '{"jsonrpc":"2.0","id":"client-made","result":{}}'


def test_what_is_here_is_handled_here_and_the_rest_is_posted() -> None:
    absorbed = _absorbed(CANCEL_7, CANCEL_0, ANSWER_HERE, ANSWER_THERE, ANSWER_FOREIGN)
    routed = route_mail(absorbed, running={7}, pending={"weir:r1:1"}, shared=True)
    assert routed.cancel_here == [7]
    assert [a.id for a in routed.answer_here] == ["weir:r1:1"]
    # Id 0 may run elsewhere: to the shared box.  The r2 answer goes to r2's box.  An
    # answer to an id no replica made goes nowhere.
    assert routed.post[0] == Post(CANCEL_BOX, b"0")
    assert routed.post[1].box == answers_box("r2") == "answers:r2"
    forwarded = read_answer(routed.post[1].data)
    assert isinstance(forwarded, Response) and forwarded.result == {"x": 1}
    assert len(routed.post) == 2


def test_without_a_shared_store_nothing_is_posted() -> None:
    absorbed = _absorbed(CANCEL_7, ANSWER_THERE)
    routed = route_mail(absorbed, running=set(), pending=set(), shared=False)
    assert routed.post == [] and routed.cancel_here == [] and routed.answer_here == []


def test_a_poll_reads_only_the_boxes_a_session_can_use() -> None:
    assert boxes_due("r1", awaiting_answers=False, started=[], now=10.0) == []
    assert boxes_due("r1", awaiting_answers=True, started=[], now=10.0) == ["answers:r1"]
    fresh = [10.0 - CANCEL_AFTER / 2]
    assert boxes_due("r1", awaiting_answers=False, started=fresh, now=10.0) == []
    old = [10.0 - CANCEL_AFTER * 2]
    assert boxes_due("r1", awaiting_answers=True, started=old, now=10.0) == [
        "answers:r1",
        CANCEL_BOX,
    ]


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"[1,2]", b'{"jsonrpc":"2.0","method":"x"}', b'{"id":"a"}']
)
def test_mail_that_is_not_an_answer_is_dropped(raw: bytes) -> None:
    assert read_answer(raw) is None


def test_an_error_answer_is_an_answer() -> None:
    raw = b'{"jsonrpc":"2.0","id":"weir:r1:2","error":{"code":-1,"message":"no"}}'
    assert isinstance(read_answer(raw), ErrorResponse)


@pytest.mark.parametrize(
    ("raw", "rid"),
    [(b"0", 0), (b'"a"', "a"), (b"true", None), (b"1.5", None), (b"{}", None), (b"x", None)],
)
def test_a_forwarded_cancellation_names_a_valid_id_or_nothing(raw: bytes, rid: object) -> None:
    assert read_cancel(raw) == rid


def test_server_request_ids_route_to_their_replicas_box() -> None:
    rid = server_request_id("replica-a", 3)
    answer = msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "result": {}}).decode()
    routed = route_mail(_absorbed(answer), running=set(), pending=set(), shared=True)
    assert routed.post[0].box == answers_box("replica-a")


def test_leases_are_renewed_twice_before_they_could_run_out() -> None:
    assert renew_interval(15.0) * 3 == pytest.approx(15.0)


# ---------------------------------------------------------------- the change bus
def test_a_change_round_trips_to_every_other_replica_and_never_to_its_own() -> None:
    raw = encode_change("notifications/resources/updated", "file:///a", "r1")
    assert read_change(raw, "r2") == ("notifications/resources/updated", "file:///a")
    assert read_change(raw, "r1") is None
    assert read_change(encode_change("notifications/tools/list_changed", None, "r1"), "r2") == (
        "notifications/tools/list_changed",
        None,
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"u": null, "r": "x"}',
        b'{"m": 1, "r": "x"}',
        b'{"m": "a", "u": 2}',
    ],
)
def test_what_is_not_a_change_on_the_bus_is_dropped(raw: bytes) -> None:
    assert read_change(raw, "r2") is None


def test_the_first_read_of_the_bus_looks_back_a_few_seconds() -> None:
    assert first_change_cursor(100.0) == f"{int((100.0 - CHANGE_LOOKBACK) * 1000)}-0"
