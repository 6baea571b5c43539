"""Sealed request state is bound to its request: a binding matrix on real sockets.

Alice's first round of a ``tools/call`` (2026-07-28) is answered ``input_required``
with a sealed ``requestState``.  Presented again with other arguments, for another
method, by another principal, late, on a replica that does not hold the seal key,
or without a token on a replica that does, it is refused 400, -32602
``request_state_invalid`` -- and the handler does not run (its execution counter is
asserted).  The same state continues Alice's round on a replica that shares the key
(one seal key configured on two servers, as replicas behind one balancer are).  The
asyncio runtime, which has no authorization, refuses Alice's state as an anonymous
Trio server does; an anonymous round continues from either runtime on the other.

Real JWTs (keys served as a JWKS on loopback), real sockets, real AES-GCM.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from tests.integration.inprocess import stop_servers
from weir.common import STATE_TTL, StateSealer, new_key
from weir.engine import App, Authorization, Context, Server, ServerConfig

from .rawhttp import Client, Reply
from .test_asyncio_driver import running_driver
from .test_auth import jwt_authorization, token

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}

app = App("bound-state")
#: Executions of each handler, counted at entry (before it asks anything).
runs: dict[str, int] = {"confirm": 0, "confirm_prompt": 0}


@app.tool()
async def confirm(ctx: Context, item: str) -> str:
    """Ask the user to confirm ``item``; say what they answered."""
    runs["confirm"] += 1
    answer = await ctx.elicit(f"Delete {item}?", {"type": "object"}, key="ok")
    return f"{item}: {answer.get('action')}"


@app.prompt(description="the same question, as a prompt")
def confirm_prompt(item: str) -> str:
    runs["confirm_prompt"] += 1
    return f"Delete {item}?"


@dataclass
class Replicas:
    """Servers on loopback: ``a`` and ``b`` share the seal key, ``c`` has its own,
    ``anon`` shares it but has no authorization, nor has ``aio``: the asyncio runtime
    (which has none), sharing the key."""

    a: int
    b: int
    c: int
    anon: int
    aio: int
    key: bytes


@asynccontextmanager
async def replicas() -> AsyncIterator[Replicas]:
    key = new_key()
    with running_driver(app, state_keys=(key,)) as aio:
        async with _trio_replicas(key, aio.port) as r:
            yield r


@asynccontextmanager
async def _trio_replicas(key: bytes, aio: int) -> AsyncIterator[Replicas]:
    async with trio.open_nursery() as nursery:
        auth: Authorization = await jwt_authorization(nursery)
        configs = [
            ServerConfig(port=0, auth=auth, state_keys=(key,)),
            ServerConfig(port=0, auth=auth, state_keys=(key,)),
            ServerConfig(port=0, auth=auth, state_keys=(new_key(),)),
            ServerConfig(port=0, state_keys=(key,)),
        ]
        servers: list[Server] = [await nursery.start(Server(app, c).run) for c in configs]
        try:
            a, b, c, anon = (s.port for s in servers)
            yield Replicas(a=a, b=b, c=c, anon=anon, aio=aio, key=key)
        finally:
            await stop_servers(servers)
            nursery.cancel_scope.cancel()


async def send(
    port: int,
    sub: str | None,
    rid: int,
    method: str,
    name: str,
    arguments: dict[str, Any],
    **round_: Any,
) -> Reply:
    """One request on a fresh connection (as clients send their rounds), as ``sub``."""
    params = {"name": name, "arguments": arguments, "_meta": META, **round_}
    message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    headers = {"mcp-protocol-version": V, "mcp-method": method, "mcp-name": name}
    if sub is not None:
        headers["authorization"] = f"Bearer {token(sub)}"
    client = await Client.connect(port)
    try:
        return await client.request("POST", "/mcp", message, headers=headers)
    finally:
        await client.aclose()


def assert_refused(reply: Reply, rid: int, case: str) -> None:
    assert reply.status == 400, (case, reply.status, reply.body[:300])
    error = reply.json()["error"]
    assert error["code"] == -32602, (case, error)
    assert error["data"]["reason"] == "request_state_invalid", (case, error)
    assert reply.json()["id"] == rid, case


ANSWER = {"ok": {"action": "accept", "content": {}}}


async def test_a_request_state_opens_only_for_its_own_request() -> None:
    with trio.fail_after(60):
        async with replicas() as r:
            first = await send(r.a, "alice", 1, "tools/call", "confirm", {"item": "x"})
            asked = first.json()["result"]
            assert asked["resultType"] == "input_required", asked
            state = asked["requestState"]
            assert runs == {"confirm": 1, "confirm_prompt": 0}
            late = StateSealer([r.key])
            claims = late.open(state)
            assert claims is not None
            claims.pop("exp")
            expired = late.seal(claims, now=time.time() - STATE_TTL - 1)
            with_state = {"inputResponses": ANSWER, "requestState": state}

            cases: list[tuple[str, int, str | None, str, str, dict[str, Any], str]] = [
                ("other arguments", r.a, "alice", "tools/call", "confirm", {"item": "y"}, state),
                (
                    "other method",
                    r.a,
                    "alice",
                    "prompts/get",
                    "confirm_prompt",
                    {"item": "x"},
                    state,
                ),
                ("other principal", r.a, "bob", "tools/call", "confirm", {"item": "x"}, state),
                (
                    "other principal, replica",
                    r.b,
                    "bob",
                    "tools/call",
                    "confirm",
                    {"item": "x"},
                    state,
                ),
                ("expired", r.a, "alice", "tools/call", "confirm", {"item": "x"}, expired),
                (
                    "replica without the key",
                    r.c,
                    "alice",
                    "tools/call",
                    "confirm",
                    {"item": "x"},
                    state,
                ),
                ("anonymous client", r.anon, None, "tools/call", "confirm", {"item": "x"}, state),
                ("asyncio runtime", r.aio, None, "tools/call", "confirm", {"item": "x"}, state),
            ]
            for rid, (case, port, sub, method, name, arguments, presented) in enumerate(cases, 10):
                reply = await send(
                    port,
                    sub,
                    rid,
                    method,
                    name,
                    arguments,
                    inputResponses=ANSWER,
                    requestState=presented,
                )
                assert_refused(reply, rid, case)
                assert runs == {"confirm": 1, "confirm_prompt": 0}, case

            # Alice's own next round continues on the replica that shares the key.
            done = await send(r.b, "alice", 2, "tools/call", "confirm", {"item": "x"}, **with_state)
            assert done.status == 200, done.body[:300]
            assert done.json()["result"]["content"][0]["text"] == "x: accept"
            assert runs == {"confirm": 2, "confirm_prompt": 0}


@pytest.mark.parametrize(("first", "then"), [("anon", "aio"), ("aio", "anon")])
async def test_an_anonymous_round_continues_on_the_other_runtime(first: str, then: str) -> None:
    """Both runtimes seal and bind a request state alike: an anonymous client's round
    begun on one continues on the other when they share the key (replicas of either
    kind behind one balancer), and runs the handler once per round."""
    with trio.fail_after(60):
        async with replicas() as r:
            ports = {"anon": r.anon, "aio": r.aio}
            before = runs["confirm"]
            asked = await send(ports[first], None, 1, "tools/call", "confirm", {"item": "z"})
            result = asked.json()["result"]
            assert result["resultType"] == "input_required", result
            state = result["requestState"]
            round2 = {"inputResponses": ANSWER, "requestState": state}
            done = await send(
                ports[then], None, 2, "tools/call", "confirm", {"item": "z"}, **round2
            )
            assert done.status == 200, done.body[:300]
            assert done.json()["result"]["content"][0]["text"] == "z: accept"
            assert runs["confirm"] == before + 2
            # Another request's arguments: refused alike on the other runtime.
            other = await send(
                ports[then], None, 3, "tools/call", "confirm", {"item": "w"}, **round2
            )
            assert_refused(other, 3, f"{first} -> {then}, other arguments")
            assert runs["confirm"] == before + 2
