"""``weir serve --workers N`` and ``--reuse-port``, on both runtimes.

``--workers N`` starts N ``python -m weir`` children on one port (each with the
parent's command line, ``--runtime`` included, and ``--reuse-port``), sharing their
sessions through a shared store; with the memory store it is refused, since a
session would be known to one worker only.  ``--reuse-port`` makes the listener
bind with ``SO_REUSEPORT``, so it can share its port with another socket that
did.  At a signal the workers stop at once when nothing runs (a shared store's
background loops are no work to wait for).  A worker killed without warning is started
again while the others serve on; one that keeps dying stops them all.  Real processes
on loopback ports, a real Valkey store.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.integration.rawhttp import Client, echo_on_fresh_connections, initialize
from tests.integration.runtimes import RUNTIMES
from tests.integration.serverproc import WeirProcess
from tests.integration.test_cli_startup import one_line_failure, weir
from weir.engine._workers import MAX_RESTARTS

#: What each asyncio worker says on stderr once it serves.
ASYNCIO_WORKER = "weir: runtime asyncio, event loop"


@RUNTIMES
def test_workers_with_the_memory_store_are_refused(runtime: str, tmp_path: Path) -> None:
    done = weir(tmp_path, "serve", "--runtime", runtime, "--workers", "2", "--port", "0")
    line = one_line_failure(done)
    assert line.startswith("weir: --workers 2 with --store memory refused: "), line
    assert "--store redis://" in line


@asynccontextmanager
async def two_workers(runtime: str, valkey_url: str) -> AsyncIterator[tuple[WeirProcess, str]]:
    """``weir serve --workers 2`` on ``runtime`` and a Valkey store, with one session
    opened; the server and the session id.  Stopped on the way out."""
    # (a long grace: nothing runs at a signal, so nothing may wait it out)
    args = ["--workers", "2", "--store", valkey_url, "--shutdown-grace", "60"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            first = await Client.connect(server.port)
            try:
                sid = await initialize(first)
            finally:
                await first.aclose()
            yield server, sid
        finally:
            server.stop()


async def every_connection_serves(server: WeirProcess, sid: str) -> None:
    """Eight calls of session ``sid``, each on a fresh connection (whichever worker
    takes it), all answered."""
    for i, reply in enumerate(await echo_on_fresh_connections(server.port, sid, 8)):
        assert reply.status == 200, (reply, server.output())
        assert reply.json()["result"]["content"][0]["text"] == f"n{i}"


@RUNTIMES
async def test_any_worker_serves_any_session_and_all_stop_at_a_signal(
    runtime: str, valkey_url: str
) -> None:
    with trio.fail_after(90):
        async with two_workers(runtime, valkey_url) as (server, sid):
            assert server.url.endswith("/mcp"), server.url
            await every_connection_serves(server, sid)
            # Each worker runs on the runtime the parent was asked for.
            workers = server.stderr().count(ASYNCIO_WORKER)
            assert workers == (2 if runtime == "asyncio" else 0), server.output()
            server.proc.send_signal(signal.SIGINT)  # (forwarded to every worker)
            assert await trio.to_thread.run_sync(server.proc.wait, 30) == 0, server.output()


def workers_of(parent: int) -> set[int]:
    """The live child processes of ``parent`` (Linux: its main thread's children)."""
    text = Path(f"/proc/{parent}/task/{parent}/children").read_text()
    return {int(pid) for pid in text.split()}


async def replaced(parent: int, gone: int, count: int) -> set[int]:
    """Wait until ``parent`` has ``count`` workers again, none of them ``gone``
    (bounded: 300 looks, 30 s); the workers then."""
    now = workers_of(parent)
    for _ in range(300):
        if len(now) == count and gone not in now:
            break
        await trio.sleep(0.1)
        now = workers_of(parent)
    return now


@RUNTIMES
async def test_a_killed_worker_is_started_again_and_a_crash_loop_stops_them_all(
    runtime: str, valkey_url: str
) -> None:
    with trio.fail_after(150):
        async with two_workers(runtime, valkey_url) as (server, sid):
            parent = server.proc.pid
            workers = workers_of(parent)
            assert len(workers) == 2, workers
            victim = min(workers)
            os.kill(victim, signal.SIGKILL)
            now = await replaced(parent, victim, 2)
            assert len(now) == 2 and victim not in now, (now, server.output())
            # The session lives in the store: every worker serves it.
            await every_connection_serves(server, sid)
            assert server.proc.poll() is None
            # The same slot dying again and again is a crash loop: it is started
            # again MAX_RESTARTS times in the window, and at the next death all stop.
            slot = (now - workers).pop()
            for _ in range(MAX_RESTARTS - 1):
                os.kill(slot, signal.SIGKILL)
                again = await replaced(parent, slot, 2)
                assert len(again) == 2, (again, server.output())
                slot = (again - now).pop()
                now = again
            os.kill(slot, signal.SIGKILL)
            assert await trio.to_thread.run_sync(server.proc.wait, 30) == 1
            assert f"died {MAX_RESTARTS + 1} times within" in server.output()


@RUNTIMES
async def test_reuse_port_shares_the_port_with_another_reuse_port_socket(runtime: str) -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()  # (listening: a bind without SO_REUSEPORT fails)
        port = held.getsockname()[1]
        args = ["--port", str(port), "--reuse-port"]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            server = WeirProcess("demo", out, err, args, driver=runtime)
            try:
                assert server.port == port, server.url
                held.close()  # (now every connection reaches the server)
                with trio.fail_after(30):
                    client = await Client.connect(port)
                    try:
                        await initialize(client)
                    finally:
                        await client.aclose()
            finally:
                server.stop()
