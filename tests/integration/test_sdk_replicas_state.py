"""An SDK app on three replicas: what one replica learnt, the others know.

* 2026-07-28: an input-required round continues on another replica, and a change
  the app announces reaches listen streams on the others.
* The session era: a call on a replica that did not see the session's
  ``initialize`` still knows what the client declared there (its capabilities, kept
  with the session in the store), so the SDK lets the tool ask the client's model.

Three replicas on one Valkey behind the round-robin balancer of
:mod:`tests.integration.test_replicas`, each serving its *own* instance of
:func:`tests.integration.sdk_apps.greeter` (as three ``weir serve`` processes would),
so nothing the SDK keeps in memory is shared.  Round one of ``greet`` lands on one
replica and answers ``input_required``; round two, with the answer and the request
state, lands on the next.  weir's seal around the state opens on any replica (the
key is shared through the store); the SDK's own seal inside it opens only where the
SDK's key is the same: with a shared ``RequestStateSecurity`` key the round completes,
with the SDK's default key (one per server) the second replica's SDK refuses the
state it cannot open.  A change the app announces on its subscription bus
(``ctx.notify_tools_changed()``) on one replica reaches a ``subscriptions/listen``
stream held on another, through the store's bus.  Loopback, real time, every wait
bounded.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

try:
    from tests.integration import sdk_apps
    from weir.app.sdk import from_sdk
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("WEIR_REQUIRE_SDK") == "1":
        raise
    pytest.skip(f"the MCP Python SDK is not installed: {exc}", allow_module_level=True)

from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import Reply
from tests.integration.test_replicas import (
    REPLICA_CONFIG,
    Balancer,
    Peer,
    Replica,
    open_tools_listener,
    read_until,
)

pytestmark = pytest.mark.interop

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}


@asynccontextmanager
async def greeters(valkey_url: str, state_key: bytes | None) -> AsyncIterator[Balancer]:
    prefix = f"weir-sdk-rounds-{secrets.token_hex(4)}"
    replicas = [
        Replica(from_sdk(sdk_apps.greeter(state_key)), f"g{i}", valkey_url, prefix, REPLICA_CONFIG)
        for i in range(3)
    ]
    async with trio.open_nursery() as nursery:
        for replica in replicas:
            await replica.start(nursery)
        balancer = Balancer([r.port for r in replicas])
        await balancer.start(nursery)
        try:
            yield balancer
        finally:
            nursery.cancel_scope.cancel()


async def greet(port: int, rid: int, **more: Any) -> Reply:
    return await greet_like(port, "greet", rid, **more)


async def greet_like(port: int, tool: str, rid: int = 1, **more: Any) -> Reply:
    """A 2026-07-28 ``tools/call`` of ``tool`` (no arguments) on a fresh connection."""
    params = {"name": tool, "arguments": {}, "_meta": META, **more}
    message = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    headers = {"mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": tool}
    client = await RawClient.connect(port)
    try:
        return await client.request("POST", "/mcp", message, headers=headers)
    finally:
        await client.aclose()


async def two_rounds(port: int) -> tuple[Reply, Reply]:
    first = await greet(port, 1)
    asked = first.json()["result"]
    assert asked["resultType"] == "input_required", asked
    [key] = asked["inputRequests"]
    answer = {key: {"action": "accept", "content": {"name": "Ada"}}}
    second = await greet(port, 2, inputResponses=answer, requestState=asked["requestState"])
    return first, second


async def test_with_a_shared_sdk_key_the_round_continues_on_another_replica(
    valkey_url: str,
) -> None:
    async with greeters(valkey_url, secrets.token_bytes(32)) as balancer:
        with trio.fail_after(20):
            first, second = await two_rounds(balancer.port)
    assert first.headers["x-upstream"] != second.headers["x-upstream"]
    assert second.json()["result"]["content"][0]["text"] == "hello Ada"


async def test_with_the_sdks_default_key_another_replica_refuses_the_state(
    valkey_url: str,
) -> None:
    async with greeters(valkey_url, None) as balancer:
        with trio.fail_after(20):
            first, second = await two_rounds(balancer.port)
    assert first.headers["x-upstream"] != second.headers["x-upstream"]
    # weir's seal opened (no 400 request_state_invalid); the SDK's, inside it, did not.
    assert second.status == 200
    error = second.json()["error"]
    assert error["code"] == -32602, error


async def test_a_change_on_one_replica_reaches_a_listen_stream_on_another(
    valkey_url: str,
) -> None:
    async with greeters(valkey_url, None) as balancer:
        with trio.fail_after(20):
            client, seen, upstream = await open_tools_listener(balancer.port, META)
            announced = await greet_like(balancer.port, "retool")
            assert announced.json()["result"]["content"][0]["text"] == "announced"
            assert announced.headers["x-upstream"] != upstream
            seen = await read_until(client, seen, b"notifications/tools/list_changed")
            await client.aclose()
    assert b"io.modelcontextprotocol/subscriptionId" in seen  # stamped by weir's listener


async def test_a_replica_that_missed_initialize_knows_the_clients_capabilities(
    valkey_url: str,
) -> None:
    async with greeters(valkey_url, None) as balancer:
        with trio.fail_after(20):
            peer = Peer(balancer.port)
            await peer.initialize()  # declares sampling, on one replica
            init_port = balancer.log[0].port
            answers = Peer(balancer.port, peer.session_id)
            mark = len(balancer.log)
            call = {"name": "compute", "arguments": {}}
            stream = await peer.post(
                {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call}
            )
            assert stream.status == 200 and stream.sse, (stream.status, stream.body)
            assert balancer.log[mark].port != init_port  # the call is on another replica
            result: dict[str, Any] | None = None
            for _ in range(20):
                seen = await peer.next_seen()
                assert seen is not None, "the stream ended without the response"
                if not seen.event.data:
                    continue
                msg = json.loads(seen.event.data)
                if msg.get("method") == "sampling/createMessage":
                    said = {"role": "assistant", "content": {"type": "text", "text": "4"}}
                    reply = await answers.post(
                        {"jsonrpc": "2.0", "id": msg["id"], "result": {**said, "model": "m"}}
                    )
                    assert reply.status == 202, (reply.status, reply.body)
                elif msg.get("id") == 7:
                    result = msg
                    break
            await peer.close()
            await answers.close()
    assert result is not None
    assert result["result"]["content"][0]["text"] == "4", result
