"""HTTP hygiene in HttpConnection: framing, Expect, header count, target length, phases.

Every refusal is checked for its status, its ``error.data.reason`` and that the
connection closes (nothing after it is delivered or written); every input is fed
whole and byte by byte, on the fast path and on h11 alone, and all four must give
the same events and bytes.  ``Inbound`` is traced byte by byte on both paths, and
the differential driver of ``test_http_fastpath`` runs again with narrow limits and
``inbound`` in its log.
"""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.protocol import (
    NEED_DATA,
    ConnectionClosed,
    HttpConnection,
    HttpError,
    HttpLimits,
    HttpRequest,
    Inbound,
    Reason,
)

from .helpers import (
    Answer,
    Transcript,
    bytewise,
    default_answer,
    error_reason,
    feed,
    parse_response,
    parse_responses,
    request_bytes,
    split_at,
)
from .test_http_fastpath import DEFAULT_PLAN, DIFF, Driver, Plan, Run, Stream, request_wire

MODES = pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "h11"])
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
HOST = ("Host", "localhost:8000")


def post(headers: list[tuple[str, str]], body: bytes = BODY, target: str = "/mcp") -> bytes:
    """A POST with ``Host``, ``headers`` and ``body`` (``Content-Length`` added if absent)."""
    return request_bytes("POST", target, [HOST, *headers], body)


def run_all(
    data: bytes,
    *,
    limits: HttpLimits | None = None,
    eof: bool = True,
    answer: Answer | None = default_answer,
) -> Transcript:
    """Feed ``data`` whole and byte by byte, fast path and h11 alone: all four agree."""
    runs = [
        feed(chunks, conn=HttpConnection(limits, fast_path=fast_path), eof=eof, answer=answer)
        for fast_path in (True, False)
        for chunks in ([data], bytewise(data))
    ]
    for run in runs[1:]:
        assert run.events == runs[0].events
        assert run.output == runs[0].output
    return runs[0]


def assert_refused(t: Transcript, status: int, reason: Reason, *, delivered: int = 0) -> None:
    """``delivered`` requests, then ``status``/``reason`` and the close; nothing after."""
    assert len(t.requests) == delivered
    *_, err, closed = t.events
    assert isinstance(err, HttpError), t.events
    assert (err.status, err.reason) == (status, reason)
    assert closed == ConnectionClosed()
    assert len(t.events) == delivered + 2
    responses = parse_responses(t.output)  # nothing may follow a closing response
    assert len(responses) == delivered + 1
    resp = responses[-1]
    assert resp.status == status
    assert resp.keep_alive is False
    assert resp.header("connection") == "close"
    assert error_reason(resp) == str(reason)


def inbound(conn: HttpConnection) -> Inbound:
    """``conn.inbound`` (a call, so that mypy does not narrow it between asserts)."""
    return conn.inbound


def refused_conn(data: bytes, fast_path: bool, limits: HttpLimits | None = None) -> HttpError:
    """Feed ``data`` to a fresh connection; the first event must be an HttpError."""
    conn = HttpConnection(limits, fast_path=fast_path)
    conn.receive_data(data)
    err = conn.next_event()
    assert isinstance(err, HttpError), err
    assert conn.should_close
    assert inbound(conn) is Inbound.IDLE
    assert parse_response(conn.data_to_send()).status == err.status
    assert not conn.has_data_to_send
    conn.receive_data(post([]))
    assert conn.next_event() == ConnectionClosed()
    assert conn.next_event() == ConnectionClosed()
    assert conn.data_to_send() == b""
    return err


# ------------------------------------------------- (1) Content-Length with TE


