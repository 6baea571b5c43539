"""Channel binding, generations and the rebind handshake (fencing), resumption
policies and replica comments (event ids), and the store's refusal (the endpoint's
other refusal reasons are checked on both runtimes in ``tests/integration/test_refusals``).

The real engine over in-memory streams, an h11 client as the peer, Trio's MockClock
(``autojump_clock``): nothing here sleeps for real.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from tests.sim.store import SimStore
from weir.engine import App, Context, MemoryStore, Server, ServerConfig, StoreUnavailable
from weir.protocol import CreditLimits
from weir.protocol.sse import SseComment, SseDecoder, SseEvent

from .helpers import H11Client, Reply, SseReply, connect, running_server

TOKEN = "mcp-channel-token"
REBIND = "weir/rebind"

app = App("channels-test")
counts: dict[str, int] = {"count": 0, "slow_started": 0, "slow_finished": 0}


@app.tool()
async def count() -> str:
    """Count executions (a non-idempotent effect)."""
    counts["count"] += 1
    return f"count {counts['count']}"


@app.tool()
async def slow(ctx: Context, seconds: int = 5) -> str:
    """Sleep, reporting progress each second; counts starts and finishes."""
    counts["slow_started"] += 1
    for i in range(seconds):
        await ctx.report_progress(i, seconds)
        await trio.sleep(1)
    counts["slow_finished"] += 1
    return f"slept {seconds}"


@app.tool()
async def chatty(ctx: Context, n: int = 6) -> str:
    """Log ``n`` messages, then answer."""
    for i in range(n):
        await ctx.info(f"line {i}")
    return f"said {n}"


# ---------------------------------------------------------------- helpers
def rpc(rid: int | str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def tool(
    rid: int | str, name: str, arguments: dict[str, Any] | None = None, progress: bool = False
) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
    if progress:
        params["_meta"] = {"progressToken": f"p{rid}"}
    return rpc(rid, "tools/call", params)


def hdrs(token: str | None = None, **extra: str) -> dict[str, str]:
    out = {k.replace("_", "-"): v for k, v in extra.items()}
    if token is not None:
        out[TOKEN] = token
    return out


def peer(client: H11Client, server: Server, nursery: trio.Nursery) -> H11Client:
    """A new connection speaking for ``client``'s session."""
    other = connect(server, nursery)
    other.session_id, other.protocol_version = client.session_id, client.protocol_version
    return other


async def open_session(
    server: Server, nursery: trio.Nursery, version: str = "2025-11-25"
) -> tuple[H11Client, str]:
    """Initialize a session; the client and the channel token it was given."""
    client = connect(server, nursery)
    init = await client.initialize(version)
    return client, init.headers[TOKEN]


def refused(reply: Reply | SseReply, status: int, reason: str) -> dict[str, Any]:
    """Assert an exact refusal; return the JSON-RPC error body."""
    assert isinstance(reply, Reply), f"expected a refusal, got a {reply.status} stream"
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["content-type"] == "application/json"
    body: dict[str, Any] = reply.json()
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["data"]["reason"] == reason, body
    return body


async def sse_messages(reply: Reply | SseReply) -> list[dict[str, Any]]:
    assert isinstance(reply, SseReply), reply
    assert reply.status == 200
    return await reply.messages()


def response_to(messages: list[dict[str, Any]], rid: int | str) -> dict[str, Any]:
    [msg] = [m for m in messages if m.get("id") == rid and "method" not in m]
    return msg


def text_of(msg: dict[str, Any]) -> str:
    out: str = msg["result"]["content"][0]["text"]
    return out


async def call_ok(
    client: H11Client, rid: int, name: str, args: dict[str, Any] | None, token: str | None
) -> tuple[list[SseEvent], dict[str, Any]]:
    """A tools/call read to its end: (every event, the response)."""
    reply = await client.post(tool(rid, name, args), hdrs(token))
    assert isinstance(reply, SseReply) and reply.status == 200, reply
    events = await reply.events()
    msgs = [json.loads(e.data) for e in events if e.data]
    return events, response_to(msgs, rid)


async def rebind(client: H11Client, rid: int | str, token: str | None) -> Reply:
    reply = await client.post(rpc(rid, REBIND), hdrs(token))
    assert isinstance(reply, Reply), reply
    return reply


