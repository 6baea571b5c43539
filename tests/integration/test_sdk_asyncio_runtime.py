"""An app that needs asyncio, written with the official SDK, runs unchanged on
``weir serve --runtime asyncio`` and is driven by the official SDK client.

The app (:mod:`tests.integration.sdk_asyncio_app`) imports nothing from weir; its
tool calls ``asyncio.get_running_loop()``, waits on an ``asyncio.Event``, sleeps with
``asyncio.sleep`` and runs blocking work with ``loop.run_in_executor``.  Served by the
asyncio runtime (through :mod:`weir.app.sdk`'s bridge, whose anyio code runs on the
serving loop) it answers, with progress on the way; served by the Trio engine the same
call fails and the client is told it needs an asyncio event loop.

The asyncio runtime serves both eras: the SDK client's default ``auto`` mode
discovers 2026-07-28 and speaks it (progress on the call's own stream, no session);
pinned to ``legacy`` it does the ``initialize`` handshake at 2025-11-25.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.serverproc import WeirProcess
from tests.integration.test_sdk_interop import (
    NEGOTIATED_VERSION,
    SESSIONLESS_VERSION,
    WireLog,
    http_client,
    on_asyncio,
    text_of,
)

pytestmark = pytest.mark.interop

APP = "tests.integration.sdk_asyncio_app:server"


@pytest.fixture(scope="module")
def servers() -> Iterator[Callable[[str], WeirProcess]]:
    """``start(runtime)``: the asyncio-only SDK app served by that runtime, for the module."""
    with contextlib.ExitStack() as stack:
        started: dict[str, WeirProcess] = {}

        def start(runtime: str) -> WeirProcess:
            if runtime not in started:
                out = stack.enter_context(tempfile.TemporaryFile())
                err = stack.enter_context(tempfile.TemporaryFile())
                started[runtime] = WeirProcess(APP, out, err, driver=runtime)
                stack.callback(started[runtime].stop)
            return started[runtime]

        yield start


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@on_asyncio
async def test_an_asyncio_only_sdk_tool_runs_unchanged_on_the_asyncio_runtime(
    servers: Callable[[str], WeirProcess], mode: Any
) -> None:
    server = servers("asyncio")
    steps: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, total, message))

    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(streamable_http_client(server.url, http_client=hc), mode=mode) as client,
    ):
        expected = SESSIONLESS_VERSION if mode == "auto" else NEGOTIATED_VERSION
        assert client.protocol_version == expected
        result = await client.call_tool("crunch", {"n": 12}, progress_callback=on_progress)
        assert text_of(result) == "144 on asyncio, executor thread True"
    assert steps == [(0.0, 1.0, "squaring"), (1.0, 1.0, "squared")]
    if mode == "auto":  # discovered, then self-contained POSTs: no session at all
        (probe,) = wire.posts_of("server/discover")
        assert probe.status == 200, wire.describe()
        assert not wire.posts_of("initialize"), wire.describe()
        for ex in wire.exchanges:
            assert "mcp-session-id" not in ex.response_headers, wire.describe()
            assert ex.request_headers.get("mcp-protocol-version") == SESSIONLESS_VERSION
    else:
        assert not wire.posts_of("server/discover"), wire.describe()
        assert wire.posts_of("initialize"), wire.describe()


@on_asyncio
async def test_on_the_trio_engine_the_same_tool_fails_and_says_why(
    servers: Callable[[str], WeirProcess],
) -> None:
    async with Client(servers("trio").url, mode="legacy") as client:
        result = await client.call_tool("crunch", {"n": 12})
    assert result.is_error
    text = str(result.content[0])
    assert "needs an asyncio event loop" in text, text


@on_asyncio
async def test_a_client_pinned_to_the_sessionless_revision_is_served(
    servers: Callable[[str], WeirProcess],
) -> None:
    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(
            streamable_http_client(servers("asyncio").url, http_client=hc),
            mode=SESSIONLESS_VERSION,
        ) as client,
    ):
        assert client.protocol_version == SESSIONLESS_VERSION
        result = await client.call_tool("crunch", {"n": 3})
        assert text_of(result) == "9 on asyncio, executor thread True"
    (call,) = wire.posts_of("tools/call")
    assert call.status == 200, wire.describe()
    assert call.request_headers.get("mcp-name") == "crunch", wire.describe()
