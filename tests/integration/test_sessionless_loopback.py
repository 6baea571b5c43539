"""The sessionless revision (2026-07-28) on real loopback sockets.

In-process servers, real TCP, real time (no ``MockClock``): what is under
test lives in the kernel (a peer's receive window, acknowledgements) or in the
server's own timers.  Each test waits for replies and events; where only the
server's timers can make a condition true it polls it, bounded in time and count.

* a streamed answer whose client stops reading holds no more than the credit, and
  the owner is torn down after the liveness timeout;
* a ``subscriptions/listen`` stream: acknowledged first, tagged, filtered, fed by
  other requests, and torn down when its client stops reading;
* closing a streamed response cancels its handler (this revision's cancellation);
* request state: a round continues with it; a tampered or another request's state
  is 400, -32602, and never runs the handler with forged answers;
* with authorization, a principal that stops reading is refused 429 on its other
  connections (its credit owner is shared by them).

Each test runs on both runtimes (the ``runtime`` fixture: the Trio engine, and the
asyncio runtime in a thread of its own, whose state is read on its own loop), except
what needs the Trio engine's epoch draws.  ``/metrics`` is read on both.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import trio

from tests.integration.rawhttp import Client, raw_request, sse_messages
from weir.app import Context
from weir.asyncio import AsyncioDriver
from weir.engine import App, Server, ServerConfig
from weir.protocol import CreditLimits, EndpointConfig
from weir.protocol.sessionless import META_SUBSCRIPTION_ID

from .configured import run_configured
from .test_asyncio_driver import running_driver
from .test_auth import jwt_authorization, token

V = "2026-07-28"
T = TypeVar("T")
DRAIN_WINDOW = 0.5
LIVENESS = 2.0
SLACK = 3.0
CREDIT = CreditLimits(
    frames=16, bytes=64 * 1024, drain_window=DRAIN_WINDOW, liveness_timeout=LIVENESS
)

app = App("sessionless-loopback")
ran: list[str] = []
unwound: list[str] = []


@app.tool()
async def bulk(size: int) -> str:
    """``size`` bytes of text."""
    return "x" * size


@app.tool()
async def slow(ctx: Context, label: str) -> str:
    """Waits an hour, recording that it started and that it unwound."""
    ran.append(label)
    try:
        await ctx.sleep(3600)
    finally:
        unwound.append(label)
    return "woke"


@app.tool()
async def greet(ctx: Context) -> str:
    """Asks the user's name, then greets them (counts each run)."""
    ran.append("greet")
    answer = await ctx.elicit("Name?", {"type": "object"}, key="name")
    return f"hello {answer.get('content', {}).get('name')}"


@app.tool()
async def touch(ctx: Context) -> str:
    """Announces that the tool list changed."""
    ctx.changed("tools")
    return "touched"


bumps: list[int] = []
finished: list[str] = []


@app.tool()
async def charge(ctx: Context, label: str) -> str:
    """Not idempotent and slow: counts its runs, finishes after 0.5 s."""
    ran.append(label)
    try:
        await ctx.sleep(0.5)
    finally:
        unwound.append(label)
    finished.append(label)
    return f"charged {label}"


@app.tool()
async def bump(by: int = 1) -> str:
    """Not idempotent: counts its runs."""
    bumps.append(by)
    return f"run {len(bumps)}"


@app.tool()
async def edit_note(ctx: Context) -> str:
    """Announces that resource note://1 changed."""
    ctx.changed("resources", uri="note://1")
    return "edited"


@app.resource("note://1", name="note", description="a resource, so that it can be watched")
def note() -> str:
    return "a note"


@app.prompt(description="a prompt, so that prompts can be listened for")
def hello() -> str:
    return "hello"


META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}


def rpc(rid: int | str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": method,
        "params": {**(params or {}), "_meta": META},
    }


def headers(message: dict[str, Any], **extra: str) -> dict[str, str]:
    out = {"mcp-protocol-version": V, "mcp-method": message["method"]}
    params = message.get("params") or {}
    if message["method"] in ("tools/call", "prompts/get"):
        out["mcp-name"] = params["name"]
    out.update(extra)
    return out


def call(
    rid: int | str, name: str, arguments: dict[str, Any] | None = None, **more: Any
) -> dict[str, Any]:
    return rpc(rid, "tools/call", {"name": name, "arguments": arguments or {}, **more})


@asynccontextmanager
async def serve_configured(config: ServerConfig | None = None) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(
            Server(app, config or ServerConfig(port=0, credit=CREDIT)).run
        )
        try:
            yield server
        finally:
            server.shutdown()
            with trio.fail_after(30):
                await server.stopped.wait()


