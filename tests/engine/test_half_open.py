"""Driver tests for half-open streams (drain credit) and the idempotency gate.

The real :class:`weir.engine.Server` runs over in-memory Trio streams.  A peer that
stops reading is a server->client one-way memory stream whose ``send_all_hook``
blocks on a :class:`trio.Event` until the test opens it (STYLE.md section 3.2,
way 2): memory streams have no kernel queue, so the engine's DrainMeter falls back
to "accepted by ``send()`` = acknowledged" and a blocked ``send_all`` is exactly
what holds the session's credit.

Time is Trio's MockClock (``autojump_clock``): every deadline is checked with the
exact value of ``trio.current_time()``, and no test sleeps in real time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import trio
import trio.testing

from weir.engine import App, Context, Server, ServerConfig
from weir.engine._session import StreamHandle
from weir.protocol import CreditLimits
from weir.protocol._credit import SessionCredit
from weir.protocol.states import CreditState
from weir.protocol.streams import StreamKind

from .helpers import H11Client, Reply, SseReply, connect, open_session, running_server

FRAMES = 8
BYTES = 4096
DRAIN = 5.0
LIVENESS = 20.0
CREDIT = CreditLimits(frames=FRAMES, bytes=BYTES, drain_window=DRAIN, liveness_timeout=LIVENESS)
CONFIG = ServerConfig(credit=CREDIT, max_stream_events=64, session_idle_timeout=None)
RETRY_MS = int(DRAIN * 1000)
TEST_DEADLINE = 1000.0  # virtual seconds; every test ends long before


# ----------------------------------------------------------------- the application


@dataclass
class Record:
    """What the tools did, per session id."""

    counts: dict[str, int] = field(default_factory=dict)
    hanging: int = 0
    cancelled: int = 0


STATE = Record()
app = App("half-open-test")


@app.tool(idempotent=False, destructive=True)
async def count(ctx: Context) -> str:
    """Not idempotent: count one more execution in this session, return the new count."""
    n = STATE.counts.get(str(ctx.session_id), 0) + 1
    STATE.counts[str(ctx.session_id)] = n
    await trio.lowlevel.checkpoint()
    return str(n)


@app.tool(idempotent=False)
async def slow_count(ctx: Context, seconds: float = 0) -> str:
    """Count one execution at once, then sleep ``seconds``, then return the count."""
    n = STATE.counts.get(str(ctx.session_id), 0) + 1
    STATE.counts[str(ctx.session_id)] = n
    await trio.sleep(seconds)
    return str(n)


@app.tool()
async def notify(ctx: Context, n: int, delay: float = 0, pad: int = 0) -> str:
    """After ``delay`` seconds, send ``n`` log notifications in order."""
    await trio.sleep(delay)
    for i in range(n):
        await ctx.info(f"log {i}" + " " * pad)
    return f"sent {n}"


@app.tool()
async def hang() -> str:
    """Run until cancelled."""
    STATE.hanging += 1
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        STATE.cancelled += 1
        raise
    raise AssertionError("unreachable")


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    STATE.counts.clear()
    STATE.hanging = STATE.cancelled = 0
    yield


@asynccontextmanager
async def serving(
    config: ServerConfig | None = None,
) -> AsyncIterator[tuple[Server, trio.Nursery]]:
    """:func:`running_server` for ``app``, failing (in virtual time) if a test gets stuck."""
    with trio.fail_after(TEST_DEADLINE):
        async with running_server(app, config) as (server, nursery):
            yield server, nursery


# ----------------------------------------------------------------- stalling peer


class Valve:
    """A server->client byte stream whose ``send_all`` blocks while the valve is shut."""

    def __init__(self) -> None:
        self.send, self.recv = trio.testing.memory_stream_one_way_pair()
        self._open = trio.Event()
        self._open.set()
        self.stalled = 0  # send_all calls blocked right now
        self.send.send_all_hook = self._hook
        self.send.close_hook = self._close_hook

    def shut(self) -> None:
        if self._open.is_set():
            self._open = trio.Event()

    def open(self) -> None:
        self._open.set()

    async def _hook(self) -> None:
        gate = self._open
        if not gate.is_set():
            self.stalled += 1
            try:
                await gate.wait()
            finally:
                self.stalled -= 1
        trio.testing.memory_stream_pump(self.send, self.recv)

    def _close_hook(self) -> None:
        # trio's own close hook pumps once: bytes a cancelled send_all left behind
        # would move but the EOF would not.  Pump the leftovers, then the EOF.
        with contextlib.suppress(trio.BrokenResourceError):  # the reader hung up first
            for _ in range(2):
                trio.testing.memory_stream_pump(self.send, self.recv)


def connect_stalling(server: Server, nursery: trio.Nursery) -> tuple[H11Client, Valve]:
    """A client whose reading side the test controls with the returned :class:`Valve`."""
    valve = Valve()
    c2s_send, c2s_recv = trio.testing.memory_stream_one_way_pair()
    nursery.start_soon(server.serve_connection, trio.StapledStream(valve.send, c2s_recv))
    return H11Client(trio.StapledStream(c2s_send, valve.recv)), valve


def as_session(server: Server, nursery: trio.Nursery, client: H11Client) -> H11Client:
    other = connect(server, nursery)
    other.session_id, other.protocol_version = client.session_id, client.protocol_version
    return other


def call_msg(request_id: int, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


@dataclass
class Legacy:
    """A 2024-11-05 HTTP+SSE session: one stalling SSE stream, POSTs on another connection."""

    session_id: str
    stream: SseReply
    valve: Valve
    poster: H11Client

    async def post(self, message: dict[str, Any]) -> Reply:
        reply = await self.poster.send(
            "POST",
            json.dumps(message).encode(),
            target=f"/messages?session_id={self.session_id}",
        )
        assert isinstance(reply, Reply), reply
        return reply

    async def read_messages(self, n: int) -> list[dict[str, Any]]:
        """Read the SSE stream until ``n`` JSON-RPC messages have arrived."""
        out: list[dict[str, Any]] = []
        for _ in range(10 * n + 10):
            if len(out) >= n:
                break
            out += [json.loads(e.data) for e in await self.stream.next_batch() if e.data]
        assert len(out) == n, out
        return out


async def open_legacy(server: Server, nursery: trio.Nursery) -> Legacy:
    client, valve = connect_stalling(server, nursery)
    client.protocol_version = None
    stream = await client.send("GET", headers={"accept": "text/event-stream"}, target="/sse")
    assert isinstance(stream, SseReply) and stream.status == 200
    [endpoint] = await stream.next_batch()
    assert endpoint.event == "endpoint"
    [sid] = parse_qs(urlsplit(endpoint.data).query)["session_id"]
    poster = connect(server, nursery)
    poster.protocol_version = None
    return Legacy(sid, stream, valve, poster)


async def scrape(server: Server, nursery: trio.Nursery) -> dict[str, float]:
    """``GET /metrics`` as ``{"name{labels}": value}``."""
    reply = await connect(server, nursery).send("GET", target="/metrics")
    assert isinstance(reply, Reply) and reply.status == 200
    out: dict[str, float] = {}
    for line in reply.body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def check_bounded(server: Server, sid: str) -> None:
    """Queue depth and bytes never exceed the session's credit."""
    session = server.sessions.get(sid)
    if session is None:
        return
    credit = session.credit
    assert session.queue_depth == credit.frames_in_use
    assert 0 <= credit.frames_in_use <= FRAMES
    assert credit.bytes_in_use <= BYTES or credit.frames_in_use == 1


