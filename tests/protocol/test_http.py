"""Tests for weir.protocol._http: HttpConnection parsing, limits, keep-alive and framing.

Inputs are fed whole and byte by byte (same events, same output bytes), and
everything the server writes is parsed back with an ``h11.Connection(h11.CLIENT)``.
"""

from __future__ import annotations

import h11
import pytest

from weir.protocol import (
    NEED_DATA,
    ConnectionClosed,
    HttpConnection,
    HttpError,
    HttpLimits,
    HttpRequest,
    Reason,
)
from weir.protocol._errors import LocalProtocolError
from weir.protocol._http_events import Headers

from .helpers import (
    bytewise,
    error_reason,
    feed,
    feed_both,
    parse_response,
    parse_responses,
    request_bytes,
)

BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
POST_HEADERS = (
    ("Host", "localhost:8000"),
    ("Accept", "application/json, text/event-stream"),
    ("Content-Type", "application/json"),
)


def post_bytes(body: bytes = BODY, *, chunked: bool = False, chunk_size: int = 3) -> bytes:
    return request_bytes(
        "POST", "/mcp?x=1", POST_HEADERS, body, chunked=chunked, chunk_size=chunk_size
    )


def only_request(conn: HttpConnection) -> HttpRequest:
    ev = conn.next_event()
    assert isinstance(ev, HttpRequest), ev
    return ev


# ------------------------------------------------------------------------- parsing


def test_post_is_one_request_with_its_body_whole_and_bytewise() -> None:
    t = feed_both(post_bytes())
    assert t.events == [
        HttpRequest(
            method="POST",
            target="/mcp?x=1",
            headers=Headers.from_raw(
                [
                    (b"host", b"localhost:8000"),
                    (b"accept", b"application/json, text/event-stream"),
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(BODY)),
                ]
            ),
            body=BODY,
        ),
        ConnectionClosed(),
    ]
    req = t.requests[0]
    assert req.path == "/mcp"
    assert req.query == "x=1"
    assert req.http_version == "1.1"
    assert req.headers.get("content-type") == "application/json"


def test_request_is_delivered_only_when_the_whole_body_has_arrived() -> None:
    data = post_bytes()
    conn = HttpConnection()
    for chunk in bytewise(data[:-1]):
        conn.receive_data(chunk)
        assert conn.next_event() is NEED_DATA
    conn.receive_data(data[-1:])
    assert only_request(conn).body == BODY


@pytest.mark.parametrize("chunk_size", [1, 2, 7, 1000])
def test_chunked_request_body_is_reassembled(chunk_size: int) -> None:
    t = feed_both(post_bytes(chunked=True, chunk_size=chunk_size))
    assert [r.body for r in t.requests] == [BODY]
    assert t.requests[0].headers.get("transfer-encoding") == "chunked"


def test_repeated_headers_are_joined_by_get_and_kept_in_items() -> None:
    data = request_bytes("GET", "/mcp", [("Host", "h"), ("Accept", "a/b"), ("Accept", "c/d")])
    (req,) = feed_both(data).requests
    assert req.headers.get("accept") == "a/b, c/d"
    assert [v for n, v in req.headers.items if n == "accept"] == ["a/b", "c/d"]
    assert "accept" in req.headers
    assert req.headers.get("missing", "dflt") == "dflt"


def test_query_is_empty_without_question_mark() -> None:
    req = HttpRequest(method="GET", target="/mcp", headers=Headers.of())
    assert (req.path, req.query) == ("/mcp", "")


# ------------------------------------------------------------------- keep-alive


