"""Half-open streams on real loopback sockets: drain credit, retrying gateways.

Every test runs the real :class:`weir.engine.Server` in-process, listening on 127.0.0.1,
and talks to it over real TCP sockets (no in-memory streams), because the things
under test only exist in the kernel: a peer's shrunken receive window, the server's
``SIOCOUTQ`` send-queue reading, ``TCP_NOTSENT_LOWAT``, abandoned connections.

Clock
-----
Real time.  ``MockClock`` is not used: virtual time that jumps while kernel I/O is
in flight makes loopback tests flaky, or lets them pass for the wrong reason.  No
test asks for a clock fixture, so pytest-trio runs each one on Trio's ordinary
clock, and ``trio.current_time()`` in a test reads the same monotonic clock as the
server's timers.  The limits are scaled down so that no test takes more than a few
seconds:

* test 1 and the burst: drain window 0.5 s, liveness timeout 2 s; the stalled peer
  POSTs every 25 ms and the healthy client calls every 60 ms (pacing only);
* test 3: the slow tool runs 1.15 s behind a gateway that gives up on an upstream
  after 0.5 s; a duplicate waits at the idempotency gate 2.5 s (longer than the
  tool) or 0.25 s (shorter than the gateway's patience); a 409 asks for a 0.5 s
  pause (``retry_ms``).  These keep the unscaled ratios 2.3 : 1 : 5 : 0.5 : 1.

No timing assertion compares an instant with a configured one exactly.  A refusal
or a teardown must not come *before* its timer: that is checked from a lower bound
on the instant the timer started (:meth:`CreditSamples.stall_floor`, or the
server's own last-progress timestamp) to the moment the reply *arrived*, so a slow
machine can only add margin.  It must also come within a generous ``SLACK`` after
the timer.  Where possible the order of events is asserted instead of a duration:
admitted, then refused, then gone, and never admitted once the session has been
seen half-open.  Nothing sleeps to synchronise: the tests wait for replies and
events, and where only the server's own timers or its ACK poller can make a
condition true, they poll it (:func:`eventually`, a short sleep between polls).
Every wait is bounded, in time by ``trio.fail_after`` or ``move_on_after`` and in
count by ``range``.

What the guarantee asks, and where it is checked
-------------------------------------------
1. ``test_half_open_legacy_stream_is_refused_bounded_and_reaped`` -- the original incident's own
   scenario on the 2024-11-05 HTTP+SSE transport: a peer with a shrunken receive
   buffer stops reading ``GET /sse`` and keeps POSTing ``tools/call``.  429
   ``stream_half_open`` + ``Retry-After`` only after the drain window; queue depth
   and bytes within the credit throughout; another session and ``initialize``
   untouched; teardown after the liveness timeout, then 404; frames never reordered.
   ``test_burst_into_a_stalled_session_keeps_memory_within_its_credit`` checks the
   memory half of the "bounded" rule for calls admitted inside the drain window.
2. ``test_healthy_exchange_releases_all_credit_exactly`` and
   ``test_credit_is_held_until_the_peer_acknowledges_not_until_send_returns`` --
   byte-exact drain tracking (``SIOCOUTQ``) on real sockets.
3. ``test_retrying_gateway_causes_no_duplicate_execution`` -- a retrying gateway
   (written here) in front of a slow, non-idempotent tool: zero duplicate executions,
   on both runtimes (``runtime``: the server runs in a thread of its own, see
   :mod:`tests.integration.runtimes`; the engine's metrics are checked on Trio).

Tests 1 and 2 read the Trio engine's own objects (its sessions' credit pulses, its
connections' drain meters); what they guarantee is checked on both runtimes in
:mod:`tests.integration.test_half_open_runtimes` and
:mod:`tests.integration.test_half_open_streams`.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import fcntl
import json
import math
import re
import socket
import sys
import tracemalloc
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import pytest
import sniffio
import trio

from tests.engine.helpers import H11Client, Reply, SseReply
from tests.integration import runtimes
from tests.integration.tlspki import connect_tls, pki
from weir.engine import App, Server, ServerConfig
from weir.engine._connection import Connection
from weir.engine._session import Session
from weir.engine._tls import TlsMeter
from weir.protocol import CreditLimits
from weir.protocol.sse import SseDecoder, SseEvent
from weir.protocol.states import CreditState

HOST = "127.0.0.1"
LINUX = sys.platform == "linux"

#: Generous upper bound (seconds) on how late a timer's effect may be seen after
#: its instant, on a slow or busy machine; lower bounds need no slack.
SLACK = 3.0
#: Test 1 and the burst: a half-open session is refused after DRAIN_WINDOW and
#: torn down after LIVENESS_TIMEOUT (real seconds).
DRAIN_WINDOW = 0.5
LIVENESS_TIMEOUT = 2.0
#: Test 3: the tool outlasts the gateway's patience (2.3 : 1, as unscaled), so the
#: buffering gateway always abandons the first delivery of every call.
SLOW_TOOL_SECONDS = 1.15
GATEWAY_HEADER_TIMEOUT = 0.5
GATEWAY_RETRY_MS = 500  # the 409 ``in_progress`` pause the server asks for

app = App("half-open-loopback")
executions: dict[str, int] = {}
FRAME_SIZE = 3000  # test 1: a few KB of text per result, so the stream fills quickly


@app.tool()
async def bulk(size: int, tag: str = "") -> str:
    """Return ``tag:`` followed by ``size`` bytes of text."""
    return f"{tag}:" + "x" * size


@app.tool()
async def count(label: str) -> str:
    """Non-idempotent and slow: count one execution of ``label`` at entry, then sleep."""
    executions[label] = executions.get(label, 0) + 1
    if sniffio.current_async_library() == "trio":
        await trio.sleep(SLOW_TOOL_SECONDS)
    else:
        await asyncio.sleep(SLOW_TOOL_SECONDS)
    return f"{label} executed"


# ---------------------------------------------------------------- fixtures & helpers
async def eventually(
    condition: Callable[[], bool], *, timeout: float, every: float = 0.005
) -> bool:
    """Poll ``condition`` every ``every`` seconds until it holds; False after ``timeout``.

    Only for conditions that nothing in the test can await: ones made true by the
    server's own timers or by its ACK poller (which are what is under test).
    Bounded in time (``fail_after``) and in count (``range``).
    """
    try:
        with trio.fail_after(timeout):
            for _ in range(math.ceil(timeout / every) + 1):
                if condition():
                    return True
                await trio.sleep(every)
    except trio.TooSlowError:
        pass
    return condition()


#: The ports of the servers :func:`serving` runs with TLS (:func:`open_client` then
#: speaks TLS to them).
_TLS_PORTS: set[int] = set()
#: The ``tls`` axis: each test so marked runs over plain TCP and over TLS.
TLS_AXIS = pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])


@asynccontextmanager
async def serving(app_: App, config: ServerConfig, *, tls: bool = False) -> AsyncIterator[Server]:
    """The real server listening on 127.0.0.1 (``config.port`` should be 0); with
    ``tls``, serving TLS with the test certificate (see ``tests.integration.tlspki``)."""
    if tls:
        config = dataclasses.replace(config, ssl_context=pki().server_context())
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app_, config).run)
        if tls:
            _TLS_PORTS.add(server.port)
        try:
            yield server
        finally:
            _TLS_PORTS.discard(server.port)
            server.shutdown()
            with trio.fail_after(30):
                await server.stopped.wait()


def tcp_socket(conn: Connection) -> trio.socket.SocketType:
    """The TCP socket under a server connection (plain, or under its ``SSLStream``)."""
    stream = conn.stream
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream.tcp
    assert isinstance(stream, trio.SocketStream)
    return stream.socket


async def open_client(port: int, *, rcvbuf: int | None = None) -> H11Client:
    """An h11 client on a fresh TCP connection; ``rcvbuf`` shrinks SO_RCVBUF before connect.
    To a server :func:`serving` runs with TLS, the connection speaks TLS."""
    if port in _TLS_PORTS:
        return H11Client(await connect_tls(port, rcvbuf=rcvbuf), host=f"{HOST}:{port}")
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((HOST, port))
    return H11Client(trio.SocketStream(sock), host=f"{HOST}:{port}")


def rpc(request_id: int | str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def bulk_call(request_id: int, size: int, tag: str) -> dict[str, Any]:
    return rpc(request_id, "tools/call", {"name": "bulk", "arguments": {"size": size, "tag": tag}})


def initialize_request(request_id: int | str = 0) -> dict[str, Any]:
    return rpc(
        request_id,
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "loopback-test", "version": "1"},
        },
    )


async def post_once(
    port: int,
    message: dict[str, Any],
    *,
    target: str = "/mcp",
    session_id: str | None = None,
    version: str | None = None,
) -> Reply | list[dict[str, Any]]:
    """POST one message on a fresh connection; a plain reply, or an SSE reply's messages."""
    client = await open_client(port)
    client.protocol_version = version
    client.session_id = session_id
    async with client.stream:
        reply = await client.send("POST", json.dumps(message).encode(), target=target)
        if isinstance(reply, SseReply):
            return await reply.messages()
        return reply


