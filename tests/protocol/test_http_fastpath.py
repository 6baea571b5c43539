"""HttpConnection's fast path against h11 alone: the two must be indistinguishable.

``HttpConnection(fast_path=True)`` parses the common request shape and frames
responses itself, handing anything else to h11 at a request boundary;
``fast_path=False`` lets h11 do everything.  This file guarantees that, for any
input bytes split into chunks in any way, with or without EOF, and any sequence
of responses (complete or streamed, with pulls while a stream is open), both
modes give the same ``next_event`` results (NEED_DATA included), the same bytes
from every ``send_*`` method and from ``data_to_send``, the same
``LocalProtocolError`` refusals and the same ``should_close`` /
``response_in_progress``.  Focused examples pin down which path serves what, the
linear-time head scan, bare-LF requests (refused), API misuse, pipelining during a response
and ``Connection: close``; ``test_agree_*`` pin the divergences the differential
test once found (each fixed in ``protocol/_http.py``) so they stay fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.protocol import (
    NEED_DATA,
    ConnectionClosed,
    HttpConnection,
    HttpError,
    HttpLimits,
    HttpRequest,
)
from weir.protocol._errors import LocalProtocolError

from .helpers import bytewise, parse_response, parse_responses, request_bytes, split_at

DIFF = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SMALL = HttpLimits(max_header_bytes=200, max_body_bytes=50)
TINY = HttpLimits(max_header_bytes=120, max_body_bytes=8)
MODES = pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "h11"])

# ------------------------------------------------------------------ the driver


@dataclass(frozen=True)
class Full:
    """Answer with ``send_response``."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True)
