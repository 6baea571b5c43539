"""Driver tests: the real engine over in-memory streams, an h11 client as the peer.

Time is Trio's MockClock (``autojump_clock``): timeouts and sleeps cost no real time
and ``trio.current_time()`` is exact.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from weir.engine import App, Context, ServerConfig, ToolError

from .helpers import BATCH_2025_03_26, H11Client, Reply, SseReply, connect, running_server

app = App("driver-test")
calls: dict[str, int] = {"slow": 0, "finished": 0}


@app.tool()
async def echo(text: str) -> str:
    """Echo."""
    return text


@app.tool()
async def slow(ctx: Context, seconds: int = 3) -> str:
    """Sleep, reporting progress each second."""
    calls["slow"] += 1
    for i in range(seconds):
        await ctx.report_progress(i, seconds)
        await trio.sleep(1)
    calls["finished"] += 1
    return f"slept {seconds}"


@app.tool()
async def poll(ctx: Context) -> str:
    """Close the stream early, then answer."""
    await ctx.info("before close")
    ctx.close_stream(retry_ms=250)
    await trio.sleep(1)
    await ctx.info("after close")
    return "done after reconnect"


@app.tool()
async def ask(ctx: Context) -> str:
    """Ask the client's model."""
    result = await ctx.sample(
        [{"role": "user", "content": {"type": "text", "text": "hi"}}], max_tokens=5
    )
    return "model said " + str(result["content"]["text"])


@app.tool()
async def broken() -> str:
    """Fail."""
    raise ToolError("nope")


@app.resource("test://crash", description="raises")
def crash() -> str:
    raise RuntimeError("boom")


def result_of(messages: list[dict[str, Any]], request_id: int) -> dict[str, Any]:
    [msg] = [m for m in messages if m.get("id") == request_id]
    return msg


async def test_initialize_and_call_over_sse(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        init = await client.initialize()
        assert init.json()["result"]["serverInfo"] == {"name": "driver-test", "version": "0.1.0"}
        assert client.session_id and all("!" <= c <= "~" for c in client.session_id)
        reply = await client.call(1, "echo", {"text": "hello"})
        assert reply.status == 200 and reply.headers["mcp-session-id"] == client.session_id
        events = await reply.events()
        assert events[0].data == "" and events[0].id is not None  # priming event
        assert result_of([m for m in map(_json, events[1:])], 1)["result"] == {
            "content": [{"type": "text", "text": "hello"}]
        }
        # keep-alive: the same connection serves the next request
        again = await client.call(2, "echo", {"text": "again"})
        assert result_of(await again.messages(), 2)["result"]["content"][0]["text"] == "again"


def _json(e: Any) -> dict[str, Any]:
    import json

    out: dict[str, Any] = json.loads(e.data)
    return out


async def test_event_ids_are_epoch_seq_and_unique_per_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        ids: list[str] = []
        for rid in range(1, 4):
            ids += [
                e.id or "" for e in await (await client.call(rid, "echo", {"text": "x"})).events()
            ]
        epochs = [i.split(":")[0] for i in ids]
        assert all(len(e) == 8 and int(e, 16) >= 0 for e in epochs)
        assert len(set(ids)) == len(ids)  # unique across the session's streams
        assert len(set(epochs)) == 3  # one epoch per stream


async def test_progress_precedes_result_and_timing_is_exact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        start = trio.current_time()
        msgs = await (
            await client.call(1, "slow", {"seconds": 3}, meta={"progressToken": 7})
        ).messages()
        assert trio.current_time() - start == pytest.approx(3.0)
        assert [m["params"]["progress"] for m in msgs[:-1]] == [0, 1, 2]
        assert all(m["params"]["progressToken"] == 7 for m in msgs[:-1])
        assert msgs[-1]["id"] == 1 and msgs[-1]["result"]["content"][0]["text"] == "slept 3"


async def test_cancelled_notification_cancels_the_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        before = dict(calls)
        reply = await client.call(1, "slow", {"seconds": 100})
        other = connect(server, nursery)
        other.session_id, other.protocol_version = client.session_id, client.protocol_version
        await trio.sleep(5)
        ack = await other.post(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 1, "reason": "test"},
            }
        )
        assert isinstance(ack, Reply) and ack.status == 202
        msgs = await reply.messages()
        assert trio.current_time() < 10
        assert not any("id" in m for m in msgs)  # no response after cancellation
        assert calls["slow"] == before["slow"] + 1 and calls["finished"] == before["finished"]


