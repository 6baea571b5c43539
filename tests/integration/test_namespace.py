"""No identifier a client sends can name weir's internal state.

The sessionless gate keeps each principal's ``Idempotency-Key`` records in a record
of its own (``engine._keyed.NAMESPACE``).  It used to be an ordinary session record
named ``~sessionless``: a ``DELETE /mcp`` with that ``Mcp-Session-Id`` erased the
gate, and a keyed call's retry ran the tool a second time.  Now an id weir did not
mint is 404 before any store lookup, on every path that takes one, and the gate's
records live in a keyspace no session id reaches -- on the memory store and on a
real Valkey.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import Reply
from weir.engine import App, Server, ServerConfig
from weir.engine._memory_store import MemoryStore
from weir.engine._redis_store import RedisStore
from weir.engine._session_store import SessionStore

SESSIONLESS = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": SESSIONLESS,
    "io.modelcontextprotocol/clientCapabilities": {},
}
#: Ids weir never minted: the gate's old record name, look-alikes, and a well-formed
#: id (the minted format) that simply does not exist.
FOREIGN_IDS = ("~sessionless", "sessionless", "~sessionless ", "A" * 43, "connection-0123")


def make_app(executions: Counter[str]) -> App:
    app = App("namespace")

    @app.tool()
    async def bump(key: str) -> str:
        """Non-idempotent: every execution counts."""
        executions[key] += 1
        return f"bumped {key} #{executions[key]}"

    return app


@asynccontextmanager
async def serving(app: App, store: SessionStore) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        server = Server(app, ServerConfig(port=0), store=store)
        await nursery.start(server.run)
        try:
            yield server
        finally:
            server.shutdown()
            await server.stopped.wait()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url: str = request.getfixturevalue("valkey_url")
    prefix = f"weir-namespace-{secrets.token_hex(4)}"
    async with await RedisStore.connect(url, prefix=prefix) as redis_store:
        yield redis_store


async def request(
    port: int, method: str, path: str = "/mcp", message: Any = None, **headers: str
) -> Reply:
    client = await RawClient.connect(port)
    try:
        return await client.request(method, path, message, headers=headers)
    finally:
        await client.aclose()


async def keyed_bump(port: int, rid: int, key: str) -> Reply:
    msg = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "bump", "arguments": {"key": key}, "_meta": META},
    }
    headers = {
        "mcp-protocol-version": SESSIONLESS,
        "mcp-method": "tools/call",
        "mcp-name": "bump",
        "idempotency-key": key,
    }
    return await request(port, "POST", "/mcp", msg, **headers)


async def test_foreign_session_ids_are_404_and_the_gate_holds(store: SessionStore) -> None:
    executions: Counter[str] = Counter()
    async with serving(make_app(executions), store) as server:
        with trio.fail_after(20):
            key = f"order-{secrets.token_hex(3)}"
            first = await keyed_bump(server.port, 1, key)
            assert first.status == 200, first
            assert (await keyed_bump(server.port, 2, key)).json()["result"] == first.json()[
                "result"
            ]
            assert executions[key] == 1

            ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
            version = {"mcp-protocol-version": "2025-11-25"}
            for sid in FOREIGN_IDS:
                session = {"mcp-session-id": sid, **version}
                replies = {
                    "DELETE": await request(server.port, "DELETE", **session),
                    "GET": await request(server.port, "GET", **session, accept="text/event-stream"),
                    "POST": await request(server.port, "POST", "/mcp", ping, **session),
                    "legacy POST": await request(
                        server.port, "POST", f"/messages?session_id={sid.strip()}", ping
                    ),
                }
                for path, reply in replies.items():
                    assert (reply.status, reply.reason) == (404, "session_not_found"), (
                        sid,
                        path,
                        reply,
                    )

            third = await keyed_bump(server.port, 3, key)
            assert third.json()["result"] == first.json()["result"]
            assert executions[key] == 1  # the gate survived: nothing ran again