def assert_half_open_refusal(reply: Reply, request_id: int) -> None:
    assert reply.status == 429
    assert reply.headers["retry-after"] == str(int(DRAIN))
    body = reply.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == request_id
    assert body["error"]["data"] == {"reason": "stream_half_open", "retryAfterMs": RETRY_MS}


def legacy_log(server: Server, sid: str) -> StreamHandle:
    [handle] = [h for h in server.sessions[sid].handles.values() if h.log.kind is StreamKind.LEGACY]
    return handle


def state_of(credit: SessionCredit) -> CreditState:
    """The state, read through a call (so the type checker does not over-narrow it)."""
    return credit.state


async def settle() -> None:
    """Let every task run until all are blocked (the clock does not move)."""
    await trio.testing.wait_all_tasks_blocked()


# ----------------------------------------------------------------- legacy: one stream for all


@dataclass
class Waiting:
    """A POST sent on its own connection in the background; ``reply`` once answered."""

    reply: Reply | None = None
    at: float | None = None

    async def run(
        self, server: Server, nursery: trio.Nursery, sid: str, msg: dict[str, Any]
    ) -> None:
        poster = connect(server, nursery)
        poster.protocol_version = None
        reply = await poster.send(
            "POST", json.dumps(msg).encode(), target=f"/messages?session_id={sid}"
        )
        assert isinstance(reply, Reply), reply
        self.reply, self.at = reply, trio.current_time()


