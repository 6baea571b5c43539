"""The App API's hooks on the Trio engine: fallback, describe, session close, changes,
and the Context's notify / protocol_version / cancel_requested / lenient progress.

Each test serves a small app in memory and talks to it over HTTP with the h11 test
client, so what is asserted is what a client sees on the wire.  The clock jumps
(in-memory streams have no kernel buffers to acknowledge, so a shutdown waits out
its grace period).
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from weir.app import MAX_NOTES_RUNNING as MAX_NOTES
from weir.app import NOTE_WAIT, SESSION_CLOSE_WAIT
from weir.engine import App, Context

from .helpers import H11Client, Reply, SseReply, connect, open_session, running_server

V26 = "2026-07-28"
META26 = {
    "io.modelcontextprotocol/protocolVersion": V26,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "hooks-test", "version": "1"},
}


def rpc(rid: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}


async def answer(client: H11Client, message: dict[str, Any], **headers: str) -> dict[str, Any]:
    """The JSON-RPC response to ``message`` (from a JSON body or the end of a stream)."""
    reply = await client.post(message, headers or None)
    if isinstance(reply, Reply):
        return reply.json()  # type: ignore[no-any-return]
    [found] = [m for m in await reply.messages() if m.get("id") == message["id"]]
    return found


def custom_app() -> tuple[App, list[tuple[str, dict[str, Any], str, str | None]]]:
    seen: list[tuple[str, dict[str, Any], str, str | None]] = []
    app = App("hooks", "1.0")

    @app.tool()
    async def echo(text: str) -> str:
        """Echo."""
        return text

    @app.fallback
    async def custom(method: str, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        seen.append((method, params, ctx.protocol_version, ctx.client_info.get("name")))
        if method == "custom/fail":
            raise ValueError("secret detail")
        return {"echoed": params.get("x")}

    return app, seen


async def test_the_fallback_answers_methods_no_registry_serves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, seen = custom_app()
    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        got = await answer(client, rpc(1, "custom/echo", {"x": 7}))
        assert got["result"] == {"echoed": 7}
        tool = await answer(
            client, rpc(2, "tools/call", {"name": "echo", "arguments": {"text": "a"}})
        )
        assert tool["result"]["content"][0]["text"] == "a"  # the registry's, not the fallback's
        failed = await answer(client, rpc(3, "custom/fail"))
        assert failed["error"]["code"] == -32603 and "secret" not in failed["error"]["message"]
    assert [(m, v, who) for m, _, v, who in seen] == [
        ("custom/echo", "2025-11-25", "test"),
        ("custom/fail", "2025-11-25", "test"),
    ]


async def test_without_a_fallback_an_unknown_method_is_32601(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("plain")
    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        got = await answer(client, rpc(1, "custom/echo"))
        assert got["error"]["code"] == -32601


async def test_an_every_method_fallback_gets_set_level_and_lists_but_not_ping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("all")
    methods: list[str] = []

    @app.tool()
    async def hidden() -> str:
        """Never listed: the fallback serves every method."""
        return "x"

    @app.fallback(every_method=True)
    async def everything(method: str, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        methods.append(method)
        return {"tools": []} if method == "tools/list" else {}

    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        assert (await answer(client, rpc(1, "tools/list")))["result"] == {"tools": []}
        assert (await answer(client, rpc(2, "logging/setLevel", {"level": "bogus"})))[
            "result"
        ] == {}
        assert (await answer(client, rpc(3, "ping")))["result"] == {}
        # Even a tool that could run inline is the fallback's to answer.
        called = await answer(client, rpc(4, "tools/call", {"name": "hidden", "arguments": {}}))
        assert called["result"] == {}
    assert methods == ["tools/list", "logging/setLevel", "tools/call"]  # ping stays weir's


async def test_describe_shapes_initialize_and_discover(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("plain-name")
    versions: list[str] = []

    @app.describe
    def described(version: str) -> dict[str, Any]:
        versions.append(version)
        return {
            "capabilities": {"tools": {"listChanged": True}, "experimental": {"mine": {}}},
            "serverInfo": {"name": "described", "version": "9", "title": "Described"},
            "instructions": f"for {version}",
        }

    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        init = (await client.initialize()).json()["result"]
        assert init["serverInfo"] == {"name": "described", "version": "9", "title": "Described"}
        assert init["instructions"] == "for 2025-11-25"
        caps = init["capabilities"]
        assert caps["tools"] == {"listChanged": True}
        assert set(caps["experimental"]) == {"mine", "weir/rebind"}  # merged, not replaced
        fresh = connect(server, nursery)
        fresh.protocol_version = V26
        found = await answer(
            fresh, rpc(9, "server/discover", {"_meta": META26}), **{"mcp-method": "server/discover"}
        )
        result = found["result"]
        assert result["capabilities"]["tools"] == {"listChanged": True}
        assert result["instructions"] == "for 2026-07-28"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "described"
    assert versions[0] == "2025-11-25" and V26 in versions


async def test_a_sessionless_fallback_sees_the_request_revision(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, seen = custom_app()
    async with running_server(app) as (server, nursery):
        client = connect(server, nursery)
        client.protocol_version = V26
        got = await answer(
            client,
            rpc(1, "custom/echo", {"x": 1, "_meta": META26}),
            **{"mcp-method": "custom/echo"},
        )
        assert got["result"]["echoed"] == 1
        refused = await client.post(
            rpc(2, "logging/setLevel", {"level": "info", "_meta": META26}),
            {"mcp-method": "logging/setLevel"},
        )
        assert isinstance(refused, Reply) and refused.status == 404  # not of this era
    assert seen[0][2] == V26 and seen[0][3] == "hooks-test"


async def test_session_close_hooks_run_on_delete_and_at_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("closing")
    closed: list[str] = []
    first = trio.Event()

    @app.on_session_close
    async def forget(session_id: str) -> None:
        await trio.sleep(0)
        closed.append(session_id)
        first.set()

    async with running_server(app) as (server, nursery):
        client, sid = await open_session(server, nursery)
        gone = await client.send("DELETE")
        assert isinstance(gone, Reply) and gone.status in (200, 204)
        with trio.fail_after(5):
            await first.wait()
        _, kept = await open_session(server, nursery)
        assert closed == [sid]
    assert closed == [sid, kept]  # the shutdown closed the one still open


async def test_notify_progress_and_cancellation_as_a_handler_sees_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("context")
    cancelled: list[bool] = []
    started, ended = trio.Event(), trio.Event()

    @app.tool()
    async def chatty(ctx: Context) -> str:
        """Custom notification, then progress 1, 1 (dropped), 2."""
        await ctx.notify("notifications/custom", {"n": 1})
        for value in (1, 1, 2):
            await ctx.report_progress(value, 2)
        return "done"

    @app.tool()
    async def waits(ctx: Context) -> str:
        """Waits until cancelled, then records what the context says."""
        try:
            started.set()
            await trio.sleep_forever()
        finally:
            cancelled.append(ctx.cancel_requested)
            ended.set()
        return "never"

    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        reply = await client.call(1, "chatty", meta={"progressToken": "p"})
        messages = await reply.messages()
        methods = [m.get("method", "result") for m in messages]
        assert methods == [
            "notifications/custom",
            "notifications/progress",
            "notifications/progress",
            "result",
        ]
        assert [m["params"]["progress"] for m in messages[1:3]] == [1, 2]

        async def call_and_wait() -> None:
            other = connect(server, nursery)
            other.session_id, other.protocol_version = client.session_id, client.protocol_version
            await other.call(2, "waits")

        nursery.start_soon(call_and_wait)
        with trio.fail_after(5):
            await started.wait()
        note = {"requestId": 2, "reason": "test"}
        ack = await client.post(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": note}
        )
        assert isinstance(ack, Reply) and ack.status == 202
        with trio.fail_after(5):
            await ended.wait()
    assert cancelled == [True]


async def test_app_changed_from_outside_a_request_reaches_get_streams(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("changes")

    @app.tool()
    async def t() -> str:
        """A tool, so that there is a tools list."""
        return "t"

    app.changed("tools")  # nobody serves it yet: nothing happens, nothing fails
    async with running_server(app) as (server, nursery):
        client, _ = await open_session(server, nursery)
        stream = await client.send("GET")
        assert isinstance(stream, SseReply) and stream.status == 200
        while not any(s.standalone is not None for s in server.sessions.values()):
            await trio.sleep(0.01)
        app.changed("tools")
        data: list[str] = []
        with trio.fail_after(5):
            while not any("list_changed" in d for d in data):
                data += [e.data for e in await stream.next_batch()]
        assert json.loads(data[-1])["method"] == "notifications/tools/list_changed"
    assert not app._change_sinks  # the server let go of the app when it stopped


async def test_a_hanging_session_close_hook_is_cancelled_and_shutdown_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("hangs")
    entered: list[float] = []
    cancelled: list[float] = []

    @app.on_session_close
    async def hang(session_id: str) -> None:
        entered.append(trio.current_time())
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(trio.current_time())

    with trio.fail_after(300):  # (virtual: the idle connection ends at its keep-alive timeout)
        async with running_server(app) as (server, nursery):
            await open_session(server, nursery)
    assert len(entered) == len(cancelled) == 1
    assert cancelled[0] - entered[0] == SESSION_CLOSE_WAIT


async def test_client_notifications_reach_the_app_within_a_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App("notes")
    heard: list[tuple[str, dict[str, Any], str]] = []
    waiting: list[float] = []
    cancelled: list[float] = []

    @app.on_notification
    async def hear(method: str, params: dict[str, Any], session_id: str) -> None:
        heard.append((method, params, session_id))
        if method == "notifications/slow":
            waiting.append(trio.current_time())
            try:
                await trio.sleep_forever()
            finally:
                cancelled.append(trio.current_time())

    async with running_server(app) as (server, nursery):
        client, sid = await open_session(server, nursery)  # (initialized: the transport's)
        note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
        ack = await client.post(note)
        assert isinstance(ack, Reply) and ack.status == 202
        await trio.sleep(0)
        assert heard == [("notifications/roots/list_changed", {}, sid)]
        for _ in range(MAX_NOTES + 36):  # a flood, one POST each (2025-11-25 has no batches)
            ack = await client.post({"jsonrpc": "2.0", "method": "notifications/slow"})
            assert isinstance(ack, Reply) and ack.status == 202
        await trio.sleep(1)
        assert len(waiting) == MAX_NOTES  # the rest were dropped, not queued
        assert server.notes_running == MAX_NOTES
        assert server.metrics.notifications_dropped == 36  # and counted (/metrics)
        await trio.sleep(NOTE_WAIT)
        assert len(cancelled) == MAX_NOTES and server.notes_running == 0
        assert all(c - w == NOTE_WAIT for w, c in zip(waiting, cancelled, strict=True))
