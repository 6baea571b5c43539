"""A FastMCP (4.x) server, served by ``weir serve`` unchanged, driven by the official
SDK client in ``auto`` (2026-07-28) and ``legacy`` (2025-11-25) mode.

FastMCP 4 builds on the official SDK 2.x and holds an SDK low-level ``Server``;
``weir serve tests.integration.fastmcp_app:mcp`` recognises it and wraps that server
with :func:`weir.app.sdk.from_sdk`.  The same runs on the asyncio runtime
(``weir serve --runtime asyncio``), in both modes.  Needs the ``fastmcp`` extra;
skipped without it unless ``WEIR_REQUIRE_FASTMCP=1`` (CI sets it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

if os.environ.get("WEIR_REQUIRE_FASTMCP") != "1":
    pytest.importorskip("fastmcp")

import mcp_types as types
from mcp import Client

from tests.integration.serverproc import WeirProcess
from tests.integration.test_sdk_interop import (
    NEGOTIATED_VERSION,
    SESSIONLESS_VERSION,
    on_asyncio,
    text_of,
)

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module", params=["trio", "asyncio"])
def fastmcp_server(request: pytest.FixtureRequest) -> Iterator[WeirProcess]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("tests.integration.fastmcp_app:mcp", out, err, driver=request.param)
        try:
            yield server
        finally:
            server.stop()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@on_asyncio
async def test_a_fastmcp_server_is_served_unchanged(fastmcp_server: WeirProcess, mode: Any) -> None:
    sessionless = mode == "auto"  # (both runtimes answer the sessionless probe)
    steps: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(progress)

    async with Client(fastmcp_server.url, mode=mode) as client:
        assert client.protocol_version == (
            SESSIONLESS_VERSION if sessionless else NEGOTIATED_VERSION
        )
        assert {t.name for t in (await client.list_tools()).tools} == {
            "add",
            "count",
            "wait_then_hash",
        }
        assert text_of(await client.call_tool("add", {"a": 2, "b": 40})) == "42"
        done = await client.call_tool("count", {"n": 3}, progress_callback=on_progress)
        assert text_of(done) == "counted to 3"
        [motto] = (await client.read_resource("fastmcp://motto")).contents
        assert isinstance(motto, types.TextResourceContents) and motto.text == "small and sharp"
        bad = await client.call_tool("add", {"a": "two", "b": 1})
        assert bad.is_error  # FastMCP's own validation, as FastMCP answers it
        if not sessionless:  # what initialize said is FastMCP's own description
            init = client.session.initialize_result
            assert init is not None and init.server_info.name == "fastmcp-test"
            assert init.instructions == "adds numbers"
    assert steps == [1, 2, 3]


@on_asyncio
async def test_a_fastmcp_tool_written_for_asyncio_runs_only_on_the_asyncio_runtime(
    fastmcp_server: WeirProcess,
) -> None:
    """``wait_then_hash`` uses asyncio's queue, timers and executor: the asyncio runtime
    answers it; the Trio engine answers a tool error that names the cause, and its log
    names the fix (FastMCP catches the exception itself: weir reads FastMCP's log)."""
    async with Client(fastmcp_server.url, mode="legacy") as client:
        result = await client.call_tool("wait_then_hash", {"text": "weir"})
    if fastmcp_server.driver == "asyncio":
        assert not result.is_error
        assert text_of(result) == hashlib.sha256(b"weir").hexdigest()[:12]
    else:
        assert result.is_error
        assert str(result.content[0]).count("needs an asyncio event loop") == 1, result
        # (FastMCP logs through its own rich handler, which wraps lines: compare words.)
        logged = " ".join(fastmcp_server.stderr(limit=60_000).split())
        assert "tool wait_then_hash failed: it used a library written for asyncio" in logged
        assert "weir serve --runtime asyncio" in logged