@dataclass
class Served:
    """The app served by one runtime: its port, its open listen streams, its credit
    owners and what each holds (frames, bytes)."""

    port: int
    listeners: Callable[[], int]
    owners: Callable[[], list[Any]]
    held: Callable[[Any], tuple[int, int]]


def _on_loop(loop: asyncio.AbstractEventLoop, read: Callable[[], T]) -> T:
    """``read()`` run on the asyncio runtime's own loop (its state is that loop's)."""

    async def call() -> T:
        return read()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(5)


@pytest.fixture(params=["trio", "asyncio"])
def runtime(request: pytest.FixtureRequest) -> str:
    """The runtime serving a test that runs on both: the Trio engine, or asyncio's."""
    return str(request.param)


@asynccontextmanager
async def served_by(runtime: str) -> AsyncIterator[Served]:
    """The app on ``runtime`` with the tests' credit (a test that reads the Trio
    engine's own state uses :func:`serving`)."""
    if runtime == "asyncio":
        with running_driver(app, CREDIT) as running:
            driver, loop = running.driver, running.loop
            yield Served(
                running.port,
                lambda: _on_loop(loop, lambda: len(driver.listeners)),
                lambda: _on_loop(loop, lambda: list(driver.owners)),
                lambda o: _on_loop(
                    loop, lambda: (o.flow.credit.frames_in_use, o.flow.credit.bytes_in_use)
                ),
            )
        return
    async with serve_configured() as server:
        yield Served(
            server.port,
            lambda: len(server.subscribers),
            lambda: list(server.owners),
            lambda o: (o.credit.frames_in_use, o.credit.bytes_in_use),
        )


async def metrics_page(port: int) -> str:
    """``GET /metrics``, as text."""
    client = await Client.connect(port)
    try:
        return (await client.request("GET", "/metrics")).body.decode()
    finally:
        await client.aclose()


async def ask(port: int, message: dict[str, Any], **extra: str) -> Any:
    client = await Client.connect(port)
    try:
        return await client.request("POST", "/mcp", message, headers=headers(message, **extra))
    finally:
        await client.aclose()


