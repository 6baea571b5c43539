"""Both runtimes keep weir's half-open guarantees on real loopback sockets.

Every test here runs against the Trio engine and the asyncio runtime (``runtime``,
:mod:`tests.integration.runtimes`): the same core (:class:`~weir.protocol.SessionFlow`,
:class:`~weir.protocol.DrainTracker`, :class:`~weir.protocol.streams.StreamLog`)
driven by either loop, checked where the guarantees live -- in the kernel's send
queue (a peer that stops reading, credit given back only on its acknowledgements):

1. ``test_a_response_lost_with_its_connection_is_replayed_after_the_cursor`` -- a
   client drops its POST stream after the priming event; the call finishes anyway
   (handlers belong to the session); ``GET`` with ``Last-Event-ID`` gets exactly the
   answer, on the same event id, then the stream ends.
2. ``test_a_client_that_stops_reading_is_refused_429_then_torn_down`` -- a peer
   with a tiny receive buffer stops reading a large response: its credit stays
   held (the bytes are not acknowledged), a second request waits for credit, a
   third is refused 429 ``stream_half_open`` once the drain window has passed and
   not before, and past the liveness timeout the session is gone (404).
3. ``test_a_resumption_displaces_a_writer_still_attached_to_an_old_connection`` --
   the newest reader wins: a resumption is not refused because the client's old
   connection has not been seen to die.
4. ``test_a_healthy_session_gives_back_every_byte_of_credit`` -- after calls whose
   responses were read, the session holds no frame and no byte.
5. ``test_sessions_connections_and_idle_sessions_are_bounded`` -- 503
   ``session_limit`` past the session limit, no fourth connection served beside
   three (see below), and idle sessions forgotten;
   ``test_a_trickled_head_is_cut_with_408_an_idle_connection_just_closed`` -- the
   core's read deadlines.
6. ``test_a_json_only_client_that_stops_reading_holds_no_more_than_its_credit`` --
   JSON bodies hold credit like frames: the same 429 and teardown.
7. ``test_batch_entries_are_admitted_one_by_one`` -- a batch (2025-03-26) is
   admitted entry by entry within the frame credit, never all at once.
8. ``test_a_legacy_stream_not_read_is_bounded_refused_then_reaped`` -- the same on
   the 2024-11-05 transport (``GET /sse``): admitted, refused, then 404, within the
   credit.  The asyncio runtime does not serve ``/sse`` yet: its case is expected to
   fail (strictly, so that it is noticed when it passes).

Where the runtimes differ by design the test says so: past the connection limit the
asyncio runtime refuses 503 ``overloaded`` while the Trio engine sheds the
longest-idle keep-alive connection; the Trio engine keeps acknowledged replay history
within its per-session budget, the asyncio runtime none.

Clock: real time (the server runs its own event loop in a thread).  The limits
are small (a fraction of a second); every wait is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import h11
import pytest

from tests.integration.runtimes import (
    RUNTIMES,
    TIMEOUT,
    TLS_AXIS,
    client_socket,
    serving,
    wait_in_thread,
)
from tests.integration.test_asyncio_driver import Client
from weir.app.samples.demo import app as demo_app
from weir.engine import App
from weir.protocol import CreditLimits, ReadTimeouts
from weir.protocol.sse import SseDecoder, SseEvent

BOTH = "application/json, text/event-stream"
#: Replay history per session (``--session-retain-bytes``), where set.
RETAIN_BYTES = 32 * 1024


class RawStream:
    """One request on its own socket, read event by event (or not read at all)."""

    def __init__(self, port: int, *, rcvbuf: int | None = None) -> None:
        self.port = port
        self.sock = client_socket(port, rcvbuf=rcvbuf)  # (TLS to a server serving it)
        self.h11 = h11.Connection(h11.CLIENT)
        self.decoder = SseDecoder()
        self.events: list[SseEvent] = []
        self.ended = False

    def send(
        self, method: str, headers: dict[str, str], body: bytes = b"", target: str = "/mcp"
    ) -> int:
        self.start(method, headers, body, target)
        return self.status()

    def start(
        self, method: str, headers: dict[str, str], body: bytes = b"", target: str = "/mcp"
    ) -> None:
        """Send the request, reading nothing."""
        hdrs = {"host": f"127.0.0.1:{self.port}", "content-length": str(len(body)), **headers}
        request = h11.Request(method=method, target=target, headers=list(hdrs.items()))
        out = self.h11.send(request)
        out = (out or b"") + (self.h11.send(h11.Data(data=body)) or b"" if body else b"")
        self.sock.sendall(out + (self.h11.send(h11.EndOfMessage()) or b""))

    def status(self) -> int:
        """The response's status code (its head read, the body not)."""
        for _ in range(10_000):
            event = self._next()
            if isinstance(event, h11.Response):
                return event.status_code
        raise AssertionError("no response head")

    def _next(self) -> Any:
        for _ in range(10_000):
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(self.sock.recv(65536))
        raise AssertionError("no event")

    def next_event(self) -> SseEvent | None:
        """The next SSE event, or None once the response has ended."""
        for _ in range(10_000):
            if self.events:
                return self.events.pop(0)
            if self.ended:
                return None
            event = self._next()
            if isinstance(event, h11.Data):
                self.events += [
                    i for i in self.decoder.feed(bytes(event.data)) if isinstance(i, SseEvent)
                ]
            elif isinstance(event, h11.EndOfMessage):
                self.ended = True
        raise AssertionError("stream never ended")

    def body(self) -> bytes:
        """The rest of a plain (non-SSE) response body."""
        chunks: list[bytes] = []
        for _ in range(10_000):
            event = self._next()
            if isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
        raise AssertionError("body never ended")

    def close(self) -> None:
        self.sock.close()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends before it closes the connection (bounded reads)."""
    received = b""
    for _ in range(100):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (it sent nothing more first), within TIMEOUT."""
    return sock.recv(65536) == b""


