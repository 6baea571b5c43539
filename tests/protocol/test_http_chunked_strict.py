"""Chunked request bodies keep the line grammar, and HTTP/1.0 may not be chunked.

h11 ends a trailer section at a bare LF (``0\\r\\n\\n``), joins obs-fold in
trailer fields and keeps bare CR and control bytes in chunk extensions and
trailer values; an HTTP/1.0 request with ``Transfer-Encoding: chunked`` it reads
as chunked.  A front end that reads any of these otherwise sees another end of
the body, so another next request, than weir does (request smuggling).  Each is
refused 400 and the connection closed, on both parse paths, however split, and
nothing pipelined after it is delivered.
"""

from __future__ import annotations

import pytest

from weir.protocol import ConnectionClosed, HttpError, HttpLimits, HttpRequest, Reason

from .helpers import error_reason, parse_responses
from .test_http_strict import SMUGGLED, run_all

HEAD = (
    b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Accept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
BAD_BODIES = {
    "trailer-section-ends-in-bare-lf": b"2\r\n{}\r\n0\r\n\n",
    "trailer-line-ends-in-bare-lf": b"2\r\n{}\r\n0\r\nX-A: b\nX-B: c\r\n\r\n",
    "trailer-obs-fold": b"2\r\n{}\r\n0\r\nX-A: b\r\n c\r\n\r\n",
    "trailer-control-byte": b"2\r\n{}\r\n0\r\nX-A: b\x01c\r\n\r\n",
    "trailer-bare-cr": b"2\r\n{}\r\n0\r\nX-A: b\rc\r\n\r\n",
    "extension-control-byte": b"2;a\x01b\r\n{}\r\n0\r\n\r\n",
    "extension-bare-cr": b"2;a\rb\r\n{}\r\n0\r\n\r\n",
    "extension-nul-after-data": b"2\r\n{}\r\n0;x\x00\r\n\r\n",
}


def refused(data: bytes, reason: Reason) -> HttpError:
    *events, output = run_all(data + SMUGGLED, eof=False)
    assert len(events) == 2, events
    err, closed = events
    assert isinstance(err, HttpError)
    assert (err.status, err.reason) == (400, reason)
    assert closed == ConnectionClosed()
    assert isinstance(output, bytes)
    [resp] = parse_responses(output)  # the refusal only: nothing smuggled is answered
    assert resp.status == 400 and not resp.keep_alive
    assert error_reason(resp) == reason.value
    return err


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_chunked_body_breaking_the_line_grammar_is_400(body: bytes) -> None:
    err = refused(HEAD + body, Reason.MALFORMED_HTTP)
    assert "chunked body" in err.message


def test_an_http10_request_with_transfer_encoding_is_400() -> None:
    head = HEAD.replace(b"HTTP/1.1", b"HTTP/1.0")
    refused(head + b"2\r\n{}\r\n0\r\n\r\n", Reason.AMBIGUOUS_FRAMING)


@pytest.mark.parametrize(
    "body",
    [
        b"2\r\n{}\r\n0\r\n\r\n",
        b'2;name=value;q="a b"\t\r\n{}\r\n0\r\n\r\n',
        b"1\r\n{\r\n1\r\n}\r\n0\r\nX-A: b\tc\r\nX-B: \xe9\r\n\r\n",
        b"2\r\n\n\r\r\n0\r\n\r\n",  # (data may hold any bytes)
    ],
    ids=["plain", "extensions", "trailers", "data-with-line-ends"],
)
def test_a_well_formed_chunked_body_is_served_and_the_next_request_too(body: bytes) -> None:
    *events, _ = run_all(HEAD + body + HEAD + b"0\r\n\r\n")
    assert [type(e) for e in events] == [HttpRequest, HttpRequest, ConnectionClosed]


def test_an_oversized_chunk_before_a_fault_is_413_however_split() -> None:
    # The sizes are counted in the order the lines come: the 413 for the chunk that
    # passes the body limit, not the 400 for a fault behind it, whether the fault
    # has arrived yet or not.
    limits = HttpLimits(max_body_bytes=4)
    data = HEAD + b"5\r\nhello\r\n0\r\n\n"
    *events, _ = run_all(data + SMUGGLED, limits=limits, eof=False)
    err = events[0]
    assert isinstance(err, HttpError) and err.status == 413, events


def test_a_body_of_too_many_tiny_chunks_is_413_however_split() -> None:
    # Each chunk costs its parsing: at most max_body // 512 of them (64 at least).
    limits = HttpLimits(max_body_bytes=100 * 512)
    ok = HEAD + b"1\r\n \r\n" * 100 + b"0\r\n\r\n"
    *events, _ = run_all(ok + HEAD + b"0\r\n\r\n", limits=limits)
    assert [type(e) for e in events] == [HttpRequest, HttpRequest, ConnectionClosed]
    too_many = HEAD + b"1\r\n \r\n" * 101 + b"0\r\n\r\n"
    *events, _ = run_all(too_many + SMUGGLED, limits=limits, eof=False)
    err = events[0]
    assert isinstance(err, HttpError) and err.status == 413, events
    assert err.reason == Reason.PAYLOAD_TOO_LARGE
