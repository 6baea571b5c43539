"""Identity belongs to the request: one keep-alive connection carrying two principals.

A gateway keeps one connection to weir open and sends Alice's request, then Bob's,
each with its own bearer token (real JWTs, keys served as a JWKS on loopback, real
sockets).  Everything keyed by a principal -- the idempotency gate's namespace, the
credit owner, the sealed request state, the session -- must be Bob's for Bob's
request: nothing is read off the connection.  Every test runs on both runtimes
(Trio, and asyncio in a thread of its own); what they cannot see from outside they
read from ``/metrics``.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from weir.asyncio._sessionless import MAX_OWNERS as ASYNCIO_MAX_OWNERS
from weir.engine import App, Context, ServerConfig
from weir.engine._owners import MAX_OWNERS
from weir.protocol import CreditLimits

from .configured import RUNTIMES, serve_configured
from .rawhttp import INIT_PARAMS, Client, Reply, call, raw_request, scrape
from .test_auth import ISSUER, jwt_authorization, token

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}
ALICE = f"{ISSUER}#alice"
BOB = f"{ISSUER}#bob"

app = App("identity")
runs: dict[str, int] = {}


@app.tool()
async def count(ctx: Context, label: str) -> str:
    """Count one execution of ``label``; say whose request ran it."""
    runs[label] = runs.get(label, 0) + 1
    who = ctx.access_token.principal if ctx.access_token is not None else "nobody"
    return f"{label} run {runs[label]} for {who}"


@app.tool()
async def confirm(ctx: Context, item: str) -> str:
    """Ask to confirm ``item`` (counted at entry); say who confirmed it."""
    runs[item] = runs.get(item, 0) + 1
    answer = await ctx.elicit(f"Delete {item}?", {"type": "object"}, key="ok")
    who = ctx.access_token.principal if ctx.access_token is not None else "nobody"
    return f"{item}: {answer.get('action')} by {who}"


#: Labels of ``hold`` calls that started, and that unwound (finished or cancelled).
held: list[str] = []
unwound: list[str] = []


@app.tool()
async def hold(ctx: Context, label: str) -> str:
    """Wait an hour, recording that ``label`` started and that it unwound (on either
    runtime: the context's own sleep)."""
    held.append(label)
    try:
        await ctx.sleep(3600)
    finally:
        unwound.append(label)
    return "woke"


@app.tool()
async def bulk(size: int) -> str:
    """``size`` bytes of text (a response big enough to stall a peer that stops reading)."""
    return "x" * size


@asynccontextmanager
async def authorized_on(runtime: str, **config: Any) -> AsyncIterator[int]:
    """The real server on 127.0.0.1, on ``runtime``, with JWT authorization and
    ``config``; its port."""
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery)
        async with serve_configured(
            runtime, app, ServerConfig(port=0, auth=auth, **config)
        ) as port:
            yield port
        nursery.cancel_scope.cancel()


def tool_call(rid: int, name: str, arguments: dict[str, Any], **more: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": META, **more}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def headers_for(tok: str, name: str, **more: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {tok}",
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": name,
        **more,
    }


async def call_as(
    client: Client,
    sub: str,
    rid: int,
    name: str,
    arguments: dict[str, Any],
    *,
    round_: dict[str, Any] | None = None,
    extra: dict[str, str] | None = None,
) -> Reply:
    message = tool_call(rid, name, arguments, **(round_ or {}))
    return await client.request(
        "POST", "/mcp", message, headers=headers_for(token(sub), name, **(extra or {}))
    )


def text(reply: Reply) -> str:
    assert reply.status == 200, (reply.status, reply.body[:300])
    return str(reply.json()["result"]["content"][0]["text"])


async def eventually(condition: Callable[[], bool], *, timeout: float, every: float = 0.01) -> bool:
    """Poll a condition only the server's own timers can make true (bounded in time and count)."""
    with trio.move_on_after(timeout):
        for _ in range(math.ceil(timeout / every) + 1):
            if condition():
                return True
            await trio.sleep(every)
    return condition()