@asynccontextmanager
async def legacy_peer(
    server: Server, *, rcvbuf: int
) -> AsyncIterator[tuple[H11Client, SseReply, str]]:
    """GET /sse from a peer with a tiny receive buffer; read the ``endpoint`` event.

    Yields the peer, its SSE reply and the endpoint (``/messages?session_id=...``).
    On exit the peer hangs up, and the legacy session -- which lives exactly as long
    as its stream -- must be forgotten by the server.
    """
    peer = await open_client(server.port, rcvbuf=rcvbuf)
    peer.protocol_version = None
    sid: str | None = None
    try:
        with trio.fail_after(10):
            sse = await peer.send("GET", target="/sse", headers={"accept": "text/event-stream"})
            assert isinstance(sse, SseReply) and sse.status == 200, sse
            [endpoint] = await sse.next_batch()
        assert endpoint.event == "endpoint", endpoint
        assert "session_id=" in endpoint.data, endpoint
        sid = session_id_of(endpoint.data)
        yield peer, sse, endpoint.data
    finally:
        await peer.stream.aclose()
        # The server notices the hang-up on its own; poll for that.
        forgotten = await eventually(lambda: sid not in server.sessions, timeout=5)
    assert forgotten, "the legacy session outlived its stream"


def session_id_of(endpoint: str) -> str:
    return endpoint.split("session_id=", 1)[1]


def text_of(message: dict[str, Any]) -> str:
    return str(message["result"]["content"][0]["text"])


def undrained_bytes(session: Session) -> int:
    """Bytes of frames appended to the session's logs that no peer has acknowledged."""
    return sum(h.log.undrained()[1] for h in session.handles.values())


