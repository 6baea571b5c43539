"""A session's streams are independent: a stalled one never holds up a healthy one.

Each test runs against both runtimes (``runtime``: the Trio engine's
:class:`weir.engine.Server` or the asyncio runtime's driver, in-process in a thread
of its own, :mod:`tests.integration.runtimes`), on 127.0.0.1, over real TCP
sockets: the stalls exist only in the kernel (a peer's tiny receive window, the
server's ``SIOCOUTQ`` reading).  The test's side is a Trio client; the session's
credit is read on the server's own loop.  One session, two kinds of connection:

* *stalled*: POSTs with ``SO_RCVBUF`` shrunk before connect, that read the
  response head and then nothing -- their large results hold the session's
  credit, and the last one's result waits for credit it will never get;
* *healthy*: one connection that reads everything.

What must hold (issue: one session-wide FIFO parked a healthy stream's 80-byte
result behind the stalled streams' frames until the liveness teardown):

1. a call on the healthy connection, whose handler started before the credit ran
   out and finishes after, gets its result while the stalled streams stall --
   before the liveness teardown, the session alive;
2. a later call on the healthy connection is answered too: its result, or 429
   ``stream_half_open`` before it ran (the tool's execution counter unchanged);
3. once the stalled sockets close, their credit comes back -- all of it, the
   waiting frame's too -- without a teardown, and no writer holds buffers;
4. a call admitted before stalled streams take *every* byte of credit not
   reserved gets its result at once when it is ready: admission reserved room for
   it that no other stream may take (issue 21 item 9, follow-up).

Clock: real time (kernel I/O; see ``test_half_open_loopback``).  Nothing sleeps
to synchronise: the tests wait for replies and for the tool's own events, and
poll (:func:`eventually`) only conditions that the server's ACK poller or timers
make true.  Bounds are generous: "before the liveness teardown", not a duration.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from typing import Any

import h11
import trio

from tests.engine.helpers import H11Client, Reply, SseReply
from tests.integration.runtimes import RUNTIMES, Served, serving, wait_in_thread
from tests.integration.test_half_open_loopback import (
    SLACK,
    _metric,
    eventually,
    get_metrics,
    open_client,
)
from weir.engine import App, Context
from weir.protocol import CreditLimits
from weir.protocol._credit import SessionCredit
from weir.protocol.states import CreditState

app = App("half-open-streams")
executions: dict[str, int] = {}
#: Set by the test to let the gated tool return; ``started`` when it has begun.
gates: dict[str, threading.Event] = {}

RESULT = 70_000  # a stalled call's result: three fit in the credit, the fourth waits
SMALL_CALLS = 6  # healthy calls after each stalled one
LIMITS = CreditLimits(frames=64, bytes=256 * 1024, drain_window=1.0, liveness_timeout=10.0)


@app.tool()
async def bulk(size: int) -> str:
    """``size`` bytes of text."""
    return "x" * size


@app.tool()
async def gated(label: str) -> str:
    """Count one execution of ``label``, then wait for the test's gate; a short answer."""
    executions[label] = executions.get(label, 0) + 1
    gates["started"].set()
    await wait_in_thread(gates["open"])
    return f"{label} done"


#: The healthy call's label (its result carries it): a result of about 190 bytes (as an SSE frame).
LABEL = "reserved-" + "r" * 60

#: The flooding tools: each waits for its ``go:<label>`` event, then sends
#: notifications of ``size`` bytes until ``stop`` is set (the credit stops it first).
floods: dict[str, threading.Event] = {}


@app.tool()
async def flood(label: str, size: int, ctx: Context) -> str:
    """Wait for the test's go, then notifications of ``size`` bytes of text."""
    executions[label] = executions.get(label, 0) + 1
    await wait_in_thread(floods[f"go:{label}"])
    for _ in range(10_000):  # bounded; the credit or the test's stop ends it first
        if floods["stop"].is_set():
            break
        await ctx.notify("notifications/message", {"level": "info", "data": "x" * size})
    return f"{label} flooded"


class Probe:
    """Session ``sid`` of ``server``, read on the server's own loop."""

    def __init__(self, server: Served, sid: str) -> None:
        self.server, self.sid = server, sid

    @property
    def waiting(self) -> int:
        """Frames waiting for credit."""
        return int(self.server.of(self.sid, lambda s: s.flow.waiting))

    def credit(self) -> SessionCredit:
        """A copy of the session's credit (its counters and state, as of now)."""
        credit: SessionCredit = self.server.of(self.sid, lambda s: copy.copy(s.flow.credit))
        return credit


def call(request_id: int, name: str, arguments: dict[str, Any]) -> bytes:
    params = {"name": name, "arguments": arguments}
    msg = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return json.dumps(msg).encode()