@asynccontextmanager
async def server_with_store(
    store: MemoryStore, config: ServerConfig | None = None
) -> AsyncIterator[tuple[Server, trio.Nursery]]:
    async with trio.open_nursery() as nursery:
        server = Server(app, config or ServerConfig(), store=store)
        await nursery.start(partial(server.run, listen=False))
        yield server, nursery
        server.shutdown()
        await server.stopped.wait()


# ---------------------------------------------------------------- the token
async def test_initialize_issues_channel_token_and_advertises_rebind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        init = await client.initialize()
        token = init.headers[TOKEN]
        assert re.fullmatch(r"1\.[A-Za-z0-9_-]{16,}", token), token
        assert REBIND in init.json()["result"]["capabilities"]["experimental"]
        # each session gets its own secret
        _, other = await open_session(server, nursery)
        assert other.startswith("1.") and other != token


async def test_requests_without_token_keep_working(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        before = counts["count"]
        _, resp = await call_ok(client, 1, "count", None, None)
        assert text_of(resp) == f"count {before + 1}"
        ping = await sse_messages(await client.post(rpc(2, "ping")))
        assert response_to(ping, 2)["result"] == {}
        # a stream issued without a token is resumed without a token
        finished = counts["slow_finished"]
        reply = await peer(client, server, nursery).post(tool(3, "slow", {"seconds": 2}))
        assert isinstance(reply, SseReply) and reply.status == 200
        [priming] = await reply.next_batch()
        assert priming.data == "" and priming.id is not None
        await reply.client.stream.aclose()  # the client vanishes mid-call
        await trio.sleep(5)
        assert counts["slow_finished"] == finished + 1
        resumed = await peer(client, server, nursery).send(
            "GET", headers={"last-event-id": priming.id}
        )
        assert text_of(response_to(await sse_messages(resumed), 3)) == "slept 2"
        # the standalone GET stream opens too
        get = await peer(client, server, nursery).send("GET")
        assert isinstance(get, SseReply) and get.status == 200
        deleted = await client.send("DELETE")
        assert isinstance(deleted, Reply) and deleted.status == 200


async def test_current_token_is_accepted_everywhere(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, token = await open_session(server, nursery)
        before = counts["count"]
        _, resp = await call_ok(client, 1, "count", None, token)
        assert text_of(resp) == f"count {before + 1}"
        ping = await sse_messages(await client.post(rpc(2, "ping"), hdrs(token)))
        assert response_to(ping, 2)["result"] == {}
        get = await peer(client, server, nursery).send("GET", headers=hdrs(token))
        assert isinstance(get, SseReply) and get.status == 200
        deleted = await client.send("DELETE", headers=hdrs(token))
        assert isinstance(deleted, Reply) and deleted.status == 200


BAD_TOKENS = [
    pytest.param("x", id="no-dot"),
    pytest.param("1.", id="no-secret"),
    pytest.param(".{secret}", id="no-generation"),
    pytest.param("abc.def", id="non-numeric"),
    pytest.param("-1.{secret}", id="negative"),
    pytest.param("1.{secret}x", id="wrong-secret"),
    pytest.param("1.nope", id="other-secret"),
    pytest.param("2.{secret}", id="future-generation"),
    pytest.param("99.nope", id="far-future"),
]


@pytest.mark.parametrize("template", BAD_TOKENS)
async def test_bad_token_is_channel_unbound_and_nothing_runs(
    template: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_server(app) as (server, nursery):
        client, good = await open_session(server, nursery)
        bad = template.format(secret=good.partition(".")[2])
        before = dict(counts)
        # a lone tools/call (checked in the store's begin_call)
        refused(await client.post(tool(1, "count"), hdrs(bad)), 409, "channel_unbound")
        # a batch with a tools/call (checked before dispatch), at 2025-03-26
        client.protocol_version = "2025-03-26"
        batch = [rpc(2, "ping"), tool(3, "count")]
        refused(await client.post(batch, hdrs(bad)), 409, "channel_unbound")
        client.protocol_version = "2025-11-25"
        refused(await client.post(rpc(4, "ping"), hdrs(bad)), 409, "channel_unbound")
        refused(await client.post(tool(5, "slow"), hdrs(bad)), 409, "channel_unbound")
        refused(await client.send("GET", headers=hdrs(bad)), 409, "channel_unbound")
        refused(await client.send("DELETE", headers=hdrs(bad)), 409, "channel_unbound")
        await trio.sleep(10)
        assert counts == before  # nothing was dispatched
        # the session is untouched: still generation 1, still served, ids 1 and 3 free
        _, resp = await call_ok(client, 1, "count", None, good)
        assert text_of(resp) == f"count {before['count'] + 1}"
        _, resp = await call_ok(client, 3, "count", None, None)
        assert text_of(resp) == f"count {before['count'] + 2}"
        # Rebinding needs the current token: a bad one, or none, proves nothing and
        # must not fence the owner ...
        refused(await rebind(client, 7, bad), 409, "channel_unbound")
        refused(await rebind(client, 6, None), 409, "channel_unbound")
        # ... the owner's own token may (and afterwards generation 1 is fenced).
        again = await rebind(client, 8, good)
        assert again.status == 200 and again.json()["result"]["generation"] == 2
        refused(await rebind(client, 9, good), 409, "cursor_stale")


@pytest.mark.parametrize("bad", ["x", "1.", ".s", "abc.def"])
async def test_malformed_token_refusal_names_the_request_id(
    bad: str, autojump_clock: trio.testing.MockClock
) -> None:
    # "Error bodies": the JSON-RPC error carries ``id`` when it is known.
    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        body = refused(await client.post(tool(7, "count"), hdrs(bad)), 409, "channel_unbound")
        assert body["id"] == 7
        body = refused(await client.post(rpc(8, "ping"), hdrs(bad)), 409, "channel_unbound")
        assert body["id"] == 8


async def test_wrong_secret_refusal_names_the_request_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        body = refused(await client.post(tool(7, "count"), hdrs("1.nope")), 409, "channel_unbound")
        assert body["id"] == 7 and body["error"]["code"] == -32000
        body = refused(await client.post(rpc(8, "ping"), hdrs("1.nope")), 409, "channel_unbound")
        assert body["id"] == 8


# ---------------------------------------------------------------- rebind
async def test_rebind_rotates_token_fences_old_generation_and_returns_finished_results(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, gen1 = await open_session(server, nursery)
        _, first = await call_ok(client, 1, "count", None, gen1)
        reply = await rebind(client, "rb-1", gen1)
        assert reply.status == 200
        assert reply.headers["content-type"] == "application/json"
        assert reply.headers["mcp-session-id"] == client.session_id
        body = reply.json()
        assert body["id"] == "rb-1"
        result = body["result"]
        assert result["generation"] == 2
        gen2 = result["channelToken"]
        assert re.fullmatch(r"2\.[A-Za-z0-9_-]{16,}", gen2), gen2
        assert gen2.partition(".")[2] != gen1.partition(".")[2]
        assert reply.headers[TOKEN] == gen2
        assert result["results"] == [first]  # the responses of calls already finished

        before = dict(counts)
        for stale in (gen1, "1.nope"):  # generation 1, whatever the secret
            refused(await client.post(tool(2, "count"), hdrs(stale)), 409, "cursor_stale")
            refused(await client.post(rpc(3, "ping"), hdrs(stale)), 409, "cursor_stale")
            refused(await client.send("GET", headers=hdrs(stale)), 409, "cursor_stale")
            refused(await client.send("DELETE", headers=hdrs(stale)), 409, "cursor_stale")
            refused(await rebind(client, 4, stale), 409, "cursor_stale")
        assert counts == before

        _, second = await call_ok(client, 2, "count", None, gen2)
        assert text_of(second) == f"count {before['count'] + 1}"
        get = await peer(client, server, nursery).send("GET", headers=hdrs(gen2))
        assert isinstance(get, SseReply) and get.status == 200
        # and again: generation 3 fences generation 2
        third = await rebind(client, 5, gen2)
        assert third.status == 200
        gen3 = third.json()["result"]["channelToken"]
        assert gen3.startswith("3.") and third.json()["result"]["generation"] == 3
        assert first in third.json()["result"]["results"]
        assert second in third.json()["result"]["results"]
        refused(await client.post(rpc(6, "ping"), hdrs(gen2)), 409, "cursor_stale")
        refused(
            await client.post(rpc(6, "ping"), hdrs("2." + gen3.partition(".")[2])),
            409,
            "cursor_stale",
        )
        pong = await sse_messages(await client.post(rpc(6, "ping"), hdrs(gen3)))
        assert response_to(pong, 6)["result"] == {}


async def test_rebind_never_inherits_pending_effects(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, gen1 = await open_session(server, nursery)
        started, finished = counts["slow_started"], counts["slow_finished"]
        t0 = trio.current_time()
        old = await client.post(tool(1, "slow", {"seconds": 5}, progress=True), hdrs(gen1))
        assert isinstance(old, SseReply) and old.status == 200
        seen = await old.next_batch()
        while not any(e.data and "progress" in e.data for e in seen):
            seen += await old.next_batch()
        priming = seen[0]
        assert priming.data == "" and priming.id is not None
        await trio.sleep(1.5)

        rb = await rebind(peer(client, server, nursery), 2, gen1)
        assert rb.status == 200
        gen2 = rb.json()["result"]["channelToken"]
        assert rb.json()["result"]["results"] == []  # nothing had finished yet
        # The generation-1 stream ends at once, without the call's result.
        seen += await old.events()
        assert old.ended
        assert trio.current_time() - t0 < 5
        old_msgs = [json.loads(e.data) for e in seen if e.data]
        assert not any(m.get("id") == 1 for m in old_msgs)
        assert counts["slow_started"] == started + 1  # the rebind did not re-execute it

        # The call itself runs to completion once (disconnection is not cancellation),
        # but its result never reaches the fenced stream.
        await trio.sleep(10)
        assert counts["slow_started"] == started + 1
        assert counts["slow_finished"] == finished + 1
        assert b'"id":1,' not in old.raw and b'"id": 1,' not in old.raw

        # Its cursor is not a continuation on either side of the rebind.
        cursor = priming.id
        other = peer(client, server, nursery)
        refused(
            await other.send("GET", headers=hdrs(gen1, last_event_id=cursor)), 409, "cursor_stale"
        )
        refused(
            await other.send("GET", headers=hdrs(gen2, last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        refused(await other.send("GET", headers={"last-event-id": cursor}), 409, "channel_unbound")

        # Same JSON-RPC id on the new channel: the gate replays, nothing re-executes.
        same = tool(1, "slow", {"seconds": 5}, progress=True)
        replayed = await peer(client, server, nursery).post(same, hdrs(gen2))
        assert text_of(response_to(await sse_messages(replayed), 1)) == "slept 5"
        assert counts["slow_started"] == started + 1
        # A fresh id executes once more -- only because the client asked.
        _, fresh = await call_ok(peer(client, server, nursery), 3, "slow", {"seconds": 1}, gen2)
        assert text_of(fresh) == "slept 1"
        assert counts["slow_started"] == started + 2
        assert counts["slow_finished"] == finished + 2
        # The explicit handshake hands back what was produced meanwhile.
        rb3 = await rebind(peer(client, server, nursery), 4, gen2)
        ids = [r["id"] for r in rb3.json()["result"]["results"]]
        assert 1 in ids and 3 in ids


async def test_rebind_aborts_every_older_stream_and_tokenless_clients_carry_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, gen1 = await open_session(server, nursery)
        listener = peer(client, server, nursery)
        get = await listener.send("GET", headers=hdrs(gen1))
        assert isinstance(get, SseReply) and get.status == 200
        rb = await rebind(client, 1, gen1)
        assert rb.status == 200
        await get.events()
        assert get.ended  # the generation-1 GET stream was ended by the rebind
        gen2 = rb.json()["result"]["channelToken"]
        again = await peer(client, server, nursery).send("GET", headers=hdrs(gen2))
        assert isinstance(again, SseReply) and again.status == 200
        # a standard client (no token) is served unchanged after the rebind
        _, resp = await call_ok(peer(client, server, nursery), 2, "count", None, None)
        assert text_of(resp).startswith("count ")


async def test_get_after_rebind_opens_a_live_stream_of_the_new_generation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, gen1 = await open_session(server, nursery)
        first = await peer(client, server, nursery).send("GET", headers=hdrs(gen1))
        assert isinstance(first, SseReply) and first.status == 200
        [old_priming] = await first.next_batch()
        rb = await rebind(client, 1, gen1)
        gen2 = rb.json()["result"]["channelToken"]
        await first.events()
        assert first.ended  # the generation-1 GET stream is fenced
        # The client opens its GET stream again under generation 2: it must be a
        # new, live stream (primed, with a fresh epoch), not the fenced one.
        second = await peer(client, server, nursery).send("GET", headers=hdrs(gen2))
        assert isinstance(second, SseReply) and second.status == 200
        got: list[SseEvent] = []
        with trio.move_on_after(30):
            got = await second.next_batch()
        assert not second.ended, "the new GET stream ended at once"
        assert [e.data for e in got] == [""]
        assert (got[0].id or "").split(":")[0] != (old_priming.id or "").split(":")[0]


# ---------------------------------------------------------------- cursor binding
async def test_cursor_is_bound_to_the_channel_it_was_issued_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, gen1 = await open_session(server, nursery)
        events, resp = await call_ok(client, 1, "count", None, gen1)
        cursor = events[0].id
        assert events[0].data == "" and cursor is not None
        before = dict(counts)

        refused(await client.send("GET", headers={"last-event-id": cursor}), 409, "channel_unbound")
        wrong = "1.nope"
        refused(
            await client.send("GET", headers=hdrs(wrong, last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        # presented with its own current token: a continuation
        replay = await client.send("GET", headers=hdrs(gen1, last_event_id=cursor))
        assert response_to(await sse_messages(replay), 1) == resp

        rb = await rebind(client, 2, gen1)
        gen2 = rb.json()["result"]["channelToken"]
        refused(
            await client.send("GET", headers=hdrs(gen1, last_event_id=cursor)),
            409,
            "cursor_stale",
        )
        refused(
            await client.send("GET", headers=hdrs(gen2, last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        refused(await client.send("GET", headers={"last-event-id": cursor}), 409, "channel_unbound")
        assert counts == before  # no refusal re-executed anything

        # a cursor issued under generation 2 continues under generation 2 only
        events2, resp2 = await call_ok(client, 3, "count", None, gen2)
        cursor2 = events2[0].id
        assert cursor2 is not None
        replay2 = await client.send("GET", headers=hdrs(gen2, last_event_id=cursor2))
        assert response_to(await sse_messages(replay2), 3) == resp2
        refused(
            await client.send("GET", headers={"last-event-id": cursor2}), 409, "channel_unbound"
        )


async def test_tokenless_cursor_presented_with_a_token_is_unbound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client, gen1 = await open_session(server, nursery)
        events, resp = await call_ok(client, 1, "count", None, None)
        cursor = events[0].id
        assert cursor is not None
        # A standard (token-less) client resumes its own cursor as usual.
        replay = await client.send("GET", headers={"last-event-id": cursor})
        assert response_to(await sse_messages(replay), 1) == resp
        # The token-less cursor presented with a token is another channel's ...
        refused(
            await client.send("GET", headers=hdrs(gen1, last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        # ... and once the session's token has been presented, a session id alone no
        # longer opens its streams: whoever holds the token is the client now.
        refused(await client.send("GET", headers={"last-event-id": cursor}), 409, "channel_unbound")
        refused(await client.send("GET"), 409, "channel_unbound")
        refused(await client.send("DELETE"), 409, "channel_unbound")
        rb = await rebind(client, 2, gen1)
        gen2 = rb.json()["result"]["channelToken"]
        refused(
            await client.send("GET", headers=hdrs(gen2, last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        deleted = await client.send("DELETE", headers=hdrs(gen2))
        assert isinstance(deleted, Reply) and deleted.status == 200


# ---------------------------------------------------------------- resumption policies
# (``off`` is checked on both runtimes in ``tests/integration/test_resume_off``.)
def test_unknown_resume_policy_is_refused_at_configuration() -> None:
    with pytest.raises(ValueError, match=r"resume must be one of shared, pinned, off.*'bogus'"):
        ServerConfig(resume="bogus")
    for policy in ("shared", "pinned", "off"):
        assert ServerConfig(resume=policy).resume == policy


async def test_resume_pinned_replays_locally_and_fails_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(resume="pinned", credit=CreditLimits(frames=3), max_stream_events=3)
    async with running_server(app, config) as (server, nursery):
        client, token = await open_session(server, nursery)
        events, resp = await call_ok(client, 1, "chatty", {"n": 6}, token)
        ids = [e.id or "" for e in events]
        assert len(ids) == 8 and all(ids)  # priming, 6 lines, the response
        epoch = ids[0].split(":")[0]
        # in the buffer: exactly the events after the cursor
        replay = await client.send("GET", headers=hdrs(token, last_event_id=ids[-2]))
        assert isinstance(replay, SseReply) and replay.status == 200
        tail = await replay.events()
        assert [e.id for e in tail] == [ids[-1]]
        assert json.loads(tail[0].data) == resp
        # dropped from the buffer, never sent, or another stream: fail closed, never from head
        for cursor in (ids[0], ids[2], f"{epoch}:8", f"{epoch}:99", "ffffffff:0"):
            refused(
                await client.send("GET", headers=hdrs(token, last_event_id=cursor)),
                409,
                "cursor_unknown",
            )
        # a tokenless session resumes under pinned too
        plain, _ = await open_session(server, nursery)
        events, resp = await call_ok(plain, 1, "count", None, None)
        again = await plain.send("GET", headers={"last-event-id": events[0].id or ""})
        assert response_to(await sse_messages(again), 1) == resp


# ---------------------------------------------------------------- replica comments
def assert_each_event_announced(raw: bytes, replica: str) -> list[SseEvent]:
    items = SseDecoder().feed(raw)
    events = [i for i in items if isinstance(i, SseEvent)]
    assert events, raw
    for i, item in enumerate(items):
        if isinstance(item, SseEvent):
            assert i > 0 and items[i - 1] == SseComment(text=f"replica={replica}"), (i, items)
    comments = [i for i in items if isinstance(i, SseComment)]
    assert len(comments) == len(events)
    return events


async def test_replica_comment_precedes_every_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(replica_id="r-test")
    async with running_server(app, config) as (server, nursery):
        assert server.replica_id == "r-test"
        client, token = await open_session(server, nursery)
        reply = await client.post(tool(1, "slow", {"seconds": 2}, progress=True), hdrs(token))
        assert isinstance(reply, SseReply)
        await reply.events()
        events = assert_each_event_announced(bytes(reply.raw), "r-test")
        assert len(events) == 4  # priming, two progress notifications, the response
        # a replay is announced the same way
        replay = await client.send("GET", headers=hdrs(token, last_event_id=events[0].id or ""))
        assert isinstance(replay, SseReply)
        await replay.events()
        assert len(assert_each_event_announced(bytes(replay.raw), "r-test")) == 3
        # the standalone GET stream's priming event
        get = await peer(client, server, nursery).send("GET", headers=hdrs(token))
        assert isinstance(get, SseReply)
        await get.next_batch()
        assert len(assert_each_event_announced(bytes(get.raw), "r-test")) == 1
        # the 2024-11-05 stream's endpoint event
        legacy = await connect(server, nursery).send("GET", target="/sse")
        assert isinstance(legacy, SseReply) and legacy.status == 200
        [endpoint] = await legacy.next_batch()
        assert endpoint.event == "endpoint"
        assert_each_event_announced(bytes(legacy.raw), "r-test")


async def test_resume_off_still_names_the_replica(autojump_clock: trio.testing.MockClock) -> None:
    config = ServerConfig(replica_id="r-off", resume="off")
    async with running_server(app, config) as (server, nursery):
        client, _ = await open_session(server, nursery)
        reply = await client.post(tool(1, "count"))
        assert isinstance(reply, SseReply)
        await reply.events()
        for event in assert_each_event_announced(bytes(reply.raw), "r-off"):
            assert event.id is None


# ---------------------------------------------------------------- the store's refusal
class FlakyStore(MemoryStore):
    """A memory store whose idempotency claims fail while ``down`` is set."""

    down = False

    async def begin_call(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise StoreUnavailable("store is down")
        return await super().begin_call(*args, **kwargs)


async def test_store_unavailable_fails_closed(autojump_clock: trio.testing.MockClock) -> None:
    store = FlakyStore()
    async with server_with_store(store) as (server, nursery):
        client, token = await open_session(server, nursery)
        before = counts["count"]
        store.down = True
        reply = await client.post(tool(1, "count"), hdrs(token))
        refused(reply, 503, "store_unavailable")
        assert isinstance(reply, Reply) and reply.headers["retry-after"] == "1"
        assert reply.json()["error"]["data"]["retryAfterMs"] == 1000
        await trio.sleep(5)
        assert counts["count"] == before
        store.down = False
        _, resp = await call_ok(client, 1, "count", None, token)
        assert text_of(resp) == f"count {before + 1}"


class LosesAClaimReply(SimStore):
    """Grants the next claim, then answers as if the store had timed out (the script
    ran; its reply was lost)."""

    lose_next = True

    async def begin_call(self, *args: Any, **kwargs: Any) -> Any:
        start = await super().begin_call(*args, **kwargs)
        if self.lose_next:
            self.lose_next = False
            raise StoreUnavailable("the reply was lost")
        return start


async def test_a_claim_whose_reply_was_lost_is_given_back_and_the_retry_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the cluster simulator: the store granted the claim, the replica never
    heard it and answered 503 ("nothing was executed").  The claim is given back on
    the next lease tick, so the retry runs the call -- once -- instead of waiting in
    ``in_progress`` and then being told ``interrupted`` about a call that never ran."""
    store = LosesAClaimReply()
    config = ServerConfig(replica_id="r-a", claim_lease=6.0, in_progress_wait=0.5)
    async with server_with_store(store, config) as (server, nursery):
        client, token = await open_session(server, nursery)
        before = counts["count"]
        reply = await client.post(tool(7, "count"), hdrs(token))
        refused(reply, 503, "store_unavailable")
        assert len(server._shared.unheard) == 1 and store.running_claims(0.0)
        await trio.sleep(2.5)  # one renewal tick (a third of the lease)
        assert len(server._shared.unheard) == 0 and not store.running_claims(0.0)
        _, resp = await call_ok(client, 7, "count", None, token)
        assert text_of(resp) == f"count {before + 1}"  # ran, once
        _, again = await call_ok(client, 7, "count", None, token)
        assert again == resp and counts["count"] == before + 1


async def test_a_replica_shutting_down_gives_back_a_claim_whose_reply_was_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = LosesAClaimReply()
    config = ServerConfig(replica_id="r-a", claim_lease=60.0, shutdown_grace=0.0)
    async with trio.open_nursery() as nursery:
        server = Server(app, config, store=store)
        await nursery.start(partial(server.run, listen=False))
        client, token = await open_session(server, nursery)
        refused(await client.post(tool(8, "count"), hdrs(token)), 503, "store_unavailable")
        assert store.running_claims(0.0)
        server.shutdown()  # long before the first lease tick
        await server.stopped.wait()
    assert not store.running_claims(0.0)


# ---------------------------------------------------------------- two replicas, one store
@asynccontextmanager
async def two_replicas(
    resume: str = "shared",
) -> AsyncIterator[tuple[Server, Server, trio.Nursery]]:
    store = SimStore()
    async with trio.open_nursery() as nursery:
        a = Server(app, ServerConfig(replica_id="r-a", resume=resume), store=store)
        b = Server(app, ServerConfig(replica_id="r-b", resume=resume), store=store)
        await nursery.start(partial(a.run, listen=False))
        await nursery.start(partial(b.run, listen=False))
        yield a, b, nursery
        a.shutdown()
        b.shutdown()
        await a.stopped.wait()
        await b.stopped.wait()


async def test_cross_replica_continuation_with_its_own_token(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with two_replicas() as (a, b, nursery):
        client, gen1 = await open_session(a, nursery)
        reply = await client.post(tool(1, "slow", {"seconds": 3}, progress=True), hdrs(gen1))
        assert isinstance(reply, SseReply)
        seen = await reply.next_batch()
        while len(seen) < 2:
            seen += await reply.next_batch()
        cursor = seen[1].id or ""
        assert seen[0].data == "" and "progress" in seen[1].data
        await client.stream.aclose()
        await trio.sleep(10)
        on_b = peer(client, b, nursery)
        refused(await on_b.send("GET", headers={"last-event-id": cursor}), 409, "channel_unbound")
        refused(
            await on_b.send("GET", headers=hdrs("1.nope", last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        resumed = await on_b.send("GET", headers=hdrs(gen1, last_event_id=cursor))
        assert isinstance(resumed, SseReply) and resumed.status == 200
        rest = await resumed.events()
        epoch, _, seq = cursor.partition(":")
        assert [e.id for e in rest] == [f"{epoch}:{n}" for n in range(int(seq) + 1, 5)]
        assert text_of(json.loads(rest[-1].data)) == "slept 3"
        # The event-id namespace: each replayed event names the replica that PRODUCED it (A), not
        # the one replaying it (B).
        assert_each_event_announced(bytes(resumed.raw), "r-a")


async def test_cross_replica_head_cursor_is_still_bound_to_its_channel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A cursor at the head of a stored log (here the priming event of a call whose
    # log is still empty) must be checked against the channel like any other.
    async with two_replicas() as (a, b, nursery):
        client, gen1 = await open_session(a, nursery)
        reply = await client.post(tool(1, "slow", {"seconds": 5}), hdrs(gen1))
        assert isinstance(reply, SseReply)
        [priming] = await reply.next_batch()
        cursor = priming.id or ""
        await client.stream.aclose()
        await trio.sleep(1)
        on_b = peer(client, b, nursery)
        refused(await on_b.send("GET", headers={"last-event-id": cursor}), 409, "channel_unbound")


async def test_cross_replica_final_cursor_is_bound_to_its_channel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with two_replicas() as (a, b, nursery):
        client, gen1 = await open_session(a, nursery)
        events, _ = await call_ok(client, 1, "count", None, gen1)
        final = events[-1].id or ""
        on_b = peer(client, b, nursery)
        refused(await on_b.send("GET", headers={"last-event-id": final}), 409, "channel_unbound")


async def test_cross_replica_resume_after_the_final_event_ends_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with two_replicas() as (a, b, nursery):
        client, gen1 = await open_session(a, nursery)
        events, _ = await call_ok(client, 1, "count", None, gen1)
        final = events[-1].id or ""
        # on the producing replica: nothing left, the stream ends at once
        start = trio.current_time()
        local = await peer(client, a, nursery).send("GET", headers=hdrs(gen1, last_event_id=final))
        assert isinstance(local, SseReply) and local.status == 200
        assert await local.events() == []
        assert trio.current_time() - start < 1
        # on another replica: the same
        start = trio.current_time()
        other = await peer(client, b, nursery).send("GET", headers=hdrs(gen1, last_event_id=final))
        assert isinstance(other, SseReply) and other.status == 200
        assert await other.events() == []
        assert trio.current_time() - start < 1, "a finished stream must end, not be tailed"


async def test_cross_replica_rebind_fences_the_other_replica(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with two_replicas() as (a, b, nursery):
        client, gen1 = await open_session(a, nursery)
        events, resp = await call_ok(client, 1, "count", None, gen1)
        cursor = events[1].id or ""  # the response, stored
        rb = await rebind(peer(client, b, nursery), 2, gen1)
        assert rb.status == 200
        gen2 = rb.json()["result"]["channelToken"]
        assert gen2.startswith("2.")
        before = dict(counts)
        on_a = peer(client, a, nursery)
        refused(await on_a.post(tool(3, "count"), hdrs(gen1)), 409, "cursor_stale")
        refused(await on_a.post(rpc(4, "ping"), hdrs(gen1)), 409, "cursor_stale")
        refused(await on_a.send("GET", headers=hdrs(gen1)), 409, "cursor_stale")
        refused(
            await on_a.send("GET", headers=hdrs(gen2, last_event_id=cursor)),
            409,
            "channel_unbound",
        )
        assert counts == before
        _, again = await call_ok(peer(client, a, nursery), 1, "count", None, gen2)
        assert again == resp  # the gate replays; nothing re-executes
        assert counts == before


async def test_pinned_cursor_from_another_replica_fails_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with two_replicas(resume="pinned") as (a, b, nursery):
        client, gen1 = await open_session(a, nursery)
        events, resp = await call_ok(client, 1, "chatty", {"n": 2}, gen1)
        cursor = events[0].id or ""
        refused(
            await peer(client, b, nursery).send("GET", headers=hdrs(gen1, last_event_id=cursor)),
            409,
            "cursor_unknown",
        )
        local = await peer(client, a, nursery).send("GET", headers=hdrs(gen1, last_event_id=cursor))
        assert response_to(await sse_messages(local), 1) == resp