_TE_AND_CL = [
    [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
    [("Transfer-Encoding", "chunked"), ("Content-Length", "5")],
    [("transfer-encoding", "Chunked"), ("content-length", "0")],
    [("Content-Length", "5"), ("Transfer-Encoding", "chunked"), ("Content-Length", "5")],
]


@pytest.mark.parametrize("framing", _TE_AND_CL, ids=["cl-te", "te-cl", "case", "cl-te-cl"])
def test_content_length_with_transfer_encoding_is_400_and_closes(
    framing: list[tuple[str, str]],
) -> None:
    chunked_body = b"5\r\nhello\r\n0\r\n\r\n"
    data = request_bytes("POST", "/mcp", [HOST, *framing]) + chunked_body
    t = run_all(data + post([]))  # the pipelined POST is never delivered either
    assert_refused(t, 400, Reason.AMBIGUOUS_FRAMING)
    assert t.events[0] == HttpError(
        status=400,
        reason=Reason.AMBIGUOUS_FRAMING,
        message="request has both Content-Length and Transfer-Encoding",
    )
    for fast_path in (True, False):
        assert refused_conn(data, fast_path).reason is Reason.AMBIGUOUS_FRAMING
    run_both_drivers([data + post([])])


def test_smuggled_request_behind_ambiguous_framing_is_never_delivered() -> None:
    # Framed by Content-Length, the GET is the body; by chunked coding, it is a
    # second request.  Neither reading is taken.
    smuggled = request_bytes("GET", "/admin", [HOST])
    data = request_bytes(
        "POST",
        "/mcp",
        [HOST, ("Content-Length", str(5 + len(smuggled))), ("Transfer-Encoding", "chunked")],
    )
    data += b"0\r\n\r\n" + smuggled
    t = run_all(data, eof=False)
    assert_refused(t, 400, Reason.AMBIGUOUS_FRAMING)


def test_after_a_keep_alive_request_ambiguous_framing_still_refuses() -> None:
    bad = request_bytes(
        "POST", "/mcp", [HOST, ("Transfer-Encoding", "chunked"), ("Content-Length", "5")]
    )
    t = run_all(post([]) + bad + b"0\r\n\r\n" + post([]))
    assert_refused(t, 400, Reason.AMBIGUOUS_FRAMING, delivered=1)
    assert t.requests[0].body == BODY


def test_transfer_encoding_alone_is_still_served() -> None:
    data = request_bytes("POST", "/mcp", [HOST], BODY, chunked=True)
    t = run_all(data)
    assert [r.body for r in t.requests] == [BODY]


# ---------------------------------------------------------- (2) Expect


@MODES
@pytest.mark.parametrize("value", ["100-continue", "100-Continue", "100-CONTINUE", " 100-continue"])
def test_expect_100_continue_is_answered_before_the_body_arrives(
    fast_path: bool, value: str
) -> None:
    data = post([("Expect", value)])
    head, body = data[: -len(BODY)], data[-len(BODY) :]
    conn = HttpConnection(fast_path=fast_path)
    conn.receive_data(head)
    assert not conn.has_data_to_send
    assert conn.next_event() is NEED_DATA
    assert conn.has_data_to_send
    assert inbound(conn) is Inbound.BODY
    assert conn.data_to_send() == CONTINUE
    assert not conn.has_data_to_send
    assert conn.data_to_send() == b""
    conn.receive_data(body)
    req = conn.next_event()
    assert isinstance(req, HttpRequest)
    assert req.body == BODY
    assert req.headers.get("expect") == value.strip()
    assert conn.data_to_send() == b""  # one 100 per request
    out = conn.send_response(200, [("content-type", "application/json")], b"{}")
    resp = parse_response(out)
    assert (resp.status, resp.body, resp.keep_alive) == (200, b"{}", True)
    assert not conn.should_close


def test_expect_100_continue_whole_and_bytewise_on_both_paths() -> None:
    t = run_all(post([("Expect", "100-continue")]) + post([("Expect", "100-continue")]))
    assert [r.body for r in t.requests] == [BODY, BODY]
    # Each 100 comes first, right before its own final response.
    assert t.output.startswith(CONTINUE)
    first, second = t.output[len(CONTINUE) :].split(CONTINUE)
    assert [r.status for r in parse_responses(first + second)] == [200, 200]
    run_both_drivers([post([("Expect", "100-continue")]) + post([])])


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "streamed"])
def test_a_100_the_driver_did_not_take_goes_out_before_the_response(streamed: bool) -> None:
    conn = HttpConnection()
    conn.receive_data(post([("Expect", "100-continue")]))  # head and body at once
    assert isinstance(conn.next_event(), HttpRequest)
    assert conn.has_data_to_send
    if streamed:
        out = conn.start_stream(200, [("content-type", "text/event-stream")])
        out += conn.send_stream_data(b"data: x\n\n") + conn.end_stream()
    else:
        out = conn.send_response(200, [], b"{}")
    assert not conn.has_data_to_send
    assert out.startswith(CONTINUE)
    assert parse_response(out[len(CONTINUE) :]).status == 200