async def fill_legacy_credit(
    server: Server, nursery: trio.Nursery, legacy: Legacy
) -> list[Waiting]:
    """At t=1 shut the reader, run a handler that never ends, fill the credit (ids 1..8).

    Then, at t=2 and t=6.5, two more calls (ids 9, 10) find no credit: they wait for
    admission -- before anything runs -- and the credit is EXHAUSTED.
    """
    sid = legacy.session_id
    legacy.valve.shut()
    await trio.sleep_until(1.0)
    reply = await legacy.post(call_msg(100, "hang"))
    assert reply.status == 202
    for rid in range(1, FRAMES + 1):
        reply = await legacy.post(call_msg(rid, "count"))
        assert reply.status == 202  # (a) credit remains: admitted
        await settle()
        check_bounded(server, sid)
        assert STATE.counts[sid] == rid
    credit = server.sessions[sid].credit
    assert credit.frames_in_use == FRAMES and credit.state is CreditState.OPEN
    assert legacy.valve.stalled == 1  # the writer is blocked in send_all
    assert STATE.hanging == 1

    waiting = [Waiting(), Waiting()]
    await trio.sleep_until(2.0)
    nursery.start_soon(waiting[0].run, server, nursery, sid, call_msg(FRAMES + 1, "count"))
    await settle()
    check_bounded(server, sid)
    assert waiting[0].reply is None  # no credit left, not half-open: it waits...
    assert STATE.counts[sid] == FRAMES  # ...before anything runs (no parked result)
    assert state_of(credit) is CreditState.EXHAUSTED
    assert credit.deadline() == 2.0 + DRAIN

    await trio.sleep_until(6.5)
    nursery.start_soon(waiting[1].run, server, nursery, sid, call_msg(FRAMES + 2, "count"))
    await settle()
    check_bounded(server, sid)
    assert state_of(credit) is CreditState.EXHAUSTED  # still inside the drain window
    assert [w.reply for w in waiting] == [None, None]
    assert STATE.counts[sid] == FRAMES
    return waiting


async def refuse_at_drain_deadline(
    server: Server, nursery: trio.Nursery, legacy: Legacy, waiting: list[Waiting]
) -> None:
    """At t=7 exactly (2 + drain window) the session is half-open: 429, nothing runs."""
    sid = legacy.session_id
    handle = legacy_log(server, sid)
    next_seq = handle.log.next_seq
    await trio.sleep_until(2.0 + DRAIN)
    await settle()
    for w, rid in zip(waiting, (FRAMES + 1, FRAMES + 2), strict=True):
        assert w.reply is not None and w.at == 2.0 + DRAIN  # refused the moment it turned
        assert_half_open_refusal(w.reply, rid)
    reply = await legacy.post(call_msg(11, "count"))
    assert trio.current_time() == 2.0 + DRAIN
    assert_half_open_refusal(reply, 11)
    await settle()
    assert STATE.counts[sid] == FRAMES  # no refused call ever executed
    assert handle.log.next_seq == next_seq  # and produced no frame
    assert server.sessions[sid].credit.state is CreditState.HALF_OPEN
    check_bounded(server, sid)
    # A notification-only POST has nothing to dispatch: accepted.
    note = await legacy.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert note.status == 202

    # (d) Another session, and initialize, are untouched.
    other = connect(server, nursery)
    await other.initialize()
    assert other.session_id != sid
    msgs = await (await other.call(1, "count")).messages()
    assert msgs[-1]["result"]["content"][0]["text"] == "1"
    assert STATE.counts[sid] == FRAMES
    check_bounded(server, sid)

    metrics = await scrape(server, nursery)
    assert metrics['weir_refusals_total{reason="stream_half_open"}'] == 3
    assert metrics["weir_half_open_sessions"] == 1
    assert metrics["weir_teardowns_total"] == 0


