"""An SDK app on three replicas: a gateway's retry of its non-idempotent tool runs once.

The app is :mod:`tests.integration.sdk_apps`: an ``MCPServer`` written with the
official MCP Python SDK only, whose ``charge`` tool counts every execution.  Each
of three in-process :class:`weir.engine.Server` replicas serves it through its own
:func:`weir.app.sdk.from_sdk` bridge (as three ``weir serve
tests.integration.sdk_apps:server`` processes would: no bridge state is shared, a
replica that did not see ``initialize`` builds its own SDK connection), with its
own :class:`~weir.engine._redis_store.RedisStore` connection to one Valkey (the
``valkey_url`` fixture).  The machinery is :mod:`tests.integration.test_replicas`'s
(:class:`Replica`, the request-level round-robin :class:`Balancer`, which names the
serving replica in ``X-Upstream`` and logs every request's replica) and
:mod:`tests.integration.test_half_open_loopback`'s :class:`RetryingGateway`, which
abandons an upstream that has not answered within 0.5 s and re-sends the same
request on a new connection -- through the balancer, so to the next replica.

What is proven
--------------
1. ``test_a_gateway_retry_of_a_session_call_runs_the_sdk_tool_once`` -- session era
   (2025-11-25, ``initialize`` + ``Mcp-Session-Id``): the gateway abandons a 0.8 s
   ``charge`` and re-delivers the same JSON-RPC ``tools/call`` (same id, no
   ``Idempotency-Key``: the gate's key is session + id) to the other replicas.  The
   tool runs once, on the replica of the first delivery; the client's answer comes
   from another replica and is the first delivery's result.  Variants: a JSON or an
   SSE response (the latter behind a buffering gateway, so it is abandoned too), and
   a duplicate that waits at the gate for the result or (``in_progress_wait``
   shorter than the gateway's patience) gets 409 ``in_progress``, on which the
   client retries with the same id.
2. ``test_a_gateway_retry_of_a_sessionless_call_runs_the_sdk_tool_once`` -- 2026-07-28
   (no session): the same, keyed by ``Idempotency-Key``; then the client re-issues
   the call (new ids, same key) once on each replica: every answer is the first
   result, and the tool still ran once.
3. ``test_a_duplicate_landing_while_the_sdk_tool_runs_waits_or_is_told_in_progress``
   -- no gateway, the overlap made certain: the duplicate is sent (to another
   replica) only once the tool's first progress notification has arrived, so it
   lands mid-execution; it waits and gets the result, or gets 409 ``in_progress``
   and then, retried after the first delivery's answer, that answer.

Each test asserts the tool ran exactly once (the app's own counter; on the
session era also the replicas' ``executions`` metric, which names the replica that
ran it), that the deliveries reached at least two replicas (the balancer's log),
and that every duplicate was decided by a gate -- replayed or refused in progress,
per the replicas' metrics, the deliveries the gateway abandoned included.  (The
sessionless keyed gate counts its replays in the metrics but not its executions
nor its 409s; there the 409s are the ones the client saw.)  Clock: real time;
every wait is bounded by ``trio.fail_after`` (and the gate's own waits by its
settings).  Nothing sleeps for timing: the only sleeps honour a 409's
``retryAfterMs``, and :func:`eventually` polls metrics that only the replicas'
own gate waits can make true.  Loopback only.  Needs the ``sdk`` extra; skipped
without it unless ``WEIR_REQUIRE_SDK=1``.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio

try:
    from tests.integration import sdk_apps
    from weir.app.sdk import from_sdk
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("WEIR_REQUIRE_SDK") == "1":  # CI: a missing SDK is a failure
        raise
    pytest.skip(
        f"the MCP Python SDK is not installed (pip install -e '.[sdk]'): {exc}",
        allow_module_level=True,
    )

from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import Reply
from tests.integration.test_half_open_loopback import RetryingGateway, eventually
from tests.integration.test_replicas import (
    HOST,
    REPLICA_CONFIG,
    Answer,
    Balancer,
    Peer,
    Replica,
    _sessionless_post,
)

pytestmark = pytest.mark.interop

VERSION = "2025-11-25"
#: The tool outlasts the gateway's patience, so the gateway abandons the first
#: delivery before the result exists; it ends before the third delivery (at 1.0 s),
#: so the answer comes from the second or third replica, well before the gateway
#: would wrap round to the first one with a fourth.
TOOL_MS = 800
GATEWAY_HEADER_TIMEOUT = 0.5
GATEWAY_RETRIES = 3
#: A duplicate waits at the gate longer than the tool runs, or shorter than the
#: gateway waits (then 409 ``in_progress``, with this pause asked for).
LONG_WAIT = 2.5
SHORT_WAIT = 0.25
RETRY_MS = 500
TEST_TIMEOUT = 30.0

WAITS = [
    pytest.param(LONG_WAIT, id="duplicate-waits-for-the-result"),
    pytest.param(SHORT_WAIT, id="duplicate-gets-409-then-retries"),
]


# ---------------------------------------------------------------- the replicas
@dataclass
class Deployment:
    """Three replicas of the SDK app behind a balancer, a retrying gateway in front."""

    replicas: list[Replica]
    balancer: Balancer
    gateway: RetryingGateway
    gateway_port: int

    def executions(self) -> int:
        """``tools/call`` executions after the gate, over every replica."""
        return sum(r.server.metrics.executions for r in self.replicas if r.server)

    def replayed(self) -> int:
        """Duplicates the replicas' gates answered with the stored result."""
        return sum(r.server.metrics.duplicates_replayed for r in self.replicas if r.server)

    def refused_in_progress(self) -> int:
        """Session-era duplicates the replicas' gates answered 409 ``in_progress``."""
        return sum(r.server.metrics.duplicates_in_progress for r in self.replicas if r.server)

    def ran_on(self) -> list[str]:
        """The ports (as ``X-Upstream`` spells them) of the replicas that executed a call."""
        return [str(r.port) for r in self.replicas if r.server and r.server.metrics.executions]

    def posts_since(self, mark: int) -> list[str]:
        """The replica (port) each POST after ``mark`` in the balancer's log went to."""
        return [str(r.port) for r in self.balancer.log[mark:] if r.method == "POST"]