def gated_app() -> tuple[App, threading.Event]:
    """An app whose ``slow`` tool finishes once the returned event is set."""
    gate = threading.Event()
    app = App("gated")

    @app.tool()
    async def slow() -> str:
        """Finish once the test says so."""
        await wait_in_thread(gate)
        return "finished"

    return app, gate


def _headers(c: Client, accept: str = BOTH) -> dict[str, str]:
    assert c.session_id is not None
    return {
        "content-type": "application/json",
        "accept": accept,
        "mcp-session-id": c.session_id,
        "mcp-protocol-version": c.version,
    }


def _filling(rid: int, credit: CreditLimits) -> bytes:
    """A call whose answer takes all but a few hundred bytes of ``credit`` (an answer
    larger than the whole credit would be refused ``result_too_large``, not held)."""
    return _call(rid, "echo", {"text": "x" * (credit.bytes - 600)})


def _call(rid: int, name: str, arguments: dict[str, Any]) -> bytes:
    params = {"name": name, "arguments": arguments}
    return json.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    ).encode()


def _slow_call_primed(port: int, c: Client, rid: int) -> tuple[RawStream, str]:
    """POST the gated ``slow`` call over SSE; its stream and its priming event's id."""
    post = RawStream(port)
    assert post.send("POST", _headers(c), _call(rid, "slow", {})) == 200
    prime = post.next_event()
    assert prime is not None and prime.data == "" and prime.id is not None
    return post, prime.id


@contextlib.contextmanager
def _primed_slow_call(runtime: str, rid: int) -> Iterator[tuple[int, Client, PrimedCall]]:
    """A server on ``runtime`` with a session whose gated ``slow`` call ``rid`` is
    primed and waiting: its port, the session's client, and the call."""
    app, gate = gated_app()
    with serving(runtime, app) as running, Client(running.port) as c:
        c.initialize()
        post, prime_id = _slow_call_primed(running.port, c, rid)
        yield running.port, c, PrimedCall(post, prime_id, gate)


