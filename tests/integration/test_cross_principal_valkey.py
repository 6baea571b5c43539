"""Two principals on two replicas sharing one Valkey: neither reaches the other's calls.

Replicas ``a`` and ``b`` (in-process servers on loopback) share a store key prefix
on a real Valkey and verify real JWTs.  Bob's ``notifications/cancelled`` naming the
request id of Alice's running call -- in her session, in his own, or sessionless --
does not cancel it; Bob's sessionless call under Alice's ``Idempotency-Key`` runs on
its own (even on the very connection that carried Alice's), and each principal's
retry on the other replica is answered from its own record.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from tests.integration.inprocess import stop_servers
from weir.engine import App, Server, ServerConfig
from weir.engine._redis_store import RedisStore

from .rawhttp import Client, Reply, call
from .test_auth import ISSUER, jwt_authorization, open_as, post, token

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}
ALICE = f"{ISSUER}#alice"
BOB = f"{ISSUER}#bob"

app = App("cross-principal")
#: Per label: executions, and what became of the last one.
runs: dict[str, int] = {}
outcome: dict[str, str] = {}
started: dict[str, trio.Event] = {}
release: dict[str, trio.Event] = {}


@app.tool()
async def slow(label: str) -> str:
    """Run until the test releases ``label``; record whether it finished or was cancelled."""
    runs[label] = runs.get(label, 0) + 1
    started[label].set()
    try:
        await release[label].wait()
    except trio.Cancelled:
        outcome[label] = "cancelled"
        raise
    outcome[label] = "finished"
    return f"{label} finished"


@app.tool()
async def count(label: str) -> str:
    """Count one execution of ``label``."""
    runs[label] = runs.get(label, 0) + 1
    return f"{label} run {runs[label]}"


@dataclass
class Pair:
    a: int
    b: int


@asynccontextmanager
async def replicas(valkey_url: str) -> AsyncIterator[Pair]:
    prefix = f"weir-cross-{secrets.token_hex(4)}"
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery)
        servers: list[Server] = []
        stores: list[RedisStore] = []
        try:
            for name in ("a", "b"):
                store = await RedisStore.connect(valkey_url, prefix=prefix, timeout=2.0)
                stores.append(store)
                config = ServerConfig(port=0, auth=auth, replica_id=name)
                servers.append(await nursery.start(Server(app, config, store=store).run))
            yield Pair(servers[0].port, servers[1].port)
        finally:
            await stop_servers(servers)
            with trio.CancelScope(shield=True):
                for store in stores:
                    await store.aclose()
            nursery.cancel_scope.cancel()


def sessionless(rid: int | None, method: str, params: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rid is not None:
        message["id"] = rid
    message["params"] = {**params, "_meta": META}
    return message


async def send_sessionless(client: Client, sub: str, message: dict[str, Any], **more: str) -> Reply:
    headers = {
        "authorization": f"Bearer {token(sub)}",
        "mcp-protocol-version": V,
        "mcp-method": message["method"],
        **more,
    }
    if message["method"] == "tools/call":
        headers["mcp-name"] = message["params"]["name"]
    return await client.request("POST", "/mcp", message, headers=headers)


def cancel(rid: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": rid, "reason": "not yours"},
    }


async def test_a_cancel_aimed_at_another_principals_call_does_not_cancel_it(
    valkey_url: str,
) -> None:
    label = "slow-" + secrets.token_hex(3)
    started[label], release[label] = trio.Event(), trio.Event()
    replies: list[Reply] = []
    with trio.fail_after(60):
        async with replicas(valkey_url) as r, trio.open_nursery() as nursery:
            alice_sid = await open_as(r.a, token("alice"))

            async def alices_call() -> None:
                replies.append(
                    await post(r.a, call(5, "slow", {"label": label}), token("alice"), alice_sid)
                )

            nursery.start_soon(alices_call)
            await started[label].wait()
            # Bob, on the other replica: in Alice's session (not his: 404) ...
            aimed = await post(r.b, cancel(5), token("bob"), alice_sid)
            assert aimed.status == 404, aimed
            # ... in his own session, and sessionless on both replicas (nothing of his).
            bob_sid = await open_as(r.b, token("bob"))
            assert (await post(r.b, cancel(5), token("bob"), bob_sid)).status == 202
            for port in (r.a, r.b):
                client = await Client.connect(port)
                try:
                    note = sessionless(None, "notifications/cancelled", {"requestId": 5})
                    assert (await send_sessionless(client, "bob", note)).status == 202
                finally:
                    await client.aclose()
            assert label not in outcome  # still running
            release[label].set()
    [reply] = replies
    assert reply.status == 200, reply
    assert reply.json()["result"]["content"][0]["text"] == f"{label} finished"
    assert outcome[label] == "finished" and runs[label] == 1


async def test_another_principals_idempotency_key_runs_separately(valkey_url: str) -> None:
    label = "keyed-" + secrets.token_hex(3)
    key = {"idempotency-key": f"k-{label}"}

    def keyed(rid: int) -> dict[str, Any]:
        return sessionless(rid, "tools/call", {"name": "count", "arguments": {"label": label}})

    def text(reply: Reply) -> str:
        assert reply.status == 200, (reply.status, reply.body[:300])
        return str(reply.json()["result"]["content"][0]["text"])

    with trio.fail_after(60):
        async with replicas(valkey_url) as r:
            gateway = await Client.connect(r.a)
            other = await Client.connect(r.b)
            try:
                alice = text(await send_sessionless(gateway, "alice", keyed(1), **key))
                bob = text(await send_sessionless(gateway, "bob", keyed(2), **key))
                # Each principal's retry on the other replica: its own record.
                alice_again = text(await send_sessionless(other, "alice", keyed(3), **key))
                bob_again = text(await send_sessionless(other, "bob", keyed(4), **key))
            finally:
                await other.aclose()
                await gateway.aclose()
    assert alice == alice_again == f"{label} run 1"
    assert bob == bob_again == f"{label} run 2"
    assert runs[label] == 2
