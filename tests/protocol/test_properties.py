"""Property tests of the pure core (Hypothesis).

1. Chunking invariance: valid requests split anywhere give the same events and
   the same output as fed whole.
2. Garbage in, in arbitrary chunks: HttpConnection yields only its own events,
   never an exception, and whatever it writes is valid HTTP.
3. Any POST body: route() returns PostMessages or raises a 4xx RemoteProtocolError.
4. StreamLog replay: after any cursor, exactly the frames that follow it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.protocol import (
    NEED_DATA,
    ConnectionClosed,
    EndpointConfig,
    HttpConnection,
    HttpError,
    HttpLimits,
    HttpRequest,
    PostMessages,
    RemoteProtocolError,
    route,
)
from weir.protocol._event_ids import EventId
from weir.protocol.streams import StreamKind, StreamLog

from .helpers import (
    PING,
    feed,
    parse_responses,
    post,
    request_bytes,
    split_at,
)

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Spec:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    chunked: bool
    chunk_size: int

    def wire(self) -> bytes:
        return request_bytes(
            self.method,
            self.target,
            self.headers,
            self.body,
            chunked=self.chunked,
            chunk_size=self.chunk_size,
        )


_token = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-",
    min_size=1,
    max_size=10,
)
_value = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30
)


@st.composite
def request_specs(draw: st.DrawFn) -> Spec:
    method = draw(st.sampled_from(["GET", "POST", "DELETE", "PUT"]))
    query = draw(st.text(alphabet="abc=&%0123456789", max_size=12))
    target = "/mcp" + ("?" + query if query else "")
    extra = draw(st.lists(st.tuples(_token.map(lambda t: "X-" + t), _value), max_size=4))
    headers = (("Host", "localhost:8000"), *extra)
    body = draw(st.binary(max_size=300)) if method in ("POST", "PUT") else b""
    chunked = bool(body) and draw(st.booleans())
    return Spec(method, target, headers, body, chunked, draw(st.integers(1, 64)))


def answer_empty(conn: HttpConnection, request: HttpRequest) -> bytes:
    # No body: correct for every method, HEAD included.
    return conn.send_response(200, [("content-type", "application/json")])


# ------------------------------------------------- (1) chunking invariance


@PROPS
@given(specs=st.lists(request_specs(), min_size=1, max_size=4), data=st.data())
def test_valid_requests_split_anywhere_give_the_same_events(
    specs: list[Spec], data: st.DataObject
) -> None:
    raw = b"".join(s.wire() for s in specs)
    whole = feed([raw])
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=30))
    split = feed(split_at(raw, cuts))
    assert split.events == whole.events
    assert split.output == whole.output
    # And the events are the requests that were sent, in order, then EOF.
    assert [(r.method, r.target, r.body) for r in whole.requests] == [
        (s.method, s.target, s.body) for s in specs
    ]
    assert whole.events[-1] == ConnectionClosed()
    assert [r.status for r in parse_responses(whole.output)] == [200] * len(specs)


@PROPS
@given(
    specs=st.lists(request_specs(), min_size=1, max_size=3),
    max_header_bytes=st.integers(30, 400),
    max_body_bytes=st.integers(0, 300),
    data=st.data(),
)
def test_limits_give_the_same_answer_however_the_input_is_split(
    specs: list[Spec], max_header_bytes: int, max_body_bytes: int, data: st.DataObject
) -> None:
    raw = b"".join(s.wire() for s in specs)
    limits = HttpLimits(max_header_bytes=max_header_bytes, max_body_bytes=max_body_bytes)
    whole = feed([raw], conn=HttpConnection(limits))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=30))
    split = feed(split_at(raw, cuts), conn=HttpConnection(limits))
    assert split.events == whole.events
    assert split.output == whole.output
    assert whole.events[-1] == ConnectionClosed()
    for err in whole.events:
        if isinstance(err, HttpError):
            assert (err.status, str(err.reason)) in {
                (431, "headers_too_large"),
                (413, "payload_too_large"),
            }


@PROPS
@given(spec=request_specs())
def test_valid_request_bytewise_equals_whole(spec: Spec) -> None:
    raw = spec.wire()
    whole = feed([raw])
    assert feed([raw[i : i + 1] for i in range(len(raw))]).events == whole.events
    assert len(whole.requests) == 1


# ---------------------------------------------------- (2) garbage never raises

_garbage = st.one_of(
    st.binary(max_size=600),
    # Start from something valid, then go wrong, to reach deeper states.
    st.tuples(request_specs(), st.binary(max_size=200)).map(lambda t: t[0].wire() + t[1]),
    st.tuples(request_specs(), st.integers(0, 400), st.binary(min_size=1, max_size=8)).map(
        lambda t: t[0].wire()[: t[1]] + t[2] + t[0].wire()[t[1] + len(t[2]) :]
    ),
)


@PROPS
@given(raw=_garbage, data=st.data(), eof=st.booleans(), answer=st.booleans())
def test_arbitrary_bytes_in_arbitrary_chunks_never_raise(
    raw: bytes, data: st.DataObject, eof: bool, answer: bool
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20))
    conn = HttpConnection(HttpLimits(max_header_bytes=256, max_body_bytes=128))
    out = bytearray()
    closed = False
    for chunk in [*split_at(raw, cuts), *([b""] if eof else [])]:
        conn.receive_data(chunk)
        for _ in range(1000):  # bounded: the core must not loop forever
            ev = conn.next_event()
            out += conn.data_to_send()
            assert ev is NEED_DATA or isinstance(ev, HttpRequest | HttpError | ConnectionClosed)
            if ev is NEED_DATA:
                break
            if isinstance(ev, ConnectionClosed):
                closed = True
                break
            if isinstance(ev, HttpRequest) and answer:
                out += answer_empty(conn, ev)
            if isinstance(ev, HttpError):
                assert 400 <= ev.status < 600
                assert conn.should_close
        else:
            raise AssertionError("next_event never returned NEED_DATA or ConnectionClosed")
        if closed:
            break
    if eof and answer:
        assert closed
    if closed:
        assert conn.next_event() == ConnectionClosed()
    # Whatever the core wrote is a valid sequence of HTTP responses.
    for resp in parse_responses(bytes(out)):
        assert 200 <= resp.status < 600


# ------------------------------------------------ (3) route() on any POST body


@PROPS
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.sampled_from([PING, b"[" + PING + b"]", b"[]", b"{}", b"null"]).flatmap(
            lambda b: st.integers(0, len(b)).map(lambda n: b[:n])
        ),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(
                        ["jsonrpc", "id", "method", "params", "result", "error", "code", "message"]
                    ),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=12,
        ).map(msgspec.json.encode),
    ),
    version=st.sampled_from([None, "2025-03-26", "2025-06-18", "2025-11-25"]),
    session=st.sampled_from([None, "s1"]),
)
def test_any_post_body_routes_or_is_refused_with_4xx(
    body: bytes, version: str | None, session: str | None
) -> None:
    try:
        out = route(post(body, version=version, session=session), EndpointConfig())
    except RemoteProtocolError as exc:
        assert 400 <= exc.http_status < 500
        assert exc.reason
    else:
        assert isinstance(out, PostMessages)
        assert out.messages
        assert out.is_batch or len(out.messages) == 1


# --------------------------------------------------------- (4) StreamLog replay


@PROPS
@given(
    payloads=st.lists(st.text(max_size=20), min_size=1, max_size=40),
    max_events=st.integers(1, 50),
    data=st.data(),
)
def test_replay_after_any_cursor_is_exactly_the_frames_after_it(
    payloads: list[str], max_events: int, data: st.DataObject
) -> None:
    log = StreamLog("0000beef", StreamKind.REQUEST, max_events=max_events)
    frames: list[bytes] = []
    for p in payloads:
        log.append(p)
        log.mark_drained(log.next_seq)
        frames.append(log.frames_from(log.next_seq - 1)[0])
    cursor = data.draw(st.integers(0, len(payloads) + 2))
    try:
        nxt = log.cursor_after(EventId("0000beef", cursor))
    except RemoteProtocolError as exc:
        assert (exc.http_status, str(exc.reason)) == (409, "cursor_unknown")
        # Refused only if the cursor was never sent or frames after it are gone.
        assert cursor >= len(payloads) or cursor + 1 < len(payloads) - max_events
        return
    assert nxt == cursor + 1
    assert log.frames_from(nxt) == frames[cursor + 1 :]
    # Accepted only if nothing after the cursor was dropped.
    assert cursor + 1 >= len(payloads) - max_events