async def test_legacy_half_open_session_is_refused_then_torn_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(CONFIG) as (server, nursery):
        legacy = await open_legacy(server, nursery)
        sid = legacy.session_id
        session = server.sessions[sid]
        waiting = await fill_legacy_credit(server, nursery, legacy)
        await refuse_at_drain_deadline(server, nursery, legacy, waiting)

        await trio.sleep_until(10.0)
        again = await legacy.post(call_msg(12, "count"))
        assert_half_open_refusal(again, 12)  # still half-open: still refused
        await trio.sleep_until(1.0 + LIVENESS - 0.5)
        await settle()
        assert sid in server.sessions and server.metrics.teardowns == 0
        check_bounded(server, sid)

        # (e) No progress since the first pending frame (t=1): torn down at t=21 exactly.
        await trio.sleep_until(1.0 + LIVENESS)
        await settle()
        assert trio.current_time() == 1.0 + LIVENESS
        assert sid not in server.sessions and session.closed
        assert server.metrics.teardowns == 1
        assert session.running == {} and STATE.cancelled == 1  # handlers cancelled
        assert all(h.writer_scope is None for h in session.handles.values())  # writer gone
        assert legacy.valve.stalled == 0
        assert (session.credit.frames_in_use, session.credit.bytes_in_use) == (0, 0)
        assert STATE.counts[sid] == FRAMES  # nothing ran twice, nothing refused ran

        gone = await legacy.post(call_msg(13, "count"))
        assert gone.status == 404
        assert gone.json()["error"]["data"]["reason"] == "session_not_found"
        # The stalled connection was closed by the server: its reader sees EOF.
        for _ in range(100):
            if await legacy.valve.recv.receive_some(65536) == b"":
                break
        else:
            raise AssertionError("the stalled connection was never closed")

        metrics = await scrape(server, nursery)
        assert metrics['weir_refusals_total{reason="stream_half_open"}'] == 4
        assert metrics["weir_teardowns_total"] == 1
        assert metrics["weir_half_open_sessions"] == 0
        assert metrics["weir_sessions"] == 1  # the other session lives on
        assert metrics["weir_credit_in_use_frames"] == 0
        assert metrics["weir_credit_peak_frames"] == FRAMES  # the stalled one, filled
        assert STATE.counts[sid] == FRAMES
    assert server.metrics.credit_peaks(server.sessions.values())[0] == FRAMES


async def test_legacy_reader_recovers_before_liveness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(CONFIG) as (server, nursery):
        legacy = await open_legacy(server, nursery)
        sid = legacy.session_id
        waiting = await fill_legacy_credit(server, nursery, legacy)
        await refuse_at_drain_deadline(server, nursery, legacy, waiting)
        session = server.sessions[sid]

        # (f) The reader resumes at t=10: every queued response arrives, in order.
        await trio.sleep_until(10.0)
        legacy.valve.open()
        msgs = await legacy.read_messages(FRAMES)
        assert [m["id"] for m in msgs] == list(range(1, FRAMES + 1))
        assert [m["result"]["content"][0]["text"] for m in msgs] == [
            str(i) for i in range(1, FRAMES + 1)
        ]
        await settle()
        assert session.credit.state is CreditState.OPEN
        assert session.queue_depth == 0
        assert trio.current_time() == 10.0

        reply = await legacy.post(call_msg(14, "count"))
        assert reply.status == 202  # admitted again
        [late] = await legacy.read_messages(1)
        assert late == {
            "jsonrpc": "2.0",
            "id": 14,
            "result": {"content": [{"type": "text", "text": str(FRAMES + 1)}]},
        }
        # No teardown: the liveness deadline passes without effect.
        await trio.sleep_until(40.0)
        await settle()
        assert sid in server.sessions and server.metrics.teardowns == 0
        metrics = await scrape(server, nursery)
        assert metrics['weir_refusals_total{reason="stream_half_open"}'] == 3
        assert metrics["weir_teardowns_total"] == 0
        assert metrics["weir_half_open_sessions"] == 0
        assert STATE.hanging == 1 and STATE.cancelled == 0
    assert server.metrics.credit_peaks(server.sessions.values())[0] == FRAMES


