"""Inline tools on the sessionless era (2026-07-28): a ``tools/call`` of a tool that
never suspends runs in the connection's task, and nothing a client sees changes.

What this module guarantees, through the real Trio server, streamed and JSON:

* an inline tool's answer -- a result, ``isError`` for a ``ToolError``, an exception,
  bad arguments, an unconvertible result, a JSON-RPC error, an unencodable result --
  is exactly what its twin answers from a handler task (:func:`with_task_twin` in
  :mod:`tests.engine.test_inline`), stamped with this era's fields, and the
  connection stays usable; the metrics count it as an inline call and an execution;
* a keyed call (``Idempotency-Key``) still executes once and replays after;
* with a shared store, a call that records nothing (unkeyed) still runs inline, and
  a keyed call runs in a handler task (its record waits on the store);
* a tool that can suspend still runs in a handler task.

Time is Trio's MockClock; all I/O is in-memory streams.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

from tests.sim.store import SimStore
from weir.engine import Server

from .helpers import H11Client, Reply, SseReply, connect
from .test_inline import (
    COUNTS,
    MODES,
    TEST_DEADLINE,
    app,
    config_for,
    fresh_counts,  # noqa: F401  (autouse: every test starts from no counts)
    inline_runs,
    serving,
    untwin,
)

V26 = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V26,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "inline-test", "version": "1"},
}
#: Fields this era stamps on every result (compared apart from the tool's own).
STAMPED = ("resultType", "_meta")


def client_of(server: Server, nursery: trio.Nursery) -> H11Client:
    client = connect(server, nursery)
    client.protocol_version = V26
    return client


def call(rid: int, name: str, arguments: Any = None) -> dict[str, Any]:
    args = {} if arguments is None else arguments
    params = {"name": name, "arguments": args, "_meta": META}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def answer(
    client: H11Client,
    msg: dict[str, Any],
    *,
    json_mode: bool,
    headers: dict[str, str] | None = None,
    replay: bool = False,
) -> dict[str, Any]:
    """POST one request; its one JSON-RPC answer, checked to be the whole response."""
    hdrs = {"mcp-method": "tools/call", "mcp-name": msg["params"]["name"], **(headers or {})}
    reply = await client.post(msg, hdrs)
    if json_mode or replay:  # (a replay is answered with JSON in either mode)
        assert isinstance(reply, Reply), reply
        assert reply.status == 200 and reply.headers["content-type"] == "application/json"
        return reply.json()  # type: ignore[no-any-return]
    assert isinstance(reply, SseReply), reply
    [only] = await reply.messages()
    return only


def tool_part(got: dict[str, Any]) -> dict[str, Any]:
    """The answer without its id and this era's stamps: what the tool decided."""
    out = {k: v for k, v in got.items() if k != "id"}
    if "result" in out:
        stamped = out["result"]
        assert stamped["resultType"] == "complete"
        assert "io.modelcontextprotocol/serverInfo" in stamped["_meta"]
        out["result"] = {k: v for k, v in stamped.items() if k not in STAMPED}
    return out


CASES = [  # (tool, arguments, whether the result is an isError result)
    pytest.param("echo", {"text": "hello"}, False, id="result"),
    pytest.param("whoami", {"label": "a"}, False, id="context"),
    pytest.param("refuse", {}, True, id="tool-error"),
    pytest.param("crash", {}, True, id="plain-exception"),
    pytest.param("bad_result", {}, True, id="unconvertible-result"),
    pytest.param("echo", {"text": 5}, True, id="wrong-type"),
    pytest.param("loose", {"count": 1, "extra": 2}, True, id="unvalidated-unexpected"),
    pytest.param("rpc_fail", {}, None, id="mcp-error"),
    pytest.param("unencodable", {}, None, id="unencodable-result"),
]