def rpc(rid: int, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def test_a_cancelled_call_is_never_run_again_under_its_key(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the cluster simulator: a client that gave up on a call (its own
    timeout: weir's client then sends ``notifications/cancelled``) and re-issued it
    with the same ``Idempotency-Key`` got a second execution -- the cancelled call
    had given its key back though its handler ran.  It is now stored as the
    ``cancelled`` error: the re-issue is told so, and the tool ran once."""
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        before = dict(calls)
        call = {"name": "slow", "arguments": {"seconds": 100}}
        keyed = {"idempotency-key": "pay-7"}
        first = await client.send(
            "POST",
            json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
            ).encode(),
            keyed,
        )
        other = connect(server, nursery)
        other.session_id, other.protocol_version = client.session_id, client.protocol_version
        await trio.sleep(5)
        cancel = {"requestId": 1, "reason": "gave up"}
        await other.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
        assert isinstance(first, SseReply) and not any("id" in m for m in await first.messages())
        again = await other.send(
            "POST",
            json.dumps(
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
            ).encode(),
            keyed,
        )
        msgs = await again.messages() if isinstance(again, SseReply) else [again.json()]
        [answer] = [m for m in msgs if "id" in m]
        assert answer["error"]["data"]["reason"] == "cancelled", answer
        assert calls["slow"] == before["slow"] + 1  # ran once, not again


async def test_server_closes_stream_early_and_client_resumes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        reply = await client.call(1, "poll")
        first = await reply.events()
        assert reply.ended and first[-1].retry is None
        assert b"retry: 250" in reply.raw
        cursor = first[-1].id
        assert cursor is not None
        resumed = await client.send("GET", headers={"last-event-id": cursor})
        assert isinstance(resumed, SseReply) and resumed.status == 200
        rest = await resumed.events()
        texts = [_json(e) for e in rest]
        assert texts[0]["params"]["data"] == "after close"
        assert texts[-1]["result"]["content"][0]["text"] == "done after reconnect"
        seqs = [int((e.id or "").split(":")[1]) for e in first + rest]
        assert seqs == list(range(len(seqs)))  # no gap, no duplicate


async def test_disconnect_is_not_cancellation_and_result_is_replayable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        before = calls["finished"]
        reply = await client.call(1, "slow", {"seconds": 2})
        [priming] = await reply.next_batch()
        await client.stream.aclose()  # the client vanishes mid-call
        await trio.sleep(5)
        assert calls["finished"] == before + 1  # the handler ran to completion
        second = connect(server, nursery)
        second.session_id, second.protocol_version = client.session_id, client.protocol_version
        resumed = await second.send("GET", headers={"last-event-id": priming.id or ""})
        assert isinstance(resumed, SseReply)
        assert (await resumed.messages())[-1]["result"]["content"][0]["text"] == "slept 2"


@pytest.mark.parametrize(
    ("cursor", "status", "reason"),
    [
        ("42", 400, "cursor_invalid"),
        ("0000000g:1", 400, "cursor_invalid"),
        ("ffffffff:0", 409, "cursor_unknown"),
    ],
)
async def test_bad_cursors_fail_closed(
    cursor: str, status: int, reason: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        reply = await client.send("GET", headers={"last-event-id": cursor})
        assert isinstance(reply, Reply) and reply.status == status
        assert reply.json()["error"]["data"]["reason"] == reason


async def test_cursor_beyond_head_is_unknown(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        events = await (await client.call(1, "echo", {"text": "x"})).events()
        epoch = (events[0].id or "").split(":")[0]
        reply = await client.send("GET", headers={"last-event-id": f"{epoch}:99"})
        assert isinstance(reply, Reply) and reply.status == 409
        assert reply.json()["error"]["data"]["reason"] == "cursor_unknown"


async def test_second_get_stream_conflicts(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        first = await client.send("GET")
        assert isinstance(first, SseReply) and first.status == 200
        other = connect(server, nursery)
        other.session_id, other.protocol_version = client.session_id, client.protocol_version
        second = await other.send("GET")
        assert isinstance(second, Reply) and second.status == 409
        assert second.json()["error"]["data"]["reason"] == "stream_conflict"


async def test_sampling_round_trip(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        reply = await client.call(1, "ask")
        request: dict[str, Any] = {}
        while "method" not in request:
            for e in await reply.next_batch():
                if e.data:
                    request = _json(e)
        assert request["method"] == "sampling/createMessage"
        answerer = connect(server, nursery)
        answerer.session_id, answerer.protocol_version = client.session_id, client.protocol_version
        ack = await answerer.post(
            {
                "jsonrpc": "2.0",
                "id": request["id"],
                "result": {
                    "role": "assistant",
                    "content": {"type": "text", "text": "bonjour"},
                    "model": "m",
                },
            }
        )
        assert isinstance(ack, Reply) and ack.status == 202
        assert (await reply.messages())[-1]["result"]["content"][0]["text"] == "model said bonjour"


async def test_delete_ends_session(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        deleted = await client.send("DELETE")
        assert isinstance(deleted, Reply) and deleted.status == 200
        after = await client.post({"jsonrpc": "2.0", "id": 5, "method": "ping"})
        assert isinstance(after, Reply) and after.status == 404
        body = after.json()
        assert body["id"] == 5 and body["error"]["data"]["reason"] == "session_not_found"


async def test_missing_and_unknown_sessions(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        missing = await client.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert isinstance(missing, Reply) and missing.status == 400
        assert missing.json()["error"]["data"]["reason"] == "session_required"
        client.session_id = "no-such-session"
        unknown = await client.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert isinstance(unknown, Reply) and unknown.status == 404


async def test_errors_are_clean(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        msgs = await (await client.call(1, "broken")).messages()
        assert msgs[-1]["result"] == {
            "content": [{"type": "text", "text": "nope"}],
            "isError": True,
        }
        bad_args = await (await client.call(2, "echo", {"text": 5})).messages()
        assert bad_args[-1]["result"]["isError"] is True
        unknown = await client.post({"jsonrpc": "2.0", "id": 3, "method": "no/such"})
        assert isinstance(unknown, SseReply)
        assert (await unknown.messages())[-1]["error"]["code"] == -32601
        crash = await client.post(
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "resources/read",
                "params": {"uri": "test://crash"},
            }
        )
        assert isinstance(crash, SseReply)
        assert (await crash.messages())[-1]["error"]["code"] == -32603
        garbage = await client.send("POST", b"{not json")
        assert isinstance(garbage, Reply) and garbage.status == 400
        assert garbage.json()["error"]["code"] == -32700
        # and the server still answers
        assert (await (await client.call(5, "echo", {"text": "ok"})).messages())[-1]["id"] == 5


async def test_json_response_mode(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app, ServerConfig(json_response=True)) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        reply = await client.post(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "j"}},
            }
        )
        assert isinstance(reply, Reply) and reply.headers["content-type"] == "application/json"
        assert reply.json()["result"]["content"][0]["text"] == "j"


async def test_batch_at_2025_03_26(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize("2025-03-26")
        reply = await client.post(BATCH_2025_03_26)
        assert isinstance(reply, SseReply)
        events = await reply.events()
        assert all(e.data for e in events)  # no priming event below 2025-11-25
        assert sorted(_json(e)["id"] for e in events) == [1, 2]
        client.protocol_version = "2025-06-18"
        refused = await client.post([{"jsonrpc": "2.0", "id": 3, "method": "ping"}])
        assert isinstance(refused, Reply) and refused.status == 400
        assert refused.json()["error"]["data"]["reason"] == "batch_not_supported"


async def test_idle_keepalive_connection_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app, ServerConfig(keepalive_timeout=30)) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        start = trio.current_time()
        assert await client.stream.receive_some(100) == b""  # server closed it
        assert trio.current_time() - start == pytest.approx(30)


async def test_keepalive_deadlines_slide_and_survive_the_servers_own_tasks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The read deadlines live in one heap served by a server task.  A request resets
    # the keep-alive clock (the old entry fires, finds a later deadline, re-arms); and
    # a connection handed in with serve_connection that outlives the server's tasks
    # still closes at its deadline (it falls back to a Trio deadline of its own).
    # (No lingering after the 408: the nursery's exit, when ``late`` is read, must be
    # the moment the 408 was sent, not that plus the linger timeout.)
    config = ServerConfig(keepalive_timeout=30, linger_timeout=0)
    async with running_server(app, config) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        await trio.sleep(20)
        ping = await client.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert ping.status == 200
        start = trio.current_time()
        assert await client.stream.receive_some(100) == b""
        assert trio.current_time() - start == pytest.approx(30)  # not 10: it slid
        late = connect(server, nursery)
        await late.stream.send_all(b"GET /mcp HTTP/1.1\r\nHost: x\r\n")  # half a head
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
    # The server's tasks have stopped; ``late`` (served in the test's nursery) still
    # waits for the rest of its head, and is answered 408 at the head deadline.
    with trio.fail_after(10 * server.config.head_timeout):  # (a hang fails, not stalls)
        assert b"408" in await late.stream.receive_some(1000)
    assert 0 < trio.current_time() - start <= server.config.head_timeout


async def test_idle_sessions_are_forgotten(autojump_clock: trio.testing.MockClock) -> None:
    async with running_server(app, ServerConfig(session_idle_timeout=600)) as (server, nursery):
        client = connect(server, nursery)
        await client.initialize()
        assert len(server.sessions) == 1
        await trio.sleep(800)
        assert len(server.sessions) == 0
        gone = await connect_as(client, server, nursery).post(
            {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        )
        assert isinstance(gone, Reply) and gone.status == 404


def connect_as(client: H11Client, server: Any, nursery: trio.Nursery) -> H11Client:
    other = connect(server, nursery)
    other.session_id, other.protocol_version = client.session_id, client.protocol_version
    return other


async def test_graceful_shutdown_lets_calls_finish_and_ends_streams_with_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as outer:
        async with running_server(app, ServerConfig(shutdown_grace=10)) as (server, nursery):
            client = connect(server, nursery)
            await client.initialize()
            listener = connect_as(client, server, nursery)
            get = await listener.send("GET")
            assert isinstance(get, SseReply)
            call = await client.call(1, "slow", {"seconds": 4})
            await trio.sleep(1)
            server.shutdown()
            late = await connect_as(client, server, nursery).post(
                {"jsonrpc": "2.0", "id": 9, "method": "ping"}
            )
            assert isinstance(late, Reply) and late.status == 503
            assert late.json()["error"]["data"]["reason"] == "shutting_down"
            assert "retry-after" in late.headers
            msgs = await call.messages()
            assert msgs[-1]["result"]["content"][0]["text"] == "slept 4"
            await get.events()
            assert get.ended and b"retry: " in get.raw
        outer.cancel_scope.cancel()


gate = {"event": trio.Event()}


@app.tool()
async def gated() -> str:
    """Answer once the test opens the gate."""
    await gate["event"].wait()
    return "through"


async def test_answer_arriving_while_the_head_is_written_is_not_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Regression: the writer sent the response head and then waited for the next
    # frame without looking again, so an answer appended during that send was
    # never written (no priming event below 2025-11-25 made the window wide).
    gate["event"] = trio.Event()
    sends = {"n": 0}
    async with running_server(app) as (server, nursery):
        s2c_send, s2c_recv = trio.testing.memory_stream_one_way_pair()
        c2s_send, c2s_recv = trio.testing.memory_stream_one_way_pair()

        async def hook() -> None:
            sends["n"] += 1
            if sends["n"] == 3:  # initialize, 202, then the call's head: answer now
                gate["event"].set()
                for _ in range(20):
                    await trio.lowlevel.checkpoint()
            trio.testing.memory_stream_pump(s2c_send, s2c_recv)

        s2c_send.send_all_hook = hook
        nursery.start_soon(server.serve_connection, trio.StapledStream(s2c_send, c2s_recv))
        client = H11Client(trio.StapledStream(c2s_send, s2c_recv))
        await client.initialize("2025-06-18")
        with trio.fail_after(10):
            msgs = await (await client.call(1, "gated")).messages()
        assert msgs[-1]["result"]["content"][0]["text"] == "through"