async def read_until_closed(peer: H11Client, sse: SseReply) -> list[SseEvent]:
    """Read whatever the server managed to send before it closed the connection."""
    events: list[SseEvent] = []
    decoder: SseDecoder = sse.decoder
    with trio.fail_after(30):
        for _ in range(10_000):
            try:
                ev = peer.conn.next_event()
            except h11.RemoteProtocolError:  # EOF in the middle of the chunked body
                break
            if ev is h11.NEED_DATA:
                peer.conn.receive_data(bytes(await peer.stream.receive_some(65536)))
            elif isinstance(ev, h11.Data):
                events.extend(e for e in decoder.feed(bytes(ev.data)) if isinstance(e, SseEvent))
            elif isinstance(ev, h11.EndOfMessage | h11.ConnectionClosed):
                break
    return events


async def get_metrics(port: int) -> str:
    client = await open_client(port)
    client.protocol_version = None
    async with client.stream:
        with trio.fail_after(10):
            reply = await client.send("GET", target="/metrics")
    assert isinstance(reply, Reply) and reply.status == 200, reply
    return reply.body.decode()


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return 0


#: ``SIOCOUTQNSD`` on Linux: bytes in a TCP socket's send queue not yet *sent*
#: (``SIOCOUTQ`` counts those plus the sent ones not yet acknowledged).
SIOCOUTQNSD = 0x894B
SIOCOUTQ = 0x5411


def sent_but_unacknowledged(sock: trio.socket.SocketType) -> int:
    """Bytes the kernel transmitted on ``sock`` that the peer has not acknowledged yet."""
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), SIOCOUTQ, buf, True)
    queued = buf[0]
    fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, buf, True)
    return queued - buf[0]


@dataclass
class CreditSamples:
    """What a sampler saw of one session's credit, at every change it was woken for."""

    max_frames: int = 0
    max_bytes: int = 0
    max_undrained: int = 0
    exhausted_at: float | None = None
    half_open_at: float | None = None
    last_open_at: float = -math.inf
    last_progress: float = 0.0
    closed_at: float | None = None
    samples: int = 0

    def take(self, session: Session) -> None:
        credit = session.credit
        now = trio.current_time()
        self.samples += 1
        self.max_frames = max(self.max_frames, credit.frames_in_use)
        self.max_bytes = max(self.max_bytes, credit.bytes_in_use)
        self.max_undrained = max(self.max_undrained, undrained_bytes(session))
        if credit.state is not CreditState.DEAD:
            self.last_progress = credit.last_progress
        if credit.state is CreditState.OPEN:
            self.last_open_at = now
        if credit.state is CreditState.EXHAUSTED and self.exhausted_at is None:
            self.exhausted_at = now
        if credit.state is CreditState.HALF_OPEN and self.half_open_at is None:
            self.half_open_at = now
        if session.closed and self.closed_at is None:
            self.closed_at = now

    def stall_floor(self, session: Session) -> float:
        """Take a sample; return an instant no later than the one the drain window started at.

        The server starts the window at ``max(exhausted since, last progress)``.  Its
        last-progress timestamp only grows, and it can only have become exhausted
        after the last time a sample saw it OPEN: so a refusal decided after this
        call comes at least ``drain_window`` after the value returned -- a lower
        bound that no scheduling delay can break.
        """
        self.take(session)
        return max(self.last_open_at, session.credit.last_progress)

    async def run(self, session: Session) -> None:
        """Sample on every credit change (``credit_changed`` pulses) until the session ends."""
        for _ in range(1_000_000):
            self.take(session)
            if session.closed:
                return
            changed = session.credit_changed
            with trio.move_on_after(0.05):  # and periodically, in case a pulse is missed
                await changed.wait()


# ---------------------------------------------------------------- 1. the original scenario
STALLED_POST_INTERVAL = 0.025  # the stalled peer's pace (pacing, not synchronisation)
HEALTHY_CALL_INTERVAL = 0.06  # the healthy client's pace


@dataclass
class Post:
    """One POST of the stalled peer, as it saw it."""

    request_id: int
    sent_at: float
    floor: float  # CreditSamples.stall_floor just before sending
    received_at: float
    reply: Reply

    @property
    def status(self) -> int:
        return self.reply.status


@dataclass
class Outcome:
    """What the stalled peer and the healthy client saw (test 1)."""

    posts: list[Post] = field(default_factory=list)
    healthy_calls: int = 0
    healthy_during_half_open: int = 0
    initializes_during_half_open: int = 0

    def with_status(self, status: int) -> list[Post]:
        return [p for p in self.posts if p.status == status]


async def stalled_peer_keeps_posting(
    port: int, endpoint: str, stalled: Session, samples: CreditSamples, out: Outcome
) -> None:
    """POST ``tools/call`` every 25 ms on fresh connections until the session is gone."""
    for i in range(1, 4000):
        floor = samples.stall_floor(stalled)
        sent_at = trio.current_time()
        reply = await post_once(port, bulk_call(i, FRAME_SIZE, f"s{i}"), target=endpoint)
        assert isinstance(reply, Reply), reply
        out.posts.append(Post(i, sent_at, floor, trio.current_time(), reply))
        samples.take(stalled)
        assert reply.status in (202, 429, 404), (reply.status, reply.body)
        if reply.status == 404:
            return
        await trio.sleep(STALLED_POST_INTERVAL)
    raise AssertionError("the stalled session was never torn down")


