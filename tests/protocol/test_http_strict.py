"""Strict request heads: bare LF, bare CR, obs-fold and control bytes are refused.

h11 reads all of these leniently (bare LF as a line end, obs-fold joined into the
field before it, most control bytes kept in field values); a front end that reads
them differently would see another request than weir does.  Both parse paths must
refuse each one with 400 ``malformed_http`` and close, as soon as the offending
bytes have arrived, with the same events and bytes however the input is split --
and nothing pipelined behind the refused head is ever delivered.  HTAB (between
and around the words of a field value) and obs-text (0x80-0xFF) stay allowed,
as RFC 9110's field-value grammar says.
"""

from __future__ import annotations

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
    Reason,
)

from .helpers import bytewise, error_reason, parse_responses, request_bytes, split_at
from .test_http_fastpath import DIFF
from .test_http_limits import outcome, run_both_drivers

HOST = ("Host", "localhost")
GOOD = request_bytes("GET", "/mcp", [HOST])
# What comes after a refused head: it must never be delivered or answered.
SMUGGLED = request_bytes("POST", "/admin", [HOST], b'{"smuggled":true}')

_CONTROLS = [bytes([c]) for c in [*range(0x09), *range(0x0B, 0x0D), *range(0x0E, 0x20), 0x7F]]
BAD_HEADS = {
    "lf-request-line": b"GET /mcp HTTP/1.1\nHost: localhost\r\n\r\n",
    "lf-header-line": b"GET /mcp HTTP/1.1\r\nHost: localhost\nX-A: b\r\n\r\n",
    "lf-blank-line": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\n\n",
    "lf-then-crlf": b"GET /mcp HTTP/1.1\r\nHost: localhost\n\r\n",
    "lf-only": b"GET /mcp HTTP/1.1\nHost: localhost\n\n",
    "lf-post": b"POST /mcp HTTP/1.1\nHost: localhost\nContent-Length: 2\n\nhi",
    "cr-in-value": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a\rb\r\n\r\n",
    "cr-line-end": b"GET /mcp HTTP/1.1\r\nHost: localhost\rX-A: b\r\n\r\n",
    "fold-sp": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a\r\n b\r\n\r\n",
    "fold-htab": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a\r\n\tb\r\n\r\n",
    "fold-first": b"GET /mcp HTTP/1.1\r\n Host: localhost\r\n\r\n",
    "fold-host": b"GET /mcp HTTP/1.1\r\nHost: local\r\n host\r\n\r\n",
    **{
        f"ctl-{c.hex()}": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a" + c + b"b\r\n\r\n"
        for c in _CONTROLS
    },
    "ctl-at-value-start": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: \x01b\r\n\r\n",
    "ctl-in-name": b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX\x01A: b\r\n\r\n",
    "ctl-in-target": b"GET /m\x01cp HTTP/1.1\r\nHost: localhost\r\n\r\n",
}
BAD_NAMES = {
    "space-in-name": b"X A: b",
    "space-before-colon": b"X-A : b",
    "no-colon": b"X-A b",
    "empty-name": b": b",
    "paren": b"X(A): b",
    "high-byte": b"X\xe9: b",
    "slash": b"X/A: b",
}


def run_all(data: bytes, *, limits: HttpLimits | None = None, eof: bool = True) -> list[object]:
    """Both paths, fed whole, in three pieces and byte by byte: all must agree."""
    cut = len(data) // 3
    outcomes = [
        outcome(run_both_drivers(chunks, limits=limits, eof=eof))
        for chunks in ([data], split_at(data, [cut, 2 * cut]), bytewise(data))
    ]
    assert outcomes[1] == outcomes[0]
    assert outcomes[2] == outcomes[0]
    events, output = outcomes[0]
    return [*events, output]


def assert_refused_400(data: bytes, *, limits: HttpLimits | None = None) -> HttpError:
    """``data`` (then a pipelined request) is refused 400 at once; nothing after it."""
    *events, output = run_all(data + SMUGGLED, limits=limits, eof=False)
    assert len(events) == 2, events
    err, closed = events
    assert isinstance(err, HttpError)
    assert (err.status, err.reason) == (400, Reason.MALFORMED_HTTP)
    assert closed == ConnectionClosed()
    assert isinstance(output, bytes)
    [resp] = parse_responses(output)  # exactly one response: the refusal
    assert resp.status == 400 and not resp.keep_alive
    assert error_reason(resp) == "malformed_http"
    return err


