"""Tests for weir.protocol._jsonrpc: strict envelope decoding and exact encoder bytes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from weir.protocol import INVALID_REQUEST, Reason, RemoteProtocolError
from weir.protocol._errors import PARSE_ERROR
from weir.protocol._jsonrpc import (
    MAX_ID_LENGTH,
    ErrorObject,
    decode_body,
    decode_message,
    encode,
)
from weir.protocol.jsonrpc import (
    ErrorResponse,
    Message,
    Notification,
    Request,
    Response,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    error_body,
)


def refusal_of(body: bytes, *, allow_batch: bool = False) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(body, allow_batch=allow_batch)
    assert info.value.http_status == 400
    return info.value


# ----------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', Request(id=1, method="ping")),
        (b'{"jsonrpc":"2.0","id":0,"method":"ping"}', Request(id=0, method="ping")),
        (b'{"jsonrpc":"2.0","id":-5,"method":"ping"}', Request(id=-5, method="ping")),
        (b'{"jsonrpc":"2.0","id":"abc","method":"ping"}', Request(id="abc", method="ping")),
        (b'{"jsonrpc":"2.0","id":"","method":"ping"}', Request(id="", method="ping")),
        (
            b'{"method":"tools/call","params":{"name":"x"},"id":"r","jsonrpc":"2.0"}',
            Request(id="r", method="tools/call", params={"name": "x"}),
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"ping","params":null}',
            Request(id=1, method="ping"),
        ),
        (
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            Notification(method="notifications/initialized"),
        ),
        (
            b'{"jsonrpc":"2.0","method":"n","params":{"a":[1,2]}}',
            Notification(method="n", params={"a": [1, 2]}),
        ),
        (b'{"jsonrpc":"2.0","id":3,"result":{}}', Response(id=3, result={})),
        (
            b'{"jsonrpc":"2.0","id":"s","result":{"content":[]}}',
            Response(id="s", result={"content": []}),
        ),
        (
            b'{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"nope"}}',
            ErrorResponse(id=4, error=ErrorObject(code=-32601, message="nope")),
        ),
        (
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"m","data":{"x":1}}}',
            ErrorResponse(id=None, error=ErrorObject(code=-1, message="m", data={"x": 1})),
        ),
        (
            b'{"jsonrpc":"2.0","error":{"code":-1,"message":"m"}}',
            ErrorResponse(id=None, error=ErrorObject(code=-1, message="m")),
        ),
        (b'  \n{"jsonrpc":"2.0","id":1,"method":"ping"}\n', Request(id=1, method="ping")),
    ],
)
def test_every_message_kind_decodes(body: bytes, expected: Message) -> None:
    assert decode_body(body, allow_batch=False) == ([expected], False)
    assert decode_body(body, allow_batch=True) == ([expected], False)
    assert decode_message(body) == expected
    assert type(decode_message(body)) is type(expected)


def test_unknown_members_are_ignored() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping","extra":[1,{"a":null}]}'
    assert decode_message(body) == Request(id=1, method="ping")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b'{"jsonrpc":"2.0","id":1,"method":"ping"',
        b'{"jsonrpc":"2.0","id":1,"method":"ping"} trailing',
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}{}',
        b"{'jsonrpc':'2.0'}",
        b"\xff\xfe",
        b"nul",
        b"[1,",
    ],
)
@pytest.mark.parametrize("allow_batch", [False, True])
def test_syntax_errors_are_parse_errors(body: bytes, allow_batch: bool) -> None:
    exc = refusal_of(body, allow_batch=allow_batch)
    assert exc.code == PARSE_ERROR
    assert exc.reason is Reason.PARSE_ERROR
    assert exc.request_id is None


@pytest.mark.parametrize(
    "body",
    [
        # The typed decoder fails on the wrong type of "id" first; the syntax
        # error after it must still win: JSON-RPC wants -32700 for any bad JSON.
        b'{"jsonrpc":"2.0","id":[1],"method":"x" ,,}',
        b'{"jsonrpc":2,"id":1,"method":"x",}',
        b'[{"jsonrpc":"2.0","id":{},"method":"x"}, oops]',
        b"[1, {]",
        b'"a string" junk',
    ],
)
@pytest.mark.parametrize("allow_batch", [False, True])
def test_syntax_error_behind_a_type_error_is_still_a_parse_error(
    body: bytes, allow_batch: bool
) -> None:
    exc = refusal_of(body, allow_batch=allow_batch)
    assert (exc.code, exc.reason) == (PARSE_ERROR, Reason.PARSE_ERROR)


@pytest.mark.parametrize("allow_batch", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}",
    ],
)
def test_absurdly_deep_nesting_is_a_parse_error_not_a_crash(body: bytes, allow_batch: bool) -> None:
    exc = refusal_of(body, allow_batch=allow_batch)
    assert (exc.code, exc.reason) == (PARSE_ERROR, Reason.PARSE_ERROR)


@pytest.mark.parametrize(
    ("body", "request_id"),
    [
        (b'{"jsonrpc":"1.0","id":1,"method":"x"}', 1),
        (b'{"jsonrpc":"2.0 ","id":"a","method":"x"}', "a"),
        (b'{"id":1,"method":"x"}', 1),
        (b'{"jsonrpc":null,"method":"x"}', None),
        (b'{"jsonrpc":"2.0","id":null,"method":"x"}', None),
        (b'{"jsonrpc":"2.0","id":1}', None),
        (b'{"jsonrpc":"2.0"}', None),
        (b"{}", None),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","result":{}}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","error":{"code":1,"message":"m"}}', None),
        (b'{"jsonrpc":"2.0","result":{}}', None),
        (b'{"jsonrpc":"2.0","id":null,"result":{}}', None),
        (b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}', None),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":1}}', None),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"x"}', None),
        (b'{"jsonrpc":"2.0","id":true,"method":"x"}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":7}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}', None),
        (b'"x"', None),
        (b"42", None),
        (b"null", None),
    ],
)
def test_invalid_envelopes_are_invalid_request(body: bytes, request_id: object) -> None:
    exc = refusal_of(body)
    assert exc.code == INVALID_REQUEST
    assert exc.reason is Reason.INVALID_REQUEST
    assert exc.request_id == request_id


@pytest.mark.parametrize("kind", ["method", "result", "error"])
def test_an_id_longer_than_the_limit_is_refused_without_repeating_it(kind: str) -> None:
    member = {"method": '"ping"', "result": "{}", "error": '{"code":1,"message":"m"}'}[kind]
    fits = "i" * MAX_ID_LENGTH
    assert decode_message(f'{{"jsonrpc":"2.0","id":"{fits}","{kind}":{member}}}'.encode())
    long = fits + "i"
    exc = refusal_of(f'{{"jsonrpc":"2.0","id":"{long}","{kind}":{member}}}'.encode())
    assert (exc.code, exc.reason, exc.request_id) == (INVALID_REQUEST, Reason.INVALID_REQUEST, None)
    assert long not in str(exc)
    in_a_batch = f'[{{"jsonrpc":"2.0","id":"{long}","{kind}":{member}}}]'.encode()
    with pytest.raises(RemoteProtocolError):
        decode_body(in_a_batch, allow_batch=True)


def test_batch_allowed_decodes_every_member_in_order() -> None:
    body = (
        b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},'
        b'{"jsonrpc":"2.0","id":"x","result":{}}]'
    )
    assert decode_body(body, allow_batch=True) == (
        [Request(id=1, method="a"), Notification(method="b"), Response(id="x", result={})],
        True,
    )


def test_single_element_batch_is_still_a_batch() -> None:
    body = b' [{"jsonrpc":"2.0","id":1,"method":"a"}]'
    assert decode_body(body, allow_batch=True) == ([Request(id=1, method="a")], True)


@pytest.mark.parametrize(
    "body", [b'[{"jsonrpc":"2.0","id":1,"method":"a"}]', b"[]", b"[1]", b"\n [ {} ]"]
)
def test_batch_refused_where_not_allowed(body: bytes) -> None:
    exc = refusal_of(body)
    assert exc.reason is Reason.BATCH_NOT_SUPPORTED
    assert exc.code == INVALID_REQUEST
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(body)
    assert info.value.reason is Reason.BATCH_NOT_SUPPORTED


def test_empty_batch_is_invalid_request() -> None:
    exc = refusal_of(b"[]", allow_batch=True)
    assert (exc.code, exc.reason) == (INVALID_REQUEST, Reason.INVALID_REQUEST)


@pytest.mark.parametrize(
    "body",
    [
        b"[1]",
        b'[{"jsonrpc":"2.0","id":1,"method":"a"}, 5]',
        b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"1.0","method":"b"}]',
        b'[{"jsonrpc":"2.0","id":null,"method":"a"}]',
    ],
)
def test_invalid_batch_member_refuses_the_batch(body: bytes) -> None:
    exc = refusal_of(body, allow_batch=True)
    assert (exc.code, exc.reason) == (INVALID_REQUEST, Reason.INVALID_REQUEST)


# ----------------------------------------------------------------------- encoding


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Request(id=1, method="ping"), b'{"jsonrpc":"2.0","id":1,"method":"ping"}'),
        (
            Request(id="a", method="m", params={"k": "v"}),
            b'{"jsonrpc":"2.0","id":"a","method":"m","params":{"k":"v"}}',
        ),
        (Notification(method="n"), b'{"jsonrpc":"2.0","method":"n"}'),
        (
            Notification(method="n", params={}),
            b'{"jsonrpc":"2.0","method":"n","params":{}}',
        ),
        (Response(id=2, result={}), b'{"jsonrpc":"2.0","id":2,"result":{}}'),
        (
            ErrorResponse(id=None, error=ErrorObject(code=-32600, message="bad")),
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}',
        ),
        (
            ErrorResponse(id="q", error=ErrorObject(code=1, message="m", data=[1])),
            b'{"jsonrpc":"2.0","id":"q","error":{"code":1,"message":"m","data":[1]}}',
        ),
    ],
)
def test_encode_exact_bytes_and_round_trip(message: Message, expected: bytes) -> None:
    assert encode(message) == expected
    assert decode_message(expected) == message


def test_encode_batch() -> None:
    assert encode([Request(id=1, method="a"), Notification(method="b")]) == (
        b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]'
    )


def test_encode_result_exact() -> None:
    assert encode_result(1, {"a": [1, None]}) == b'{"jsonrpc":"2.0","id":1,"result":{"a":[1,null]}}'
    assert encode_result("x", {}) == b'{"jsonrpc":"2.0","id":"x","result":{}}'


def test_encode_error_exact_and_omits_absent_data() -> None:
    assert encode_error(1, -32601, "no such method") == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no such method"}}'
    )
    assert encode_error(None, -32000, "m", {"reason": "in_progress"}) == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"m",'
        b'"data":{"reason":"in_progress"}}}'
    )


def test_encode_request_and_notification_exact_and_omit_absent_params() -> None:
    assert encode_request(5, "sampling/createMessage") == (
        b'{"jsonrpc":"2.0","id":5,"method":"sampling/createMessage"}'
    )
    assert (
        encode_request("s", "m", {"a": 1})
        == b'{"jsonrpc":"2.0","id":"s","method":"m","params":{"a":1}}'
    )
    assert encode_notification("notifications/progress") == (
        b'{"jsonrpc":"2.0","method":"notifications/progress"}'
    )
    assert (
        encode_notification("n", {"p": [1]}) == b'{"jsonrpc":"2.0","method":"n","params":{"p":[1]}}'
    )


def test_encoded_strings_are_escaped() -> None:
    out = encode_request('id"1', 'we"ird\n')
    assert msgspec.json.decode(out) == {"jsonrpc": "2.0", "id": 'id"1', "method": 'we"ird\n'}


@pytest.mark.parametrize(
    "out",
    [
        encode(Request(id=1, method="m")),
        encode(Notification(method="m")),
        encode(ErrorResponse(id=1, error=ErrorObject(code=1, message="m"))),
        encode_error(1, 1, "m"),
        encode_error(None, 1, "m"),
        encode_request(1, "m"),
        encode_notification("m"),
    ],
)
def test_absent_optional_members_are_never_written_as_null(out: bytes) -> None:
    decoded: dict[str, Any] = msgspec.json.decode(out)
    assert "params" not in decoded
    if "error" in decoded:
        assert "data" not in decoded["error"]
    # The only null allowed is an unknown id in an error response.
    assert out.count(b"null") == (1 if decoded.get("id", 0) is None else 0)


def test_error_body_carries_reason_retry_and_extra_data() -> None:
    exc = RemoteProtocolError(
        "slow down",
        http_status=429,
        reason=Reason.STREAM_HALF_OPEN,
        code=-32000,
        request_id="r1",
        retry_after_ms=1500,
        data={"session": "s"},
    )
    assert msgspec.json.decode(error_body(exc)) == {
        "jsonrpc": "2.0",
        "id": "r1",
        "error": {
            "code": -32000,
            "message": "slow down",
            "data": {"reason": "stream_half_open", "retryAfterMs": 1500, "session": "s"},
        },
    }