def test_expect_with_chunked_body_gets_100_and_the_body() -> None:
    data = request_bytes("POST", "/mcp", [HOST, ("Expect", "100-continue")], BODY, chunked=True)
    t = run_all(data)
    assert [r.body for r in t.requests] == [BODY]
    assert t.output.startswith(CONTINUE)
    assert parse_response(t.output[len(CONTINUE) :]).status == 200


@MODES
def test_expect_with_declared_body_over_the_limit_is_413_and_no_100(fast_path: bool) -> None:
    limits = HttpLimits(max_body_bytes=len(BODY) - 1)
    data = post([("Expect", "100-continue")])
    head = data[: -len(BODY)]
    conn = HttpConnection(limits, fast_path=fast_path)
    conn.receive_data(head)
    err = conn.next_event()
    assert isinstance(err, HttpError)
    assert (err.status, err.reason) == (413, Reason.PAYLOAD_TOO_LARGE)
    out = conn.data_to_send()
    assert CONTINUE not in out
    assert error_reason(parse_response(out)) == "payload_too_large"
    assert conn.next_event() == ConnectionClosed()
    t = run_all(head, limits=limits, eof=False)
    assert_refused(t, 413, Reason.PAYLOAD_TOO_LARGE)


def test_expect_with_chunked_body_growing_past_the_limit_is_100_then_413() -> None:
    limits = HttpLimits(max_body_bytes=len(BODY) - 1)
    data = request_bytes("POST", "/mcp", [HOST, ("Expect", "100-continue")], BODY, chunked=True)
    t = run_all(data, limits=limits)
    assert t.output.startswith(CONTINUE)
    t.output = t.output[len(CONTINUE) :]
    assert_refused(t, 413, Reason.PAYLOAD_TOO_LARGE)


@pytest.mark.parametrize(
    "value", ["foo", "100-continue, foo", "foo, 100-continue", "101-continue", "100-continue=1"]
)
def test_other_expectation_is_417_and_closes(value: str) -> None:
    data = post([("Expect", value)])
    t = run_all(data + post([]), eof=False)
    assert_refused(t, 417, Reason.EXPECTATION_FAILED)
    assert CONTINUE not in t.output
    for fast_path in (True, False):
        assert refused_conn(data[: -len(BODY)], fast_path).status == 417
    run_both_drivers([data])


def test_other_expectation_on_a_get_is_417() -> None:
    t = run_all(request_bytes("GET", "/mcp", [HOST, ("Expect", "whatever")]))
    assert_refused(t, 417, Reason.EXPECTATION_FAILED)


def test_100_continue_in_http_1_0_is_ignored() -> None:
    # RFC 9110 section 10.1.1: a server MUST ignore it in an HTTP/1.0 request.
    data = b"POST /mcp HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"
    t = run_all(data)
    assert [r.body for r in t.requests] == [b"hi"]
    assert CONTINUE not in t.output
    assert parse_response(t.output).status == 200


def test_empty_expect_member_is_ignored() -> None:
    t = run_all(post([("Expect", "100-continue, ")]))
    assert [r.body for r in t.requests] == [BODY]


# ----------------------------------------------------- (3) header field count


