"""With a shared store, the store decides about shared sessions, not one replica.

Two servers on one Valkey, ``session_idle_timeout`` of a few seconds.  A session
created on replica A and then served only by replica B used to be deleted from the
store by A's sweep (A saw no traffic): B answered 404 mid-conversation.  Now A's
sweep asks the store, which knows B served the session, and A only forgets its
own copy.  Once nobody serves the session it does expire, by the store's clock.

A replica's liveness teardown (its connection to the client stalled) likewise ends
only its own copy: another replica may be serving the same session.

Margins rather than luck: B's traffic comes every 0.25 s while the store allows
``idle`` (3 s) plus a quarter between touches; the expiry is awaited for up to
20 s, and must not come sooner than ``idle`` after the last request was *sent*
(B touches the store at most a quarter before any request it serves, and the
store waits ``idle`` plus that quarter, so ``idle`` is the exact lower bound; the
tolerance is for the store's millisecond clock against the test's).
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from tests.integration.inprocess import valkey_replicas
from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import initialize, raw_request
from weir.engine import App, Context, Server, ServerConfig
from weir.engine._redis_store import RedisStore
from weir.protocol import CreditLimits

IDLE = 3.0
BUSY_FOR = 3 * IDLE
CLOCKS = 0.05  # Valkey's clock (TIME, wall) against Trio's (monotonic), over seconds
VERSION = {"mcp-protocol-version": "2025-11-25"}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def replicas(
    url: str, count: int, app: App | None = None, **config: Any
) -> AbstractAsyncContextManager[tuple[list[Server], RedisStore]]:
    cfg = ServerConfig(port=0, session_idle_timeout=IDLE, **config)
    return valkey_replicas(url, count, app or App("idle"), cfg, label="idle")


async def test_a_session_busy_on_b_outlives_a_sweep_on_a(valkey_url: str) -> None:
    async with replicas(valkey_url, 2) as ([a, b], store):
        with trio.fail_after(BUSY_FOR + 30):
            on_a = await RawClient.connect(a.port)
            sid = await initialize(on_a)
            await on_a.aclose()
            on_b = await RawClient.connect(b.port)
            start = trio.current_time()
            statuses = []
            last_request = start
            while trio.current_time() - start < BUSY_FOR:  # bounded by time and by count
                last_request = trio.current_time()
                reply = await on_b.request("POST", "/mcp", LIST, session=sid, headers=VERSION)
                statuses.append(reply.status)
                assert reply.status == 200, (len(statuses), reply)
                await trio.sleep(0.25)
                assert len(statuses) < 1000
            # A saw nothing for three idle timeouts: it forgot its copy, deleted nothing.
            assert sid not in a.sessions
            assert a.metrics.sessions_expired == 0
            assert await store.get_session("anonymous", sid) is not None

            # Nobody serves it now: it expires by the store's clock (reads do not touch).
            for _ in range(200):
                if await store.get_session("anonymous", sid) is None:
                    break
                await trio.sleep(0.1)
            else:
                raise AssertionError("an idle session never expired")
            assert trio.current_time() - last_request >= IDLE - CLOCKS
            reply = await on_b.request("POST", "/mcp", LIST, session=sid, headers=VERSION)
            assert (reply.status, reply.reason) == (404, "session_not_found")
            await on_b.aclose()


def chatty_app() -> App:
    app = App("stalled")

    @app.tool()
    async def chatty(ctx: Context) -> str:
        """Far more progress than the session's credit holds."""
        for i in range(1, 400):
            await ctx.report_progress(i, 400, "x" * 3000)
        return "done"

    return app


async def test_a_liveness_teardown_on_a_ends_only_a_s_copy(valkey_url: str) -> None:
    """A client's connection to A stalls (a tiny receive window, nothing read): A tears
    its copy down after the liveness timeout, and the session lives on for B."""
    credit = CreditLimits(frames=16, bytes=64 * 1024, drain_window=0.5, liveness_timeout=2.0)
    async with replicas(valkey_url, 2, chatty_app(), credit=credit) as ([a, b], store):
        with trio.fail_after(30):
            setup = await RawClient.connect(a.port)
            sid = await initialize(setup)
            await setup.aclose()
            call = {
                "jsonrpc": "2.0",
                "id": 5,
                "method": "tools/call",
                "params": {"name": "chatty", "arguments": {}, "_meta": {"progressToken": 1}},
            }
            stalled = await RawClient.connect(a.port, rcvbuf=4096)
            head = {"mcp-session-id": sid, **VERSION}
            await stalled.send_raw(
                raw_request("POST", "/mcp", body=json.dumps(call).encode(), headers=head)
            )
            for _ in range(250):  # the teardown is A's own timer: poll for it
                if a.metrics.teardowns:
                    break
                await trio.sleep(0.1)
            assert a.metrics.teardowns == 1
            assert sid not in a.sessions
            assert await store.get_session("anonymous", sid) is not None
            on_b = await RawClient.connect(b.port)
            reply = await on_b.request("POST", "/mcp", LIST, session=sid, headers=VERSION)
            assert reply.status == 200, reply
            await on_b.aclose()
            await stalled.aclose()