@dataclasses.dataclass
class PrimedCall:
    """A call's POST stream, its priming event's id, and the gate that finishes it."""

    post: RawStream
    prime_id: str
    gate: threading.Event


def _resume(port: int, c: Client, cursor: str) -> RawStream:
    get = RawStream(port)
    headers = {**_headers(c), "accept": "text/event-stream", "last-event-id": cursor}
    assert get.send("GET", headers) == 200  # never 409: the newest reader wins
    return get


@RUNTIMES
def test_a_response_lost_with_its_connection_is_replayed_after_the_cursor(runtime: str) -> None:
    with _primed_slow_call(runtime, 7) as (port, c, call):
        call.post.close()  # the answer is not here yet: it is lost with the connection
        call.gate.set()
        get = _resume(port, c, call.prime_id)
        answer = get.next_event()
        assert answer is not None and answer.id is not None
        epoch, seq = call.prime_id.split(":")
        assert answer.id == f"{epoch}:{int(seq) + 1}"  # exactly after the cursor
        rpc = json.loads(answer.data)
        assert rpc["id"] == 7 and rpc["result"]["content"][0]["text"] == "finished"
        assert get.next_event() is None  # the final message ends the resumed stream
        get.close()


@RUNTIMES
def test_a_resumption_displaces_a_writer_still_attached_to_an_old_connection(runtime: str) -> None:
    with _primed_slow_call(runtime, 8) as (port, c, call):
        # The old connection stays open (half-open, say): the client resumes anyway.
        new = _resume(port, c, call.prime_id)
        call.gate.set()
        answer = new.next_event()
        assert answer is not None and json.loads(answer.data)["result"]["content"][0]["text"]
        assert new.next_event() is None
        # The displaced writer's connection is cut, mid-stream, without the answer.
        with pytest.raises(h11.RemoteProtocolError, match="incomplete chunked read"):
            call.post.next_event()
        call.post.close()
        new.close()


@RUNTIMES
def test_resumptions_sent_back_to_back_each_get_a_status_line(runtime: str) -> None:
    # Each resumption displaces the one before it, perhaps before that one's writer has
    # sent its head: the displaced response still starts (200) before it is cut, so no
    # client sees its connection closed with no answer at all.
    with _primed_slow_call(runtime, 9) as (port, c, call):
        headers = {**_headers(c), "accept": "text/event-stream", "last-event-id": call.prime_id}
        readers: list[RawStream] = []
        for _ in range(5):
            pair = [RawStream(port), RawStream(port)]
            for reader in pair:
                reader.start("GET", headers)  # the second on the heels of the first
            readers += pair
        statuses = [reader.status() for reader in readers]
        assert statuses == [200] * len(readers), [
            r.body() for r, s in zip(readers, statuses, strict=True) if s != 200
        ]
        call.gate.set()
        # One of them (whichever the server took last) is the stream's reader: it gets
        # the answer; every other was cut.
        answered = [_answer_or_cut(reader) for reader in readers]
        assert answered.count(9) == 1 and answered.count(None) == len(readers) - 1
        for reader in (call.post, *readers):
            reader.close()


def _answer_or_cut(reader: RawStream) -> int | None:
    """The id of the answer on a resumed stream that then ends; None if it was cut."""
    try:
        answer = reader.next_event()
        assert answer is not None
        assert reader.next_event() is None
    except h11.RemoteProtocolError:
        return None
    return int(json.loads(answer.data)["id"])