@pytest.mark.parametrize("data", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_bad_line_ends_folds_and_control_bytes_are_400_on_both_paths(data: bytes) -> None:
    err = assert_refused_400(data)
    assert err.message.startswith("malformed HTTP request: ")


@pytest.mark.parametrize("line", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_header_names_that_are_not_tokens_are_400_on_both_paths(line: bytes) -> None:
    assert_refused_400(b"GET /mcp HTTP/1.1\r\nHost: localhost\r\n" + line + b"\r\n\r\n")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"GET /mcp HTTP/1.1\r\nHost: localhost\nX", "bare LF"),
        (b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a\rb", "bare CR"),
        (b"GET /mcp HTTP/1.1\r\nHost: localhost\r\n\tb", "folding"),
        (b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a\x00", "control byte 0x00"),
        (b"GET /mcp HTTP/1.1\r\nHost: localhost\r\nX-A: a\x7f", "control byte 0x7f"),
    ],
    ids=["lf", "cr", "fold", "nul", "del"],
)
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "h11"])
def test_a_fault_is_refused_before_the_head_is_complete(
    data: bytes, says: str, fast_path: bool
) -> None:
    # A client cannot hold the connection (or a head deadline) open after a fault.
    conn = HttpConnection(fast_path=fast_path)
    conn.receive_data(data)
    err = conn.next_event()
    assert isinstance(err, HttpError), err
    assert err.status == 400 and says in err.message
    assert conn.should_close
    conn.receive_data(GOOD)
    assert conn.next_event() == ConnectionClosed()


def test_a_fault_cut_at_its_last_byte_waits_for_the_next_one() -> None:
    # A CR at the end of the bytes so far may be the start of a CRLF: not yet a fault.
    for data in (b"GET /mcp HTTP/1.1\r", b"GET /mcp HTTP/1.1\r\nHost: localhost\r\n"):
        for fast_path in (True, False):
            conn = HttpConnection(fast_path=fast_path)
            conn.receive_data(data)
            assert conn.next_event() is NEED_DATA


@pytest.mark.parametrize(
    "value",
    ["a\tb", "\ta", "a\t", "a \t b", "caf\xe9", "\xff\x80", "a  b"],
    ids=["htab-inside", "htab-before", "htab-after", "mixed-ows", "latin-1", "obs-text", "spaces"],
)
def test_htab_and_obs_text_in_values_are_served(value: str) -> None:
    data = request_bytes("GET", "/mcp", [HOST, ("X-A", value)])
    *events, _ = run_all(data)
    [req, closed] = events
    assert isinstance(req, HttpRequest)
    assert req.headers.get("x-a") == value.strip(" \t")
    assert closed == ConnectionClosed()
    conn = HttpConnection()
    conn.receive_data(data)
    assert isinstance(conn.next_event(), HttpRequest)
    assert conn._h11 is None  # served by the fast path


def test_the_request_after_a_good_one_is_checked_too() -> None:
    # Keep-alive: the second head is refused, the first was served.
    *events, output = run_all(GOOD + b"GET / HTTP/1.1\nHost: localhost\n\n" + SMUGGLED, eof=False)
    assert [type(e) for e in events] == [HttpRequest, HttpError, ConnectionClosed]
    assert isinstance(output, bytes)
    assert [r.status for r in parse_responses(output)] == [200, 400]


def test_the_body_may_hold_any_bytes() -> None:
    body = b"\n\r\x00\x01\x7f\r\n folded"
    data = request_bytes("POST", "/mcp", [HOST], body)
    *events, _ = run_all(data)
    assert isinstance(events[0], HttpRequest) and events[0].body == body


def test_the_h11_path_checks_a_trickled_head_without_keeping_it_twice() -> None:
    limits = HttpLimits(max_header_bytes=4096)
    pad = "p" * (4096 - len(request_bytes("GET", "/mcp", [HOST, ("X-Pad", "")])))
    head = request_bytes("GET", "/mcp", [HOST, ("X-Pad", pad)])
    assert len(head) == 4096
    conn = HttpConnection(limits, fast_path=False)
    for byte in bytewise(head[:-1]):
        conn.receive_data(byte)
        assert conn.next_event() is NEED_DATA
        # Only the bytes one check could not decide, and where a blank line may start.
        watch = conn._watch
        assert watch is not None and watch.held <= 4
    conn.receive_data(head[-1:])
    assert isinstance(conn.next_event(), HttpRequest)


# A head over the header limit is refused 431 whatever it holds -- a fault, or
# whitespace that would shrink it once parsed -- however the bytes are split.
_LIMITS = HttpLimits(max_header_bytes=100)


@pytest.mark.parametrize(
    "tail",
    [b"a\x01", b"a", b"a\r\n b", b"a\nX-B: c"],
    ids=["control-byte", "clean", "fold", "bare-lf"],
)
def test_a_head_over_the_limit_is_431_whatever_lies_past_the_limit(tail: bytes) -> None:
    data = b"GET / HTTP/1.1\r\nHost: x\r\nX-A:" + b" " * 100 + tail + b"\r\n\r\n"
    *events, _ = run_all(data, limits=_LIMITS)
    assert len(events) == 2, events
    err = events[0]
    assert isinstance(err, HttpError)
    assert (err.status, err.reason) == (431, Reason.HEADERS_TOO_LARGE)