def test_keep_alive_two_requests_with_complete_and_streamed_responses() -> None:
    conn = HttpConnection()
    out = b""
    conn.receive_data(post_bytes())
    first = only_request(conn)
    assert first.body == BODY
    assert conn.next_event() is NEED_DATA
    out += conn.send_response(200, [("content-type", "application/json")], b'{"a":1}')
    assert not conn.should_close

    conn.receive_data(
        request_bytes("GET", "/mcp", [("Host", "x"), ("Accept", "text/event-stream")])
    )
    second = only_request(conn)
    assert second.method == "GET"
    out += conn.start_stream(200, [("content-type", "text/event-stream")])
    assert conn.response_in_progress
    out += conn.send_stream_data(b"data: one\n\n")
    assert conn.send_stream_data(b"") == b""
    out += conn.send_stream_data(b"data: two\n\n")
    out += conn.end_stream()
    assert not conn.response_in_progress
    assert not conn.should_close
    assert conn.data_to_send() == b""

    r1, r2 = parse_responses(out)
    assert (r1.status, r1.body, r1.keep_alive) == (200, b'{"a":1}', True)
    assert r1.header("content-length") == "7"
    assert r1.header("server") == "weir"
    assert (r2.status, r2.body, r2.keep_alive) == (200, b"data: one\n\ndata: two\n\n", True)
    assert r2.header("transfer-encoding") == "chunked"
    assert r2.header("content-type") == "text/event-stream"

    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
    assert conn.should_close


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_chunk_in_parts_is_the_same_bytes_and_copies_nothing_on_the_fast_path(
    fast_path: bool,
) -> None:
    frames = [b"data: one\n\n", b"", b"data: " + b"x" * 70000 + b"\n\n"]
    whole, parts = HttpConnection(fast_path=fast_path), HttpConnection(fast_path=fast_path)
    outs: list[bytes] = []
    for conn in (whole, parts):
        conn.receive_data(request_bytes("GET", "/mcp", [("Host", "x")]))
        only_request(conn)
        outs.append(conn.start_stream(200, [("content-type", "text/event-stream")]))
    outs[0] += whole.send_stream_data(b"".join(frames)) + whole.end_stream()
    pieces = parts.send_stream_parts(frames)
    assert parts.send_stream_parts([b"", b""]) == []
    outs[1] += b"".join(pieces) + parts.end_stream()
    assert outs[0] == outs[1]
    (response,) = parse_responses(outs[1])
    assert response.body == b"".join(frames)
    if fast_path:  # the caller's frames themselves, between the size line and CRLF
        assert pieces[0] == b"%x\r\n" % sum(map(len, frames))
        assert all(a is b for a, b in zip(pieces[1:-1], frames, strict=True))


def test_parts_outside_a_streamed_response_are_refused() -> None:
    conn = HttpConnection()
    conn.receive_data(post_bytes())
    only_request(conn)
    with pytest.raises(LocalProtocolError):
        conn.send_stream_parts([b"data: x\n\n"])


def test_pipelined_request_waits_until_the_first_response_ends() -> None:
    conn = HttpConnection()
    conn.receive_data(post_bytes() + request_bytes("DELETE", "/mcp", [("Host", "x")]))
    assert only_request(conn).method == "POST"
    assert conn.next_event() is NEED_DATA
    conn.start_stream(200, [("content-type", "text/event-stream")])
    conn.send_stream_data(b"data: x\n\n")
    assert conn.next_event() is NEED_DATA
    conn.end_stream()
    assert only_request(conn).method == "DELETE"
    assert conn.next_event() is NEED_DATA


def test_pipelined_requests_whole_and_bytewise() -> None:
    data = post_bytes() + post_bytes(chunked=True) + request_bytes("GET", "/mcp", [("Host", "x")])
    t = feed_both(data)
    assert [r.method for r in t.requests] == ["POST", "POST", "GET"]
    assert [r.body for r in t.requests] == [BODY, BODY, b""]
    assert [r.status for r in parse_responses(t.output)] == [200, 200, 200]


def test_client_connection_close_closes_after_the_response() -> None:
    conn = HttpConnection()
    conn.receive_data(request_bytes("GET", "/mcp", [("Host", "x"), ("Connection", "close")]))
    only_request(conn)
    assert not conn.should_close
    resp = parse_response(conn.send_response(204, []))
    assert conn.should_close
    assert resp.keep_alive is False
    assert resp.header("connection") == "close"
    assert conn.next_event() == ConnectionClosed()


def test_http_1_0_client_is_closed_after_the_response() -> None:
    conn = HttpConnection()
    conn.receive_data(b"GET /mcp HTTP/1.0\r\n\r\n")
    assert only_request(conn).http_version == "1.0"
    conn.send_response(200, [], b"x")
    assert conn.should_close


def test_connection_close_after_streamed_response() -> None:
    conn = HttpConnection()
    conn.receive_data(request_bytes("GET", "/mcp", [("Host", "x"), ("Connection", "close")]))
    only_request(conn)
    out = conn.start_stream(200, [("content-type", "text/event-stream")])
    out += conn.send_stream_data(b"data: x\n\n")
    assert not conn.should_close
    out += conn.end_stream()
    assert conn.should_close
    assert parse_response(out).body == b"data: x\n\n"