def _fields(n: int) -> list[tuple[str, str]]:
    """``n`` header fields in all, ``Host`` first (a GET has no Content-Length)."""
    return [HOST, *[(f"X-F{i}", "v") for i in range(n - 1)]]


@pytest.mark.parametrize("limit", [1, 5, 100])
def test_header_fields_up_to_the_limit_are_served_on_the_fast_path(limit: int) -> None:
    limits = HttpLimits(max_header_fields=limit)
    data = request_bytes("GET", "/mcp", _fields(limit))
    t = run_all(data, limits=limits)
    assert len(t.requests) == 1
    assert len(t.requests[0].headers.items) == limit
    conn = HttpConnection(limits)
    conn.receive_data(data)
    assert isinstance(conn.next_event(), HttpRequest)
    assert conn._h11 is None


@pytest.mark.parametrize("limit", [1, 5, 100])
def test_more_header_fields_than_the_limit_is_431_and_closes(limit: int) -> None:
    limits = HttpLimits(max_header_fields=limit)
    data = request_bytes("GET", "/mcp", _fields(limit + 1))
    t = run_all(data + post([]), limits=limits)
    assert_refused(t, 431, Reason.TOO_MANY_HEADERS)
    assert t.events[0] == HttpError(
        status=431,
        reason=Reason.TOO_MANY_HEADERS,
        message=f"more than {limit} request header fields",
    )
    for fast_path in (True, False):
        assert refused_conn(data, fast_path, limits).reason is Reason.TOO_MANY_HEADERS
    run_both_drivers([data], limits=limits)


def test_default_limit_is_100_header_fields() -> None:
    assert HttpLimits().max_header_fields == 100
    assert len(run_all(request_bytes("GET", "/mcp", _fields(100))).requests) == 1
    t = run_all(request_bytes("GET", "/mcp", _fields(101)))
    assert_refused(t, 431, Reason.TOO_MANY_HEADERS)


def test_too_many_fields_in_a_pipelined_request_refuses_only_that_one() -> None:
    limits = HttpLimits(max_header_fields=3)
    data = post([]) + request_bytes("GET", "/mcp", _fields(4)) + post([])
    t = run_all(data, limits=limits)
    assert_refused(t, 431, Reason.TOO_MANY_HEADERS, delivered=1)


def test_a_head_too_large_and_with_too_many_fields_is_headers_too_large() -> None:
    limits = HttpLimits(max_header_bytes=100, max_header_fields=2)
    t = run_all(request_bytes("GET", "/mcp", [*_fields(3), ("X-Pad", "p" * 100)]), limits=limits)
    assert_refused(t, 431, Reason.HEADERS_TOO_LARGE)


# ------------------------------------------------------- (4) request target


def _target(n: int) -> str:
    return "/" + "a" * (n - 1)


@pytest.mark.parametrize("limit", [1, 10, 8192])
def test_target_up_to_the_limit_is_served_on_the_fast_path(limit: int) -> None:
    limits = HttpLimits(max_target_bytes=limit)
    data = request_bytes("GET", _target(limit), [HOST])
    t = run_all(data, limits=limits)
    assert [r.target for r in t.requests] == [_target(limit)]
    conn = HttpConnection(limits)
    conn.receive_data(data)
    assert isinstance(conn.next_event(), HttpRequest)
    assert conn._h11 is None


@pytest.mark.parametrize("limit", [1, 10, 8192])
@pytest.mark.parametrize("method", ["GET", "POST", "OPTIONS", "M" * 16, "M" * 17])
def test_target_over_the_limit_is_414_and_closes(limit: int, method: str) -> None:
    limits = HttpLimits(max_target_bytes=limit)
    data = request_bytes(method, _target(limit + 1), [HOST])
    assert len(data) < limits.max_header_bytes  # the whole head is well within its limit
    t = run_all(data + post([]), limits=limits)
    assert_refused(t, 414, Reason.URI_TOO_LONG)
    assert t.events[0] == HttpError(
        status=414,
        reason=Reason.URI_TOO_LONG,
        message=f"request target longer than {limit} bytes",
    )
    for fast_path in (True, False):
        assert refused_conn(data, fast_path, limits).reason is Reason.URI_TOO_LONG
    run_both_drivers([data], limits=limits)


