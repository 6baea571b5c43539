"""A session's streams are independent: a stalled one never holds up a healthy one.

The real :class:`weir.engine.Server`, in-process, on 127.0.0.1, over real TCP
sockets: the stalls exist only in the kernel (a peer's tiny receive window, the
server's ``SIOCOUTQ`` reading).  One session, two kinds of connection:

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
   waiting frame's too -- without a teardown, and no writer holds buffers.

Clock: real time (kernel I/O; see ``test_half_open_loopback``).  Nothing sleeps
to synchronise: the tests wait for replies and for the tool's own events, and
poll (:func:`eventually`) only conditions that the server's ACK poller or timers
make true.  Bounds are generous: "before the liveness teardown", not a duration.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from tests.engine.helpers import H11Client, Reply, SseReply
from tests.integration.test_half_open_loopback import (
    SLACK,
    _metric,
    eventually,
    get_metrics,
    open_client,
    serving,
)
from weir.engine import App, ServerConfig
from weir.engine._session import Session
from weir.protocol import CreditLimits

app = App("half-open-streams")
executions: dict[str, int] = {}
#: Set by the test to let the gated tool return; ``started`` when it has begun.
gates: dict[str, trio.Event] = {}

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
    await gates["open"].wait()
    return f"{label} done"


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


def writers_attached(session: Session) -> int:
    return sum(h.writer_scope is not None for h in session.handles.values())


async def test_a_stalled_stream_never_parks_a_healthy_streams_result() -> None:
    executions.clear()
    gates.update(started=trio.Event(), open=trio.Event())
    with trio.fail_after(LIMITS.liveness_timeout + 30):
        async with serving(app, ServerConfig(port=0, credit=LIMITS)) as server:
            port = server.port
            healthy = await open_client(port)
            async with healthy.stream:
                await healthy.initialize()
                sid = healthy.session_id
                assert sid is not None
                session = server.sessions[sid]

                other = await open_client(port)  # a second healthy connection
                other.session_id, other.protocol_version = sid, healthy.protocol_version
                # 1. The healthy call starts while there is credit ...
                control = await healthy.call(1, "gated", {"label": "control"})
                await gates["started"].wait()
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
                assert await eventually(lambda: session.flow.waiting == 1, timeout=10)
                assert session.credit.bytes_in_use > LIMITS.bytes - RESULT
                started = trio.current_time()
                gates["open"].set()  # the healthy call's 80-byte result is ready
                answers: list[dict[str, Any]] = []
                with trio.move_on_after(LIMITS.liveness_timeout + SLACK):
                    answers = await control.messages()
                answered = trio.current_time() - started
                assert answers and answers[-1]["result"]["content"][0]["text"] == "control done"
                assert answered < LIMITS.liveness_timeout  # not waiting for the teardown
                assert not session.closed and server.metrics.teardowns == 0
                assert session.flow.waiting == 1  # the stalled stream's frame still waits

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
                assert not session.closed
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
                    c = session.credit
                    return c.frames_in_use == 0 and c.bytes_in_use == 0 and not session.flow.waiting

                assert await eventually(released, timeout=LIMITS.liveness_timeout / 2)
                assert not session.closed and server.metrics.teardowns == 0
                assert await eventually(lambda: writers_attached(session) == 0, timeout=5)
                assert all(h.log.undrained() == (0, 0) for h in session.handles.values())
                metrics = await get_metrics(port)
                assert _metric(metrics, "weir_credit_bytes_in_use") == 0
                assert _metric(metrics, "weir_credit_frames_in_use") == 0


async def test_a_finished_but_unread_stream_gives_its_credit_back_when_its_peer_hangs_up() -> None:
    """The whole response fits in the kernel's buffers, so its writer finishes; the
    peer never reads it, then hangs up: its credit comes back, without a teardown."""
    with trio.fail_after(LIMITS.liveness_timeout + 30):
        async with serving(app, ServerConfig(port=0, credit=LIMITS)) as server:
            healthy = await open_client(server.port)
            async with healthy.stream:
                await healthy.initialize()
                sid = healthy.session_id
                assert sid is not None
                session = server.sessions[sid]
                peer = await open_client(server.port, rcvbuf=4096)
                peer.session_id, peer.protocol_version = sid, healthy.protocol_version
                reply = await peer.send("POST", call(1, "bulk", {"size": 12_000}))
                assert isinstance(reply, SseReply) and reply.status == 200, reply

                def written_not_read() -> bool:  # the writer is done, the bytes unacknowledged
                    return writers_attached(session) == 0 and session.credit.frames_in_use > 0

                assert await eventually(written_not_read, timeout=10)
                await peer.stream.aclose()

                def released() -> bool:
                    return session.credit.frames_in_use == 0 and session.credit.bytes_in_use == 0

                assert await eventually(released, timeout=LIMITS.liveness_timeout / 2)
                assert not session.closed and server.metrics.teardowns == 0