# ------------------------------------------------------------------------- limits


def test_content_length_over_limit_is_413_before_any_body_arrives() -> None:
    limits = HttpLimits(max_body_bytes=10)
    head = request_bytes("POST", "/mcp", [("Host", "x"), ("Content-Length", "11")])
    t = feed_both(head, limits=limits, eof=False)
    assert t.events == [
        HttpError(
            status=413,
            reason=Reason.PAYLOAD_TOO_LARGE,
            message="request body larger than 10 bytes",
        ),
        ConnectionClosed(),
    ]
    resp = parse_response(t.output)
    assert resp.status == 413
    assert resp.keep_alive is False
    assert resp.header("content-type") == "application/json"
    assert error_reason(resp) == "payload_too_large"
    body = resp.json()
    assert body["id"] is None
    assert body["error"]["code"] == -32600


def test_body_exactly_at_limit_is_accepted() -> None:
    limits = HttpLimits(max_body_bytes=len(BODY))
    for chunked in (False, True):
        t = feed_both(post_bytes(chunked=chunked), limits=limits)
        assert [r.body for r in t.requests] == [BODY]


def test_chunked_body_growing_past_limit_is_413() -> None:
    limits = HttpLimits(max_body_bytes=len(BODY) - 1)
    t = feed_both(post_bytes(chunked=True), limits=limits)
    assert not t.requests
    assert isinstance(t.events[0], HttpError)
    assert t.events[0].status == 413
    assert t.events[0].reason is Reason.PAYLOAD_TOO_LARGE
    assert t.events[-1] == ConnectionClosed()
    resp = parse_response(t.output)
    assert resp.status == 413
    assert error_reason(resp) == "payload_too_large"


def test_after_413_further_bytes_are_ignored_and_nothing_more_is_written() -> None:
    conn = HttpConnection(HttpLimits(max_body_bytes=4))
    conn.receive_data(request_bytes("POST", "/mcp", [("Host", "x")], b"0123456789"))
    assert isinstance(conn.next_event(), HttpError)
    assert parse_response(conn.data_to_send()).status == 413
    conn.receive_data(post_bytes())
    assert conn.next_event() == ConnectionClosed()
    assert conn.data_to_send() == b""
    assert conn.should_close


def _head(extra: int) -> bytes:
    return request_bytes("GET", "/mcp", [("Host", "x"), ("X-Pad", "a" * extra)])


@pytest.mark.parametrize("over", [1, 2, 300])
def test_oversized_header_block_is_431_however_it_is_split(over: int) -> None:
    data = _head(300)
    t = feed_both(data, limits=HttpLimits(max_header_bytes=len(data) - over))
    assert t.events == [
        HttpError(
            status=431,
            reason=Reason.HEADERS_TOO_LARGE,
            message="request header block too large",
        ),
        ConnectionClosed(),
    ]
    resp = parse_response(t.output)
    assert resp.status == 431
    assert resp.keep_alive is False
    assert error_reason(resp) == "headers_too_large"


def test_header_block_exactly_at_limit_is_accepted() -> None:
    data = _head(300)
    t = feed_both(data, limits=HttpLimits(max_header_bytes=len(data)))
    assert len(t.requests) == 1


