"""An app that needs asyncio, written with the official SDK, runs unchanged on
``weir serve --runtime asyncio`` and is driven by the official SDK client.

The app (:mod:`tests.integration.sdk_asyncio_app`) imports nothing from weir; its
tool calls ``asyncio.get_running_loop()``, waits on an ``asyncio.Event``, sleeps with
``asyncio.sleep`` and runs blocking work with ``loop.run_in_executor``.  Served by the
asyncio runtime (through :mod:`weir.app.sdk`'s bridge, whose anyio code runs on the
serving loop) it answers, with progress on the way; served by the Trio engine the same
call fails and the client is told it needs an asyncio event loop.

The asyncio runtime serves the session era only.  The SDK client's default ``auto``
mode probes 2026-07-28 first, is refused, and falls back to ``initialize``; a client
pinned to 2026-07-28 gets the refusal itself: HTTP 400, JSON-RPC -32022 with
``data.reason`` ``unsupported_protocol_version`` and the revisions that are served.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator

import pytest
from mcp import Client, MCPError
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


@on_asyncio
async def test_an_asyncio_only_sdk_tool_runs_unchanged_on_the_asyncio_runtime(
    servers: Callable[[str], WeirProcess],
) -> None:
    server = servers("asyncio")
    steps: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, total, message))

    wire = WireLog()
    async with (
        http_client(wire) as hc,
        Client(streamable_http_client(server.url, http_client=hc)) as client,
    ):
        assert client.protocol_version == NEGOTIATED_VERSION  # auto fell back
        result = await client.call_tool("crunch", {"n": 12}, progress_callback=on_progress)
        assert text_of(result) == "144 on asyncio, executor thread True"
    assert steps == [(0.0, 1.0, "squaring"), (1.0, 1.0, "squared")]
    (probe,) = wire.posts_of("server/discover")
    assert probe.status == 400, wire.describe()


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
async def test_a_client_pinned_to_the_sessionless_revision_is_refused_clearly(
    servers: Callable[[str], WeirProcess],
) -> None:
    wire = WireLog()
    with pytest.raises(BaseException) as raised:  # (an MCPError, in the SDK's task groups)
        async with (
            http_client(wire) as hc,
            Client(
                streamable_http_client(servers("asyncio").url, http_client=hc),
                mode=SESSIONLESS_VERSION,
            ) as client,
        ):
            await client.call_tool("crunch", {"n": 1})
    errors = [raised.value]
    while isinstance(errors[-1], BaseExceptionGroup) and len(errors) < 10:
        errors.append(errors[-1].exceptions[0])
    error = errors[-1]
    assert isinstance(error, MCPError), raised.value
    assert error.code == -32022
    data = error.error.data
    assert data["reason"] == "unsupported_protocol_version"
    assert SESSIONLESS_VERSION not in data["supported"]
    assert NEGOTIATED_VERSION in data["supported"]
    (call,) = wire.posts_of("tools/call")
    assert call.status == 400, wire.describe()