def test_default_target_limit_is_8192_bytes() -> None:
    assert HttpLimits().max_target_bytes == 8192
    t = run_all(request_bytes("GET", _target(8193), [HOST]))
    assert_refused(t, 414, Reason.URI_TOO_LONG)


def trickle(conn: HttpConnection, first: bytes, byte: bytes, most: int) -> tuple[object, int]:
    """Feed ``first``, then ``byte`` after every NEED_DATA; return the event and bytes fed."""
    conn.receive_data(first)
    fed = len(first)
    for _ in range(most):
        ev = conn.next_event()
        if ev is not NEED_DATA:
            return ev, fed
        assert inbound(conn) is Inbound.HEAD
        conn.receive_data(byte)
        fed += 1
    raise AssertionError("never refused")


@MODES
@pytest.mark.parametrize("method", ["GET", "DELETE", "M" * 16])
def test_endless_request_line_is_cut_as_soon_as_the_target_passes_the_limit(
    fast_path: bool, method: str
) -> None:
    limits = HttpLimits(max_target_bytes=100)  # max_header_bytes stays 64 KiB
    conn = HttpConnection(limits, fast_path=fast_path)
    ev, fed = trickle(conn, method.encode() + b" /", b"a", 100_000)
    assert isinstance(ev, HttpError)
    assert (ev.status, ev.reason) == (414, Reason.URI_TOO_LONG)
    # Refused at the first byte past the limit: method, space, 101 target bytes.
    assert fed == len(method) + 1 + 101
    assert fed <= limits.max_target_bytes + 16 + 2
    resp = parse_response(conn.data_to_send())
    assert (resp.status, resp.keep_alive) == (414, False)
    assert error_reason(resp) == "uri_too_long"
    assert conn.next_event() == ConnectionClosed()
    assert conn.should_close


@MODES
def test_endless_request_line_after_a_keep_alive_request_is_cut_too(fast_path: bool) -> None:
    limits = HttpLimits(max_target_bytes=50)
    conn = HttpConnection(limits, fast_path=fast_path)
    conn.receive_data(post([]) + b"GET /aaaa")  # the next request line has begun
    assert isinstance(conn.next_event(), HttpRequest)
    assert conn.next_event() is NEED_DATA
    assert inbound(conn) is Inbound.IDLE  # answering: the peer owes nothing yet
    conn.send_response(200, [], b"")
    assert inbound(conn) is Inbound.HEAD
    ev, fed = trickle(conn, b"a", b"a", 1000)  # (b"" would be the EOF)
    assert isinstance(ev, HttpError)
    assert ev.status == 414
    assert fed == 51 - len("/aaaa")


@MODES
def test_endless_line_with_a_long_method_runs_into_the_header_limit(fast_path: bool) -> None:
    # Past 16 bytes of method the target is judged when the head is complete, so
    # an endless line is cut by max_header_bytes instead (431).
    limits = HttpLimits(max_target_bytes=100, max_header_bytes=1000)
    conn = HttpConnection(limits, fast_path=fast_path)
    ev, fed = trickle(conn, b"M" * 17 + b" /", b"a", 10_000)
    assert isinstance(ev, HttpError)
    assert (ev.status, ev.reason) == (431, Reason.HEADERS_TOO_LARGE)
    assert fed == 1001


@MODES
def test_request_line_at_the_limit_trickled_is_served(fast_path: bool) -> None:
    limits = HttpLimits(max_target_bytes=100)
    data = request_bytes("GET", _target(100), [HOST])
    conn = HttpConnection(limits, fast_path=fast_path)
    for byte in bytewise(data[:-1]):
        conn.receive_data(byte)
        assert conn.next_event() is NEED_DATA
    conn.receive_data(data[-1:])
    req = conn.next_event()
    assert isinstance(req, HttpRequest)
    assert req.target == _target(100)