async def healthy_client(port: int, stalled: Session, out: Outcome) -> None:
    """Another session (Streamable HTTP) calling tools, plus fresh ``initialize`` requests."""
    client = await open_client(port)
    async with client.stream:
        await client.initialize()
        for n in range(1, 4000):
            if stalled.closed:
                return
            half_open = stalled.half_open
            reply = await client.call(10_000 + n, "bulk", {"size": 2000, "tag": f"h{n}"})
            [message] = await reply.messages()
            assert message["id"] == 10_000 + n
            assert text_of(message) == f"h{n}:" + "x" * 2000
            out.healthy_calls += 1
            out.healthy_during_half_open += half_open
            if n % 4 == 0:
                # Session-independent: never refused on another session's account.
                init = await post_once(port, initialize_request(n))
                assert isinstance(init, Reply) and init.status == 200, init
                assert init.json()["result"]["protocolVersion"] == "2025-11-25"
                out.initializes_during_half_open += stalled.half_open
            await trio.sleep(HEALTHY_CALL_INTERVAL)
    raise AssertionError("the stalled session was never torn down")


@TLS_AXIS
async def test_half_open_legacy_stream_is_refused_bounded_and_reaped(tls: bool) -> None:
    """A peer stops reading its legacy SSE stream but keeps POSTing ``tools/call``."""
    limits = CreditLimits(
        frames=4, bytes=16384, drain_window=DRAIN_WINDOW, liveness_timeout=LIVENESS_TIMEOUT
    )
    out = Outcome()
    async with serving(app, ServerConfig(port=0, credit=limits), tls=tls) as server:
        port = server.port
        rss_before = rss_bytes()
        async with legacy_peer(server, rcvbuf=4096) as (peer, sse, endpoint):
            sid = session_id_of(endpoint)
            stalled = server.sessions[sid]
            samples = CreditSamples()
            with trio.fail_after(LIVENESS_TIMEOUT + 20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(samples.run, stalled)
                    nursery.start_soon(healthy_client, port, stalled, out)
                    await stalled_peer_keeps_posting(port, endpoint, stalled, samples, out)
                rss_after = rss_bytes()
                late = await post_once(port, bulk_call(999, 10, "late"), target=endpoint)
                # What the server managed to send before it closed the connection.
                received = [json.loads(e.data)["id"] for e in await read_until_closed(peer, sse)]
        metrics = await get_metrics(port)

    admitted = [p.request_id for p in out.with_status(202)]
    refused = out.with_status(429)
    gone = out.with_status(404)

    # Order: admitted, then refused (never admitted again: no progress was made),
    # then gone -- the last POST, which ended the loop.
    statuses = [p.status for p in out.posts]
    assert admitted and refused and len(gone) == 1, statuses
    n_ok, n_refused = len(admitted), len(refused)
    assert statuses == [202] * n_ok + [429] * n_refused + [404], statuses

    # Refusal: only once half-open, i.e. after the drain window without progress ...
    assert samples.exhausted_at is not None and samples.half_open_at is not None
    for p in refused:
        assert p.received_at - p.floor >= limits.drain_window, (p, limits)
    # ... and from then on: no POST sent after the session was seen half-open was
    # admitted, and the first of them was refused (there were several: the session
    # stays half-open until the liveness timeout).
    after_half_open = [p for p in out.posts if p.sent_at >= samples.half_open_at]
    assert len(after_half_open) >= 2, statuses
    assert after_half_open[0].status == 429
    assert all(p.status != 202 for p in after_half_open)
    first_refusal = refused[0]
    assert first_refusal.received_at - first_refusal.floor <= limits.drain_window + SLACK
    for p in refused:
        reply = p.reply
        assert int(reply.headers["retry-after"]) >= 1
        body = reply.json()
        assert body["id"] == p.request_id
        assert body["error"]["data"]["reason"] == "stream_half_open"
        assert body["error"]["data"]["retryAfterMs"] >= 1000
    assert server.metrics.refusals["stream_half_open"] == n_refused
    assert _metric(metrics, 'weir_refusals_total{reason="stream_half_open"}') == n_refused

    # Bounded: queue depth within the frame credit, bytes within the byte credit.
    assert samples.samples > n_ok
    assert samples.max_frames == limits.frames  # it did fill up...
    assert samples.max_bytes <= limits.bytes + FRAME_SIZE + 200  # ...and no further
    assert samples.max_undrained <= limits.bytes + FRAME_SIZE + 200

    # The other session and initialize were never refused on its account.
    assert out.healthy_calls >= 10
    assert out.healthy_during_half_open >= 3
    assert out.initializes_during_half_open >= 1

    # Teardown after the liveness timeout (the sampler sees it no earlier than it
    # happened, and the server's last progress is exact); later POSTs get 404.
    assert samples.closed_at is not None
    assert samples.closed_at >= samples.last_progress + limits.liveness_timeout
    assert samples.closed_at <= samples.last_progress + limits.liveness_timeout + SLACK
    assert gone[0].received_at >= samples.last_progress + limits.liveness_timeout
    assert server.metrics.teardowns == 1
    assert _metric(metrics, "weir_teardowns_total") == 1
    assert stalled.credit.frames_in_use == 0 and stalled.credit.bytes_in_use == 0
    assert gone[0].reply.json()["error"]["data"]["reason"] == "session_not_found"
    assert isinstance(late, Reply) and late.status == 404

    # Never reordered: the peer got a prefix of the admitted calls, in order, and
    # nothing it was refused.
    assert received == admitted[: len(received)], (received, admitted)
    assert len(received) >= 1

    # Memory did not balloon (the original incident saw +1.2 GB); generous, as RSS is coarse.
    assert rss_after - rss_before < 64 * 1024 * 1024


async def test_burst_into_a_stalled_session_keeps_memory_within_its_credit() -> None:
    """Bounded: memory per stalled session <= byte credit + a constant.

    The peer stalls, then fires a burst of calls: the session is EXHAUSTED (or,
    when the fill already found no room, half-open), so each call waits for
    admission (before anything runs) until the drain window makes the session
    half-open, and is then refused.  Whatever the burst costs must stay
    within the session's byte credit (plus a small constant), however many calls
    it holds.
    """
    limits = CreditLimits(
        frames=4, bytes=65536, drain_window=DRAIN_WINDOW, liveness_timeout=LIVENESS_TIMEOUT
    )
    size = 60_000
    burst = 40
    slack = 1024 * 1024
    config = ServerConfig(port=0, credit=limits)
    with trio.fail_after(30):
        async with (
            serving(app, config) as server,
            legacy_peer(server, rcvbuf=4096) as (_, _, endpoint),
        ):
            held = await burst_into_stalled_session(server, endpoint, limits, size, burst)
    assert held <= limits.bytes + slack, (
        f"{held} bytes held by a stalled session after {burst} admitted calls of "
        f"{size} bytes each; its byte credit is {limits.bytes}"
    )


async def burst_into_stalled_session(
    server: Server, endpoint: str, limits: CreditLimits, size: int, burst: int
) -> int:
    """Stall the session, then admit ``burst`` calls; return the memory they left behind."""
    port = server.port
    stalled = server.sessions[session_id_of(endpoint)]
    samples = CreditSamples()  # sampled by hand here: no sampler task under tracemalloc

    def settled() -> bool:
        # The last call's handler has enqueued its response, or waits for credit.
        samples.take(stalled)
        return stalled.inflight == 0 or stalled.credit.state is CreditState.EXHAUSTED

    with trio.fail_after(5):
        for i in range(1, 100):  # fill the credit until a frame has to wait for it
            samples.take(stalled)
            reply = await post_once(port, bulk_call(i, size, f"fill{i}"), target=endpoint)
            assert isinstance(reply, Reply) and reply.status in (202, 429), reply
            if reply.status == 429:  # no room left for its result: refused before it ran
                break
            # The handler runs after the 202, in the server's nursery: poll for it.
            assert await eventually(settled, timeout=5), "the fill call never settled"
            if stalled.credit.state is CreditState.EXHAUSTED:
                break
    assert stalled.credit.state in (CreditState.EXHAUSTED, CreditState.HALF_OPEN)
    posts: list[tuple[float, float, float, int]] = []  # (sent, received, floor, status)
    tracemalloc.start()
    try:
        start = trio.current_time()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(100, 100 + burst):
            floor = samples.stall_floor(stalled)
            sent_at = trio.current_time()
            reply = await post_once(port, bulk_call(i, size, f"b{i}"), target=endpoint)
            # Admitted (202) or refused (429): either way it must not cost memory
            # beyond the credit.
            assert isinstance(reply, Reply) and reply.status in (202, 429), reply
            posts.append((sent_at, trio.current_time(), floor, reply.status))
        burst_took = trio.current_time() - start
        # Every admitted handler has run and parked its result (its response waits
        # for credit): the frames waiting are exactly the requests in flight.  The
        # handlers run in the server's nursery: poll for that.
        parked = await eventually(lambda: stalled.flow.waiting == stalled.inflight, timeout=5)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert parked, (stalled.flow.waiting, stalled.inflight)
    # Admission waits at most until the session is half-open, then refuses at once.
    assert burst_took < limits.drain_window + SLACK
    for _, received_at, floor, status in posts:
        if status == 429:  # never before the drain window
            assert received_at - floor >= limits.drain_window
    half_open_at = samples.half_open_at
    assert half_open_at is not None
    assert all(status == 429 for sent_at, _, _, status in posts if sent_at >= half_open_at)
    assert stalled.credit.frames_in_use <= limits.frames  # the credit itself holds...
    assert stalled.credit.bytes_in_use <= limits.bytes
    return after - before  # ...but does the memory?


# ---------------------------------------------------------------- 2. byte-exact tracking
@pytest.mark.skipif(not LINUX, reason="SIOCOUTQ byte-exact tracking is Linux-only")
@TLS_AXIS
async def test_healthy_exchange_releases_all_credit_exactly(tls: bool) -> None:
    with trio.fail_after(30):
        async with serving(app, ServerConfig(port=0), tls=tls) as server:
            client = await open_client(server.port)
            async with client.stream:
                await client.initialize()
                assert client.session_id is not None
                session = server.sessions[client.session_id]
                samples = CreditSamples()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(samples.run, session)
                    for n in range(1, 4):
                        reply = await client.call(n, "bulk", {"size": 200_000, "tag": f"t{n}"})
                        [message] = await reply.messages()
                        assert text_of(message) == f"t{n}:" + "x" * 200_000
                    # Only the server's ACK poller gives the credit back: poll for it.
                    released = await eventually(
                        lambda: not (session.credit.frames_in_use or session.credit.bytes_in_use),
                        timeout=5,
                    )
                    nursery.cancel_scope.cancel()
                assert released, (session.credit.frames_in_use, session.credit.bytes_in_use)
                connections = list(server.open_connections)  # the client's is still open
                carrier = max(connections, key=lambda c: c.tracker.written)  # the streams' one
                # The chunked body's last bytes follow the last frame; the ACK poller
                # counts them: poll for it.
                assert await eventually(
                    lambda: carrier.tracker.acked == carrier.tracker.written, timeout=5
                ), (carrier.tracker.acked, carrier.tracker.written)
                assert samples.max_frames >= 1  # credit was really held in flight...
                assert session.credit.frames_in_use == 0  # ...and all of it came back
                assert session.credit.bytes_in_use == 0
                assert session.credit.state is CreditState.OPEN
                assert connections, "the server made no Connection"
                for conn in connections:
                    assert conn.meter.exact, "DrainMeter fell back to 'accepted by send()'"
                assert carrier.tracker.written > 600_000
                assert carrier.tracker.acked == carrier.tracker.written
                assert carrier.meter.unacknowledged() == 0
                assert not carrier.tracker.pending


@pytest.mark.skipif(not LINUX, reason="SIOCOUTQ byte-exact tracking is Linux-only")
@TLS_AXIS
async def test_credit_is_held_until_the_peer_acknowledges_not_until_send_returns(
    tls: bool,
) -> None:
    """A frame ``send()`` accepted in full still holds credit until the peer's TCP ACKs it.

    Without byte-exact tracking the frame would be released the moment the kernel
    accepted it; here the peer (4 KiB receive buffer, not reading) cannot take a
    12 KB frame, so part of it sits unacknowledged in the server's send queue and
    the frame keeps its credit until the peer reads.
    """
    with trio.fail_after(30):
        async with (
            serving(app, ServerConfig(port=0), tls=tls) as server,
            legacy_peer(server, rcvbuf=4096) as (_, sse, endpoint),
        ):
            await credit_held_until_acknowledged(server, sse, endpoint)


async def credit_held_until_acknowledged(server: Server, sse: SseReply, endpoint: str) -> None:
    session = server.sessions[session_id_of(endpoint)]
    carrier = max(server.open_connections, key=lambda c: c.tracker.written)  # the SSE stream's
    assert carrier.meter.exact
    sock = tcp_socket(carrier)
    meter = carrier.meter
    # What the peer's TCP has acknowledged: bytes (TLS: ciphertext bytes).
    acked_before = (
        meter.ciphertext_acked() if isinstance(meter, TlsMeter) else carrier.tracker.acked
    )
    reply = await post_once(server.port, bulk_call(7, 12_000, "held"), target=endpoint)
    assert isinstance(reply, Reply) and reply.status == 202

    # The frame's mark is registered only once the writer's send() returned for
    # all of it: from then on, only the peer's ACKs can release it.  Then wait
    # until the peer has acknowledged everything it will while it does not read
    # (nothing the kernel transmitted is unacknowledged: the rest waits for the
    # peer's window) and the server's ACK poller has counted all of it.  Both are
    # the kernel's and the server's doing: poll for them.
    def every_ack_counted() -> bool:
        return (
            carrier.tracker.pending
            and sent_but_unacknowledged(sock) == 0
            and carrier.tracker.written - carrier.tracker.acked == carrier.meter.unacknowledged()
        )

    assert await eventually(every_ack_counted, timeout=5), (
        carrier.tracker.pending,
        sent_but_unacknowledged(sock),
        carrier.tracker.written - carrier.tracker.acked,
        carrier.meter.unacknowledged(),
    )
    # The peer did acknowledge part of it (under TLS, bytes of its record: the record
    # as a whole is not, and the peer could not read a byte of it yet) ...
    if isinstance(meter, TlsMeter):
        assert meter.ciphertext_acked() > acked_before
    else:
        assert carrier.tracker.acked > acked_before
    tracked = carrier.tracker.written - carrier.tracker.acked
    in_kernel = carrier.meter.unacknowledged()
    assert 0 < in_kernel <= tracked  # never counts a byte acknowledged too early
    assert carrier.tracker.pending  # ...but not the frame's last byte
    assert session.credit.frames_in_use == 1
    assert session.credit.bytes_in_use > 12_000

    # The peer reads; its ACKs release the frame.
    found: list[dict[str, Any]] = []
    with trio.fail_after(5):
        for _ in range(50):
            batch = await sse.next_batch()
            found += [json.loads(e.data) for e in batch if e.data]
            if found:
                break
    assert [m["id"] for m in found] == [7]
    assert text_of(found[0]) == "held:" + "x" * 12_000
    # Released by the server's ACK poller: poll for it.
    assert await eventually(
        lambda: (
            not session.credit.frames_in_use and carrier.tracker.acked == carrier.tracker.written
        ),
        timeout=5,
    ), (session.credit.frames_in_use, carrier.tracker.acked, carrier.tracker.written)
    assert session.credit.bytes_in_use == 0
    assert carrier.meter.unacknowledged() == 0


# ---------------------------------------------------------------- 3. a retrying gateway
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"content-length",  # re-framed by h11 on each side
}