@pytest.mark.parametrize("json_mode", MODES)
@pytest.mark.parametrize(("name", "arguments", "is_error"), CASES)
async def test_an_inline_call_answers_like_a_handler_task(
    name: str,
    arguments: dict[str, Any],
    is_error: bool | None,
    json_mode: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client = client_of(server, nursery)
        got = await answer(client, call(1, name, arguments), json_mode=json_mode)
        assert got["id"] == 1
        assert inline_runs(server) == Counter([name])
        twin = await answer(client, call(2, f"{name}_task", arguments), json_mode=json_mode)
        assert twin["id"] == 2
        assert inline_runs(server) == Counter([name])  # the twin ran in a handler task
        if name == "whoami":  # the context names the request it serves
            assert got["result"]["structuredContent"]["request"] == 1
            twin["result"]["structuredContent"]["request"] = 1
            twin["result"]["content"] = got["result"]["content"]
        assert tool_part(got) == tool_part(untwin(twin, 1))
        if is_error is None:  # a JSON-RPC error, never a 500
            assert got["error"]["code"] in (-32001, -32603)
        else:
            assert got["result"].get("isError", False) is is_error
        # The connection is still usable, and still runs inline calls.
        after = await answer(client, call(3, "echo", {"text": "ok"}), json_mode=json_mode)
        assert after["result"]["content"] == [{"type": "text", "text": "ok"}]
        assert inline_runs(server) == Counter([name, "echo"])
        assert server.metrics.executions == 3
        await trio.testing.wait_all_tasks_blocked()
        assert all(not s.running and s.inflight == 0 for s in server.owners)
        assert all(s.credit.frames_in_use == 0 for s in server.owners)


@pytest.mark.parametrize("json_mode", MODES)
async def test_a_keyed_inline_call_executes_once_and_replays(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with serving(config_for(json_mode)) as (server, nursery):
        client = client_of(server, nursery)
        key = {"idempotency-key": "order-42"}
        first = await answer(client, call(10, "counted"), json_mode=json_mode, headers=key)
        assert first["result"]["content"] == [{"type": "text", "text": "1"}]
        again = await answer(
            client, call(11, "counted"), json_mode=json_mode, headers=key, replay=True
        )
        assert again == {**first, "id": 11}  # the recorded result, under the new id
        assert COUNTS["counted"] == 1 and inline_runs(server) == Counter(["counted"])
        assert server.metrics.executions == 1 and server.metrics.duplicates_replayed == 1


@pytest.mark.parametrize("json_mode", MODES)
async def test_on_a_shared_store_only_a_call_that_records_nothing_runs_inline(
    json_mode: bool, autojump_clock: trio.testing.MockClock
) -> None:
    """An unkeyed call records nothing, so it runs inline on a shared store too; a
    keyed call's record waits on the store, so it runs in a handler task (a client
    going away must not cancel the record) -- and still executes once."""
    with trio.fail_after(TEST_DEADLINE):
        async with trio.open_nursery() as nursery:
            server = Server(app, config_for(json_mode), store=SimStore())
            await nursery.start(functools.partial(server.run, listen=False))
            client = client_of(server, nursery)
            got = await answer(client, call(1, "echo", {"text": "hi"}), json_mode=json_mode)
            assert got["result"]["content"] == [{"type": "text", "text": "hi"}]
            assert inline_runs(server) == Counter(["echo"])
            key = {"idempotency-key": "order-7"}
            first = await answer(client, call(2, "counted"), json_mode=json_mode, headers=key)
            assert first["result"]["content"] == [{"type": "text", "text": "1"}]
            again = await answer(
                client, call(3, "counted"), json_mode=json_mode, headers=key, replay=True
            )
            assert again == {**first, "id": 3}
            assert COUNTS["counted"] == 1
            assert inline_runs(server) == Counter(["echo"])  # the keyed call ran in a task
            server.shutdown()
            await server.stopped.wait()


async def test_a_tool_that_can_suspend_runs_in_a_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(config_for(False)) as (server, nursery):
        client = client_of(server, nursery)
        got = await answer(client, call(1, "sleepy", {"seconds": 2}), json_mode=False)
        assert got["result"]["content"] == [{"type": "text", "text": "slept 2"}]
        assert trio.current_time() == 2.0  # it slept, in its own task
        assert inline_runs(server) == Counter()
        assert COUNTS["sleepy finished"] == 1