@pytest.mark.parametrize(
    "rest",
    [
        b" HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n",
        b" HTTP/9.9\r\n\r\n",
        b"\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
        b" HTTP/1.1\r\n",
        b"",
    ],
    ids=["bad-header", "bad-version", "bad-target-byte", "line-only", "no-line-end"],
)
def test_over_long_target_is_414_whatever_follows(rest: bytes) -> None:
    limits = HttpLimits(max_target_bytes=20)
    data = b"GET " + _target(21).encode() + rest
    t = run_all(data, limits=limits, eof=False)
    assert_refused(t, 414, Reason.URI_TOO_LONG)


def test_over_long_target_in_a_head_over_the_header_limit() -> None:
    # Short method: the line alone decides (414), before the head limit.
    limits = HttpLimits(max_target_bytes=20, max_header_bytes=100)
    padded = [HOST, ("X-Pad", "p" * 200)]
    assert_refused(
        run_all(request_bytes("GET", _target(21), padded), limits=limits), 414, Reason.URI_TOO_LONG
    )
    # Long method: the head's size is checked first (431).
    t = run_all(request_bytes("M" * 17, _target(21), padded), limits=limits)
    assert_refused(t, 431, Reason.HEADERS_TOO_LARGE)


_VALID_RESTS = [
    b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
    b" HTTP/1.1\nHost: x\n\n",
]
_TOKENS = ["GET", "POST", "DELETE", "OPTIONS", "M" * 16, "M" * 17]


@given(
    method=st.sampled_from([*_TOKENS, "G(T", ""]),
    length=st.integers(7, 13),
    rest=st.sampled_from([*_VALID_RESTS, b" HTTP/1.1\r\nbad\r\n\r\n", b" HTTP/1.1\r\n", b""]),
    before=st.sampled_from([b"", request_bytes("GET", "/", [HOST])]),
    max_header_bytes=st.sampled_from([24, 40, 4096]),
    data=st.data(),
)
@DIFF
def test_request_line_answers_are_the_same_however_split(
    method: str,
    length: int,
    rest: bytes,
    before: bytes,
    max_header_bytes: int,
    data: st.DataObject,
) -> None:
    limits = HttpLimits(max_target_bytes=10, max_header_bytes=max_header_bytes)
    raw = before + method.encode() + b" " + _target(length).encode() + rest
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    eof = data.draw(st.booleans())
    runs = [
        run_both_drivers(chunks, limits=limits, eof=eof)
        for chunks in ([raw], split_at(raw, cuts), bytewise(raw))
    ]
    outcomes = [outcome(run) for run in runs]
    errors = [e for e in outcomes[0][0] if isinstance(e, HttpError)]
    # A 414 is decided from the bytes alone: if one split gives it, all do, with
    # the same events and bytes.  (So do valid requests; an invalid head gets the
    # same status and reason however split -- over the header limit too -- but
    # h11's message may differ.)
    any_414 = any(isinstance(e, HttpError) and e.status == 414 for o in outcomes for e in o[0])
    if any_414 or (method in _TOKENS and rest in _VALID_RESTS):
        assert outcomes[1] == outcomes[0]
        assert outcomes[2] == outcomes[0]
    verdicts = [[(e.status, e.reason) for e in o[0] if isinstance(e, HttpError)] for o in outcomes]
    assert verdicts[1] == verdicts[0]
    assert verdicts[2] == verdicts[0]
    roomy = max_header_bytes == 4096 and method in ("GET", "POST", "DELETE", "OPTIONS")
    if roomy and length > 10:
        assert [(e.status, e.reason) for e in errors] == [(414, Reason.URI_TOO_LONG)]
    if length <= 10:
        assert all(e.status != 414 for e in errors)


# --------------------------------------------------------------- (5) Inbound


