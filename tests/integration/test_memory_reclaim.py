"""A heavy session's end gives free memory back to the operating system, on both runtimes.

What makes a session heavy is all it held: its unacknowledged answers (credit) and
what it kept after they were acknowledged (replay history, results kept for a
retry).  A client that read every byte of a large answer before ending its
session leaves no credit in use, only the kept copy; that session is as heavy as
one that stalled.  ``weir_memory_reclaims_total`` counts the reclaims.
"""

from __future__ import annotations

import pytest
import trio

from weir.common._memory import RECLAIM_AFTER, ReclaimPacing
from weir.engine import App, ServerConfig

from .configured import RUNTIMES, serve_configured
from .rawhttp import Client, call, initialize, scrape

app = App("reclaim")


@app.tool()
async def text(size: int) -> str:
    """``size`` bytes of text."""
    return "r" * size


async def reclaims_after(port: int, expected: int) -> float:
    """Read ``weir_memory_reclaims_total`` until it is ``expected`` (bounded: 5 s; a
    reclaim runs a second after the session's end)."""
    value = await scrape(port, "weir_memory_reclaims_total")
    for _ in range(50):
        if value == expected:
            break
        await trio.sleep(0.1)
        value = await scrape(port, "weir_memory_reclaims_total")
    return value


@RUNTIMES
@pytest.mark.parametrize("mode", ["json", "sse"])
async def test_a_session_that_kept_a_large_answer_is_followed_by_a_reclaim(
    runtime: str, mode: str
) -> None:
    config = ServerConfig(port=0, json_response=mode == "json")
    with trio.fail_after(30):
        async with serve_configured(runtime, app, config) as port:
            client = await Client.connect(port)
            try:
                assert await scrape(port, "weir_memory_reclaims_total") == 0
                sid = await initialize(client)
                size = RECLAIM_AFTER + 64 * 1024
                reply = await client.request(
                    "POST", "/mcp", call(1, "text", {"size": size}), session=sid
                )
                assert reply.status == 200 and len(reply.body) > size
                # Every byte read and acknowledged: no credit left, only what is kept.
                for _ in range(100):  # (bounded: 5 s)
                    if await scrape(port, "weir_credit_in_use_bytes") == 0:
                        break
                    await trio.sleep(0.05)
                assert await scrape(port, "weir_credit_in_use_bytes") == 0
                assert await scrape(port, "weir_retained_bytes") >= size
                assert (await client.request("DELETE", "/mcp", session=sid)).status == 200
                assert await reclaims_after(port, 1) == 1
            finally:
                await client.aclose()


def test_reclaims_follow_heavy_sessions_at_most_once_a_second() -> None:
    pacing = ReclaimPacing()
    assert not pacing.after_end(RECLAIM_AFTER - 1, 0.0)  # light: never
    assert pacing.after_end(RECLAIM_AFTER, 0.0)
    assert not pacing.after_end(10 * RECLAIM_AFTER, 0.9)  # within the second: one will do
    assert pacing.after_end(RECLAIM_AFTER, 1.0)
