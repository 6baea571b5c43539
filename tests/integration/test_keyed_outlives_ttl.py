"""A sessionless keyed call that runs longer than the store's TTL keeps its claim.

The sessionless gate's records (a principal's namespace in the store) live for
``Retention.ttl`` after their last write.  A call still running holds its claim by
lease renewals; those renewals keep the namespace alive too, or the claim would
expire with it mid-call and a retry would run the tool a second time.

Real Valkey (its clock is the one that expires keys, so the test waits real time:
two TTLs, with renewals six times per TTL).
"""

from __future__ import annotations

import secrets
from typing import Any

import trio

from weir.engine import App, Server, ServerConfig
from weir.engine._redis_store import RedisStore
from weir.engine._store_records import Retention

from .rawhttp import Client, Reply

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}
TTL = 3.0
# Renewed every 0.5 s: a renewal would have to be late by a whole second (on a loaded
# CI machine too) before the lease lapsed for a reason this test is not about.
LEASE = 1.5

app = App("keyed-outlives-ttl")
runs: dict[str, int] = {}
started: dict[str, trio.Event] = {}
release: dict[str, trio.Event] = {}


@app.tool()
async def long(label: str) -> str:
    """Run until the test releases ``label`` (counted; a second run returns at once)."""
    runs[label] = runs.get(label, 0) + 1
    if runs[label] > 1:
        return f"{label} ran again"
    started[label].set()
    await release[label].wait()
    return f"{label} done"


async def keyed(port: int, rid: int, label: str) -> Reply:
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "long", "arguments": {"label": label}, "_meta": META},
    }
    headers = {
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": "long",
        "idempotency-key": f"key-{label}",
    }
    client = await Client.connect(port)
    try:
        return await client.request("POST", "/mcp", message, headers=headers, timeout=30)
    finally:
        await client.aclose()


async def test_a_keyed_call_running_past_the_ttl_is_not_run_again(valkey_url: str) -> None:
    label = "long-" + secrets.token_hex(3)
    started[label], release[label] = trio.Event(), trio.Event()
    replies: list[Reply] = []
    prefix = f"weir-keyed-ttl-{secrets.token_hex(4)}"
    store = await RedisStore.connect(valkey_url, prefix=prefix, retention=Retention(ttl=TTL))
    config = ServerConfig(port=0, claim_lease=LEASE, in_progress_wait=0.2)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(Server(app, config, store=store).run)
            try:

                async def first() -> None:
                    replies.append(await keyed(server.port, 1, label))

                nursery.start_soon(first)
                await started[label].wait()
                await trio.sleep(2 * TTL)  # the store's clock expires keys: real time
                retry = await keyed(server.port, 2, label)
                assert retry.status == 409, (retry.status, retry.body[:300])
                assert retry.json()["error"]["data"]["reason"] == "in_progress"
                release[label].set()
                with trio.fail_after(10):
                    while not replies:
                        await trio.sleep(0.01)
            finally:
                release[label].set()
                server.shutdown()
                await server.stopped.wait()
                await store.aclose()
    [reply] = replies
    assert reply.status == 200, reply
    assert runs[label] == 1
