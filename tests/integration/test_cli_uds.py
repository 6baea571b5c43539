"""``weir serve --uds PATH``: serving on a Unix domain socket, on both runtimes.

A real ``weir serve`` process listens on a socket file in a short temporary folder
(a Unix socket path is at most 107 bytes); the test speaks HTTP to it over
``AF_UNIX``.  A stale socket file (nobody listening) is replaced; a live server's
socket, or a file that is not a socket, is refused in one line; the file is gone
after the server stops.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from .rawhttp import Client, call, initialize, raw_request
from .runtimes import RUNTIMES
from .serverproc import DRIVERS, REPO_ROOT
from .test_cli_startup import one_line_failure, weir


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="weir", dir="/tmp") as where:
        yield Path(where)


def _serve(runtime: str, path: Path, *args: str) -> subprocess.Popen[str]:
    """``weir serve --uds PATH ARGS`` on ``runtime``, once it said it serves."""
    proc = subprocess.Popen(
        [sys.executable, *DRIVERS[runtime], "demo", "--uds", str(path), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(30, proc.kill)  # (bounds the read below)
    watchdog.start()
    try:
        first = proc.stdout.readline()
    finally:
        watchdog.cancel()
    if first.strip() != f"weir: serving unix:{path}":
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"did not start: {first!r}\n{err}")
    return proc


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


async def _echo(path: Path, text: str) -> str:
    c = Client(await trio.open_unix_socket(str(path)))
    try:
        sid = await initialize(c)
        reply = await c.request("POST", "/mcp", call(1, "echo", {"text": text}), session=sid)
        said: str = reply.json()["result"]["content"][0]["text"]
        return said
    finally:
        await c.aclose()


@RUNTIMES
async def test_it_serves_on_the_socket_and_removes_it_at_the_end(
    runtime: str, folder: Path
) -> None:
    path = folder / "mcp.sock"
    proc = _serve(runtime, path)
    try:
        with trio.fail_after(30):
            assert await _echo(path, "over unix") == "over unix"
    finally:
        err = _stop(proc)
    assert "Traceback" not in err, err
    assert not path.exists()


@RUNTIMES
async def test_a_client_that_stops_reading_is_still_refused_429(runtime: str, folder: Path) -> None:
    # Over a Unix socket the drain meter is not exact (SIOCOUTQ counts buffer memory
    # there): an answer counts as delivered once the kernel takes it.  A client that
    # stops reading an answer larger than the socket's buffer still holds its credit
    # (the rest cannot be written), and its next request is refused once the drain
    # window has passed: the half-open guarantee holds, later by one buffer.
    path = folder / "stall.sock"
    credit = 1 << 20
    args = ["--credit-bytes", str(credit), "--drain-window", "0.5", "--liveness-timeout", "30"]
    proc = _serve(runtime, path, *args, "--max-body-bytes", str(2 * credit))
    try:
        with trio.fail_after(60):
            c = Client(await trio.open_unix_socket(str(path)))
            stalled = Client(await trio.open_unix_socket(str(path)))
            try:
                sid = await initialize(c)
                big = call(1, "echo", {"text": "x" * (credit - 600)})
                body = json.dumps(big).encode()
                headers = {"mcp-session-id": sid, "connection": "keep-alive"}
                await stalled.send_raw(raw_request("POST", "/mcp", body=body, headers=headers))
                assert b" 200 " in await stalled.stream.receive_some(256)  # (then not read)
                reply = await c.request(
                    "POST", "/mcp", call(2, "echo", {"text": "b" * 1000}), session=sid
                )
                assert reply.status == 429 and reply.reason == "stream_half_open", reply
            finally:
                await c.aclose()
                await stalled.aclose()
    finally:
        _stop(proc)


@RUNTIMES
async def test_a_stale_socket_file_is_replaced(runtime: str, folder: Path) -> None:
    path = folder / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # (bound, never listening, closed: what a crash leaves)
    proc = _serve(runtime, path)
    try:
        with trio.fail_after(30):
            assert await _echo(path, "fresh") == "fresh"
    finally:
        _stop(proc)


@RUNTIMES
def test_a_live_servers_socket_is_not_taken(runtime: str, folder: Path) -> None:
    path = folder / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen(1)
        done = weir(folder, "serve", "--runtime", runtime, "--uds", str(path))
        assert one_line_failure(done) == (
            f"weir: cannot listen on unix:{path}: another server listens there"
        )
    assert path.exists()


@RUNTIMES
def test_a_file_that_is_not_a_socket_is_left_alone(runtime: str, folder: Path) -> None:
    path = folder / "data.txt"
    path.write_text("precious")
    done = weir(folder, "serve", "--runtime", runtime, "--uds", str(path))
    assert one_line_failure(done) == (
        f"weir: cannot listen on unix:{path}: the file exists and is not a socket"
    )
    assert path.read_text() == "precious"


@pytest.mark.parametrize("other", [["--reuse-port"], ["--workers", "2", "--store", "redis://h"]])
def test_uds_is_one_process(other: list[str], folder: Path) -> None:
    done = weir(folder, "serve", "--uds", str(folder / "s.sock"), *other)
    assert one_line_failure(done) == (
        "weir: --uds is one process's socket: not with --workers > 1 or --reuse-port"
    )