@RUNTIMES
@TLS_AXIS
def test_a_client_that_stops_reading_is_refused_429_then_torn_down(runtime: str, tls: bool) -> None:
    credit = CreditLimits(frames=8, bytes=32768, drain_window=0.5, liveness_timeout=2.0)
    with serving(runtime, demo_app, credit=credit, tls=tls) as running, Client(running.port) as c:
        c.initialize()
        assert c.session_id is not None
        # A: an answer of nearly the whole credit into a 4 KB receive window, never read.
        stalled = RawStream(running.port, rcvbuf=4096)
        assert stalled.send("POST", _headers(c), _filling(1, credit)) == 200
        # B: a call into what A left -- no room for one typical answer, so it is not
        # admitted (it would run and find no room for its result): it waits for
        # admission, before anything runs, and is refused 429 once the drain window
        # has passed without progress, not before.
        started = time.monotonic()
        refused = RawStream(running.port)
        call = _call(2, "echo", {"text": "b" * 1000})
        assert refused.send("POST", _headers(c), call) == 429  # refused before any stream
        assert time.monotonic() - started >= credit.drain_window * 0.9
        error = json.loads(refused.body())["error"]
        assert error["data"]["reason"] == "stream_half_open" and error["data"]["retryAfterMs"] > 0
        refused.close()
        frames, nbytes, queued = running.credit_of(c.session_id)
        # What the session holds is bounded by its credit, and nothing waits for it.
        assert frames <= credit.frames and queued == 0 and nbytes <= credit.bytes
        ping = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "ping"}).encode()
        # Past the liveness timeout the session is torn down: 404, and B's stream ends.
        deadline = time.monotonic() + credit.liveness_timeout + 3.0
        status = 429
        for _ in range(100):
            probe = RawStream(running.port)
            status = probe.send("POST", _headers(c), ping)
            probe.close()
            if status == 404 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 404, status
        assert not running.has_session(c.session_id)
        stalled.close()