@asynccontextmanager
async def sdk_deployment(
    valkey_url: str, *, in_progress_wait: float, json_response: bool, buffer_body: bool
) -> AsyncIterator[Deployment]:
    """:func:`tests.integration.test_replicas.replica_set`'s replicas and balancer, each
    replica with a bridge of its own over the one SDK server, and a gateway in front."""
    prefix = f"weir-sdk-replicas-{secrets.token_hex(4)}"
    config = {
        **REPLICA_CONFIG,
        "in_progress_wait": in_progress_wait,
        "retry_ms": RETRY_MS,
        "json_response": json_response,
    }
    replicas = [
        Replica(from_sdk(sdk_apps.server), f"r{i + 1}", valkey_url, prefix, config)
        for i in range(3)
    ]
    async with trio.open_nursery() as nursery:
        for replica in replicas:
            await replica.start(nursery)
        balancer = Balancer([r.port for r in replicas])
        await balancer.start(nursery)
        gateway = RetryingGateway(
            balancer.port,
            header_timeout=GATEWAY_HEADER_TIMEOUT,
            retries=GATEWAY_RETRIES,
            buffer_body=buffer_body,
        )
        listeners = await nursery.start(partial(trio.serve_tcp, gateway.handle, 0, host=HOST))
        gateway_port = int(listeners[0].socket.getsockname()[1])
        try:
            yield Deployment(replicas, balancer, gateway, gateway_port)
        finally:
            nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- a client
async def post(port: int, message: dict[str, Any], headers: dict[str, str]) -> Reply:
    """POST one message on a fresh connection; the whole reply (JSON or SSE)."""
    client = await RawClient.connect(port)
    try:
        return await client.request("POST", "/mcp", message, headers=headers, timeout=10)
    finally:
        await client.aclose()