async def eventually(condition: Callable[[], bool], *, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        for _ in range(math.ceil(timeout / 0.01) + 1):
            if condition():
                return True
            await trio.sleep(0.01)
    return condition()


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    unwound.clear()
    bumps.clear()
    finished.clear()


async def test_a_stalled_streamed_answer_is_bounded_then_torn_down(runtime: str) -> None:
    async with served_by(runtime) as server:
        stalled = await Client.connect(server.port, rcvbuf=4096)
        big = call(1, "bulk", {"size": CREDIT.bytes - 2000})
        await stalled.send_raw(
            raw_request("POST", "/mcp", body=json.dumps(big).encode(), headers=headers(big))
        )
        assert await eventually(lambda: bool(server.owners()), timeout=5)
        (owner,) = server.owners()
        held = []
        started = trio.current_time()
        # Another client is served meanwhile, on its own connection and credit.
        assert (await ask(server.port, call(2, "bulk", {"size": 10}))).status == 200
        held.append(server.held(owner)[1])
        assert await eventually(lambda: owner.closed, timeout=LIVENESS + SLACK)
        assert trio.current_time() - started >= LIVENESS * 0.9 - 0.1
        assert max(held) <= CREDIT.bytes
        assert server.held(owner)[1] == 0  # released with the teardown
        assert await stalled.closed_by_peer(timeout=SLACK)
        await stalled.aclose()


async def test_a_listen_stream_is_acknowledged_tagged_filtered_and_fed(runtime: str) -> None:
    async with served_by(runtime) as server:
        listen = rpc(
            "listen-1",
            "subscriptions/listen",
            {
                "notifications": {
                    "toolsListChanged": True,
                    "promptsListChanged": False,
                    "resourcesListChanged": True,
                }
            },
        )
        client = await Client.connect(server.port)
        await client.send_raw(
            raw_request("POST", "/mcp", body=json.dumps(listen).encode(), headers=headers(listen))
        )
        body = b""
        with trio.fail_after(10):
            while b"acknowledged" not in body:
                body += await client.stream.receive_some(65536)
            assert (await ask(server.port, call(1, "touch"))).status == 200
            while b"list_changed" not in body:
                body += await client.stream.receive_some(65536)
        head, _, rest = body.partition(b"\r\n\r\n")
        assert b"text/event-stream" in head.lower() and b"id:" not in rest
        messages = sse_messages(body.replace(b"\r\n", b"\n"))
        ack, changed = messages[0], messages[1]
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        # Only what was asked: prompts were not.
        assert ack["params"]["notifications"] == {
            "toolsListChanged": True,
            "resourcesListChanged": True,
        }
        assert changed["method"] == "notifications/tools/list_changed"
        for msg in (ack, changed):
            assert msg["params"]["_meta"][META_SUBSCRIPTION_ID] == "listen-1"
        await client.aclose()
        assert await eventually(lambda: not server.listeners(), timeout=SLACK)


async def test_a_listen_stream_whose_client_stops_reading_is_torn_down(runtime: str) -> None:
    async with served_by(runtime) as server:
        listen = rpc(7, "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        stalled = await Client.connect(server.port, rcvbuf=4096)
        await stalled.send_raw(
            raw_request("POST", "/mcp", body=json.dumps(listen).encode(), headers=headers(listen))
        )
        assert await eventually(lambda: bool(server.listeners()), timeout=5)
        (owner,) = server.owners()
        # Fill its credit with something else it never reads: a big answer on the same
        # owner is impossible (one request at a time), so the notices pile up instead.
        for i in range(40):
            assert (await ask(server.port, call(i, "touch"))).status == 200
            await trio.sleep(0.005)
        frames, nbytes = server.held(owner)
        assert frames <= CREDIT.frames and nbytes <= CREDIT.bytes
        metrics = await Client.connect(server.port)
        page = (await metrics.request("GET", "/metrics")).body.decode()
        await metrics.aclose()
        assert "weir_listen_streams 1" in page and "weir_sessionless_owners " in page
        assert await eventually(lambda: not server.listeners(), timeout=LIVENESS + SLACK + 2)
        await stalled.aclose()


async def test_closing_a_streamed_response_cancels_its_handler(runtime: str) -> None:
    async with served_by(runtime) as server:
        message = call(1, "slow", {"label": "a"})
        client = await Client.connect(server.port)
        await client.send_raw(
            raw_request("POST", "/mcp", body=json.dumps(message).encode(), headers=headers(message))
        )
        assert await eventually(lambda: ran == ["a"], timeout=5)
        await client.aclose()
        assert await eventually(lambda: unwound == ["a"], timeout=SLACK)


async def test_request_state_continues_a_round_and_a_forged_one_is_refused(runtime: str) -> None:
    async with served_by(runtime) as server:
        first = (await ask(server.port, call(1, "greet"))).json()["result"]
        assert first["resultType"] == "input_required"
        assert first["inputRequests"]["name"]["method"] == "elicitation/create"
        state = first["requestState"]
        answer = {"name": {"action": "accept", "content": {"name": "Ada"}}}
        done = await ask(server.port, call(2, "greet", inputResponses=answer, requestState=state))
        assert done.json()["result"]["content"][0]["text"] == "hello Ada"
        for forged, other in ((state + "-TAMPERED", "greet"), (state, "touch")):
            refused = await ask(
                server.port, call(3, other, inputResponses=answer, requestState=forged)
            )
            assert refused.status == 400
            error = refused.json()["error"]
            assert error["code"] == -32602 and error["data"]["reason"] == "request_state_invalid"
            assert refused.json()["id"] == 3
        assert ran == ["greet", "greet"]  # the forged rounds ran nothing


async def test_a_principal_that_stops_reading_is_refused_on_its_other_connections(
    runtime: str,
) -> None:
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery)
        config = ServerConfig(port=0, credit=CREDIT, auth=auth)
        async with run_configured(runtime, app, config) as server:
            alice = {"authorization": f"Bearer {token('alice')}"}
            bob = {"authorization": f"Bearer {token('bob')}"}
            stalled = await Client.connect(server.port, rcvbuf=4096)
            big = call(1, "bulk", {"size": CREDIT.bytes - 2000})
            await stalled.send_raw(
                raw_request(
                    "POST", "/mcp", body=json.dumps(big).encode(), headers={**headers(big), **alice}
                )
            )
            for _ in range(100):  # until Alice's owner holds the stalled answer (5 s)
                page = await metrics_page(server.port)
                if "\nweir_sessionless_owners 1\n" in page:
                    break
                await trio.sleep(0.05)
            assert "\nweir_sessionless_owners 1\n" in page, page
            waiting = await Client.connect(server.port)
            second = call(2, "bulk", {"size": 4000})
            await waiting.send_raw(
                raw_request(
                    "POST",
                    "/mcp",
                    body=json.dumps(second).encode(),
                    headers={**headers(second), **alice},
                )
            )
            started = trio.current_time()
            refused = None
            for _ in range(100):
                reply = await ask(server.port, call(3, "bulk", {"size": 1}), **alice)
                if reply.status == 429:
                    refused = reply
                    break
                await trio.sleep(0.05)
            assert refused is not None, "alice was never refused"
            assert trio.current_time() - started >= DRAIN_WINDOW * 0.9 - 0.1
            assert refused.reason == "stream_half_open" and "retry-after" in refused.headers
            # Another principal is untouched.
            assert (await ask(server.port, call(4, "bulk", {"size": 1}), **bob)).status == 200
            await stalled.aclose()
            await waiting.aclose()
        nursery.cancel_scope.cancel()


async def test_an_idempotency_key_makes_a_reissued_call_replay_not_run(runtime: str) -> None:
    async with served_by(runtime) as server:
        key = {"idempotency-key": "order-17"}
        first = await ask(server.port, call(1, "bump"), **key)
        # The revision's advice after a lost stream: the same request with a new id.
        again = await ask(server.port, call(2, "bump"), **key)
        assert first.json()["result"]["content"][0]["text"] == "run 1"
        assert again.json()["id"] == 2
        assert again.json()["result"]["content"] == first.json()["result"]["content"]
        assert bumps == [1]  # ran once
        other = await ask(server.port, call(3, "bump", {"by": 2}), **key)
        assert other.status == 422 and other.reason == "idempotency_key_reused"
        fresh = await ask(server.port, call(4, "bump"), **{"idempotency-key": "order-18"})
        assert fresh.json()["result"]["content"][0]["text"] == "run 2"
        unkeyed = [await ask(server.port, call(5, "bump")) for _ in range(2)]
        assert [r.status for r in unkeyed] == [200, 200] and len(bumps) == 4  # no key: no gate
        # What the metrics say: four executions (two keyed, two not), one replay.
        client = await Client.connect(server.port)
        page = (await client.request("GET", "/metrics")).body.decode()
        await client.aclose()
        assert "\nweir_tool_executions_total 4\n" in page, page
        assert '\nweir_duplicate_requests_total{outcome="replayed"} 1\n' in page, page


async def test_a_keyed_call_that_asks_for_input_is_not_its_outcome_yet(runtime: str) -> None:
    async with served_by(runtime) as server:
        key = {"idempotency-key": "greet-1"}
        first = (await ask(server.port, call(1, "greet"), **key)).json()["result"]
        assert first["resultType"] == "input_required"
        answer = {"name": {"action": "accept", "content": {"name": "Ada"}}}
        round2 = call(2, "greet", inputResponses=answer, requestState=first["requestState"])
        done = await ask(server.port, round2, **key)
        assert done.json()["result"]["content"][0]["text"] == "hello Ada"
        round2["id"] = 3
        replayed = await ask(server.port, round2, **key)  # the last round, re-issued
        assert replayed.json()["result"]["content"] == done.json()["result"]["content"]
        assert ran == ["greet", "greet"]
        # The handler's two runs, by outcome (the replay ran nothing).
        client = await Client.connect(server.port)
        page = (await client.request("GET", "/metrics")).body.decode()
        await client.aclose()
        for outcome in ("input_required", "ok"):
            line = f'\nweir_tool_calls_total{{tool="greet",outcome="{outcome}"}} 1\n'
            assert line in page, page


async def test_a_keyed_call_outlives_a_lost_stream_and_its_reissue_replays(runtime: str) -> None:
    async with served_by(runtime) as server:
        key = {"idempotency-key": "pay-1"}
        message = call(1, "charge", {"label": "p"})
        client = await Client.connect(server.port)
        body = json.dumps(message).encode()
        await client.send_raw(
            raw_request("POST", "/mcp", body=body, headers=headers(message, **key))
        )
        assert await eventually(lambda: ran == ["p"], timeout=5)
        await client.aclose()  # the stream is lost mid-call
        # The client issues it again with a new id and the same key, at once.
        again = await ask(server.port, call(2, "charge", {"label": "p"}), **key)
        assert again.status == 200 and again.json()["id"] == 2
        assert again.json()["result"]["content"][0]["text"] == "charged p"
        assert ran == ["p"] and finished == ["p"]  # ran once, to its end


async def test_a_watched_resource_update_reaches_its_listener_only(runtime: str) -> None:
    async with served_by(runtime) as server:
        listen = rpc(
            "watch",
            "subscriptions/listen",
            {"notifications": {"resourceSubscriptions": ["note://1", "note://2"]}},
        )
        client = await Client.connect(server.port)
        body = json.dumps(listen).encode()
        await client.send_raw(raw_request("POST", "/mcp", body=body, headers=headers(listen)))
        seen = b""
        with trio.fail_after(10):
            while b"acknowledged" not in seen:
                seen += await client.stream.receive_some(65536)
            assert (await ask(server.port, call(1, "touch"))).status == 200  # not asked for
            assert (await ask(server.port, call(2, "edit_note"))).status == 200
            while b"resources/updated" not in seen:
                seen += await client.stream.receive_some(65536)
        messages = sse_messages(seen.replace(b"\r\n", b"\n"))
        assert messages[0]["params"]["notifications"] == {
            "resourceSubscriptions": ["note://1", "note://2"]
        }
        assert [m["method"] for m in messages[1:]] == ["notifications/resources/updated"]
        assert messages[1]["params"]["uri"] == "note://1"
        assert messages[1]["params"]["_meta"][META_SUBSCRIPTION_ID] == "watch"
        await client.aclose()
        # A listener that hangs up is the connection's business, not the server's.
        assert await eventually(lambda: not server.listeners(), timeout=SLACK)
        assert (await ask(server.port, call(3, "touch"))).status == 200


def test_a_retry_window_is_refused_without_authorization() -> None:
    """Without authorization every client is one principal: a retry window would answer
    one client with another's result (the window itself is tested with authorization
    in ``test_request_identity``)."""
    with pytest.raises(ValueError, match="retry_window needs authorization"):
        ServerConfig(port=0, credit=CREDIT, retry_window=30.0)
    with pytest.raises(ValueError, match="retry_window"):
        ServerConfig(retry_window=-1)
    with pytest.raises(ValueError, match="retry_window needs authorization"):
        AsyncioDriver(app, EndpointConfig(), retry_window=30.0)  # (the asyncio runtime's)


async def test_an_answer_streams_epoch_already_in_use_is_drawn_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A streamed answer's epoch is four random bytes, and its owner keeps finished
    streams: a draw equal to one in use (rare, but certain over a busy principal's
    life) is drawn again -- the request is answered, not failed."""
    real = secrets.token_hex
    draws = iter(["deadbeef", "deadbeef"])

    def token_hex(n: int | None = None) -> str:
        return next(draws, None) or real(n) if n == 4 else real(n)

    async with serve_configured() as server:
        monkeypatch.setattr(secrets, "token_hex", token_hex)  # (the server has its ids)
        client = await Client.connect(server.port)
        try:
            for rid in (1, 2):
                message = call(rid, "greet")
                reply = await client.request("POST", "/mcp", message, headers=headers(message))
                assert reply.status == 200, (reply.status, reply.body[:300])
                assert "text/event-stream" in reply.headers["content-type"], reply.headers
        finally:
            await client.aclose()


async def test_both_runtimes_answer_alike() -> None:
    """The same requests get the same status and the same bytes from both runtimes:
    what the answers say is the core's and ``weir.common``'s, not a runtime's."""
    bare = {"io.modelcontextprotocol/protocolVersion": V}  # declares no capability
    asks: list[dict[str, Any]] = [
        rpc(1, "server/discover"),
        rpc(2, "tools/list"),
        rpc(3, "prompts/get", {"name": "hello"}),
        rpc(4, "ping"),
        rpc(5, "initialize"),
        call(6, "greet", requestState="w1.forged"),
        {**call(7, "greet"), "params": {"name": "greet", "arguments": {}, "_meta": bare}},
        call(8, "bulk", {"size": "not a number"}),
        rpc(9, "resources/read", {"uri": "note://nope"}),
    ]
    answers: dict[str, list[tuple[int, bytes]]] = {}
    for runtime in ("trio", "asyncio"):
        async with served_by(runtime) as server:
            got = answers[runtime] = []
            for message in asks:
                extra = {"mcp-name": "note://nope"} if message["method"] == "resources/read" else {}
                reply = await ask(server.port, message, **extra)
                got.append((reply.status, reply.body))
    for message, on_trio, on_asyncio in zip(asks, answers["trio"], answers["asyncio"], strict=True):
        assert on_trio == on_asyncio, (message["method"], on_trio, on_asyncio)
    assert [status for status, _ in answers["trio"]] == [
        200,
        200,
        200,
        404,
        404,
        400,
        400,
        200,
        200,
    ]
