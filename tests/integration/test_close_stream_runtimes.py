"""A close a tool asked for while nobody read its stream does not cut the resumption.

MCP 2025-11-25's SSE polling: a tool may end its request's SSE connection early
(``ctx.close_stream``): the writer sends ``retry:`` and ends the HTTP response, and
the client resumes the stream with ``GET`` and ``Last-Event-ID``.  The close is asked
of the connection writing the stream then.  A close asked while no connection writes
it (the client's went away first) is moot: the next reader of the stream claims it
(:class:`~weir.protocol.get.ClaimReader`, "a close asked of an earlier connection is
done with"), and its GET is written until the call's response.  Were the stale close
kept, the resumed GET would be cut at once with ``retry:`` -- no response, another
reconnection for nothing.

Both runtimes, in this process (:mod:`tests.integration.runtimes`), real loopback
sockets; the tool waits on :class:`threading.Event` gates, so nothing sleeps.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import h11
import trio

from weir.engine import App, Context

from .rawhttp import Client, raw_request
from .runtimes import RUNTIMES, Served, serving, wait_in_thread
from .test_channel_runtimes import HDR
from .test_tail_effects_mixed import events_of, open_session


@dataclass
class Gates:
    """What the tool waits for, and what it says it did."""

    detached: threading.Event = field(default_factory=threading.Event)
    asked: threading.Event = field(default_factory=threading.Event)
    finish: threading.Event = field(default_factory=threading.Event)


def _app(gates: Gates) -> App:
    app = App("close-stream")

    @app.tool()
    async def hold(ctx: Context) -> str:
        """Say something, ask for the stream to close once nobody reads it, then answer
        when told."""
        await ctx.info("before")
        assert await wait_in_thread(gates.detached)
        ctx.close_stream(retry_ms=250)
        gates.asked.set()
        assert await wait_in_thread(gates.finish)
        return "finished"

    return app


async def _read_until_event(c: Client, data: str) -> str:
    """Read a streamed response until an event carrying ``data`` came: its id."""
    conn = c.h11
    conn.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    buf = b""
    for _ in range(10_000):
        for event in events_of(buf):
            if event.get("data") and data in event["data"]:
                return event["id"]
        got = conn.next_event()
        if got is h11.NEED_DATA:
            conn.receive_data(bytes(await c.stream.receive_some(65536)))
        elif isinstance(got, h11.Data):
            buf += bytes(got.data)
        elif isinstance(got, h11.EndOfMessage | h11.ConnectionClosed):
            break
    raise AssertionError(f"the stream ended before {data!r}: {buf!r}")


async def _until_detached(served: Served, sid: str) -> None:
    """Bounded: until no connection writes any of ``sid``'s streams."""
    for _ in range(500):
        if served.writers(sid) == 0:
            return
        await trio.sleep(0.01)
    raise AssertionError("the stream's writer never let go of the closed connection")


@RUNTIMES
async def test_a_close_asked_while_nobody_reads_does_not_cut_the_resumed_stream(
    runtime: str,
) -> None:
    """The client's connection goes away after the call's first message; the tool then
    asks for its stream to close (no connection writes it).  A GET with the last event
    id reads the rest of the stream up to the call's response -- it is not cut short
    by the moot close (no ``retry:``, the response is its final event)."""
    gates = Gates()
    with serving(runtime, _app(gates)) as served, trio.fail_after(30):
        c = await Client.connect(served.port)
        sid = await open_session(c)
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "hold"}}
        ).encode()
        await c.send_raw(
            raw_request("POST", "/mcp", body=body, headers={"mcp-session-id": sid, **HDR})
        )
        cursor = await _read_until_event(c, '"before"')
        await c.aclose()
        await _until_detached(served, sid)
        gates.detached.set()
        assert await wait_in_thread(gates.asked)  # the close is asked of nobody

        g = await Client.connect(served.port)
        headers = {**HDR, "accept": "text/event-stream", "last-event-id": cursor}
        await g.send_raw(raw_request("GET", "/mcp", headers={"mcp-session-id": sid, **headers}))
        conn = g.h11
        conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        conn.send(h11.EndOfMessage())
        buf, released, ended = b"", False, False
        for _ in range(10_000):
            got = conn.next_event()
            if got is h11.NEED_DATA:
                conn.receive_data(bytes(await g.stream.receive_some(65536)))
            elif isinstance(got, h11.Response):
                assert got.status_code == 200, got
                # The head is out: the writer has caught up with the cursor and
                # decided whether to wait (or, on a stale close, to cut).  Only
                # now does the call answer.
                gates.finish.set()
                released = True
            elif isinstance(got, h11.Data):
                buf += bytes(got.data)
            elif isinstance(got, h11.EndOfMessage | h11.ConnectionClosed):
                ended = isinstance(got, h11.EndOfMessage)
                break
        await g.aclose()
        assert released and ended, buf
        events = events_of(buf)
        assert all("retry" not in e for e in events), f"the resumed GET was cut: {buf!r}"
        final = json.loads(events[-1]["data"])
        assert final["id"] == 5 and final["result"]["content"][0]["text"] == "finished", buf
