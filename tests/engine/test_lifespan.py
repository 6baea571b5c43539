"""The app's lifespan: entered before serving, exited after the last request, its state in ctx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing

from weir.engine import App, Context, Server, ServerConfig

from .helpers import SseReply, open_session

events: list[str] = []


def make_app(*, fail: bool = False) -> App:
    app = App("lifespan-test", "0")

    @app.lifespan
    @asynccontextmanager
    async def lifespan(a: App) -> AsyncIterator[dict[str, int]]:
        events.append(f"enter {a.name}")
        if fail:
            raise RuntimeError("the database is not there")
        pool = {"opened": 1}
        try:
            yield pool
        finally:
            events.append("exit")

    @app.tool()
    async def uses_state(ctx: Context) -> str:
        """Reads the lifespan's state."""
        events.append("call")
        await trio.sleep(0)
        return f"opened {ctx.state['opened']}"

    @app.tool()
    async def inline_state(ctx: Context) -> str:
        """Never suspends (runs inline), and still sees the state."""
        return f"inline {ctx.state['opened']}"

    return app


async def test_lifespan_wraps_serving_and_tools_see_its_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events.clear()
    app = make_app()
    async with trio.open_nursery() as nursery:
        server = Server(app, ServerConfig())
        await nursery.start(partial(server.run, listen=False))
        assert events == ["enter lifespan-test"] and server.state == {"opened": 1}
        client, _ = await open_session(server, nursery)
        for name, text in (("uses_state", "opened 1"), ("inline_state", "inline 1")):
            reply = await client.call(1 if name == "uses_state" else 2, name)
            assert isinstance(reply, SseReply)
            [result] = [m for m in await reply.messages() if "result" in m]
            assert result["result"]["content"][0]["text"] == text
        server.shutdown()
        await server.stopped.wait()
    assert events == ["enter lifespan-test", "call", "exit"]


async def test_a_failing_lifespan_stops_the_server_from_starting() -> None:
    events.clear()
    server = Server(make_app(fail=True), ServerConfig(port=0))
    with pytest.raises(RuntimeError, match="database"):
        await server.run()  # raises before it would report that it started
    assert events == ["enter lifespan-test"] and server.listeners == []