def _cut_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (what it still sends is
    read and dropped; a reset counts as closed)."""
    sock.settimeout(seconds)
    try:
        for _ in range(10_000):
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


@RUNTIMES
@TLS_AXIS
@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
def test_a_stalled_peers_connection_is_cut_at_the_liveness_teardown(
    runtime: str, json_response: bool, tls: bool
) -> None:
    # The answer fits the kernel's send queue whole, so the server has nothing left
    # to write; before, the asyncio runtime kept the connection (and with it the
    # session, its log and the kernel's buffer) until the peer left, or for the
    # keep-alive timeout.  Now the teardown cuts it, as the Trio engine does.
    credit = CreditLimits(frames=8, bytes=256 * 1024, drain_window=0.5, liveness_timeout=1.5)
    idle = ReadTimeouts(keepalive=60.0)
    options: dict[str, Any] = {"credit": credit, "read_timeouts": idle, "tls": tls}
    served = serving(runtime, demo_app, json_response=json_response, **options)
    with served as running, Client(running.port) as c:
        c.initialize()
        sid = c.session_id
        assert sid is not None
        stalled = RawStream(running.port, rcvbuf=4096)
        accept = "application/json" if json_response else BOTH
        assert stalled.send("POST", _headers(c, accept), _filling(1, credit)) == 200
        session = running.of(sid, lambda s: s)
        deadline = time.monotonic() + credit.liveness_timeout + 5.0
        while running.has_session(sid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running.has_session(sid)
        # The client still holds its end open: the server closed its own.
        assert _cut_within(stalled.sock, 5.0), "the stalled connection was kept"
        if runtime == "asyncio":
            # Nothing resumes a torn-down session: its log keeps no history either.
            held = running.probe(lambda: sum(log.retained_bytes for log in session.streams))
            assert held == 0
        stalled.close()


@RUNTIMES
@TLS_AXIS
def test_a_healthy_session_gives_back_every_byte_of_credit(runtime: str, tls: bool) -> None:
    retain = serving(runtime, demo_app, retain_bytes=RETAIN_BYTES, tls=tls)
    with retain as running, Client(running.port) as c:
        c.initialize()
        assert c.session_id is not None
        for i in range(20):
            reply = c.call("tools/call", {"name": "echo", "arguments": {"text": "y" * (i * 500)}})
            assert reply.status == 200
        held = running.credit_of(c.session_id)
        for _ in range(200):  # the driver learns of acknowledgements by polling the kernel
            if held == (0, 0, 0):
                break
            time.sleep(0.01)
            held = running.credit_of(c.session_id)
        assert held == (0, 0, 0)
        sid = c.session_id
        # About 16 streams are remembered (the table forgets the oldest when a stream
        # is added: 16, plus the newest).  Both runtimes keep replay history of
        # delivered streams within the per-session budget (here 32 KiB, of about
        # 95 KB answered), and not a byte more.
        streams = running.logs(sid)
        assert len(streams) <= 16 + 1
        retained = sum(log.retained_bytes for log in streams)
        assert 0 < retained <= RETAIN_BYTES, retained


@RUNTIMES
def test_sessions_connections_and_idle_sessions_are_bounded(runtime: str) -> None:
    app = App("limits")
    limits = {"max_sessions": 2, "max_connections": 3, "idle_timeout": 0.4}
    with serving(runtime, app, **limits) as running:
        first, second = Client(running.port), Client(running.port)
        first.initialize()
        second.initialize()
        third = Client(running.port)  # a third connection is within its limit ...
        refused = third.call("initialize", {"protocolVersion": "2025-11-25"})  # a session is not
        assert refused.status == 503
        assert refused.json()["error"]["data"]["reason"] == "session_limit"
        # A fourth connection is past the connection limit: never served beside three.
        with socket.create_connection(("127.0.0.1", running.port), timeout=TIMEOUT) as sock:
            if runtime == "asyncio":  # refused outright, and closed
                received = _read_until_closed(sock)
                assert received.startswith(b"HTTP/1.1 503 ")
                assert b'"reason":"overloaded"' in received
            else:  # the Trio engine sheds the longest-idle keep-alive connection for it
                sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 ")
                assert _closed_by_peer(first.sock), "no idle connection was shed"
        for c in (first, second, third):
            c.sock.close()
        # Idle sessions are forgotten: the sweep runs every idle_timeout / 4.
        for _ in range(100):  # the driver's own timer is what is under test: poll it
            if running.session_count() == 0:
                break
            time.sleep(0.05)
        assert running.session_count() == 0
        gone = Client(running.port)
        gone.session_id = first.session_id
        assert gone.call("tools/list").status == 404  # forgotten, not merely hidden
        gone.sock.close()


@RUNTIMES
def test_a_trickled_head_is_cut_with_408_an_idle_connection_just_closed(runtime: str) -> None:
    timeouts = ReadTimeouts(keepalive=0.6, head=0.3, body=0.3)
    with serving(runtime, demo_app, read_timeouts=timeouts) as running:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", running.port), timeout=TIMEOUT) as sock:
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more
            received = _read_until_closed(sock)
        assert received.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in received
        assert time.monotonic() - started >= 0.3  # not before the head's deadline
        with socket.create_connection(("127.0.0.1", running.port), timeout=TIMEOUT) as idle:
            assert idle.recv(65536) == b""  # idle past keep-alive: closed, nothing said


@RUNTIMES
def test_a_json_only_client_that_stops_reading_holds_no_more_than_its_credit(runtime: str) -> None:
    credit = CreditLimits(frames=8, bytes=32768, drain_window=0.5, liveness_timeout=2.0)
    json_only = serving(runtime, demo_app, credit=credit, json_response=True)
    with json_only as running, Client(running.port) as c:
        c.initialize()
        assert c.session_id is not None
        only_json = "application/json"
        stalled = RawStream(running.port, rcvbuf=4096)
        assert stalled.send("POST", _headers(c, only_json), _filling(1, credit)) == 200
        # The next request finds no room for its answer: it waits for admission ...
        waiting = RawStream(running.port)
        body = _call(2, "echo", {"text": "b" * 1000})
        started = time.monotonic()
        heads: list[int] = []

        def send_waiting() -> None:
            heads.append(waiting.send("POST", _headers(c, only_json), body))

        sender = threading.Thread(target=send_waiting)
        sender.start()
        # ... and a third request is refused 429 once the drain window has passed.
        ping = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "ping"}).encode()
        refused = RawStream(running.port)
        assert refused.send("POST", _headers(c, only_json), ping) == 429
        assert time.monotonic() - started >= credit.drain_window * 0.9
        refused.close()
        frames, nbytes, _ = running.credit_of(c.session_id)
        assert frames == 1 and nbytes <= credit.bytes  # the one stalled body, no more
        sender.join(credit.liveness_timeout + 5)
        assert not sender.is_alive()
        # ... before it runs, and is refused with the third once half-open (it is not
        # run, left waiting for credit, and lost in the teardown).
        assert heads == [429]
        stalled.close()
        waiting.close()


@RUNTIMES
def test_a_batch_into_a_half_open_session_gets_an_error_per_entry(runtime: str) -> None:
    # 2025-03-26, the one revision with batches: as on the Trio engine, the batch's
    # response starts at once and each entry is admitted on its own; entries refused
    # as half-open carry that refusal themselves, sent once the peer drains again.
    credit = CreditLimits(frames=8, bytes=32768, drain_window=0.5, liveness_timeout=5.0)
    with serving(runtime, demo_app, credit=credit) as running, Client(running.port) as c:
        c.initialize("2025-03-26")
        stalled = RawStream(running.port, rcvbuf=4096)
        assert stalled.send("POST", _headers(c), _filling(1, credit)) == 200
        # No room for another answer: refused once half-open, before it ran.
        waiting = RawStream(running.port)
        assert waiting.send("POST", _headers(c), _call(2, "echo", {"text": "b" * 1000})) == 429
        ping = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "ping"}).encode()
        refused = RawStream(running.port)
        assert refused.send("POST", _headers(c), ping) == 429  # half-open
        refused.close()
        batch = [{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in (4, 5)]
        entries = RawStream(running.port)
        assert entries.send("POST", _headers(c), json.dumps(batch).encode()) == 200
        for _ in range(1000):  # the stalled peer reads again: credit comes back
            event = stalled.next_event()
            if event is None or event.data:
                break
        answers = []
        for _ in range(10):
            event = entries.next_event()
            if event is None:
                break
            if event.data:
                answers.append(json.loads(event.data))
        assert sorted(a["id"] for a in answers) == [4, 5]
        assert {a["error"]["data"]["reason"] for a in answers} == {"stream_half_open"}
        for stream in (entries, waiting, stalled):
            stream.close()


@RUNTIMES
def test_batch_entries_are_admitted_one_by_one(runtime: str) -> None:
    # A frame credit of 4: at most 4 entries of the batch are in flight at a time,
    # and the rest are admitted as earlier ones finish -- never all 10 at once.
    app, gate = gated_app()
    started: list[int] = []

    @app.tool()
    async def wait(n: int) -> str:
        """Count its start, then finish once the test says so."""
        started.append(n)
        await wait_in_thread(gate)
        return str(n)

    credit = CreditLimits(frames=4, bytes=1 << 20)
    with serving(runtime, app, credit=credit) as running, Client(running.port) as c:
        c.initialize("2025-03-26")
        sid = c.session_id
        assert sid is not None
        batch = [
            {"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
             "params": {"name": "wait", "arguments": {"n": i}}}
            for i in range(10)
        ]  # fmt: skip
        stream = RawStream(running.port)
        assert stream.send("POST", _headers(c), json.dumps(batch).encode()) == 200

        def admitted() -> int:
            return int(running.probe(lambda: running.sessions[sid].flow.inflight))

        for _ in range(400):  # the handlers run on the server's loop: poll for them
            if len(started) >= 4 and admitted() >= 4:
                break
            time.sleep(0.01)
        assert admitted() == 4 and sorted(started) == [0, 1, 2, 3], (admitted(), started)
        gate.set()
        answers = []
        for _ in range(100):
            event = stream.next_event()
            if event is None:
                break
            if event.data:
                answers.append(json.loads(event.data))
        assert sorted(a["id"] for a in answers) == [100 + i for i in range(10)]
        assert sorted(started) == list(range(10)) and admitted() == 0
        stream.close()


@RUNTIMES
def test_a_stream_whose_connection_goes_away_gives_its_credit_back(runtime: str) -> None:
    # As on the Trio engine: a peer that never reads its answer and then hangs up
    # leaves nothing that could ever acknowledge it, so the stream's frames give
    # their credit back at once (they stay in the log as replay history) -- not
    # at the liveness teardown, which here is far away.
    credit = CreditLimits(frames=8, bytes=65536, drain_window=5.0, liveness_timeout=60.0)
    with serving(runtime, demo_app, credit=credit) as running, Client(running.port) as c:
        c.initialize()
        sid = c.session_id
        assert sid is not None
        peer = RawStream(running.port, rcvbuf=4096)
        call = _call(1, "echo", {"text": "x" * 12_000})
        assert peer.send("POST", _headers(c), call) == 200
        held = running.credit_of(sid)
        for _ in range(200):  # the answer is enqueued, then held unacknowledged
            if held[0] and held[1] > 12_000:
                break
            time.sleep(0.01)
            held = running.credit_of(sid)
        assert held[0] and held[1] > 12_000, held
        peer.close()
        for _ in range(300):  # the driver notices the hang-up on its next read
            held = running.credit_of(sid)
            if held == (0, 0, 0):
                break
            time.sleep(0.01)
        assert held == (0, 0, 0)
        assert running.has_session(sid)  # no teardown
        # The history stays: the stream can still be resumed from its start.
        streams = running.logs(sid)
        assert any(log.next_seq >= 1 and log.retained_bytes > 12_000 for log in streams)


@RUNTIMES
def test_a_legacy_stream_not_read_is_bounded_refused_then_reaped(runtime: str) -> None:
    # The original incident on the 2024-11-05 transport (in detail, on the Trio engine:
    # test_half_open_loopback): a peer stops reading GET /sse and keeps POSTing.
    credit = CreditLimits(frames=4, bytes=16384, drain_window=0.5, liveness_timeout=2.0)
    frame = 3000
    with serving(runtime, demo_app, credit=credit) as running:
        peer = RawStream(running.port, rcvbuf=4096)
        assert peer.send("GET", {"accept": "text/event-stream"}, target="/sse") == 200
        endpoint = peer.next_event()
        assert endpoint is not None and endpoint.event == "endpoint", endpoint
        sid = endpoint.data.split("session_id=", 1)[1]

        def held() -> tuple[int, int]:
            if sid not in running.sessions:  # torn down
                return 0, 0
            credit = running.sessions[sid].flow.credit
            return credit.frames_in_use, credit.bytes_in_use

        statuses: list[int] = []
        most = (0, 0)
        deadline = time.monotonic() + credit.liveness_timeout + 20
        for i in range(1, 2000):  # until the session is gone (bounded in time too)
            post = RawStream(running.port)
            body = _call(i, "echo", {"text": "x" * frame})
            headers = {"content-type": "application/json"}
            statuses.append(post.send("POST", headers, body, target=endpoint.data))
            post.close()
            frames, nbytes = running.probe(held)
            most = (max(most[0], frames), max(most[1], nbytes))
            if statuses[-1] == 404 or time.monotonic() > deadline:
                break
            time.sleep(0.025)  # the peer's pace (pacing, not synchronisation)
        # Admitted, then refused (never admitted again: no progress), then gone.
        n_ok, n_refused = statuses.count(202), statuses.count(429)
        assert n_ok and n_refused, statuses
        assert statuses == [202] * n_ok + [429] * n_refused + [404], statuses
        # Bounded: never more than the credit (plus the one frame that took the last).
        assert most[0] == credit.frames and most[1] <= credit.bytes + frame + 200, most
        assert not running.has_session(sid)
        peer.close()
