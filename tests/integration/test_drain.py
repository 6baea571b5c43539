"""The graceful drain at shutdown, on both runtimes, over real sockets.

A session has its GET stream open and a call running when the server is told to
shut down.  From then on a new request is answered 503 ``shutting_down`` (with
``Retry-After``); the running call gets the grace period to finish, and its answer
reaches its client; every open SSE stream ends with a ``retry:`` field (so its
client resumes elsewhere); what outlives the grace is cancelled, its stream ended
the same way.  (The Trio engine's in-process version of the first test, on a
virtual clock, is tests/engine/test_server.py's.)  The call is held by a
``threading.Event`` the test sets, so nothing depends on how long anything takes.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
from collections.abc import Callable

import trio

from weir.app import App, Context
from weir.engine import ServerConfig

from .configured import RUNTIMES, run_configured
from .rawhttp import Client, call, initialize, raw_request
from .serverproc import WeirProcess

app = App("drain")
started = threading.Event()
release = threading.Event()


@app.tool()
async def gated(ctx: Context) -> str:
    """Answer once the test releases it (at most 30 s)."""
    started.set()
    for _ in range(3000):
        if release.is_set():
            return "through"
        await ctx.sleep(0.01)
    return "never released"


async def read_until(c: Client, done: Callable[[bytes], bool], seen: bytes = b"") -> bytes:
    """Read ``c`` until ``done(what was read)`` or the peer closes (at most 20 s)."""
    with trio.fail_after(20):
        while not done(seen):
            chunk = await c.stream.receive_some(65536)
            if not chunk:
                break
            seen += chunk
    return seen


def ended(data: bytes) -> bool:
    """A chunked response's last chunk is in ``data``."""
    return data.endswith(b"0\r\n\r\n")


async def open_stream(port: int, sid: str) -> Client:
    """A connection with the session's GET stream open (its head read)."""
    c = await Client.connect(port)
    headers = {"mcp-session-id": sid, "accept": "text/event-stream"}
    await c.send_raw(raw_request("GET", "/mcp", headers=headers))
    head = await read_until(c, lambda d: b"\r\n\r\n" in d)
    assert head.startswith(b"HTTP/1.1 200"), head
    return c


async def start_gated(port: int, sid: str) -> Client:
    """A connection whose POST runs ``gated`` (running once this returns)."""
    started.clear()
    c = await Client.connect(port)
    body = json.dumps(call(5, "gated", {})).encode()
    await c.send_raw(raw_request("POST", "/mcp", body=body, headers={"mcp-session-id": sid}))
    assert await trio.to_thread.run_sync(lambda: started.wait(20)), "the call never started"
    return c


async def refused_once_draining(c: Client, sid: str) -> dict[str, object]:
    """Ping on ``c`` until the drain refuses it (bounded); the refusal's error."""
    for rid in range(100, 400):
        reply = await c.request(
            "POST", "/mcp", {"jsonrpc": "2.0", "id": rid, "method": "ping"}, session=sid
        )
        if reply.status == 503:
            assert "retry-after" in reply.headers, reply
            error: dict[str, object] = reply.json()["error"]
            return error
        assert reply.status == 200, reply
        await trio.sleep(0.01)
    raise AssertionError("never refused while draining")


@RUNTIMES
async def test_a_running_call_finishes_and_open_streams_end_with_retry(runtime: str) -> None:
    release.clear()
    with trio.fail_after(60):
        async with run_configured(runtime, app, ServerConfig(port=0, shutdown_grace=30)) as server:
            client = await Client.connect(server.port)
            sid = await initialize(client)
            stream = await open_stream(server.port, sid)
            calling = await start_gated(server.port, sid)

            server.shutdown()
            data = (await refused_once_draining(client, sid))["data"]
            assert isinstance(data, dict) and data["reason"] == "shutting_down", data
            release.set()  # the running call may finish: its answer is delivered
            answered = await read_until(calling, ended)
            assert b'"text":"through"' in answered, answered
            closed = await read_until(stream, ended)
            assert b"retry: " in closed, closed
            await server.stopped()
            for c in (client, stream, calling):
                await c.aclose()


@RUNTIMES
async def test_what_outlives_the_grace_is_cancelled_its_stream_ended_with_retry(
    runtime: str,
) -> None:
    release.clear()
    try:
        with trio.fail_after(60):
            config = ServerConfig(port=0, shutdown_grace=0.2)
            async with run_configured(runtime, app, config) as server:
                client = await Client.connect(server.port)
                sid = await initialize(client)
                calling = await start_gated(server.port, sid)
                server.shutdown()
                cut = await read_until(calling, ended)
                assert b"retry: " in cut and b"through" not in cut, cut
                await server.stopped()
                for c in (client, calling):
                    await c.aclose()
    finally:
        release.set()


@RUNTIMES
async def test_on_a_shared_store_an_idle_server_stops_without_waiting_out_the_grace(
    runtime: str, valkey_url: str
) -> None:
    """A shared store's background work (relays of mail and changes) is no call to
    wait for: with nothing running at the signal, the server stops at once, not
    after ``--shutdown-grace``."""
    args = ["--store", valkey_url, "--shutdown-grace", "60"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(30):
                c = await Client.connect(server.port)
                try:
                    sid = await initialize(c)
                    echo = await c.request(
                        "POST", "/mcp", call(1, "echo", {"text": "x"}), session=sid
                    )
                    assert echo.status == 200, echo
                finally:
                    await c.aclose()
            server.proc.send_signal(signal.SIGINT)
            assert server.proc.wait(30) == 0, server.output()
        finally:
            server.stop()