@RUNTIMES
async def test_bobs_keyed_call_on_alices_connection_is_bobs(runtime: str) -> None:
    """Same connection, same ``Idempotency-Key``, same arguments: Bob's call runs as
    Bob's, in Bob's namespace, and is not answered with Alice's stored result."""
    label = f"keyed-{runtime}-" + token("x")[-8:]
    with trio.fail_after(30):
        async with authorized_on(runtime) as port:
            client = await Client.connect(port)
            try:
                key = {"idempotency-key": "k-shared-1"}
                alice = text(
                    await call_as(client, "alice", 1, "count", {"label": label}, extra=key)
                )
                bob = text(await call_as(client, "bob", 2, "count", {"label": label}, extra=key))
                # Alice again, same key: her own stored answer (it ran once for her).
                again = text(
                    await call_as(client, "alice", 3, "count", {"label": label}, extra=key)
                )
            finally:
                await client.aclose()
    assert alice == f"{label} run 1 for {ALICE}"
    assert bob == f"{label} run 2 for {BOB}"
    assert again == alice
    assert runs[label] == 2


@RUNTIMES
async def test_bobs_request_state_on_alices_connection_is_sealed_for_bob(runtime: str) -> None:
    """Bob's first round, on a connection that carried Alice's request: his state
    continues his round on another connection, and Alice cannot present it."""
    item = f"state-{runtime}-" + token("x")[-8:]
    answer = {"ok": {"action": "accept", "content": {}}}
    with trio.fail_after(30):
        async with authorized_on(runtime) as port:
            gateway = await Client.connect(port)
            later = await Client.connect(port)
            try:
                assert text(await call_as(gateway, "alice", 1, "bulk", {"size": 1})) == "x"
                asked = (await call_as(gateway, "bob", 2, "confirm", {"item": item})).json()
                state = asked["result"]["requestState"]
                round_ = {"inputResponses": answer, "requestState": state}
                stolen = await call_as(later, "alice", 3, "confirm", {"item": item}, round_=round_)
                assert stolen.status == 400 and stolen.reason == "request_state_invalid"
                assert runs[item] == 1  # Alice's attempt ran nothing
                done = await call_as(later, "bob", 4, "confirm", {"item": item}, round_=round_)
            finally:
                await later.aclose()
                await gateway.aclose()
    assert text(done) == f"{item}: accept by {BOB}"
    assert runs[item] == 2


@RUNTIMES
async def test_alices_stalled_peer_does_not_refuse_bob_on_a_shared_connection(
    runtime: str,
) -> None:
    """Alice stops reading on one connection until her credit owner is half-open; on a
    gateway's connection that carried Alice's request, Bob's requests are still served
    (Alice's are refused 429 ``stream_half_open``, as they should be)."""
    credit = CreditLimits(frames=8, bytes=64 * 1024, drain_window=0.3, liveness_timeout=60.0)
    label = f"bob-after-stall-{runtime}"
    with trio.fail_after(60):
        async with authorized_on(runtime, credit=credit) as port:
            gateway = await Client.connect(port)
            stalled = [await Client.connect(port, rcvbuf=4096) for _ in range(3)]
            try:
                assert text(await call_as(gateway, "alice", 1, "bulk", {"size": 10})) == "x" * 10
                # Alice's other connections ask for large answers and never read them.
                for rid, peer in enumerate(stalled, start=100):
                    message = json.dumps(tool_call(rid, "bulk", {"size": 48 * 1024})).encode()
                    head = headers_for(token("alice"), "bulk")
                    await peer.send_raw(raw_request("POST", "/mcp", body=message, headers=head))

                # (Alice's owner is the one half-open: Bob's is not, and anonymous
                # requests have none here.)
                for _ in range(400):  # bounded: 20 s
                    if await scrape(port, "weir_sessionless_half_open") == 1:
                        break
                    await trio.sleep(0.05)
                assert await scrape(port, "weir_sessionless_half_open") == 1
                # What Alice's owner holds shows in the credit gauges, as a session's would.
                assert await scrape(port, "weir_credit_in_use_bytes") >= 48 * 1024
                bob = await call_as(gateway, "bob", 3, "count", {"label": label})
                assert text(bob) == f"{label} run 1 for {BOB}"
                refused = await call_as(gateway, "alice", 4, "bulk", {"size": 10})
                assert refused.status == 429 and refused.reason == "stream_half_open"
                bob = await call_as(gateway, "bob", 5, "count", {"label": label})
                assert text(bob) == f"{label} run 2 for {BOB}"
            finally:
                for peer in stalled:
                    await peer.aclose()
                await gateway.aclose()