async def stalled_call(port: int, session_id: str, request_id: int) -> H11Client:
    """POST a large call from a peer that reads the head and nothing more."""
    peer = await open_client(port, rcvbuf=4096)
    peer.session_id = session_id
    reply = await peer.send("POST", call(request_id, "bulk", {"size": RESULT}))
    assert isinstance(reply, SseReply) and reply.status == 200, reply
    return peer


@RUNTIMES
async def test_a_stalled_stream_never_parks_a_healthy_streams_result(runtime: str) -> None:
    executions.clear()
    gates.update(started=threading.Event(), open=threading.Event())
    with trio.fail_after(LIMITS.liveness_timeout + 30):
        with serving(runtime, app, credit=LIMITS) as server:
            port = server.port
            healthy = await open_client(port)
            async with healthy.stream:
                await healthy.initialize()
                sid = healthy.session_id
                assert sid is not None
                session = Probe(server, sid)

                other = await open_client(port)  # a second healthy connection
                other.session_id, other.protocol_version = sid, healthy.protocol_version
                # 1. The healthy call starts while there is credit ...
                control = await healthy.call(1, "gated", {"label": "control"})
                assert await trio.to_thread.run_sync(gates["started"].wait, 10)
                # ... then stalled streams take it: three results fit, the fourth waits.
                # Small calls on the healthy connection in between (as a client's
                # traffic would be) keep the session's typical frame small, so
                # admission lets the fourth in.
                stalled = []
                for i in range(4):
                    stalled.append(await stalled_call(port, sid, 10 + i))
                    for j in range(SMALL_CALLS):
                        small = await other.call(100 + 10 * i + j, "bulk", {"size": 10})
                        assert len(await small.messages()) == 1
                assert await eventually(lambda: session.waiting == 1, timeout=10)
                assert session.credit().bytes_in_use > LIMITS.bytes - RESULT
                started = trio.current_time()
                gates["open"].set()  # the healthy call's 80-byte result is ready
                answers: list[dict[str, Any]] = []
                with trio.move_on_after(LIMITS.liveness_timeout + SLACK):
                    answers = await control.messages()
                answered = trio.current_time() - started
                assert answers and answers[-1]["result"]["content"][0]["text"] == "control done"
                assert answered < LIMITS.liveness_timeout  # not waiting for the teardown
                assert server.has_session(sid)
                assert session.waiting == 1  # the stalled stream's frame still waits

                # 2. A later call on the healthy connection: answered, or refused
                # before it ran -- either way before the liveness teardown.
                started = trio.current_time()
                later: Reply | SseReply | None = None
                later_answers: list[dict[str, Any]] = []
                with trio.move_on_after(LIMITS.liveness_timeout + SLACK):
                    later = await healthy.post(
                        json.loads(call(2, "gated", {"label": "later"}))  # the gate is open
                    )
                    if isinstance(later, SseReply):
                        later_answers = await later.messages()
                assert later is not None and trio.current_time() - started < LIMITS.liveness_timeout
                assert server.has_session(sid)
                if isinstance(later, Reply):
                    assert later.status == 429, later
                    assert later.json()["error"]["data"]["reason"] == "stream_half_open"
                    assert "later" not in executions  # nothing refused has run
                else:
                    assert later_answers[-1]["result"]["content"][0]["text"] == "later done"
                    assert executions["later"] == 1

                # 3. The stalled peers hang up: all their credit comes back (the
                # waiting frame's too), no teardown, no writer left holding buffers.
                for peer in stalled:
                    await peer.stream.aclose()

                def released() -> bool:
                    c = session.credit()
                    return c.frames_in_use == 0 and c.bytes_in_use == 0 and not session.waiting

                assert await eventually(released, timeout=LIMITS.liveness_timeout / 2)
                assert server.has_session(sid)
                assert await eventually(lambda: server.writers(sid) == 0, timeout=5)
                assert all(log.undrained() == (0, 0) for log in server.logs(sid))
                if runtime == "trio":  # (the asyncio runtime serves no /metrics yet)
                    metrics = await get_metrics(port)
                    assert _metric(metrics, "weir_credit_in_use_bytes") == 0
                    assert _metric(metrics, "weir_credit_in_use_frames") == 0