def _end_to_end(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]


async def _next_h11_event(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Event:
    for _ in range(100_000):
        ev = conn.next_event()
        if ev is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
            continue
        assert not isinstance(ev, type), ev
        return ev
    raise AssertionError("no HTTP event")


async def _read_body(conn: h11.Connection, stream: trio.abc.Stream) -> list[h11.Data]:
    parts: list[h11.Data] = []
    for _ in range(100_000):
        ev = await _next_h11_event(conn, stream)
        if isinstance(ev, h11.EndOfMessage):
            return parts
        assert isinstance(ev, h11.Data), ev
        parts.append(ev)
    raise AssertionError("endless body")


class RetryingGateway:
    """A small HTTP/1.1 reverse proxy that re-sends requests whose upstream is slow.

    Each client request is forwarded to weir over a *fresh* upstream connection.  If
    the upstream has not produced response headers within ``header_timeout``
    seconds (with ``buffer_body``: the whole response, like a buffering proxy), the
    gateway abandons that upstream connection and re-sends the same request on a new
    one, up to ``retries`` times; then it answers 504 itself.  An upstream that
    breaks the connection gets a 502 (recorded in ``upstream_errors``).  This is the
    gateway of the original incident, whose retries duplicated non-idempotent tool calls.
    """

    def __init__(
        self, upstream_port: int, *, header_timeout: float, retries: int, buffer_body: bool
    ) -> None:
        self.upstream_port = upstream_port
        self.header_timeout = header_timeout
        self.retries = retries
        self.buffer_body = buffer_body
        self.deliveries: list[bytes] = []  # every request body sent upstream, retries included
        self.abandoned = 0
        self.gave_up = 0
        self.upstream_errors: list[str] = []

    async def handle(self, client: trio.SocketStream) -> None:
        """Serve one client connection (keep-alive: several requests, one at a time)."""
        conn = h11.Connection(h11.SERVER)
        async with client:
            for _ in range(100):
                request = await _next_h11_event(conn, client)
                if isinstance(request, h11.ConnectionClosed):
                    return
                assert isinstance(request, h11.Request), request
                body = b"".join(bytes(p.data) for p in await _read_body(conn, client))
                await self._forward(conn, client, request, body)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()

    async def _forward(
        self, conn: h11.Connection, client: trio.SocketStream, request: h11.Request, body: bytes
    ) -> None:
        headers = _end_to_end(request.headers)
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        for _ in range(self.retries + 1):
            async with await trio.open_tcp_stream(HOST, self.upstream_port) as upstream:
                up = h11.Connection(h11.CLIENT)
                out = (
                    up.send(
                        h11.Request(method=request.method, target=request.target, headers=headers)
                    )
                    or b""
                )
                if body:
                    out += up.send(h11.Data(data=body)) or b""
                out += up.send(h11.EndOfMessage()) or b""
                self.deliveries.append(body)
                response: h11.Response | None = None
                parts: list[h11.Data] = []
                try:
                    await upstream.send_all(out)
                    with trio.move_on_after(self.header_timeout):
                        first = await _next_h11_event(up, upstream)
                        assert isinstance(first, h11.Response), first
                        if self.buffer_body:
                            parts = await _read_body(up, upstream)
                        response = first
                except (h11.RemoteProtocolError, trio.BrokenResourceError) as exc:
                    self.upstream_errors.append(repr(exc))
                    await self._answer(conn, client, 502)
                    return
                if response is None:
                    self.abandoned += 1  # too slow: drop this upstream, re-send on a new one
                    continue
                head = h11.Response(
                    status_code=response.status_code, headers=_end_to_end(response.headers)
                )
                await client.send_all(conn.send(head) or b"")
                for part in parts:
                    await client.send_all(conn.send(part) or b"")
                if not self.buffer_body:
                    try:
                        for _ in range(100_000):
                            ev = await _next_h11_event(up, upstream)
                            if isinstance(ev, h11.EndOfMessage):
                                break
                            assert isinstance(ev, h11.Data), ev
                            await client.send_all(conn.send(ev) or b"")
                    except (h11.RemoteProtocolError, trio.BrokenResourceError) as exc:
                        self.upstream_errors.append(repr(exc))
                        return  # the client sees its response cut short
                await client.send_all(conn.send(h11.EndOfMessage()) or b"")
                return
        self.gave_up += 1
        await self._answer(conn, client, 504)

    @staticmethod
    async def _answer(conn: h11.Connection, client: trio.SocketStream, status: int) -> None:
        head = h11.Response(status_code=status, headers=[(b"content-length", b"0")])
        await client.send_all((conn.send(head) or b"") + (conn.send(h11.EndOfMessage()) or b""))


@runtimes.RUNTIMES
@pytest.mark.parametrize(
    ("json_response", "buffer_body", "in_progress_wait"),
    [
        pytest.param(True, False, 2.5, id="json-replay-after-wait"),
        pytest.param(True, False, 0.25, id="json-409-then-client-retry"),
        pytest.param(False, True, 2.5, id="sse-buffering-gateway"),
        pytest.param(False, True, 0.25, id="sse-buffering-gateway-409"),
        pytest.param(False, False, 2.5, id="sse-headers-first-no-retry"),
    ],
)
async def test_retrying_gateway_causes_no_duplicate_execution(
    json_response: bool, buffer_body: bool, in_progress_wait: float, runtime: str
) -> None:
    """Five clients call a 1.15 s non-idempotent tool through a gateway that gives up after 0.5 s.

    With ``json_response`` (or a buffering gateway) nothing reaches the gateway in
    time, so it abandons the first delivery and re-sends it, up to 3 times.  The
    idempotency gate (key: session + JSON-RPC id) must stop every re-delivery: it
    waits for the running call and replays its result, or (``in_progress_wait``
    shorter than the gateway's patience) answers 409 ``in_progress``, on which the
    client retries with the same id.  With SSE and a headers-first gateway the
    stream's headers arrive at once and nothing is retried.
    """
    executions.clear()
    clients = 5
    header_timeout = GATEWAY_HEADER_TIMEOUT  # < SLOW_TOOL_SECONDS: it gives up on delivery 1
    assert header_timeout < SLOW_TOOL_SECONDS < (3 + 1) * header_timeout
    config = ServerConfig(
        port=0,
        json_response=json_response,
        in_progress_wait=in_progress_wait,
        retry_ms=GATEWAY_RETRY_MS,
    )
    options = {"in_progress_wait": in_progress_wait, "retry_ms": GATEWAY_RETRY_MS}
    serve = runtimes.serving(runtime, app, json_response=json_response, **options)
    with trio.fail_after(60), serve as server:
        async with trio.open_nursery() as nursery:
            gateway = RetryingGateway(
                server.port, header_timeout=header_timeout, retries=3, buffer_body=buffer_body
            )
            listeners = await nursery.start(partial(trio.serve_tcp, gateway.handle, 0, host=HOST))
            gw_port = int(listeners[0].socket.getsockname()[1])
            await calls_through_gateway(server, gateway, gw_port, clients, config)
            nursery.cancel_scope.cancel()


async def calls_through_gateway(
    server: runtimes.Served,
    gateway: RetryingGateway,
    gw_port: int,
    clients: int,
    config: ServerConfig,
) -> None:
    """Each of ``clients`` calls ``count`` once, through the gateway; check the books."""
    first = await open_client(gw_port)
    async with first.stream:
        await first.initialize()
    sid, version = first.session_id, first.protocol_version
    assert sid is not None

    results: dict[int, str] = {}
    conflicts: dict[int, int] = {}

    async def call(request_id: int) -> None:
        label = f"r{request_id}"
        message = rpc(request_id, "tools/call", {"name": "count", "arguments": {"label": label}})
        for _ in range(10):
            reply = await post_once(gw_port, message, session_id=sid, version=version)
            if isinstance(reply, list):
                [answer] = [m for m in reply if m.get("id") == request_id]
                results[request_id] = text_of(answer)
                return
            if reply.status == 409:
                data = reply.json()["error"]["data"]
                assert data["reason"] == "in_progress", data
                assert int(reply.headers["retry-after"]) >= 1
                assert data["retryAfterMs"] == config.retry_ms, data
                conflicts[request_id] = conflicts.get(request_id, 0) + 1
                # Honour the server's precise hint (Retry-After is whole seconds).
                await trio.sleep(data["retryAfterMs"] / 1000)
                continue
            assert reply.status == 200, (reply.status, reply.body, gateway.upstream_errors)
            answer = reply.json()
            assert answer["id"] == request_id
            results[request_id] = text_of(answer)
            return
        raise AssertionError(f"request {request_id} never got its result")

    async with trio.open_nursery() as calls:
        for request_id in range(1, clients + 1):
            calls.start_soon(call, request_id)

    ids = range(1, clients + 1)
    assert results == {i: f"r{i} executed" for i in ids}
    tool_deliveries = sum(b'"tools/call"' in b for b in gateway.deliveries)
    duplicates = tool_deliveries - clients
    # Abandoned deliveries may still be waiting at the gate on the server (their
    # connections are gone, nothing answers them to us): poll until the server has
    # decided every one of them, replayed or refused -- none may execute.  Each
    # waits on its own connection, which ends once it is decided.
    decided = await eventually(
        lambda: server.connections() == 0,
        timeout=SLOW_TOOL_SECONDS + config.in_progress_wait + SLACK,
    )
    assert decided, server.connections()
    if server.runtime == "trio":  # the engine's own books (the asyncio runtime keeps none)
        metrics = server.target.metrics
        assert await eventually(
            lambda: metrics.duplicates_replayed + metrics.duplicates_in_progress >= duplicates,
            timeout=SLACK,
        ), (metrics.duplicates_replayed, metrics.duplicates_in_progress, duplicates)
        assert metrics.executions == clients
    assert executions == {f"r{i}": 1 for i in ids}  # zero duplicate side effects
    assert gateway.gave_up == 0
    assert gateway.upstream_errors == []
    if gateway.buffer_body or config.json_response:
        assert gateway.abandoned >= clients  # the gateway really did retry
        assert duplicates >= clients
    else:
        assert gateway.abandoned == 0  # SSE sends headers first: nothing to retry
        assert duplicates == 0
    if config.in_progress_wait < gateway.header_timeout and (
        gateway.buffer_body or config.json_response
    ):
        assert conflicts, "expected 409 in_progress answers to reach the clients"

    if server.runtime != "trio":
        return  # (no /metrics on the asyncio runtime yet)
    metrics = server.target.metrics
    text = await get_metrics(server.port)
    assert _metric(text, "weir_tool_executions_total") == clients
    replayed = _metric(text, 'weir_duplicate_requests_total{outcome="replayed"}')
    in_progress = _metric(text, 'weir_duplicate_requests_total{outcome="in_progress"}')
    assert replayed == metrics.duplicates_replayed
    assert in_progress == metrics.duplicates_in_progress
    assert replayed + in_progress == duplicates