async def test_legacy_reader_that_disconnects_is_torn_down_not_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(CONFIG) as (server, nursery):
        legacy = await open_legacy(server, nursery)
        sid = legacy.session_id
        session = server.sessions[sid]
        waiting = await fill_legacy_credit(server, nursery, legacy)
        await legacy.stream.client.stream.aclose()  # the client goes away entirely
        await settle()
        assert trio.current_time() == 6.5
        assert sid not in server.sessions and session.closed
        assert STATE.cancelled == 1
        assert (session.credit.frames_in_use, session.credit.bytes_in_use) == (0, 0)
        for w in waiting:  # the calls waiting for admission learn the session is gone
            assert w.reply is not None and w.reply.status == 404
        gone = await legacy.post(call_msg(11, "count"))
        assert gone.status == 404
        assert gone.json()["error"]["data"]["reason"] == "session_not_found"
        assert server.metrics.refusals["stream_half_open"] == 0


# ----------------------------------------------------------------- Streamable HTTP


@dataclass
class Stalled:
    """A Streamable-HTTP session whose POST stream for ``notify`` stalls at t=1."""

    client: H11Client  # a healthy connection of the session (initialize went here)
    stalled: H11Client
    reply: SseReply
    valve: Valve

    @property
    def sid(self) -> str:
        assert self.client.session_id is not None
        return self.client.session_id


@dataclass
class StreamWaiting:
    """A Streamable-HTTP POST sent in the background; ``reply`` once answered."""

    reply: Reply | None = None
    at: float | None = None

    async def run(self, client: H11Client, msg: dict[str, Any]) -> None:
        reply = await client.post(msg)
        assert isinstance(reply, Reply), reply
        self.reply, self.at = reply, trio.current_time()


async def stall_streamable(
    server: Server, nursery: trio.Nursery, n: int = 20, pad: int = 0
) -> Stalled:
    client = connect(server, nursery)
    await client.initialize()
    stalled, valve = connect_stalling(server, nursery)
    stalled.session_id, stalled.protocol_version = client.session_id, client.protocol_version
    reply = await stalled.call(1, "notify", {"n": n, "delay": 1, "pad": pad})
    assert reply.status == 200
    [priming] = await reply.next_batch()
    assert priming.data == "" and priming.id is not None
    valve.shut()
    out = Stalled(client, stalled, reply, valve)
    await trio.sleep_until(1.0)
    await settle()
    credit = server.sessions[out.sid].credit
    check_bounded(server, out.sid)
    assert state_of(credit) is CreditState.EXHAUSTED
    assert credit.last_progress == 1.0
    assert credit.deadline() == 1.0 + DRAIN
    assert valve.stalled == 1
    return out


