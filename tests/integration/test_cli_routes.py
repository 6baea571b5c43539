"""``--metrics-path``, ``--no-metrics`` and ``--no-legacy-sse``, on both runtimes.

A real ``weir serve`` process on a loopback port; each path is asked for on a
connection of its own and only the status line is read.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from .rawhttp import raw_request
from .runtimes import RUNTIMES
from .serverproc import WeirProcess
from .test_cli_startup import one_line_failure, weir


def _status(port: int, method: str, path: str) -> int:
    """The status of one request (``Connection: close``: one response, then EOF)."""
    body = b"{}" if method == "POST" else b""
    head = raw_request(method, path, body=body, headers={"connection": "close"})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        first = s.recv(64)
    return int(first.split(b" ", 2)[1])


def _statuses(runtime: str, args: Sequence[str], asks: Sequence[tuple[str, str]]) -> list[int]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            return [_status(server.port, method, path) for method, path in asks]
        finally:
            server.stop()


@RUNTIMES
def test_metrics_are_served_where_metrics_path_says(runtime: str) -> None:
    asks = [("GET", "/m"), ("GET", "/metrics")]
    assert _statuses(runtime, ["--metrics-path", "/m"], asks) == [200, 404]


@RUNTIMES
def test_no_metrics_serves_none(runtime: str) -> None:
    assert _statuses(runtime, [], [("GET", "/metrics")]) == [200]
    assert _statuses(runtime, ["--no-metrics"], [("GET", "/metrics")]) == [404]


@RUNTIMES
def test_no_legacy_sse_serves_neither_legacy_path(runtime: str) -> None:
    asks = [("GET", "/sse"), ("POST", "/messages?sessionId=abc")]
    # (served: a stream opens; a message for an unknown session is a bad request)
    assert _statuses(runtime, [], asks) == [200, 400]
    assert _statuses(runtime, ["--no-legacy-sse"], asks) == [404, 404]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--metrics-path", "m"], "weir: --metrics-path must start with '/', got 'm'"),
        (["--metrics-path", "/mcp"], "weir: --metrics-path /mcp is the MCP endpoint's --path"),
    ],
)
def test_a_metrics_path_that_cannot_be_is_refused(
    args: list[str], said: str, tmp_path: Path
) -> None:
    assert one_line_failure(weir(tmp_path, "serve", "--port", "0", *args)) == said
