"""Inline execution on both runtimes and both eras, over real sockets.

A ``tools/call`` of a tool that never suspends, with the process-local store, runs in
the connection's task (no handler task).  Checked here, on Trio and asyncio, for
the session era (2025-11-25) and the sessionless era (2026-07-28), streamed and as
one JSON body: the answer -- a result, an ``isError`` result, a JSON-RPC error --
is exactly what a twin of the tool answers from a handler task (the twin only
awaits the tool), the metrics count the call as inline once, the connection stays
usable, a keyed retry replays without running again, and every request's credit is
given back.  (The Trio engine's in-memory tests, ``tests/engine/test_inline*.py``,
cover the credit waits in virtual time.)

Clock: real time; nothing waits for a timer.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from tests.engine.helpers import H11Client, Reply, SseReply
from tests.integration.runtimes import RUNTIMES, Served, serving
from tests.integration.test_half_open_loopback import open_client
from weir.engine import App, McpError, ToolError

app = App("inline-runtimes")
TIMEOUT = 20.0
V26 = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V26,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "inline-runtimes", "version": "1"},
}
ERAS = pytest.mark.parametrize("era", ["session", "sessionless"])
MODES = pytest.mark.parametrize("json_mode", [False, True], ids=["sse", "json"])
RUNS = Counter[str]()


@app.tool()
async def echo(text: str) -> str:
    """Echo (never suspends: inline)."""
    return text


@app.tool()
async def echo_task(text: str) -> str:
    """Echo from a handler task (its await makes it one)."""
    return await echo(text)


@app.tool()
async def refuse() -> str:
    """A tool error."""
    raise ToolError("refused by policy")


@app.tool()
async def refuse_task() -> str:
    """The same, from a handler task."""
    return await refuse()


@app.tool()
async def rpc_fail() -> str:
    """A JSON-RPC error."""
    raise McpError(-32001, "custom failure", {"k": 1})


@app.tool()
async def rpc_fail_task() -> str:
    """The same, from a handler task."""
    return await rpc_fail()


@app.tool()
async def counted() -> str:
    """Count one more run; the count."""
    RUNS["counted"] += 1
    return str(RUNS["counted"])


class Caller:
    """One era's way to call a tool on ``server``, a fresh connection per call."""

    def __init__(self, server: Served, era: str, sid: str | None, version: str) -> None:
        self.server, self.era, self.sid, self.version = server, era, sid, version
        self.clients: list[H11Client] = []

    async def call(
        self, rid: int, name: str, arguments: dict[str, Any], headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        client = await open_client(self.server.port)
        self.clients.append(client)
        client.session_id, client.protocol_version = self.sid, self.version
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        hdrs = dict(headers or {})
        if self.era == "sessionless":
            params["_meta"] = META
            hdrs.update({"mcp-method": "tools/call", "mcp-name": name})
        msg = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
        reply = await client.post(msg, hdrs)
        assert reply.status == 200, reply
        if isinstance(reply, Reply):
            return reply.json()  # type: ignore[no-any-return]
        assert isinstance(reply, SseReply)
        [answer] = [m for m in await reply.messages() if m.get("id") == rid]
        return answer

    def inline_calls(self) -> Counter[str]:
        return Counter(self.server.probe(lambda: dict(self.server.target.metrics.inline_calls)))


@asynccontextmanager
async def caller_of(runtime: str, era: str, json_mode: bool) -> AsyncIterator[Caller]:
    RUNS.clear()
    with trio.fail_after(TIMEOUT), serving(runtime, app, json_response=json_mode) as server:
        sid, version = None, V26
        if era == "session":
            first = await open_client(server.port)
            async with first.stream:
                await first.initialize()
            sid, version = first.session_id, first.protocol_version or ""
        caller = Caller(server, era, sid, version)
        try:
            yield caller
        finally:
            for client in caller.clients:
                await client.stream.aclose()


def without_stamps(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without its id and the sessionless era's stamps."""
    out = {k: v for k, v in answer.items() if k != "id"}
    if "result" in out:
        out["result"] = {k: v for k, v in out["result"].items() if k not in ("resultType", "_meta")}
    return json.loads(json.dumps(out).replace("_task", ""))  # type: ignore[no-any-return]


@RUNTIMES
@ERAS
@MODES
async def test_inline_answers_match_a_handler_tasks(
    runtime: str, era: str, json_mode: bool
) -> None:
    async with caller_of(runtime, era, json_mode) as c:
        got = [await c.call(i, name, args) for i, (name, args) in enumerate(CALLS, start=1)]
        assert c.inline_calls() == Counter(["echo", "refuse", "rpc_fail"])
        twins = [
            await c.call(100 + i, f"{name}_task", args) for i, (name, args) in enumerate(CALLS)
        ]
        assert c.inline_calls() == Counter(["echo", "refuse", "rpc_fail"])  # twins: tasks
        assert [without_stamps(a) for a in got] == [without_stamps(t) for t in twins]
        assert got[0]["result"]["content"] == [{"type": "text", "text": "hi"}]
        assert got[1]["result"]["isError"] is True
        assert got[2]["error"] == {"code": -32001, "message": "custom failure", "data": {"k": 1}}


CALLS = [("echo", {"text": "hi"}), ("refuse", {}), ("rpc_fail", {})]


@RUNTIMES
@ERAS
@MODES
async def test_a_keyed_inline_call_runs_once(runtime: str, era: str, json_mode: bool) -> None:
    async with caller_of(runtime, era, json_mode) as c:
        key = {"idempotency-key": "order-7"}
        first = await c.call(1, "counted", {}, key)
        again = await c.call(2, "counted", {}, key)
        assert first["result"]["content"] == [{"type": "text", "text": "1"}]
        assert again == {**first, "id": 2} and RUNS["counted"] == 1
        assert c.inline_calls() == Counter(["counted"])
        if era == "session":  # its credit is all back
            assert c.server.credit_of(c.sid or "")[:2] == (0, 0)