async def open_session(port: int) -> dict[str, str]:
    """``initialize`` + ``notifications/initialized`` at 2025-11-25; the headers to send."""
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": {"name": "sdk-replicas-test", "version": "1"},
        },
    }
    reply = await post(port, init, {})
    assert reply.status == 200, (reply.status, reply.body)
    assert reply.json()["result"]["serverInfo"]["name"] == "sdk-replicas"  # the SDK's identity
    headers = {"mcp-session-id": reply.headers["mcp-session-id"], "mcp-protocol-version": VERSION}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    ack = await post(port, note, headers)
    assert ack.status == 202, (ack.status, ack.body)
    return headers


def charge_call(rid: int, key: str, **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "charge", "arguments": {"key": key, "ms": TOOL_MS}, **params},
    }


async def call_until_answered(
    send: Callable[[], Awaitable[Reply]], rid: int, *, max_conflicts: int = 10
) -> tuple[Reply, int]:
    """``send()`` until it is answered (not 409 ``in_progress``): the answer, and how
    many 409s came first (each honoured with its ``retryAfterMs``)."""
    conflicts = 0
    for _ in range(max_conflicts + 1):
        reply = await send()
        if reply.status != 409:
            assert reply.status == 200, (reply.status, reply.body)
            assert reply.json()["id"] == rid, reply.body
            return reply, conflicts
        data = reply.json()["error"]["data"]
        assert data["reason"] == "in_progress", data
        assert data["retryAfterMs"] == RETRY_MS, data
        assert int(reply.headers["retry-after"]) >= 1, reply.headers
        conflicts += 1
        await trio.sleep(data["retryAfterMs"] / 1000)  # the server's hint, not a timing guess
    raise AssertionError(f"request {rid} was still in progress after {conflicts} 409s")


def text_of(reply: Reply) -> str:
    return str(reply.json()["result"]["content"][0]["text"])


async def check_books(dep: Deployment, key: str, duplicates: int, conflicts: int = 0) -> None:
    """Session era: the tool ran once, and every duplicate delivery was decided by a
    gate (replayed, or refused in progress), none ran -- the abandoned ones included,
    which may still be waiting at a gate when the client has its answer."""
    decided = await eventually(
        lambda: dep.replayed() + dep.refused_in_progress() >= duplicates,
        timeout=TOOL_MS / 1000 + LONG_WAIT + 3.0,
    )
    assert decided, (dep.replayed(), dep.refused_in_progress(), duplicates)
    assert sdk_apps.executions[key] == 1, sdk_apps.executions
    assert dep.executions() == 1
    assert dep.replayed() + dep.refused_in_progress() == duplicates
    assert dep.refused_in_progress() >= conflicts


async def check_sessionless_books(
    dep: Deployment, key: str, duplicates: int, conflicts: int
) -> None:
    """2026-07-28: the tool ran once, and every duplicate was replayed or refused in
    progress.  The keyed gate counts its replays in ``duplicates_replayed`` but
    neither its executions nor its 409s in the metrics, so the 409s are those the
    client saw (a 409 comes before the gateway gives up, so none is lost)."""
    decided = await eventually(
        lambda: dep.replayed() + conflicts >= duplicates,
        timeout=TOOL_MS / 1000 + LONG_WAIT + 3.0,
    )
    assert decided, (dep.replayed(), conflicts, duplicates)
    assert sdk_apps.executions[key] == 1, sdk_apps.executions
    assert dep.replayed() + conflicts == duplicates