def test_never_ending_header_block_is_431_without_buffering_it_all() -> None:
    conn = HttpConnection(HttpLimits(max_header_bytes=100))
    conn.receive_data(b"GET /mcp HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    assert conn.next_event() is NEED_DATA
    ev: object = NEED_DATA
    for _ in range(100):
        conn.receive_data(b"a" * 10)
        ev = conn.next_event()
        if ev is not NEED_DATA:
            break
    assert isinstance(ev, HttpError)
    assert ev.status == 431
    assert parse_response(conn.data_to_send()).status == 431


# ------------------------------------------------------------------ broken peers


@pytest.mark.parametrize(
    "data",
    [
        b"garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"\x00\xff\r\n\r\n",
    ],
)
def test_malformed_request_is_400_malformed_http_then_closed(data: bytes) -> None:
    for chunks in ([data], bytewise(data)):
        t = feed(chunks, eof=False)
        assert len(t.events) == 2
        err, closed = t.events
        assert isinstance(err, HttpError)
        assert (err.status, err.reason) == (400, Reason.MALFORMED_HTTP)
        assert closed == ConnectionClosed()
        resp = parse_response(t.output)
        assert resp.status == 400
        assert resp.keep_alive is False
        assert error_reason(resp) == "malformed_http"


def test_malformed_connection_stays_closed() -> None:
    conn = HttpConnection()
    conn.receive_data(b"garbage\r\n\r\n")
    assert isinstance(conn.next_event(), HttpError)
    assert conn.should_close
    conn.receive_data(post_bytes())
    assert conn.next_event() == ConnectionClosed()
    assert conn.next_event() == ConnectionClosed()


def test_eof_on_idle_connection_is_connection_closed_with_no_output() -> None:
    t = feed_both(b"")
    assert t.events == [ConnectionClosed()]
    assert t.output == b""


def test_eof_after_a_complete_cycle_is_connection_closed() -> None:
    t = feed_both(post_bytes())
    assert [type(e) for e in t.events] == [HttpRequest, ConnectionClosed]


def test_eof_in_the_middle_of_a_request_never_delivers_it() -> None:
    t = feed_both(post_bytes()[:-3])
    assert not t.requests
    assert t.events[-1] == ConnectionClosed()


def test_data_after_eof_is_ignored() -> None:
    conn = HttpConnection()
    conn.receive_data(b"")
    conn.receive_data(post_bytes())
    assert conn.next_event() == ConnectionClosed()
    assert conn.should_close


# ------------------------------------------------------------------ API misuse


def _answered() -> HttpConnection:
    conn = HttpConnection()
    conn.receive_data(post_bytes() + post_bytes())
    only_request(conn)
    return conn


def test_send_failed_makes_the_connection_unusable() -> None:
    conn = _answered()
    assert not conn.should_close
    conn.send_failed()
    assert conn.should_close
    with pytest.raises(LocalProtocolError):
        conn.send_response(200, [], b"x")
    assert conn.next_event() == ConnectionClosed()


def test_send_failed_during_a_stream() -> None:
    conn = _answered()
    conn.start_stream(200, [])
    conn.send_failed()
    assert conn.should_close
    with pytest.raises(LocalProtocolError):
        conn.send_stream_data(b"x")
    with pytest.raises(LocalProtocolError):
        conn.end_stream()


def test_sending_body_after_end_of_stream_raises() -> None:
    conn = HttpConnection()
    conn.receive_data(request_bytes("GET", "/mcp", [("Host", "x")]))
    only_request(conn)
    conn.start_stream(200, [])
    conn.end_stream()
    with pytest.raises(LocalProtocolError):
        conn.send_stream_data(b"late")
    with pytest.raises(LocalProtocolError):
        conn.end_stream()


def test_second_response_to_one_request_raises() -> None:
    conn = _answered()
    conn.send_response(200, [], b"x")
    # The pipelined second request has not been pulled yet: no response is due.
    with pytest.raises(LocalProtocolError):
        conn.send_response(200, [], b"y")


def test_responding_before_any_request_raises() -> None:
    conn = HttpConnection()
    with pytest.raises(LocalProtocolError):
        conn.send_response(200, [], b"x")
    with pytest.raises(LocalProtocolError):
        conn.start_stream(200, [])


def test_complete_response_headers_and_body_are_exact() -> None:
    conn = _answered()
    out = conn.send_response(202, [("x-a", "b")], b"")
    assert out == b"HTTP/1.1 202 Accepted\r\nserver: weir\r\nx-a: b\r\ncontent-length: 0\r\n\r\n"
    resp = parse_responses(out)[0]
    assert (resp.status, resp.body) == (202, b"")


def test_head_response_has_headers_but_no_body_and_keeps_the_connection() -> None:
    client = h11.Connection(h11.CLIENT)
    wire = client.send(h11.Request(method="HEAD", target="/mcp", headers=[("host", "x")]))
    wire += client.send(h11.EndOfMessage())
    conn = HttpConnection()
    conn.receive_data(wire + request_bytes("GET", "/mcp", [("Host", "x")]))
    assert only_request(conn).method == "HEAD"
    out = conn.send_response(405, [("allow", "GET, POST, DELETE")], b'{"error":1}')
    client.receive_data(out)
    resp = client.next_event()
    assert isinstance(resp, h11.Response)
    assert resp.status_code == 405
    assert (b"content-length", b"11") in list(resp.headers)
    assert client.next_event() == h11.EndOfMessage()
    assert not conn.should_close
    assert only_request(conn).method == "GET"
    assert conn.send_response(200, [], b"abc").endswith(b"\r\n\r\nabc")
