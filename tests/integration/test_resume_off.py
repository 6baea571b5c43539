"""``--resume off`` on both runtimes: events carry no ids, and no stream is resumed.

With resumption off a session's SSE events have no ``id:`` line, its streams open
without a priming event (an id and empty data, which only a resumption needs), and
every ``Last-Event-ID`` is refused 409 ``cursor_unknown`` (a malformed one is still
400 ``cursor_invalid``): never a replay from the head of a stream.  Each test serves
one app configured as ``weir serve --resume off`` configures it
(:mod:`tests.integration.configured`), over real loopback sockets, once per runtime;
nothing waits for a timer.  The last test is the contrast: with resumption on, a stream
opens with its priming event.
"""

from __future__ import annotations

import json
import re
from typing import Any

import trio

from tests.engine.helpers import H11Client, Reply, SseReply
from tests.integration.configured import RUNTIMES, serve_configured
from tests.integration.test_half_open_loopback import open_client
from weir.engine import App, Context, ServerConfig

app = App("resume-off")
TOKEN = "mcp-channel-token"
OFF = ServerConfig(port=0, resume="off")


@app.tool()
async def chatty(ctx: Context, n: int = 2) -> str:
    """Log ``n`` messages, then answer."""
    for i in range(n):
        await ctx.info(f"line {i}")
    return f"said {n}"


@app.tool()
async def announce(ctx: Context) -> str:
    """Tell the session's GET stream that the tool list changed."""
    ctx.changed("tools")
    return "announced"


def tool(rid: int, name: str, arguments: dict[str, Any] | None = None) -> bytes:
    params = {"name": name, "arguments": arguments or {}}
    return json.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    ).encode()


async def session(port: int) -> tuple[H11Client, str]:
    """An initialized session (2025-11-25: its streams would be primed); the client
    and its channel token."""
    client = await open_client(port)
    init = await client.initialize("2025-11-25")
    return client, init.headers[TOKEN]


async def peer(port: int, of: H11Client) -> H11Client:
    """A new connection speaking for ``of``'s session."""
    other = await open_client(port)
    other.session_id, other.protocol_version = of.session_id, of.protocol_version
    return other


async def announced_on_a_get_stream(port: int, of: H11Client, token: str) -> SseReply:
    """``of``'s session's GET stream (its head arrived), after a call of ``announce``
    on another connection has put a change notification on it."""
    get = await (await peer(port, of)).send("GET", headers={TOKEN: token})
    assert isinstance(get, SseReply) and get.status == 200, get
    said = await (await peer(port, of)).send("POST", tool(2, "announce"), {TOKEN: token})
    assert isinstance(said, SseReply) and said.status == 200, said
    await said.events()
    return get


def refused(reply: Reply | SseReply, status: int, reason: str) -> None:
    assert isinstance(reply, Reply), f"expected a refusal, got a {reply.status} stream"
    assert reply.status == status, (reply.status, reply.body)
    assert reply.json()["error"]["data"]["reason"] == reason, reply.body


@RUNTIMES
async def test_resume_off_emits_no_ids_and_no_priming(runtime: str) -> None:
    with trio.fail_after(30):
        async with serve_configured(runtime, app, OFF) as port:
            client, token = await session(port)
            reply = await client.send("POST", tool(1, "chatty", {"n": 2}), {TOKEN: token})
            assert isinstance(reply, SseReply) and reply.status == 200, reply
            events = await reply.events()
            assert not re.search(rb"(^|\n)id:", bytes(reply.raw)), bytes(reply.raw)
            assert all(e.id is None for e in events)
            assert all(e.data for e in events), "no priming event without resumption"
            messages = [json.loads(e.data) for e in events]
            assert [m["result"]["content"][0]["text"] for m in messages if "id" in m] == ["said 2"]
            # The standalone stream: its first event is the first message, without an id.
            get = await announced_on_a_get_stream(port, client, token)
            first = (await get.next_batch())[0]
            assert json.loads(first.data)["method"] == "notifications/tools/list_changed"
            assert first.id is None
            assert not re.search(rb"(^|\n)id:", bytes(get.raw)), bytes(get.raw)


@RUNTIMES
async def test_resume_off_refuses_any_cursor(runtime: str) -> None:
    with trio.fail_after(30):
        async with serve_configured(runtime, app, OFF) as port:
            client, token = await session(port)
            done = await client.send("POST", tool(1, "chatty"))
            assert isinstance(done, SseReply) and done.status == 200, done
            await done.events()
            # (without the token first: once it has been presented, it is needed)
            for headers in ({}, {TOKEN: token}):
                for cursor in ("00000001:0", "00000002:0", "ffffffff:7"):
                    get = await peer(port, client)
                    sent = await get.send("GET", headers={**headers, "last-event-id": cursor})
                    refused(sent, 409, "cursor_unknown")


@RUNTIMES
async def test_resume_off_still_calls_a_malformed_cursor_malformed(runtime: str) -> None:
    with trio.fail_after(30):
        async with serve_configured(runtime, app, OFF) as port:
            client, _ = await session(port)
            refused(
                await client.send("GET", headers={"last-event-id": "42"}), 400, "cursor_invalid"
            )


@RUNTIMES
async def test_with_resumption_on_a_standalone_stream_opens_with_a_priming_event(
    runtime: str,
) -> None:
    # The contrast to the first test, with the default resumption: a 2025-11-25 session's
    # GET stream starts with an event that has an id and empty data, before the first
    # message (without it a client that loses the stream early has no cursor to resume).
    with trio.fail_after(30):
        async with serve_configured(runtime, app, ServerConfig(port=0)) as port:
            client, token = await session(port)
            get = await announced_on_a_get_stream(port, client, token)
            events = await get.next_batch()
            for _ in range(8):  # (the two events may arrive in pieces)
                if len(events) >= 2:
                    break
                events += await get.next_batch()
            assert events[0].id is not None and events[0].data == ""
            assert json.loads(events[1].data)["method"] == "notifications/tools/list_changed"
            assert events[1].id is not None