@RUNTIMES
async def test_a_finished_but_unread_stream_gives_its_credit_back_when_its_peer_hangs_up(
    runtime: str,
) -> None:
    """The whole response fits in the kernel's buffers, so its writer finishes; the
    peer never reads it, then hangs up: its credit comes back, without a teardown."""
    with trio.fail_after(LIMITS.liveness_timeout + 30):
        with serving(runtime, app, credit=LIMITS) as server:
            healthy = await open_client(server.port)
            async with healthy.stream:
                await healthy.initialize()
                sid = healthy.session_id
                assert sid is not None
                session = Probe(server, sid)
                peer = await open_client(server.port, rcvbuf=4096)
                peer.session_id, peer.protocol_version = sid, healthy.protocol_version
                reply = await peer.send("POST", call(1, "bulk", {"size": 12_000}))
                assert isinstance(reply, SseReply) and reply.status == 200, reply

                def written_not_read() -> bool:  # the writer is done, the bytes unacknowledged
                    return server.writers(sid) == 0 and session.credit().frames_in_use > 0

                assert await eventually(written_not_read, timeout=10)
                await peer.stream.aclose()

                def released() -> bool:
                    c = session.credit()
                    return c.frames_in_use == 0 and c.bytes_in_use == 0

                assert await eventually(released, timeout=LIMITS.liveness_timeout / 2)
                assert server.has_session(sid)


@RUNTIMES
async def test_a_result_admitted_before_the_credit_filled_up_has_its_room_kept(
    runtime: str,
) -> None:
    """The race made deterministic: a healthy call is admitted (and reserves room
    for its result); then stalled streams fill every byte of credit that is not
    reserved, down to less than the healthy call's result; only then is the result
    ready -- and it is granted at once, not after the liveness teardown."""
    executions.clear()
    gates.update(started=threading.Event(), open=threading.Event())
    floods.clear()
    floods.update(
        {"go:big": threading.Event(), "go:small": threading.Event(), "stop": threading.Event()}
    )
    with trio.fail_after(LIMITS.liveness_timeout + 30):
        with serving(runtime, app, credit=LIMITS) as server:
            port = server.port
            healthy = await open_client(port)
            async with healthy.stream:
                await healthy.initialize()
                sid = healthy.session_id
                assert sid is not None
                session = Probe(server, sid)
                # Admitted while the credit is free: the healthy call, then two
                # stalled callers whose tools wait for the test's go.
                # (Its result, about 190 bytes, is larger than a small frame of the
                # stalled streams and smaller than the typical frame it reserved.)
                control = await healthy.call(1, "gated", {"label": LABEL})
                assert await trio.to_thread.run_sync(gates["started"].wait, 10)
                stalled = []
                for i, (label, size) in enumerate((("big", 8000), ("small", 1))):
                    peer = await open_client(port, rcvbuf=4096)
                    peer.session_id = sid
                    args = {"label": label, "size": size}
                    reply = await peer.send("POST", call(10 + i, "flood", args))
                    assert isinstance(reply, SseReply) and reply.status == 200, reply
                    stalled.append(peer)
                # Big frames until one waits, then the smallest frames there are
                # until one of those waits too: what is free is now less than one
                # small frame -- less than the healthy call's result.
                floods["go:big"].set()
                assert await eventually(lambda: session.waiting == 1, timeout=10)
                floods["go:small"].set()
                assert await eventually(lambda: session.waiting == 2, timeout=10)
                # Until the session is half-open: no byte acknowledged for the drain
                # window, so the stalled peers' kernels have stopped taking frames.
                half_open = await eventually(
                    lambda: session.credit().state is CreditState.HALF_OPEN, timeout=10
                )
                credit = session.credit()
                assert half_open and session.waiting == 2
                # Less free than the healthy result needs (a small frame, ~130 bytes, waits).
                assert LIMITS.bytes - credit.held_bytes < 180
                assert credit.held_bytes <= LIMITS.bytes  # reservations included
                assert credit.held_frames <= LIMITS.frames
                started = trio.current_time()
                gates["open"].set()  # the healthy call's result is ready
                answers: list[dict[str, Any]] = []
                # (A stream cut short by a teardown has no answer.)
                with (
                    trio.move_on_after(LIMITS.liveness_timeout + SLACK),
                    contextlib.suppress(h11.RemoteProtocolError),
                ):
                    answers = await control.messages()
                answered = trio.current_time() - started
                assert answers and answers[-1]["result"]["content"][0]["text"] == f"{LABEL} done"
                assert answered < LIMITS.drain_window  # at once: not after a teardown
                assert server.has_session(sid)
                # The stalled streams still stall (what the healthy call's reservation
                # did not need went back to the session: a small frame may have taken it).
                assert session.waiting >= 1
                assert session.credit().held_bytes <= LIMITS.bytes

                floods["stop"].set()
                for peer in stalled:
                    await peer.stream.aclose()

                def released() -> bool:
                    c = session.credit()
                    return c.held_frames == 0 and c.held_bytes == 0 and not session.waiting

                assert await eventually(released, timeout=LIMITS.liveness_timeout / 2)
                assert server.has_session(sid)