# ---------------------------------------------------------------- 1. session era
@pytest.mark.parametrize("in_progress_wait", WAITS)
@pytest.mark.parametrize(
    ("json_response", "buffer_body"),
    [
        pytest.param(True, False, id="json-response"),
        pytest.param(False, True, id="sse-buffering-gateway"),
    ],
)
async def test_a_gateway_retry_of_a_session_call_runs_the_sdk_tool_once(
    valkey_url: str, json_response: bool, buffer_body: bool, in_progress_wait: float
) -> None:
    """Session era: the gateway's re-deliveries (same session, same id) of a call it
    abandoned land on the other replicas; the tool runs once, on the first one."""
    key = f"session-{secrets.token_hex(3)}"
    with trio.fail_after(TEST_TIMEOUT):
        async with sdk_deployment(
            valkey_url,
            in_progress_wait=in_progress_wait,
            json_response=json_response,
            buffer_body=buffer_body,
        ) as dep:
            headers = await open_session(dep.gateway_port)
            mark = len(dep.balancer.log)
            message = charge_call(1, key)
            answer, conflicts = await call_until_answered(
                partial(post, dep.gateway_port, message, headers), 1
            )
            deliveries = dep.posts_since(mark)
            assert text_of(answer) == f"charged {key} #1", answer.body
            assert answer.headers.get("content-type", "").startswith(
                "application/json" if json_response else "text/event-stream"
            ), answer.headers
            # The tool ran where the first delivery went; the answer came from elsewhere.
            assert dep.ran_on() == [deliveries[0]], (dep.ran_on(), deliveries)
            assert answer.headers["x-upstream"] != deliveries[0], (answer.headers, deliveries)
            assert len(set(deliveries)) >= 2, deliveries
            gateway = dep.gateway
            assert gateway.abandoned >= 1 and gateway.gave_up == 0, vars(gateway)
            assert gateway.upstream_errors == []
            assert len(gateway.deliveries) - 2 == len(deliveries)  # + initialize, initialized
            if in_progress_wait < GATEWAY_HEADER_TIMEOUT:
                assert conflicts >= 1, "expected 409 in_progress to reach the client"
            await check_books(dep, key, len(deliveries) - 1, conflicts)
            print(
                f"session era: deliveries to {deliveries}, ran on {deliveries[0]}, answered by "
                f"{answer.headers['x-upstream']}; abandoned={gateway.abandoned} 409s={conflicts} "
                f"replayed={dep.replayed()} refused_in_progress={dep.refused_in_progress()}"
            )


# ---------------------------------------------------------------- 2. 2026-07-28
@pytest.mark.parametrize("in_progress_wait", WAITS)
async def test_a_gateway_retry_of_a_sessionless_call_runs_the_sdk_tool_once(
    valkey_url: str, in_progress_wait: float
) -> None:
    """2026-07-28: re-deliveries and re-issues under one ``Idempotency-Key``, on every
    replica, are answered with the first delivery's result; the tool runs once."""
    key = f"sessionless-{secrets.token_hex(3)}"
    args = {"arguments": {"key": key, "ms": TOOL_MS}}
    idem = {"idempotency-key": key}
    with trio.fail_after(TEST_TIMEOUT):
        async with sdk_deployment(
            valkey_url, in_progress_wait=in_progress_wait, json_response=False, buffer_body=True
        ) as dep:
            mark = len(dep.balancer.log)
            answer, conflicts = await call_until_answered(
                partial(_sessionless_post, dep.gateway_port, 1, "charge", args, **idem), 1
            )
            deliveries = dep.posts_since(mark)
            assert text_of(answer) == f"charged {key} #1", answer.body
            # The first delivery ran it (the others came after the gateway gave up on
            # it); the answer came from another replica.
            assert answer.headers["x-upstream"] != deliveries[0], (answer.headers, deliveries)
            assert len(set(deliveries)) >= 2, deliveries
            assert dep.gateway.abandoned >= 1 and dep.gateway.gave_up == 0, vars(dep.gateway)
            if in_progress_wait < GATEWAY_HEADER_TIMEOUT:
                assert conflicts >= 1, "expected 409 in_progress to reach the client"

            # The client re-issues the call (new ids, same key) on every replica.
            reissued = [
                await _sessionless_post(dep.balancer.port, rid, "charge", args, **idem)
                for rid in (2, 3, 4)
            ]
            assert {r.headers["x-upstream"] for r in reissued} == {
                str(r.port) for r in dep.replicas
            }
            assert [r.json()["id"] for r in reissued] == [2, 3, 4]
            assert [text_of(r) for r in reissued] == [f"charged {key} #1"] * 3
            duplicates = len(deliveries) - 1 + len(reissued)
            await check_sessionless_books(dep, key, duplicates, conflicts)
            print(
                f"2026-07-28: deliveries to {deliveries}, answered by "
                f"{answer.headers['x-upstream']}, re-issued on "
                f"{[r.headers['x-upstream'] for r in reissued]}; "
                f"abandoned={dep.gateway.abandoned} 409s={conflicts} replayed={dep.replayed()}"
            )