@RUNTIMES
async def test_a_retry_window_answers_a_principals_retry_but_not_another_principal(
    runtime: str,
) -> None:
    """With authorization, the window takes the same request from the same principal
    for a gateway's retry; the same bytes from Bob, on the same connection, run anew."""
    label = f"window-{runtime}-" + token("x")[-8:]
    with trio.fail_after(30):
        async with authorized_on(runtime, retry_window=30.0) as port:
            client = await Client.connect(port)
            try:
                first = text(await call_as(client, "alice", 7, "count", {"label": label}))
                retry = text(await call_as(client, "alice", 7, "count", {"label": label}))
                bob = text(await call_as(client, "bob", 7, "count", {"label": label}))
            finally:
                await client.aclose()
    assert first == retry == f"{label} run 1 for {ALICE}"
    assert bob == f"{label} run 2 for {BOB}"
    assert runs[label] == 2


@RUNTIMES
def test_the_cli_refuses_a_retry_window_without_authorization(runtime: str) -> None:
    """``weir serve --retry-window`` without ``--auth-*``: one line, non-zero exit."""
    serve = [sys.executable, "-m", "weir", "serve", "--runtime", runtime, "demo"]
    done = subprocess.run(
        [*serve, "--port", "0", "--retry-window", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "retry_window needs authorization" in lines[0], done.stderr


@RUNTIMES
async def test_a_gateway_connection_holds_a_bounded_number_of_owners(runtime: str) -> None:
    """A connection that carried requests of many principals holds at most
    ``MAX_OWNERS`` credit owners (the least recently used given back); all go with it."""
    assert MAX_OWNERS == ASYNCIO_MAX_OWNERS  # (the same bound on both runtimes)
    subs = [f"user{i}" for i in range(MAX_OWNERS + 1)]
    with trio.fail_after(60):
        async with authorized_on(runtime) as port:
            client = await Client.connect(port)
            try:
                for rid, sub in enumerate(subs, start=1):
                    assert text(await call_as(client, sub, rid, "bulk", {"size": 1})) == "x"
                assert await scrape(port, "weir_sessionless_owners") == MAX_OWNERS
            finally:
                await client.aclose()
            for _ in range(200):  # bounded: 10 s
                if await scrape(port, "weir_sessionless_owners") == 0:
                    break
                await trio.sleep(0.05)
            assert await scrape(port, "weir_sessionless_owners") == 0


@RUNTIMES
async def test_an_idempotency_key_cannot_name_the_retry_windows_record(runtime: str) -> None:
    """The window keeps its record under a key of its own making: a client sending
    that very text as its ``Idempotency-Key`` (for either bucket the retry may fall
    in) claims a key of its own, and the window's request still runs, once."""
    label = f"window-name-{runtime}-" + token("x")[-8:]
    window = 3600.0
    message = tool_call(9, "count", {"label": label})
    canonical = msgspec.json.encode(
        [message["id"], message["method"], message["params"]], order="sorted"
    )
    digest = hashlib.sha256(canonical).hexdigest()[:32]
    bucket = int(time.time() // window)
    with trio.fail_after(30):
        async with authorized_on(runtime, retry_window=window) as port:
            client = await Client.connect(port)
            try:
                for b in (bucket, bucket + 1):
                    squat = {"idempotency-key": f"same:{digest}:{b}"}
                    other = {"label": f"{label}-squat-{b}"}
                    text(await call_as(client, "alice", 9, "count", other, extra=squat))
                first = text(await call_as(client, "alice", 9, "count", {"label": label}))
                retry = text(await call_as(client, "alice", 9, "count", {"label": label}))
            finally:
                await client.aclose()
    assert first == retry == f"{label} run 1 for {ALICE}"
    assert runs[label] == 1


@RUNTIMES
async def test_two_clients_of_one_principal_may_both_number_a_call_1(runtime: str) -> None:
    """JSON-RPC ids are each client's own: two of Alice's clients (two connections,
    one credit owner) both send a call with id 1.  Closing the first one's response
    cancels the first call -- not the second, which runs on until its own ends."""
    one, two = f"one-{runtime}-" + token("x")[-8:], f"two-{runtime}-" + token("x")[-8:]
    with trio.fail_after(30):
        async with authorized_on(runtime) as port:
            first = await Client.connect(port)
            second = await Client.connect(port)
            try:
                for client, label in ((first, one), (second, two)):
                    message = tool_call(1, "hold", {"label": label})
                    body = json.dumps(message).encode()
                    head = headers_for(token("alice"), "hold")
                    await client.send_raw(raw_request("POST", "/mcp", body=body, headers=head))
                    assert await eventually(lambda n=label: n in held, timeout=5)  # type: ignore[misc]
                await first.aclose()
                assert await eventually(lambda: one in unwound or two in unwound, timeout=10)
                assert one in unwound and two not in unwound, unwound
                await second.aclose()
                assert await eventually(lambda: two in unwound, timeout=10)
            finally:
                await first.aclose()
                await second.aclose()


@RUNTIMES
async def test_one_pooled_connection_carries_two_principals_sessions(runtime: str) -> None:
    """A pooling proxy's one keep-alive connection carries Alice's and Bob's
    session-era requests in turn: each request is served as its own token's
    principal (its handler's ``access_token`` too), and neither reaches the
    other's session on it -- nor does a request without a token."""
    label = f"pooled-{runtime}-" + token("x")[-8:]
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}

    async def send(c: Client, sub: str | None, message: Any, sid: str | None = None) -> Reply:
        headers = {"authorization": f"Bearer {token(sub)}"} if sub else {}
        return await c.request("POST", "/mcp", message, session=sid, headers=headers)

    with trio.fail_after(30):
        async with authorized_on(runtime) as port:
            pooled = await Client.connect(port)
            try:
                sids = {}
                for sub in ("alice", "bob"):
                    opened = await send(pooled, sub, init)
                    assert opened.status == 200, opened
                    sids[sub] = opened.headers["mcp-session-id"]
                    assert (await send(pooled, sub, note, sids[sub])).status == 202
                said = []
                for rid, (sub, owner) in enumerate(
                    [("alice", "alice"), ("bob", "bob"), ("bob", "alice"), ("alice", "bob")], 1
                ):
                    reply = await send(
                        pooled, sub, call(rid, "count", {"label": label}), sids[owner]
                    )
                    if sub == owner:
                        said.append(text(reply))
                    else:
                        assert reply.status == 404 and reply.reason == "session_not_found", reply
                nobody = await send(pooled, None, call(9, "count", {"label": label}), sids["alice"])
                assert nobody.status == 401 and nobody.reason == "unauthorized", nobody
                last = text(
                    await send(pooled, "alice", call(10, "count", {"label": label}), sids["alice"])
                )
            finally:
                await pooled.aclose()
    assert said == [f"{label} run 1 for {ALICE}", f"{label} run 2 for {BOB}"]
    assert last == f"{label} run 3 for {ALICE}"
    assert runs[label] == 3  # the refused requests ran nothing
