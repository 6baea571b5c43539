"""``weir serve --workers N`` and ``--reuse-port``, on both runtimes.

``--workers N`` starts N ``python -m weir`` children on one port (each with the
parent's command line, ``--runtime`` included, and ``--reuse-port``), sharing their
sessions through a shared store; with the memory store it is refused, since a
session would be known to one worker only.  ``--reuse-port`` makes the listener
bind with ``SO_REUSEPORT``, so it can share its port with another socket that
did.  At a signal the workers stop at once when nothing runs (a shared store's
background loops are no work to wait for).  Real processes on loopback ports, a real Valkey store.
"""

from __future__ import annotations

import signal
import socket
import tempfile
from pathlib import Path

import trio

from tests.integration.rawhttp import Client, echo_on_fresh_connections, initialize
from tests.integration.runtimes import RUNTIMES
from tests.integration.serverproc import WeirProcess
from tests.integration.test_cli_startup import one_line_failure, weir

#: What each asyncio worker says on stderr once it serves.
ASYNCIO_WORKER = "weir: runtime asyncio, event loop"


@RUNTIMES
def test_workers_with_the_memory_store_are_refused(runtime: str, tmp_path: Path) -> None:
    done = weir(tmp_path, "serve", "--runtime", runtime, "--workers", "2", "--port", "0")
    line = one_line_failure(done)
    assert line.startswith("weir: --workers 2 with --store memory refused: "), line
    assert "--store redis://" in line


@RUNTIMES
async def test_any_worker_serves_any_session_and_all_stop_at_a_signal(
    runtime: str, valkey_url: str
) -> None:
    # (a long grace: nothing runs at the signal, so nothing may wait it out)
    args = ["--workers", "2", "--store", valkey_url, "--shutdown-grace", "60"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            assert server.url.endswith("/mcp"), server.url
            with trio.fail_after(60):
                first = await Client.connect(server.port)
                try:
                    sid = await initialize(first)
                finally:
                    await first.aclose()
                replies = await echo_on_fresh_connections(server.port, sid, 8)
                for i, reply in enumerate(replies):
                    assert reply.status == 200, (reply, server.output())
                    assert reply.json()["result"]["content"][0]["text"] == f"n{i}"
            # Each worker runs on the runtime the parent was asked for.
            workers = server.stderr().count(ASYNCIO_WORKER)
            assert workers == (2 if runtime == "asyncio" else 0), server.output()
            server.proc.send_signal(signal.SIGINT)  # (forwarded to every worker)
            assert server.proc.wait(30) == 0, server.output()
        finally:
            server.stop()


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