def inbound_trace(data: bytes, fast_path: bool) -> list[object]:
    """``inbound`` before anything, then after each byte fed and each event pulled."""
    conn = HttpConnection(fast_path=fast_path)
    trace: list[object] = [conn.inbound]
    for byte in bytewise(data):
        conn.receive_data(byte)
        while (ev := conn.next_event()) is not NEED_DATA:
            trace.append((type(ev).__name__, conn.inbound))
            if isinstance(ev, HttpRequest):
                conn.send_response(200, [], b"")
                trace.append(("answered", conn.inbound))
            else:
                return trace
        trace.append(conn.inbound)
    return trace


IDLE, HEAD, BODY_ = Inbound.IDLE, Inbound.HEAD, Inbound.BODY


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_inbound_is_head_then_body_byte_by_byte_on_both_paths(chunked: bool) -> None:
    data = request_bytes("POST", "/mcp", [HOST], BODY, chunked=chunked)
    head = data.index(b"\r\n\r\n") + 4
    body = len(data) - head
    # The last head byte makes it BODY; the last body byte delivers the request.
    expected: list[object] = [IDLE, *[HEAD] * (head - 1), *[BODY_] * body]
    expected += [("HttpRequest", IDLE), ("answered", IDLE), IDLE]
    for fast_path in (True, False):
        assert inbound_trace(data, fast_path) == expected


def test_inbound_of_a_bodiless_request_is_head_then_idle() -> None:
    data = request_bytes("GET", "/mcp", [HOST])
    expected: list[object] = [IDLE, *[HEAD] * (len(data) - 1)]
    expected += [("HttpRequest", IDLE), ("answered", IDLE), IDLE]
    for fast_path in (True, False):
        assert inbound_trace(data, fast_path) == expected


def test_inbound_with_expect_is_body_while_the_100_waits() -> None:
    data = post([("Expect", "100-continue")])
    traces = [inbound_trace(data, fast_path) for fast_path in (True, False)]
    assert traces[0] == traces[1]
    assert traces[0][len(data) - len(BODY)] is BODY_


def test_inbound_across_keep_alive_and_pipelining() -> None:
    data = post([]) + request_bytes("GET", "/mcp", [HOST]) + request_bytes("DELETE", "/mcp", [HOST])
    traces = [inbound_trace(data, fast_path) for fast_path in (True, False)]
    assert traces[0] == traces[1]
    assert traces[0].count(("HttpRequest", IDLE)) == 3
    assert traces[0][-1] is IDLE


@MODES
def test_inbound_while_answering_is_idle_and_after_it_sees_the_pipelined_head(
    fast_path: bool,
) -> None:
    conn = HttpConnection(fast_path=fast_path)
    assert inbound(conn) is IDLE
    conn.receive_data(post([]))
    assert isinstance(conn.next_event(), HttpRequest)
    assert inbound(conn) is IDLE
    conn.start_stream(200, [("content-type", "text/event-stream")])
    conn.receive_data(b"GET /mcp HT")  # a pipelined head begins mid-stream
    assert conn.next_event() is NEED_DATA
    assert inbound(conn) is IDLE
    conn.end_stream()
    assert conn.next_event() is NEED_DATA
    assert inbound(conn) is HEAD
    conn.receive_data(b"TP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nab")
    assert conn.next_event() is NEED_DATA
    assert inbound(conn) is BODY_
    conn.receive_data(b"c")
    assert isinstance(conn.next_event(), HttpRequest)
    assert inbound(conn) is IDLE


@MODES
def test_inbound_is_idle_once_closed(fast_path: bool) -> None:
    conn = HttpConnection(fast_path=fast_path)
    conn.receive_data(b"GET /mcp HTTP/1.1\r\nHo")
    assert conn.next_event() is NEED_DATA
    assert inbound(conn) is HEAD
    conn.receive_data(b"")
    assert isinstance(conn.next_event(), HttpError | ConnectionClosed)
    assert inbound(conn) is IDLE
    conn = HttpConnection(fast_path=fast_path)
    conn.receive_data(post([]))
    conn.send_failed()
    assert inbound(conn) is IDLE