# ------------------------------------------------------------ property: any fault


_FAULT_BYTES = [b"\n", b"\r", b"\r\n ", b"\r\n\t", *_CONTROLS]


@st.composite
def faulty_heads(draw: st.DrawFn) -> bytes:
    """A valid request with one fault put anywhere in its head."""
    names = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8)
    values = st.text("abcdefghijklmnopqrstuvwxyz0123456789 \t,;=/\xe9", max_size=12)
    headers = draw(st.lists(st.tuples(names.map(lambda n: "X-" + n), values), max_size=4))
    method = draw(st.sampled_from(["GET", "POST", "DELETE"]))
    body = draw(st.binary(max_size=20)) if method == "POST" else b""
    data = request_bytes(method, "/mcp", [HOST, *headers], body)
    head_end = data.index(b"\r\n\r\n") + 4
    fault = draw(st.sampled_from(_FAULT_BYTES))
    # Anywhere after the method (a fault at the very start is refused too, by h11),
    # and inside the head: a fold put after the last header line's CRLF would follow
    # the blank line, in the next request's bytes, not in this head.
    at = draw(st.integers(4, head_end - (4 if fault.startswith(b"\r\n") else 2)))
    how = draw(st.sampled_from(["insert", "replace"]))
    if fault.startswith(b"\r\n") and data[at - 2 : at] == b"\r\n":
        # A fold at a line's very start would make a blank line: the head's end,
        # and the rest a next request. Fold the previous line instead.
        at -= 2
    if fault == b"\n" and how == "replace":
        # A bare LF: drop the CR of one line end.
        crs = [i for i in range(head_end) if data[i : i + 2] == b"\r\n"]
        i = draw(st.sampled_from(crs))
        return data[:i] + data[i + 1 :]
    if how == "replace" and data[at : at + 1] not in (b"\r", b"\n"):
        return data[:at] + fault + data[at + 1 :]
    if data[at - 1 : at] == b"\r" and fault == b"\n":
        at -= 1  # (inserting LF after a CR would make a CRLF, not a fault)
    return data[:at] + fault + data[at:]


@DIFF
@given(data=faulty_heads(), pipelined=st.booleans(), cuts=st.lists(st.integers(0, 200)))
def test_any_fault_anywhere_in_the_head_is_400_on_both_paths_however_split(
    data: bytes, pipelined: bool, cuts: list[int]
) -> None:
    raw = data + (SMUGGLED if pipelined else b"")
    first = outcome(run_both_drivers([raw], eof=False))
    again = outcome(run_both_drivers(split_at(raw, cuts), eof=False))
    assert again == first
    events, output = first
    assert [type(e) for e in events] == [HttpError, ConnectionClosed], events
    err = events[0]
    assert isinstance(err, HttpError)
    assert (err.status, err.reason) == (400, Reason.MALFORMED_HTTP)
    assert [r.status for r in parse_responses(output)] == [400]


@DIFF
@given(
    data=faulty_heads(),
    clean=st.booleans(),
    max_header_bytes=st.integers(20, 160),
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
def test_near_the_header_limit_the_answer_is_the_same_however_split(
    data: bytes, clean: bool, max_header_bytes: int, cuts: list[int]
) -> None:
    # A fault within the first max_header_bytes + 1 bytes is 400, one past them
    # 431 (or 414 for an over-long target), whether the head comes whole, cut or
    # byte by byte.
    if clean:  # no control bytes in the head (the body may hold anything)
        head, blank, body = data.partition(b"\r\n\r\n")
        controls = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
        data = head.translate(None, controls) + blank + body
    raw = data + SMUGGLED
    limits = HttpLimits(max_header_bytes=max_header_bytes)
    outcomes = [
        outcome(run_both_drivers(chunks, limits=limits, eof=False))
        for chunks in ([raw], split_at(raw, cuts), bytewise(raw))
    ]
    assert outcomes[1] == outcomes[0]
    assert outcomes[2] == outcomes[0]


def test_a_refusal_by_h11_quotes_none_of_the_clients_bytes_however_split() -> None:
    # A request, then a line starting with a space where the next head should begin.
    raw = b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n \r\n" + SMUGGLED
    whole = outcome(run_both_drivers([raw], eof=False))
    split = outcome(run_both_drivers(split_at(raw, [59]), eof=False))
    assert split == whole
    err = whole[0][1]
    assert isinstance(err, HttpError) and "bytearray" not in err.message