async def test_streamable_stalled_post_stream_recovers_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(CONFIG) as (server, nursery):
        st = await stall_streamable(server, nursery, n=20)
        sid = st.sid
        credit = server.sessions[sid].credit
        assert credit.frames_in_use == FRAMES  # the handler waits for the 9th log frame

        # (a) Exhausted but not half-open: the call waits for admission (nothing runs).
        await trio.sleep_until(5.5)
        queued = StreamWaiting()
        nursery.start_soon(queued.run, as_session(server, nursery, st.client), call_msg(2, "count"))
        await settle()
        assert queued.reply is None
        check_bounded(server, sid)

        # (b) 1 + drain window: refused before dispatch, the waiting call included.
        await trio.sleep_until(1.0 + DRAIN)
        await settle()
        assert queued.reply is not None and queued.at == 1.0 + DRAIN
        assert_half_open_refusal(queued.reply, 2)
        refused = await as_session(server, nursery, st.client).post(call_msg(3, "count"))
        assert isinstance(refused, Reply)
        assert_half_open_refusal(refused, 3)
        assert state_of(credit) is CreditState.HALF_OPEN
        # (d) initialize and other sessions still work.
        other = connect(server, nursery)
        await other.initialize()
        msgs = await (await other.call(7, "count")).messages()
        assert msgs[-1]["result"]["content"][0]["text"] == "1"
        check_bounded(server, sid)
        assert sid not in STATE.counts  # nothing of this session executed

        # (f) The reader resumes at t=9.
        await trio.sleep_until(9.0)
        st.valve.open()
        events = await st.reply.events()
        seqs = [int((e.id or "").split(":")[1]) for e in events]
        assert seqs == list(range(1, 22))  # after the priming event (seq 0): no gap
        datas = [json.loads(e.data) for e in events]
        assert [d["params"]["data"] for d in datas[:-1]] == [f"log {i}" for i in range(20)]
        assert datas[-1]["id"] == 1 and datas[-1]["result"]["content"][0]["text"] == "sent 20"
        assert trio.current_time() == 9.0
        await settle()
        assert state_of(credit) is CreditState.OPEN and credit.frames_in_use == 0

        later = await as_session(server, nursery, st.client).call(4, "count")
        assert (await later.messages())[-1]["result"]["content"][0]["text"] == "1"
        assert STATE.counts[sid] == 1  # only the call admitted after recovery ran
        await trio.sleep_until(60.0)
        assert sid in server.sessions and server.metrics.teardowns == 0
        metrics = await scrape(server, nursery)
        assert metrics['weir_refusals_total{reason="stream_half_open"}'] == 2
        assert metrics["weir_teardowns_total"] == 0


async def test_streamable_stalled_session_is_torn_down_at_liveness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(CONFIG) as (server, nursery):
        st = await stall_streamable(server, nursery, n=20)
        sid = st.sid
        session = server.sessions[sid]
        hanging = StreamWaiting()
        nursery.start_soon(hanging.run, as_session(server, nursery, st.client), call_msg(2, "hang"))
        await trio.sleep_until(1.0 + DRAIN)
        await settle()
        assert hanging.reply is not None  # waited for admission, then refused
        assert_half_open_refusal(hanging.reply, 2)
        for rid in (3, 4):
            refused = await as_session(server, nursery, st.client).post(call_msg(rid, "count"))
            assert isinstance(refused, Reply)
            assert_half_open_refusal(refused, rid)
        await trio.sleep_until(1.0 + LIVENESS - 0.25)
        await settle()
        assert sid in server.sessions
        check_bounded(server, sid)

        await trio.sleep_until(1.0 + LIVENESS)
        await settle()
        assert sid not in server.sessions and session.closed
        assert server.metrics.teardowns == 1
        assert session.running == {}
        assert all(h.writer_scope is None for h in session.handles.values())
        assert (session.credit.frames_in_use, session.credit.bytes_in_use) == (0, 0)
        assert st.valve.stalled == 0
        assert STATE.hanging == 0  # refused before dispatch: never ran
        gone = await as_session(server, nursery, st.client).post(call_msg(5, "count"))
        assert isinstance(gone, Reply) and gone.status == 404
        body = gone.json()
        assert body["id"] == 5 and body["error"]["data"]["reason"] == "session_not_found"
        metrics = await scrape(server, nursery)
        assert metrics['weir_refusals_total{reason="stream_half_open"}'] == 3
        assert metrics["weir_teardowns_total"] == 1
        assert metrics["weir_sessions"] == 0
        assert sid not in STATE.counts