class Stream:
    """Answer with ``start_stream``, then ``ops`` (bytes: a chunk; None: pull an event)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    ops: tuple[bytes | None, ...]


@dataclass(frozen=True)
class Plan:
    """How to answer one request.

    ``early_pulls`` events are pulled before answering (feeding a chunk on
    NEED_DATA); ``misuse`` is an API misuse tried before (or, ``*_after``, after).
    """

    response: Full | Stream
    misuse: str | None = None
    early_pulls: int = 0


DEFAULT_PLAN = Plan(Full(200, (("content-type", "application/json"),), b'{"ok":true}'))


@dataclass
class Run:
    """Everything one connection did, in order, for comparison."""

    log: list[tuple[object, ...]] = field(default_factory=list)
    output: bytearray = field(default_factory=bytearray)
    should_close: bool = False


class Driver:
    """Drive one connection: pull events, feed a chunk on NEED_DATA, answer requests."""

    def __init__(
        self,
        conn: HttpConnection,
        chunks: list[bytes],
        *,
        eof: bool,
        eager_eof: bool,
        plans: list[Plan],
    ) -> None:
        self.conn = conn
        self.chunks = chunks
        self.eof = eof
        self.eager_eof = eager_eof
        self.plans = plans or [DEFAULT_PLAN]
        self.fed = 0
        self.eof_sent = False
        self.answered = 0
        self.run = Run()

    def feed_next(self) -> bool:
        """Feed the next chunk (or the EOF); False when there is nothing left."""
        conn = self.conn
        if self.fed < len(self.chunks):
            conn.receive_data(self.chunks[self.fed])
            self.fed += 1
            self.run.log.append(("fed", self.fed))
            if self.eager_eof and self.eof and self.fed == len(self.chunks):
                conn.receive_data(b"")
                self.eof_sent = True
                self.run.log.append(("eof",))
            return True
        if self.eof and not self.eof_sent:
            conn.receive_data(b"")
            self.eof_sent = True
            self.run.log.append(("eof",))
            return True
        return False

    def state(self) -> None:
        self.run.log.append(
            ("state", self.conn.should_close, self.conn.response_in_progress),
        )

    def pull(self) -> object:
        ev = self.conn.next_event()
        self.run.log.append(("event", ev))
        sent = self.conn.data_to_send()
        if sent:
            self.run.log.append(("data_to_send", sent))
            self.run.output += sent
        self.state()
        return ev

    def wrote(self, what: str, out: bytes) -> None:
        self.run.log.append((what, out))
        self.run.output += out
        self.state()

    def misuse(self, op: str) -> None:
        conn = self.conn
        if op == "end_stream":
            self.wrote("end_stream", conn.end_stream())
        elif op.startswith("data"):
            self.wrote("data", conn.send_stream_data(b"x"))
        elif op.startswith("empty_data"):
            self.wrote("data", conn.send_stream_data(b""))
        elif op.startswith("respond_again"):
            self.wrote("response", conn.send_response(200, (), b""))

    def pull_while_answering(self) -> bool:
        """Pull one event mid-answer; False if the peer broke HTTP (stop there)."""
        ev = self.pull()
        if ev is NEED_DATA:
            self.feed_next()
        return not isinstance(ev, HttpError)

    def answer(self, plan: Plan) -> bool:
        """Answer the request just delivered; False once the caller was refused."""
        conn = self.conn
        for _ in range(plan.early_pulls):
            if not self.pull_while_answering():
                return False
        try:
            if plan.misuse is not None and not plan.misuse.endswith("_after"):
                self.misuse(plan.misuse)
            resp = plan.response
            if isinstance(resp, Full):
                self.wrote("response", conn.send_response(resp.status, resp.headers, resp.body))
            else:
                self.wrote("start_stream", conn.start_stream(resp.status, resp.headers))
                for op in resp.ops:
                    if op is None:
                        if not self.pull_while_answering():
                            return False
                    else:
                        self.wrote("data", conn.send_stream_data(op))
                self.wrote("end_stream", conn.end_stream())
            if plan.misuse is not None and plan.misuse.endswith("_after"):
                self.misuse(plan.misuse)
        except LocalProtocolError:
            # The connection must be closed now: what it does next is unspecified.
            self.run.log.append(("raised", "LocalProtocolError"))
            return False
        except Exception as exc:  # anything else breaks the API contract
            self.run.log.append(("raised", type(exc).__module__, type(exc).__name__))
            return False
        return True

    def go(self) -> Run:
        for _ in range(20_000):  # bounded: the core must never loop forever
            ev = self.pull()
            if ev is NEED_DATA:
                if not self.feed_next():
                    break
            elif isinstance(ev, ConnectionClosed):
                break
            elif isinstance(ev, HttpRequest):
                plan = self.plans[self.answered % len(self.plans)]
                self.answered += 1
                if not self.answer(plan):
                    break
        else:
            raise AssertionError("the driver never finished")
        self.run.should_close = self.conn.should_close
        return self.run


def drive(
    fast_path: bool,
    chunks: list[bytes],
    *,
    limits: HttpLimits | None = None,
    eof: bool = True,
    eager_eof: bool = False,
    plans: list[Plan] | None = None,
) -> Run:
    conn = HttpConnection(limits, fast_path=fast_path)
    return Driver(conn, chunks, eof=eof, eager_eof=eager_eof, plans=plans or []).go()


def assert_same(
    chunks: list[bytes],
    *,
    limits: HttpLimits | None = None,
    eof: bool = True,
    eager_eof: bool = False,
    plans: list[Plan] | None = None,
) -> Run:
    """Drive both modes identically; assert they did exactly the same; return one."""
    fast = drive(True, chunks, limits=limits, eof=eof, eager_eof=eager_eof, plans=plans)
    slow = drive(False, chunks, limits=limits, eof=eof, eager_eof=eager_eof, plans=plans)
    assert fast.log == slow.log
    assert fast.output == slow.output
    assert fast.should_close == slow.should_close
    return fast


# ------------------------------------------------------------------ strategies

_PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))
_HIGH = "".join(chr(c) for c in range(0x80, 0x100))
_CONTROL = "".join(chr(c) for c in [*range(0x20), 0x7F])

# Every combination of the pieces below is a request h11 accepts (the fast path
# takes only some of them); the faults then break one or two things on purpose.
_METHODS = ["GET", "GET", "POST", "POST", "POST", "DELETE", "HEAD", "PUT", "OPTIONS"]
_targets = st.one_of(
    st.sampled_from(
        ["/", "/mcp", "/mcp?x=1", "/mcp?a=b&c=%20d", "/mcp?", "//x", "/mcp#f", "*", "http://h/"]
    ),
    st.text(_PRINTABLE, max_size=12).map(lambda s: "/" + s),
)
_VERSIONS = ["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2.0"]
_names = st.one_of(
    st.sampled_from(["Accept", "Content-Type", "mcp-session-id", "User-Agent", "Origin", "X-A"]),
    st.text(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~",
        min_size=1,
        max_size=8,
    ),
)
_values = st.one_of(
    st.text(_PRINTABLE + " \t", max_size=16),
    st.text(_PRINTABLE + _HIGH, max_size=8),
    st.sampled_from(["a, b", " padded ", "", "\t"]),
)
_SPECIAL = [("Expect", "100-continue"), ("Upgrade", "websocket"), ("TE", "trailers")]
_SPECIAL += [("Trailer", "X-T"), ("Keep-Alive", "timeout=5")]
_CONNECTIONS = [None] * 12 + ["close", "keep-alive", "Close", "keep-alive, close"]
_CONNECTIONS += ["upgrade", "close,", "", "foo"]
_seps = st.sampled_from([": ", ": ", ": ", ":", ":  ", ":\t", ": \t"])
_trails = st.sampled_from(["", "", "", "", " ", "\t", " \t"])
_FRAMINGS = ["auto"] * 6 + ["leading_zero", "dup_same", "comma", "huge"]
_FRAMINGS += ["chunked", "chunked", "chunked_ext", "chunked_trailer"]
_BAD_FRAMINGS = ["none", "dup_diff", "nondigit", "wrong", "chunked_bad", "te_and_cl", "te_other"]
_FAULTS = [
    "method",
    "target",
    "version",
    "double_space",
    "name",
    "value",
    "sep",
    "dup_host",
    "no_host",
    "framing",
    "obs_fold",
    "lead",
    "flip",
    "drop",
    "cut",
    "garbage",
    "line_fault",
]
# A bare CR or LF, obs-fold or a control byte, put anywhere in the head.
_LINE_FAULTS = [b"\r", b"\n", b"\r\n ", b"\r\n\t", b"\x00", b"\x01", b"\x0b", b"\x1f", b"\x7f"]


def _chunk_encode(body: bytes, size: int, ext: bytes = b"", trailer: bytes = b"") -> bytes:
    out = b""
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    return out + b"0\r\n" + trailer + b"\r\n"


@st.composite
def request_wire(draw: st.DrawFn, limits: HttpLimits | None) -> bytes:
    """One request h11 accepts, of the common shape or not, with 0-2 faults."""
    common = draw(st.booleans())  # keep to the fast path's shape (before the faults)
    n_faults = draw(st.sampled_from([0] * 12 + [1] * 3 + [2]))
    faults = set(draw(st.lists(st.sampled_from(_FAULTS), min_size=n_faults, max_size=n_faults)))
    if "garbage" in faults:
        return draw(
            st.one_of(
                st.binary(max_size=40),
                st.sampled_from([b"\r\n", b"\n", b"\r\n\r\n", b" ", b"GET", b"\x16\x03\x01"]),
            )
        )
    method = draw(st.sampled_from(_METHODS[:6] if common else _METHODS))
    if "method" in faults:
        method = draw(st.sampled_from(["get", "G ET", "PO\x00ST", "", "GET\t"]))
    target = draw(_targets)
    if "target" in faults:
        target = draw(st.sampled_from(["", "/a b", "/\xe9", "/\x7f", "/\x00", "/a\tb"]))
    version = "HTTP/1.1" if common else draw(st.sampled_from(_VERSIONS))
    if "version" in faults:
        version = draw(st.sampled_from(["http/1.1", "HTTP/1.1 ", "HTTP/1", "HTTP/1.10", "HTTP"]))
    space = "  " if "double_space" in faults else " "
    lines = [f"{method}{space}{target} {version}"]

    headers: list[tuple[str, str]] = []
    hosts = 2 if "dup_host" in faults else 0 if "no_host" in faults else 1
    if version == "HTTP/1.0" and draw(st.booleans()):
        hosts -= 1  # optional in HTTP/1.0
    for _ in range(hosts):
        headers.append(("Host", draw(st.sampled_from(["localhost", "localhost:8000", "x", ""]))))
    headers += draw(st.lists(st.tuples(_names, _values), max_size=3))
    if not common and draw(st.integers(0, 3)) == 0:
        headers.append(draw(st.sampled_from(_SPECIAL)))
    if "name" in faults:
        bad = draw(st.sampled_from(["X Bad", "", "Bad\x00", "\xdcml", "X(y)", "a:b", "X\x7f"]))
        headers.append((bad, "v"))
    if "value" in faults:
        headers.append(("X-Bad", draw(st.text(_PRINTABLE + _CONTROL, min_size=1, max_size=6))))
    connection = draw(st.sampled_from(_CONNECTIONS[:15] if common else _CONNECTIONS))
    if connection is not None:
        headers.append(("Connection", connection))

    body = draw(st.binary(max_size=60))
    framings = _FRAMINGS[:7] if common else _FRAMINGS
    framing = draw(st.sampled_from(_BAD_FRAMINGS if "framing" in faults else framings))
    n = len(body)
    tail = body
    size = draw(st.integers(1, 20))
    if framing == "auto":
        if body or method == "POST":
            headers.append(("Content-Length", str(n)))
    elif framing == "leading_zero":
        headers.append(("Content-Length", "00" + str(n)))
    elif framing == "dup_same":
        headers += [("Content-Length", str(n)), ("content-length", str(n))]
    elif framing == "comma":
        headers.append(("Content-Length", f"{n}, {n}"))
    elif framing == "huge":
        headers.append(("Content-Length", draw(st.sampled_from(["9" * 15, "9" * 16, "9" * 30]))))
        tail = b""
    elif framing == "none":
        pass
    elif framing == "dup_diff":
        headers += [("Content-Length", str(n)), ("content-length", str(n + 1))]
    elif framing == "nondigit":
        value = draw(st.sampled_from(["abc", "+5", "-1", "0x10", "1e3", "5 5", "\u00b2"]))
        headers.append(("Content-Length", value))
    elif framing == "wrong":
        headers.append(("Content-Length", str(max(0, n + draw(st.integers(-3, 3))))))
    elif framing == "te_other":
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["gzip", "gzip, chunked"]))))
    else:
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["chunked", "Chunked"]))))
        tail = _chunk_encode(body, size)
        if framing == "chunked_ext":
            tail = _chunk_encode(body, size, ext=b";a=b")
        elif framing == "chunked_trailer":
            tail = _chunk_encode(body, size, trailer=b"X-T: 1\r\n")
        elif framing == "chunked_bad":
            tail = draw(st.sampled_from([b"zz\r\n", tail[:-2] + b"x\r\n", b"5\r\nab\r\n0\r\n\r\n"]))
        elif framing == "te_and_cl":
            headers.append(("Content-Length", str(len(tail))))
    if draw(st.booleans()):
        headers = draw(st.permutations(headers))

    for name, value in headers:
        sep = draw(st.sampled_from([" : ", " :", ":\n"]) if "sep" in faults else _seps)
        lines.append(f"{name}{sep}{value}{draw(_trails)}")
    if "obs_fold" in faults:
        at = draw(st.integers(1, len(lines)))
        lines.insert(at, draw(st.sampled_from([" folded", "\tfolded", " "])))
    if limits is not None and limits.max_header_bytes < 1000 and draw(st.integers(0, 2)) == 0:
        # Pad the head to land right around the header limit.
        sep = draw(st.sampled_from([": ", ":", ":  "]))
        size_so_far = sum(len(line) + 2 for line in lines) + 2 + len(f"X-Pad{sep}") + 2
        want = limits.max_header_bytes + draw(st.integers(-4, 3))
        if want > size_so_far:
            lines.append(f"X-Pad{sep}" + "p" * (want - size_so_far))
    style = "crlf" if common else draw(st.sampled_from(["crlf"] * 4 + ["lf", "mixed"]))
    head = draw(st.sampled_from(["\r\n", "\n", "\r\n\r\n"])) if "lead" in faults else ""
    for line in [*lines, ""]:
        if style == "crlf":
            head += line + "\r\n"
        elif style == "lf":
            head += line + "\n"
        else:
            head += line + draw(st.sampled_from(["\r\n", "\n"]))
    wire = head.encode("latin-1") + tail
    if "line_fault" in faults:
        at = draw(st.integers(0, len(head)))
        wire = wire[:at] + draw(st.sampled_from(_LINE_FAULTS)) + wire[at:]
    if "flip" in faults and wire:
        at = draw(st.integers(0, len(wire) - 1))
        wire = wire[:at] + draw(st.binary(min_size=1, max_size=1)) + wire[at + 1 :]
    if "drop" in faults and wire:
        at = draw(st.integers(0, len(wire) - 1))
        wire = wire[:at] + wire[at + 1 :]
    if "cut" in faults:
        wire = wire[: draw(st.integers(0, len(wire)))]
    return wire


_GOOD_HEADERS = [
    ("content-type", "application/json"),
    ("content-type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("mcp-session-id", "abc123"),
    ("x-odd", "a\tb  c"),
    ("x-latin", "caf\xe9"),
    ("Allow", "GET, POST, DELETE"),
]
# Headers the caller may not send: both modes must refuse them.
_BAD_HEADERS = [
    ("content-length", "5"),
    ("Content-Length", "0"),
    ("transfer-encoding", "chunked"),
    ("Connection", "close"),
    ("x-bad", "a\r\nb"),
    ("bad name", "x"),
    ("x-euro", "\u20ac"),
    ("x-trail", "a "),
]


def _with_bad(
    pair: tuple[list[tuple[str, str]], tuple[str, str] | None],
) -> tuple[tuple[str, str], ...]:
    good, bad = pair
    return (*good, bad) if bad is not None else tuple(good)


_resp_headers = st.tuples(
    st.lists(st.sampled_from(_GOOD_HEADERS), max_size=3),
    st.sampled_from([None] * 50 + _BAD_HEADERS),
).map(_with_bad)
# Mostly what the engine sends; the last four have no body or are not final.
_statuses = st.sampled_from(
    [200] * 10 + [202, 400, 404, 405, 413, 500, 503, 299, 599] + [204, 304, 100, 1000]
)
_responses = st.one_of(
    st.builds(
        Full,
        _statuses,
        _resp_headers,
        st.binary(max_size=30),
    ),
    st.builds(
        Stream,
        _statuses,
        _resp_headers,
        st.lists(st.one_of(st.none(), st.binary(max_size=12)), max_size=4).map(tuple),
    ),
)
_plans = st.builds(
    Plan,
    _responses,
    st.sampled_from(
        [None] * 40
        + ["end_stream", "data", "empty_data", "respond_again_after", "data_after"]
        + ["empty_data_after"]
    ),
    st.sampled_from([0] * 6 + [1, 2]),
)

# ------------------------------------------------------ (1) differential test


@DIFF
@given(data=st.data())
def test_fast_path_and_h11_alone_are_indistinguishable(data: st.DataObject) -> None:
    limits = data.draw(st.sampled_from([None, SMALL, SMALL, TINY]), label="limits")
    requests = data.draw(st.lists(request_wire(limits), min_size=1, max_size=4), label="requests")
    raw = b"".join(requests)
    how = data.draw(st.sampled_from(["cuts", "cuts", "cuts", "whole", "bytewise"]), label="split")
    if how == "whole":
        chunks = [raw]
    elif how == "bytewise":
        chunks = bytewise(raw)
    else:
        cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12), label="cuts")
        chunks = split_at(raw, cuts)
    eof = data.draw(st.booleans(), label="eof")
    eager_eof = eof and data.draw(st.booleans(), label="eager_eof")
    plans = data.draw(st.lists(_plans, min_size=1, max_size=4), label="plans")
    assert_same(chunks, limits=limits, eof=eof, eager_eof=eager_eof, plans=plans)


# ------------------------------------------------------------ (2) examples

BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
POST_HEADERS = (
    ("Host", "localhost:8000"),
    ("Accept", "application/json, text/event-stream"),
    ("Content-Type", "application/json"),
)


def post_bytes(*, chunked: bool = False) -> bytes:
    return request_bytes("POST", "/mcp?x=1", POST_HEADERS, BODY, chunked=chunked)


def next_request(conn: HttpConnection) -> HttpRequest:
    ev = conn.next_event()
    assert isinstance(ev, HttpRequest), ev
    return ev


def h11_alone_request(data: bytes) -> HttpRequest:
    conn = HttpConnection(fast_path=False)
    conn.receive_data(data)
    return next_request(conn)


# (a) which path serves what


def test_common_shape_post_is_served_by_the_fast_path() -> None:
    conn = HttpConnection()
    conn.receive_data(post_bytes())
    req = next_request(conn)
    assert conn._h11 is None
    assert req == h11_alone_request(post_bytes())
    assert req.body == BODY
    out = conn.send_response(200, [("content-type", "application/json")], b"{}")
    assert conn.next_event() is NEED_DATA
    assert conn._h11 is None
    assert parse_response(out).body == b"{}"
    assert_same([post_bytes()])


def test_chunked_post_is_handed_to_h11_with_the_same_request() -> None:
    conn = HttpConnection()
    conn.receive_data(post_bytes(chunked=True))
    req = next_request(conn)
    assert conn._h11 is not None
    assert req == h11_alone_request(post_bytes(chunked=True))
    assert req.body == BODY
    assert req.headers.get("transfer-encoding") == "chunked"
    assert_same([post_bytes(chunked=True)])


def test_take_over_at_the_second_request_of_a_keep_alive_connection() -> None:
    data = post_bytes() + post_bytes(chunked=True) + post_bytes()
    conn = HttpConnection()
    conn.receive_data(data)
    assert next_request(conn).body == BODY
    assert conn._h11 is None
    conn.send_response(202, ())
    assert next_request(conn).body == BODY
    assert conn._h11 is not None
    run = assert_same([data])
    assert [e[1] for e in run.log if e[0] == "event" and isinstance(e[1], HttpRequest)] == [
        h11_alone_request(post_bytes()),
        h11_alone_request(post_bytes(chunked=True)),
        h11_alone_request(post_bytes()),
    ]
    assert_same(bytewise(data))


# (b) a byte-by-byte trickle stays linear


def test_trickled_head_near_the_limit_is_scanned_in_linear_time() -> None:
    limit = 4096
    base = request_bytes("GET", "/mcp", [("Host", "x"), ("X-Pad", "")])
    head = request_bytes("GET", "/mcp", [("Host", "x"), ("X-Pad", "p" * (limit - len(base)))])
    assert len(head) == limit
    conn = HttpConnection(HttpLimits(max_header_bytes=limit))
    scanned = 0
    for i, byte in enumerate(bytewise(head[:-1]), start=1):
        conn.receive_data(byte)
        assert conn.next_event() is NEED_DATA
        # The search resumes where a terminator could still start: each byte
        # costs a bounded scan, so the whole head costs O(n), not O(n^2).
        assert conn._scanned == max(0, i - 3)
        assert conn._scanned >= scanned
        assert len(conn._buf) - conn._scanned <= 3
        scanned = conn._scanned
    conn.receive_data(head[-1:])
    req = next_request(conn)
    assert conn._h11 is None
    assert conn._scanned == 0
    assert req == h11_alone_request(head)
    assert_same(bytewise(head), limits=HttpLimits(max_header_bytes=limit))


# (c) bare LF


@pytest.mark.parametrize(
    "data",
    [
        b"GET /mcp HTTP/1.1\nHost: x\n\n",
        b"POST /mcp HTTP/1.1\nHost: x\nContent-Length: 2\n\nhi",
        b"GET /mcp HTTP/1.1\r\nHost: x\r\n\n",
    ],
)
def test_bare_lf_request_is_handed_to_h11_and_refused_as_h11_alone_refuses_it(
    data: bytes,
) -> None:
    # (h11 itself would parse it; both paths refuse it: test_http_strict.py.)
    for chunks in ([data], bytewise(data)):
        conn = HttpConnection()
        ev: object = NEED_DATA
        for chunk in chunks:
            conn.receive_data(chunk)
            ev = conn.next_event()
            if ev is not NEED_DATA:
                break
        assert isinstance(ev, HttpError) and ev.status == 400  # without waiting for EOF
        assert conn._h11 is not None
        assert_same(chunks, eof=False)
        assert_same(chunks)


# (d) API misuse


def _with_request(fast_path: bool, data: bytes | None = None) -> HttpConnection:
    conn = HttpConnection(fast_path=fast_path)
    conn.receive_data(data or request_bytes("GET", "/mcp", [("Host", "x")]))
    next_request(conn)
    return conn


@MODES
def test_response_without_a_request_raises(fast_path: bool) -> None:
    conn = HttpConnection(fast_path=fast_path)
    with pytest.raises(LocalProtocolError):
        conn.send_response(200, [], b"x")
    with pytest.raises(LocalProtocolError):
        conn.start_stream(200, [])
    conn.receive_data(request_bytes("GET", "/mcp", [("Host", "x")]))
    assert conn.next_event() is not NEED_DATA
    conn.send_response(200, [], b"x")
    with pytest.raises(LocalProtocolError):  # the one request is answered
        conn.send_response(200, [], b"x")


@MODES
def test_stream_data_before_start_stream_raises(fast_path: bool) -> None:
    conn = _with_request(fast_path)
    with pytest.raises(LocalProtocolError):
        conn.send_stream_data(b"data: x\n\n")
    conn = _with_request(fast_path)
    with pytest.raises(LocalProtocolError):
        conn.end_stream()


@MODES
@pytest.mark.parametrize(
    "header",
    [
        ("content-length", "3"),
        ("Content-Length", "3"),
        ("transfer-encoding", "chunked"),
        ("Transfer-Encoding", "identity"),
        ("connection", "close"),
        ("Connection", "keep-alive"),
        ("x-split", "a\r\nb"),
        ("x-split", "a\r\nX-Injected: 1"),
        ("x-lf", "a\nb"),
    ],
)
def test_framing_or_malformed_response_header_raises(
    fast_path: bool, header: tuple[str, str]
) -> None:
    with pytest.raises(LocalProtocolError):
        _with_request(fast_path).send_response(200, [header], b"abc")
    with pytest.raises(LocalProtocolError):
        _with_request(fast_path).start_stream(200, [header])


# (e) pipelining during a response


@MODES
def test_pipelined_request_waits_for_the_end_of_the_stream(fast_path: bool) -> None:
    first = post_bytes()
    second = request_bytes("DELETE", "/mcp", [("Host", "x")])
    conn = HttpConnection(fast_path=fast_path)
    conn.receive_data(first)
    assert next_request(conn).method == "POST"
    out = conn.start_stream(200, [("content-type", "text/event-stream")])
    assert conn.response_in_progress
    assert conn.next_event() is NEED_DATA
    conn.receive_data(second)
    assert conn.next_event() is NEED_DATA
    out += conn.send_stream_data(b"data: x\n\n")
    assert conn.next_event() is NEED_DATA
    out += conn.end_stream()
    assert not conn.response_in_progress
    assert next_request(conn).method == "DELETE"
    out += conn.send_response(200, [], b"bye")
    assert [(r.status, r.body) for r in parse_responses(out)] == [
        (200, b"data: x\n\n"),
        (200, b"bye"),
    ]
    plan = Plan(Stream(200, (("content-type", "text/event-stream"),), (None, b"data: x\n\n")))
    run = assert_same([first, second], eof=False, plans=[plan, DEFAULT_PLAN])
    assert [e[1] for e in run.log if e[0] == "event"][:4] == [
        NEED_DATA,  # nothing fed yet
        h11_alone_request(first),
        NEED_DATA,  # pulled mid-stream: the DELETE is not delivered yet
        h11_alone_request(second),
    ]


# (f) Connection: close


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "streamed"])
def test_connection_close_is_answered_with_connection_close_in_both_modes(
    streamed: bool,
) -> None:
    data = request_bytes("POST", "/mcp", [("Host", "x"), ("Connection", "close")], BODY)
    outs = []
    for fast_path in (True, False):
        conn = HttpConnection(fast_path=fast_path)
        conn.receive_data(data + post_bytes())  # nothing after the close is served
        assert next_request(conn).body == BODY
        if streamed:
            out = conn.start_stream(200, [("content-type", "text/event-stream")])
            out += conn.send_stream_data(b"data: x\n\n")
            assert not conn.should_close
            out += conn.end_stream()
        else:
            out = conn.send_response(200, [("content-type", "application/json")], b"{}")
        assert conn.should_close
        assert conn.next_event() == ConnectionClosed()
        resp = parse_response(out)
        assert resp.header("connection") == "close"
        assert resp.keep_alive is False
        outs.append(out)
    assert outs[0] == outs[1]
    assert b"\r\nConnection: close\r\n" in outs[0]
    plan = Plan(Stream(200, (), (b"x",))) if streamed else DEFAULT_PLAN
    run = assert_same([data + post_bytes()], eof=False, plans=[plan])
    assert run.should_close


# ------------------------------- divergences the differential test once found (fixed)


def test_agree_lf_crlf_blank_line_is_not_left_waiting_for_more_data() -> None:
    # h11 ends a head at "\n\r?\n"; a head whose last line ends in a bare LF and
    # whose blank line is CRLF ("x\n\r\n") has no "\r\n\r\n" and no "\n\n".
    data = b"GET / HTTP/1.1\r\nHost: x\n\r\n"
    assert_same([data], eof=False)


@pytest.mark.parametrize(
    "data",
    [b"\r\n", b"\n", b"\r\nGET / HTTP/1.1\r\n", b" GET / HTTP/1.1\r\n", b"\x16\x03\x01\x02\x00"],
    ids=["crlf", "lf", "crlf-then-request", "space", "tls-hello"],
)
def test_agree_head_starting_below_0x21_is_refused_at_once(data: bytes) -> None:
    # h11 refuses a buffer whose first byte is < 0x21 before the head is complete
    # ("no request line received" / "illegal request line"); so must the fast path.
    assert_same([data], eof=False)


@pytest.mark.parametrize("streamed", [False, True], ids=["answering", "streaming"])
def test_agree_bytes_after_a_connection_close_request_while_answering(
    streamed: bool,
) -> None:
    # After "Connection: close" nothing more may come from the client; bytes that
    # do come while the response is due (or streaming) are ignored by both paths,
    # and the connection closes after the response (never a 400 in its place).
    data = request_bytes("GET", "/", [("Host", "x"), ("Connection", "close")])
    data += request_bytes("GET", "/", [("Host", "x")])
    plan = Plan(Stream(200, (), (None,))) if streamed else Plan(Full(200, (), b""), None, 1)
    assert_same([data], eof=False, plans=[plan])


def test_agree_head_of_exactly_the_limit_without_optional_whitespace() -> None:
    # Raw head == max_header_bytes, but "Host:x" has no space after the colon:
    # the h11 path measures the canonical "name: value" form, one byte larger.
    limit = 200
    base = b"GET / HTTP/1.1\r\nHost:x\r\nX-Pad:"
    data = base + b"p" * (limit - len(base) - 4) + b"\r\n\r\n"
    assert len(data) == limit
    assert_same([data], limits=HttpLimits(max_header_bytes=limit), eof=False)


@pytest.mark.parametrize("status", [204, 304])
def test_agree_streamed_or_bodied_response_with_a_bodiless_status(status: int) -> None:
    data = request_bytes("GET", "/mcp", [("Host", "x")])
    assert_same([data], eof=False, plans=[Plan(Stream(status, (), ()))])
    assert_same([data], eof=False, plans=[Plan(Full(status, (), b"abc"))])


@pytest.mark.parametrize("status", [100, 101, 1000])
def test_agree_status_outside_200_to_999_is_refused_with_local_protocol_error(
    status: int,
) -> None:
    data = request_bytes("GET", "/mcp", [("Host", "x")])
    for fast_path in (True, False):
        with pytest.raises(LocalProtocolError):
            _with_request(fast_path, data).send_response(status, [], b"")
        with pytest.raises(LocalProtocolError):
            _with_request(fast_path, data).start_stream(status, [])


def test_agree_empty_stream_data_without_a_stream() -> None:
    data = request_bytes("GET", "/mcp", [("Host", "x")])
    assert_same([data], eof=False, plans=[Plan(DEFAULT_PLAN.response, "empty_data")])
    assert_same([data], eof=False, plans=[Plan(DEFAULT_PLAN.response, "empty_data_after")])


def test_agree_should_close_after_answering_once_eof_has_arrived() -> None:
    # The request and the EOF arrive before the response is sent.
    data = request_bytes("GET", "/mcp", [("Host", "x")])
    assert_same([data], eager_eof=True)
