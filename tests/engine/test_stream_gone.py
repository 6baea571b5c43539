"""A tool whose stream is gone stops with one warning line, not a traceback.

With a shared store, an event that could not be stored is not sent, and the call's
stream ends there.  The tool learns it when its next ``report_progress`` raises
:class:`weir.app.StreamGone` (the engine's ``StreamLost``).  If the tool lets it out,
that is not a bug in the tool: the log says why in one line, and the call's answer
is an ``isError`` result saying its stream is gone.  (Found by the cluster simulator,
where a store outage filled the log with ``tool ... failed`` tracebacks.)
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from tests.engine.helpers import open_session
from tests.sim.store import SimStore
from weir.app import StreamGone
from weir.engine import App, Context, Server, ServerConfig
from weir.engine._store_errors import StoreUnavailable
from weir.engine._stream_handle import StreamLost

seen: list[str] = []
app = App("gone")


@app.tool()
async def steps(ctx: Context) -> str:
    """Reports progress until the stream is gone."""
    for i in range(1, 4):
        try:
            await ctx.report_progress(i, 3)
        except StreamGone as exc:
            seen.append(type(exc).__name__)
            raise
    return "done"


class RefusingStore(SimStore):
    """Stores nothing after the priming event: every progress event is refused."""

    async def append_event(self, *args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("down for appends")


def test_the_engine_s_stream_lost_is_the_app_s_stream_gone() -> None:
    assert issubclass(StreamLost, StreamGone)


async def test_a_tool_whose_stream_is_gone_is_one_warning(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="weir")
    server = Server(app, ServerConfig(replica_id="r-a"), store=RefusingStore())
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.run, listen=False))
        client, _ = await open_session(server, nursery)
        reply = await client.call(1, "steps", meta={"progressToken": "p"})
        await reply.events()
        await trio.sleep(1)
        server.shutdown()
    assert seen == ["StreamLost"]
    mine = [r for r in caplog.records if r.name == "weir.app._dispatch"]
    assert [r.levelno for r in mine] == [logging.WARNING], [r.getMessage() for r in mine]
    assert "its stream is gone" in mine[0].getMessage() and mine[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