async def test_byte_credit_bounds_large_frames(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(CONFIG) as (server, nursery):
        st = await stall_streamable(server, nursery, n=12, pad=1000)
        credit = server.sessions[st.sid].credit
        assert credit.frames_in_use < FRAMES  # bytes, not frames, ran out
        assert credit.bytes_in_use <= BYTES
        await trio.sleep_until(1.0 + DRAIN)
        refused = await as_session(server, nursery, st.client).post(call_msg(2, "count"))
        assert isinstance(refused, Reply)
        assert_half_open_refusal(refused, 2)
        st.valve.open()
        events = await st.reply.events()
        assert [int((e.id or "").split(":")[1]) for e in events] == list(range(1, 14))
    assert server.metrics.credit_peaks(server.sessions.values())[1] <= BYTES


async def stall_after_a_call(
    server: Server, nursery: trio.Nursery
) -> tuple[H11Client, Valve, SseReply]:
    """A session whose healthy connection has carried one SSE response; then it stalls.

    ``client``'s connection served ``tools/call`` id 50 as an SSE stream (so the
    engine associates that keep-alive connection with the session); at t=1 the
    session's ``notify`` POST stream stops draining: EXHAUSTED at t=1, half-open at
    1 + drain window unless the *session's frames* make progress.
    """
    client = connect(server, nursery)
    await client.initialize()
    first = await (await client.call(50, "count")).messages()
    assert first[-1]["result"]["content"][0]["text"] == "1"
    stalled, valve = connect_stalling(server, nursery)
    stalled.session_id, stalled.protocol_version = client.session_id, client.protocol_version
    reply = await stalled.call(1, "notify", {"n": 20, "delay": 1})
    await reply.next_batch()
    valve.shut()
    await trio.sleep_until(1.0)
    await settle()
    assert client.session_id is not None
    credit = server.sessions[client.session_id].credit
    assert state_of(credit) is CreditState.EXHAUSTED and credit.last_progress == 1.0
    return client, valve, reply


async def test_refusals_do_not_count_as_progress(autojump_clock: trio.testing.MockClock) -> None:
    """A half-open session stays half-open however often it is refused.

    Only acknowledged bytes of the session's *frames* are forward progress.  The
    bytes of our own 429 answer must not take the session out of HALF_OPEN (nor
    push its liveness deadline), or every other gateway retry would be admitted.
    """
    async with serving(CONFIG) as (server, nursery):
        client, valve, _ = await stall_after_a_call(server, nursery)
        sid = client.session_id
        assert sid is not None
        credit = server.sessions[sid].credit
        await trio.sleep_until(1.0 + DRAIN)
        statuses: list[int] = []
        for rid in range(2, 6):  # a retrying gateway on its pooled connection
            refused = await client.post(call_msg(rid, "count"))
            statuses.append(refused.status if isinstance(refused, Reply) else -refused.status)
            if not isinstance(refused, Reply):
                break  # admitted: an SSE response now occupies the connection
            await settle()
        assert statuses == [429] * 4, f"retries at t={trio.current_time()}: {statuses}"
        assert state_of(credit) is CreditState.HALF_OPEN
        assert credit.last_progress == 1.0
        assert STATE.counts[sid] == 1
        await trio.sleep_until(1.0 + LIVENESS)
        await settle()
        assert sid not in server.sessions and server.metrics.teardowns == 1
        valve.open()


async def test_another_sessions_traffic_is_not_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Per-session isolation: bytes written for session B never count for session A.

    A pooling proxy sends session B's request over a keep-alive connection that
    last carried session A's SSE response.  A (stalled since t=1) must still be
    half-open at 1 + drain window.
    """
    async with serving(CONFIG) as (server, nursery):
        client_a, valve, _ = await stall_after_a_call(server, nursery)
        sid_a = client_a.session_id
        assert sid_a is not None
        credit_a = server.sessions[sid_a].credit
        other = connect(server, nursery)
        await other.initialize()
        await trio.sleep_until(3.0)
        # The same pooled connection now carries session B's call.
        client_a.session_id, client_a.protocol_version = other.session_id, other.protocol_version
        msgs = await (await client_a.call(1, "count")).messages()
        assert msgs[-1]["result"]["content"][0]["text"] == "1"
        progress_a = credit_a.last_progress
        await trio.sleep_until(1.0 + DRAIN)
        refused = await connect_as_session(server, nursery, sid_a, other).post(call_msg(3, "count"))
        assert isinstance(refused, Reply), (
            f"half-open session A admitted a request at t={trio.current_time()}: session B's "
            f"bytes moved A's last progress from 1.0 to {progress_a}"
        )
        assert_half_open_refusal(refused, 3)
        assert progress_a == 1.0
        valve.open()


def connect_as_session(
    server: Server, nursery: trio.Nursery, sid: str, like: H11Client
) -> H11Client:
    other = connect(server, nursery)
    other.session_id, other.protocol_version = sid, like.protocol_version
    return other


# ----------------------------------------------------------------- (h) the idempotency gate


async def test_same_request_id_executes_once(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as (server, nursery):
        client, sid = await open_session(server, nursery)
        first = await (await client.call(1, "count")).messages()
        second = await (await client.call(1, "count")).messages()
        assert (
            first[-1]
            == second[-1]
            == {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {"content": [{"type": "text", "text": "1"}]},
            }
        )
        assert STATE.counts[sid] == 1
        assert server.metrics.executions == 1 and server.metrics.duplicates_replayed == 1


async def test_duplicate_while_running_waits_then_gets_409_in_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(in_progress_wait=2.0)
    async with serving(config) as (server, nursery):
        client, sid = await open_session(server, nursery)
        running = await client.call(5, "slow_count", {"seconds": 10})
        await trio.sleep_until(1.0)
        dup = await as_session(server, nursery, client).post(call_msg(5, "slow_count", seconds=10))
        assert trio.current_time() == 3.0  # waited in_progress_wait, no more
        assert isinstance(dup, Reply) and dup.status == 409
        assert dup.headers["retry-after"] == "1"
        body = dup.json()
        assert body["id"] == 5
        assert body["error"]["data"] == {"reason": "in_progress", "retryAfterMs": 1000}
        assert STATE.counts[sid] == 1
        msgs = await running.messages()
        assert trio.current_time() == 10.0
        assert msgs[-1]["result"]["content"][0]["text"] == "1"
        # After completion the stored result is replayed.
        replay = await as_session(server, nursery, client).post(
            call_msg(5, "slow_count", seconds=10)
        )
        assert isinstance(replay, SseReply)
        assert (await replay.messages())[-1] == msgs[-1]
        assert STATE.counts[sid] == 1
        assert server.metrics.duplicates_in_progress == 1
        assert server.metrics.duplicates_replayed == 1
        assert server.metrics.executions == 1


async def test_duplicate_that_finishes_within_the_wait_is_replayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(in_progress_wait=5.0)
    async with serving(config) as (server, nursery):
        client, sid = await open_session(server, nursery)
        running = await client.call(6, "slow_count", {"seconds": 3})
        await trio.sleep_until(1.0)
        dup = await as_session(server, nursery, client).post(call_msg(6, "slow_count", seconds=3))
        assert isinstance(dup, SseReply)
        dup_msgs = await dup.messages()
        assert trio.current_time() == 3.0  # answered as soon as the first finished
        orig = await running.messages()
        assert dup_msgs[-1] == orig[-1]
        assert orig[-1]["id"] == 6 and orig[-1]["result"]["content"][0]["text"] == "1"
        assert STATE.counts[sid] == 1
        assert server.metrics.executions == 1


async def test_same_id_different_arguments_is_422(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as (server, nursery):
        client, sid = await open_session(server, nursery)
        await (await client.call(7, "slow_count", {"seconds": 0})).messages()
        reused = await client.post(call_msg(7, "slow_count", seconds=1))
        assert isinstance(reused, Reply) and reused.status == 422
        body = reused.json()
        assert body["id"] == 7
        assert body["error"]["data"]["reason"] == "idempotency_key_reused"
        assert STATE.counts[sid] == 1


async def test_idempotency_key_header_replays_under_the_new_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving() as (server, nursery):
        client, sid = await open_session(server, nursery)
        key = {"idempotency-key": "order-42"}
        first = await client.post(call_msg(10, "count"), headers=key)
        assert isinstance(first, SseReply)
        first_msgs = await first.messages()
        assert first_msgs[-1]["id"] == 10
        again = await client.post(call_msg(11, "count"), headers=key)
        assert isinstance(again, SseReply)
        again_msgs = await again.messages()
        assert again_msgs[-1] == {**first_msgs[-1], "id": 11}
        assert STATE.counts[sid] == 1
        reused = await client.post(call_msg(12, "slow_count", seconds=0), headers=key)
        assert isinstance(reused, Reply) and reused.status == 422
        assert reused.json()["id"] == 12
        assert reused.json()["error"]["data"]["reason"] == "idempotency_key_reused"
        # Without the header, id 11 is a fresh key: it executes.
        fresh = await (await client.call(11, "count")).messages()
        assert fresh[-1]["result"]["content"][0]["text"] == "2"
        assert STATE.counts[sid] == 2