# ---------------------------------------------------------------- 3. a certain overlap
@pytest.mark.parametrize("in_progress_wait", WAITS)
async def test_a_duplicate_landing_while_the_sdk_tool_runs_waits_or_is_told_in_progress(
    valkey_url: str, in_progress_wait: float
) -> None:
    """A duplicate sent to another replica while the tool certainly runs (its first
    progress has arrived) waits for the result, or is 409 ``in_progress``; once."""
    key = f"overlap-{secrets.token_hex(3)}"
    message = charge_call(1, key, _meta={"progressToken": key})
    body = json.dumps(message).encode()
    with trio.fail_after(TEST_TIMEOUT):
        async with sdk_deployment(
            valkey_url, in_progress_wait=in_progress_wait, json_response=False, buffer_body=False
        ) as dep:
            first = Peer(dep.balancer.port)
            await first.initialize()
            mark = len(dep.balancer.log)
            stream = await first.start("POST", body)
            assert stream.status == 200 and stream.sse, (stream.status, stream.body)
            for _ in range(10):  # until the tool's first progress: it is running now
                seen = await first.next_seen()
                assert seen is not None, "the stream ended before the tool ran"
                if seen.event.data and "notifications/progress" in seen.event.data:
                    break
            assert key in sdk_apps.running

            retry = Peer(dep.balancer.port, first.session_id)  # another connection
            duplicate = await retry.start("POST", body)
            assert duplicate.headers["x-upstream"] != stream.headers["x-upstream"]
            if in_progress_wait == LONG_WAIT:
                # It waited at the gate for the running call, then replayed its result.
                assert duplicate.status == 200, (duplicate.status, duplicate.body)
                replayed = await _final(retry, duplicate)
            else:
                assert duplicate.status == 409 and duplicate.reason == "in_progress", (
                    duplicate.status,
                    duplicate.body,
                )
                assert key in sdk_apps.running  # refused while the tool still ran
            result = await _final(first, stream)
            assert result["result"]["content"][0]["text"] == f"charged {key} #1", result
            if in_progress_wait == SHORT_WAIT:
                again = await retry.start("POST", body)  # retried once the answer is out
                assert again.status == 200, (again.status, again.body)
                assert again.headers["x-upstream"] != stream.headers["x-upstream"]
                replayed = await _final(retry, again)
            assert replayed == result
            deliveries = dep.posts_since(mark)
            assert len(set(deliveries)) >= 2, deliveries
            assert dep.ran_on() == [stream.headers["x-upstream"]]
            await first.close()
            await retry.close()
            await check_books(dep, key, len(deliveries) - 1, int(in_progress_wait == SHORT_WAIT))
            print(
                f"overlap: ran on {stream.headers['x-upstream']}, duplicate on "
                f"{duplicate.headers['x-upstream']} -> {duplicate.status}; deliveries {deliveries}"
            )


async def _final(peer: Peer, answer: Answer) -> dict[str, Any]:
    """The JSON-RPC response ``answer`` carries (read from its SSE stream, or its body)."""
    if not answer.sse:
        msg: dict[str, Any] = answer.json()
        return msg
    for _ in range(100):
        seen = await peer.next_seen()
        assert seen is not None, "the stream ended without the response"
        if seen.event.data:
            msg = json.loads(seen.event.data)
            if "result" in msg or "error" in msg:
                return msg
    raise AssertionError("no response in 100 events")
