"""weir's client on the sessionless revision, against the real server on loopback.

``open_client`` in ``auto`` mode must pick 2026-07-28 on both of weir's runtimes (the
Trio engine and the asyncio runtime: each test runs on both) and fall back to the
session era on a server without it; on 2026-07-28 it must answer input-required
rounds through its handlers, make every ``tools/call`` exactly-once with an
``Idempotency-Key``, and hold listen streams.  Real sockets, real time; every wait
bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from weir.app import Context
from weir.engine import App, Server, ServerConfig
from weir.engine._client_sessionless import header_value
from weir.engine.client import SessionClient, SessionlessClient, open_client
from weir.protocol._sessionless import decode_header_value

from .test_asyncio_driver import running_driver

app = App("client-sessionless")
runs: list[str] = []


@app.tool()
async def add(a: int, b: int) -> int:
    """Adds."""
    return a + b


@app.tool()
async def once(label: str) -> str:
    """Not idempotent: records each run."""
    runs.append(label)
    return f"{label} ran {runs.count(label)} time(s)"


@app.tool()
async def who(ctx: Context) -> str:
    """Asks the user's name and the model's opinion in one round."""
    answers = await ctx.input(
        {
            "name": (
                "elicitation/create",
                {"message": "Name?", "requestedSchema": {"type": "object"}},
            ),
            "view": ("sampling/createMessage", {"messages": [], "maxTokens": 5}),
        }
    )
    return f"{answers['name']['content']['name']} / {answers['view']['content']['text']}"


@app.tool()
async def steps(ctx: Context) -> str:
    """Three progress steps, then done."""
    for i in range(3):
        await ctx.report_progress(i + 1, 3)
    return "stepped"


@app.tool()
async def announce(ctx: Context) -> str:
    """Announces a tool-list change."""
    ctx.changed("tools")
    return "announced"


@pytest.fixture(params=["trio", "asyncio"])
def runtime(request: pytest.FixtureRequest) -> str:
    """The runtime serving the test's app: the Trio engine, or the asyncio runtime."""
    return str(request.param)


@asynccontextmanager
async def serving(runtime: str) -> AsyncIterator[str]:
    if runtime == "asyncio":
        with running_driver(app, always_json=False) as running:
            yield f"http://127.0.0.1:{running.port}/mcp"
        return
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app, ServerConfig(port=0)).run)
        try:
            yield server.url
        finally:
            server.shutdown()
            with trio.fail_after(30):
                await server.stopped.wait()


@pytest.fixture(autouse=True)
def _reset() -> None:
    runs.clear()


async def test_auto_mode_picks_the_sessionless_revision_and_calls(runtime: str) -> None:
    async with serving(runtime) as url, open_client(url) as client:
        assert isinstance(client, SessionlessClient)
        assert client.protocol_version == "2026-07-28" and client.session_id is None
        assert "2026-07-28" in client.server_info["supportedVersions"]
        result = await client.call_tool("add", {"a": 2, "b": 3})
        assert result.text == "5" and result.result_type == "complete" and not result.is_error
        assert {t.name for t in await client.list_tools()} >= {"add", "once", "who"}


async def test_input_required_rounds_go_to_the_handlers(runtime: str) -> None:
    asked: list[str] = []

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params["message"])
        return {"action": "accept", "content": {"name": "Ada"}}

    async def sample(params: dict[str, Any]) -> dict[str, Any]:
        asked.append("sample")
        return {"role": "assistant", "content": {"type": "text", "text": "fine"}, "model": "m"}

    async with (
        serving(runtime) as url,
        open_client(url, elicitation=elicit, sampling=sample) as client,
    ):
        result = await client.call_tool("who")
    assert result.text == "Ada / fine"
    assert sorted(asked) == ["Name?", "sample"]  # one round, both asks


async def test_a_reissued_call_with_its_key_runs_once(runtime: str) -> None:
    async with serving(runtime) as url, open_client(url) as client:
        first = await client.call_tool("once", {"label": "x"}, idempotency_key="k-1")
        again = await client.call_tool("once", {"label": "x"}, idempotency_key="k-1")
        fresh = await client.call_tool("once", {"label": "x"})
    assert first == again and runs == ["x", "x"]
    assert fresh.text == "x ran 2 time(s)"


async def test_progress_reaches_its_callback_before_the_result(runtime: str) -> None:
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async with serving(runtime) as url, open_client(url) as client:
        result = await client.call_tool("steps", on_progress=progress)
    assert seen == [1.0, 2.0, 3.0] and result.text == "stepped"


async def test_a_listen_stream_yields_the_ack_then_changes(runtime: str) -> None:
    async with serving(runtime) as url, open_client(url) as client:
        assert isinstance(client, SessionlessClient)
        async with client.listen(toolsListChanged=True) as messages:
            with trio.fail_after(10):
                ack = await messages.__anext__()
                assert ack["method"] == "notifications/subscriptions/acknowledged"
                await client.call_tool("announce")
                change = await messages.__anext__()
        assert change["method"] == "notifications/tools/list_changed"


async def test_auto_mode_falls_back_to_the_session_era(monkeypatch: pytest.MonkeyPatch) -> None:
    from weir.app.samples.demo import app as demo
    from weir.asyncio._sessionless import SessionlessPosts
    from weir.protocol._lifecycle import SUPPORTED_VERSIONS
    from weir.protocol._sessionless import unsupported_version
    from weir.protocol.sessionless import SessionlessMessage

    async def refuse(self: SessionlessPosts, msg: SessionlessMessage, who: object) -> None:
        raise unsupported_version("2026-07-28", SUPPORTED_VERSIONS, 0)

    # A server of the session era only: the asyncio runtime, made to refuse 2026-07-28.
    monkeypatch.setattr(SessionlessPosts, "serve", refuse)
    with running_driver(demo) as running:
        url = f"http://127.0.0.1:{running.port}/mcp"
        async with open_client(url) as client:
            assert isinstance(client, SessionClient)
            assert client.session_id is not None
            result = await client.call_tool("echo", {"text": "old"})
            assert result.text == "old"
        with pytest.raises(Exception, match="does not serve"):
            async with open_client(url, mode="sessionless"):
                pass


def test_header_values_round_trip_through_the_servers_decoder() -> None:
    for value in ("plain", " padded ", "héllo", "=?base64?literal?=", "tab\\there"):
        assert decode_header_value(header_value(value)) == value
    assert header_value("plain") == "plain"


async def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        async with open_client("http://127.0.0.1:9/mcp", mode="fast"):
            pass