# --------------------------------------------------------- (6) HttpLimits


_LIMIT_NAMES = [f.name for f in fields(HttpLimits)]


def test_limits_defaults() -> None:
    assert HttpLimits() == HttpLimits(
        max_header_bytes=64 * 1024,
        max_body_bytes=4 * 1024 * 1024,
        max_header_fields=100,
        max_target_bytes=8192,
    )
    assert set(_LIMIT_NAMES) == {
        "max_header_bytes",
        "max_body_bytes",
        "max_header_fields",
        "max_target_bytes",
    }


@pytest.mark.parametrize("name", _LIMIT_NAMES)
@pytest.mark.parametrize("value", [-1, -(2**70), 1.5, "10", None, True])
def test_limits_must_be_positive_ints(name: str, value: object) -> None:
    with pytest.raises(
        ValueError, match=rf"HttpLimits\.{name} must be a (positive|non-negative) int"
    ):
        HttpLimits(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", _LIMIT_NAMES)
def test_zero_is_refused_except_for_the_body(name: str) -> None:
    if name == "max_body_bytes":
        assert HttpLimits(max_body_bytes=0).max_body_bytes == 0  # no body allowed
        return
    with pytest.raises(ValueError, match=f"HttpLimits.{name} must be a positive int, got 0"):
        HttpLimits(**{name: 0})


def test_one_is_accepted_everywhere() -> None:
    HttpLimits(max_header_bytes=1, max_body_bytes=1, max_header_fields=1, max_target_bytes=1)


# ------------------------------------- differential: narrow limits, inbound logged


class InboundDriver(Driver):
    """The differential driver, logging ``inbound`` with the rest of the state."""

    def state(self) -> None:
        super().state()
        self.run.log.append(("inbound", self.conn.inbound))


def run_both_drivers(
    chunks: list[bytes],
    *,
    limits: HttpLimits | None = None,
    eof: bool = True,
    eager_eof: bool = False,
    plans: list[Plan] | None = None,
) -> Run:
    """Drive the fast path and h11 alone identically (``inbound`` included); must agree."""
    runs = [
        InboundDriver(
            HttpConnection(limits, fast_path=fast_path),
            chunks,
            eof=eof,
            eager_eof=eager_eof,
            plans=plans or [],
        ).go()
        for fast_path in (True, False)
    ]
    assert runs[0].log == runs[1].log
    assert runs[0].output == runs[1].output
    assert runs[0].should_close == runs[1].should_close
    return runs[0]


def outcome(run: Run) -> tuple[list[object], bytes]:
    """What a run did regardless of how its input was split: its events and bytes."""
    events = [e[1] for e in run.log if e[0] == "event" and e[1] is not NEED_DATA]
    return events, bytes(run.output)


NARROW = HttpLimits(
    max_header_bytes=200, max_body_bytes=50, max_header_fields=4, max_target_bytes=8
)
STREAM_PLAN = Plan(Stream(200, (("content-type", "text/event-stream"),), (None, b"x")))


@DIFF
@given(data=st.data())
def test_fast_path_and_h11_agree_under_narrow_limits_inbound_included(
    data: st.DataObject,
) -> None:
    limits = data.draw(st.sampled_from([None, NARROW]), label="limits")
    requests = data.draw(st.lists(request_wire(limits), min_size=1, max_size=3), label="requests")
    raw = b"".join(requests)
    how = data.draw(st.sampled_from(["cuts", "whole", "bytewise"]), label="split")
    if how == "whole":
        chunks = [raw]
    elif how == "bytewise":
        chunks = bytewise(raw)
    else:
        chunks = split_at(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    eof = data.draw(st.booleans(), label="eof")
    plans = data.draw(st.sampled_from([[DEFAULT_PLAN], [STREAM_PLAN, DEFAULT_PLAN]]))
    run_both_drivers(chunks, limits=limits, eof=eof, plans=plans)
