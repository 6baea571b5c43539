"""absorb(): a POST's messages sorted for the driver; server-to-client request ids."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from weir.protocol._jsonrpc import decode_body
from weir.protocol._messages import absorb, answer_owner
from weir.protocol.jsonrpc import ErrorResponse, Notification, Request, Response
from weir.protocol.messages import server_request_id


def _body(*messages: str) -> bytes:
    return ("[" + ",".join(messages) + "]").encode()


def test_every_kind_goes_where_the_driver_needs_it() -> None:
    messages, _ = decode_body(
        _body(
            '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
            '{"jsonrpc":"2.0","method":"notifications/initialized"}',
            '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}',
            '{"jsonrpc":"2.0","id":"weir:r1:3","result":{}}',
            '{"jsonrpc":"2.0","id":"weir:r1:4","error":{"code":-1,"message":"no"}}',
            '{"jsonrpc":"2.0","method":"notifications/progress","params":{}}',
            '{"jsonrpc":"2.0","id":2,"method":"ping"}',
        ),
        allow_batch=True,
    )
    out = absorb(messages)
    assert [r.id for r in out.requests] == [1, 2]  # in arrival order
    assert out.initialized
    assert out.cancels == [7]
    assert [a.id for a in out.answers] == ["weir:r1:3", "weir:r1:4"]
    assert isinstance(out.answers[0], Response) and isinstance(out.answers[1], ErrorResponse)
    assert [n.method for n in out.notes] == ["notifications/progress"]  # the app's to hear


def test_a_cancellation_naming_no_valid_id_is_dropped() -> None:
    bad = [None, True, 1.5, [1], {"a": 1}]
    notes = [
        Notification(method="notifications/cancelled", params={"requestId": rid}) for rid in bad
    ]
    notes.append(Notification(method="notifications/cancelled"))
    assert absorb(list(notes)).cancels == []
    assert absorb(list(notes)).notes == []  # a bad cancellation is nobody's notification


def test_nothing_to_do_for_a_lone_request() -> None:
    out = absorb([Request(id="a", method="ping")])
    assert out.cancels == [] and out.answers == [] and not out.initialized and not out.notes


@given(st.text(alphabet="abc-:0123456789", min_size=1, max_size=12), st.integers(0, 2**40))
def test_the_replica_a_request_id_names_is_found_again(replica: str, n: int) -> None:
    assert answer_owner(server_request_id(replica, n)) == replica


def test_ids_weir_did_not_make_name_no_replica() -> None:
    for rid in (None, 3, "3", "weir:", "weir:x", "weir::3", "weir:x:y", "other:x:3"):
        assert answer_owner(rid) is None, rid
