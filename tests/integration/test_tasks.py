"""The tasks extension on real loopback sockets: lifecycle, input, cancellation,
bounds, ownership, leases and shutdown, on both runtimes; and across replicas on a
real Valkey.

In-process servers, real TCP and real time; the tools wait on a thread event the
tests set (:func:`~tests.integration.runtimes.wait_in_thread`, so they run under
either loop), and where only the server can make a condition true the test polls
it, bounded in time and count (:func:`eventually`).  Tests parametrised with
``runtime`` run once on the Trio engine and once on the asyncio runtime (configured
from the same ``ServerConfig`` as ``weir serve --runtime asyncio``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from tests.integration.rawhttp import Client, Reply
from weir.app import Context, McpError
from weir.engine import App, Server, ServerConfig
from weir.engine._memory_store import MemoryStore
from weir.engine._redis_store import RedisStore
from weir.engine._session_store import SessionStore
from weir.protocol.tasks import TASKS_EXTENSION, decode_record, encode_record, new_task

from .configured import RUNTIMES, run_configured
from .runtimes import wait_in_thread
from .test_auth import jwt_authorization, token
from .test_sessionless_loopback import eventually

V = "2026-07-28"
DECLARED: dict[str, Any] = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}

app = App("tasks")
release = threading.Event()
ran: list[str] = []
unwound: list[str] = []


@app.tool(task="optional")
async def work(ctx: Context, label: str) -> str:
    """Waits for the test's release, recording that it started and unwound."""
    ran.append(label)
    try:
        await wait_in_thread(release)
    finally:
        unwound.append(label)
    return f"done {label}"


@app.tool(task="optional")
async def stages(ctx: Context) -> str:
    """Says where it is, waits for the release, then says it is done."""
    await ctx.set_status("stage 1 of 2")
    ran.append("stages")
    await wait_in_thread(release)
    await ctx.set_status("x" * 5000)
    return "staged"


@app.tool(task="optional")
async def big(size: int) -> str:
    """A result of ``size`` bytes."""
    return "x" * size


@app.tool(task="optional")
async def breaks() -> str:
    """A protocol-level error."""
    raise McpError(-32603, "broken below the tool")


@app.tool(task="required")
async def ask_two(ctx: Context) -> str:
    """Asks two questions at once; counts its runs."""
    ran.append("ask_two")
    schema = {"type": "object", "properties": {"n": {"type": "string"}}}
    answers = await ctx.input(
        {
            "a": ("elicitation/create", {"message": "A?", "requestedSchema": schema}),
            "b": ("elicitation/create", {"message": "B?", "requestedSchema": schema}),
        }
    )
    return "+".join(str(answers[k]["content"]["n"]) for k in ("a", "b"))


def rpc(
    rid: int, method: str, params: dict[str, Any], caps: dict[str, Any] | None = None
) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": DECLARED if caps is None else caps,
    }
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta}}


async def post(port: int, message: dict[str, Any], bearer: str | None = None) -> Reply:
    hdrs = {"mcp-protocol-version": V, "mcp-method": message["method"]}
    params = message["params"]
    if "name" in params:
        hdrs["mcp-name"] = params["name"]
    if "taskId" in params:
        hdrs["mcp-name"] = params["taskId"]
    hdrs["accept"] = "application/json, text/event-stream"
    if bearer is not None:
        hdrs["authorization"] = f"Bearer {bearer}"
    client = await Client.connect(port)
    try:
        return await client.request("POST", "/mcp", message, headers=hdrs)
    finally:
        await client.aclose()


async def result(port: int, message: dict[str, Any], bearer: str | None = None) -> Any:
    reply = await post(port, message, bearer)
    body = reply.json() if reply.body.startswith(b"{") else _last_sse(reply.body)
    assert "result" in body, body
    return body["result"]


def _last_sse(raw: bytes) -> Any:
    import json

    datas = [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]
    return json.loads(datas[-1])


async def get(port: int, task_id: str, bearer: str | None = None) -> Any:
    return await result(port, rpc(90, "tasks/get", {"taskId": task_id}), bearer)


async def settled(port: int, task_id: str, want: str) -> Any:
    """Poll ``tasks/get`` (bounded) until the task's status is ``want``."""
    seen: list[Any] = []

    async def check() -> bool:
        seen[:] = [await get(port, task_id)]
        return bool(seen[0]["status"] == want)

    with trio.move_on_after(10):
        for _ in range(200):
            if await check():
                return seen[0]
            await trio.sleep(0.05)
    raise AssertionError(f"task never reached {want}: {seen}")


@dataclass
class Serving:
    """A server a test talks to: its port and its store."""

    port: int
    store: SessionStore


@asynccontextmanager
async def serving(
    runtime: str = "trio", config: ServerConfig | None = None, store: SessionStore | None = None
) -> AsyncIterator[Serving]:
    """``app`` served on ``runtime`` with ``config`` (port 0) on ``store`` (default: a
    fresh memory store), stopped gracefully on the way out (within 30 s)."""
    config = config or ServerConfig(port=0)
    if isinstance(store, RedisStore):  # (a Trio client: the Trio engine only)
        assert runtime == "trio"
        async with trio.open_nursery() as nursery:
            server: Server = await nursery.start(Server(app, config, store=store).run)
            try:
                yield Serving(server.port, store)
            finally:
                server.shutdown()
                with trio.fail_after(30):
                    await server.stopped.wait()
        return
    memory = store if isinstance(store, MemoryStore) else MemoryStore()
    async with run_configured(runtime, app, config, memory) as running:
        yield Serving(running.port, memory)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    global release
    release = threading.Event()
    ran.clear()
    unwound.clear()
    yield
    release.set()  # (frees the worker threads of tools still waiting)


# ---------------------------------------------------------------- lifecycle
@RUNTIMES
async def test_a_task_is_readable_at_once_and_inlines_its_result_when_done(runtime: str) -> None:
    async with serving(runtime) as server:
        handle = await result(
            server.port, rpc(1, "tools/call", {"name": "work", "arguments": {"label": "one"}})
        )
        assert handle["resultType"] == "task" and handle["status"] == "working"
        assert "result" not in handle and "requestState" not in handle
        assert isinstance(handle["ttlMs"], int) and isinstance(handle["pollIntervalMs"], int)
        tid = handle["taskId"]
        assert len(tid) >= 40  # 32 random bytes, url-safe
        now = await get(server.port, tid)
        assert now["status"] == "working" and "result" not in now
        release.set()
        done = await settled(server.port, tid, "completed")
        assert done["result"]["content"] == [{"type": "text", "text": "done one"}]
        assert ran == ["one"]


@RUNTIMES
async def test_a_client_that_did_not_declare_tasks_gets_the_result_and_no_task_methods(
    runtime: str,
) -> None:
    async with serving(runtime) as server:
        release.set()
        plain = await result(
            server.port,
            rpc(1, "tools/call", {"name": "work", "arguments": {"label": "p"}}, caps={}),
        )
        assert plain["resultType"] == "complete" and "taskId" not in plain
        refused = await post(server.port, rpc(2, "tasks/get", {"taskId": "x"}, caps={}))
        assert refused.status == 400 and refused.json()["error"]["code"] == -32021
        required = await post(
            server.port, rpc(3, "tools/call", {"name": "ask_two", "arguments": {}}, caps={})
        )
        error = required.json()["error"]
        assert error["code"] == -32021
        assert TASKS_EXTENSION in error["data"]["requiredCapabilities"]["extensions"]
        assert "ask_two" not in ran  # refused before the handler
        for removed in ("tasks/result", "tasks/list"):
            gone = await post(server.port, rpc(4, removed, {"taskId": "x"}))
            assert gone.json()["error"]["code"] == -32601


@RUNTIMES
async def test_cancelling_a_running_task_stops_its_handler_and_a_terminal_one_is_unchanged(
    runtime: str,
) -> None:
    async with serving(runtime) as server:
        handle = await result(
            server.port, rpc(1, "tools/call", {"name": "work", "arguments": {"label": "c"}})
        )
        tid = handle["taskId"]
        assert await eventually(lambda: ran == ["c"], timeout=5)
        ack = await result(server.port, rpc(2, "tasks/cancel", {"taskId": tid}))
        assert ack == {"resultType": "complete", **{k: ack[k] for k in ack if k == "_meta"}}
        assert await eventually(lambda: unwound == ["c"], timeout=5)
        assert (await get(server.port, tid))["status"] == "cancelled"
        again = await result(server.port, rpc(3, "tasks/cancel", {"taskId": tid}))
        assert again["resultType"] == "complete"
        assert (await get(server.port, tid))["status"] == "cancelled"


@RUNTIMES
async def test_a_protocol_error_fails_the_task_and_a_large_result_is_refused(runtime: str) -> None:
    async with serving(runtime, ServerConfig(port=0, max_task_result_bytes=200)) as server:
        broke = await result(server.port, rpc(1, "tools/call", {"name": "breaks", "arguments": {}}))
        failed = await settled(server.port, broke["taskId"], "failed")
        assert failed["error"]["code"] == -32603 and "result" not in failed
        fat = await result(
            server.port, rpc(2, "tools/call", {"name": "big", "arguments": {"size": 500}})
        )
        failed = await settled(server.port, fat["taskId"], "failed")
        assert failed["error"]["data"]["reason"] == "result_too_large"
        thin = await result(
            server.port, rpc(3, "tools/call", {"name": "big", "arguments": {"size": 10}})
        )
        assert (await settled(server.port, thin["taskId"], "completed"))["result"]


@RUNTIMES
async def test_a_keyed_call_that_created_a_task_gets_the_same_handle_again(runtime: str) -> None:
    async with serving(runtime) as server:
        message = rpc(1, "tools/call", {"name": "work", "arguments": {"label": "k"}})
        hdrs_key = {"idempotency-key": "order-7"}
        first = await post_with(server.port, message, hdrs_key)
        again = await post_with(server.port, {**message, "id": 2}, hdrs_key)
        assert first["result"]["taskId"] == again["result"]["taskId"]
        assert await eventually(lambda: ran == ["k"], timeout=5)
        release.set()
        await settled(server.port, first["result"]["taskId"], "completed")
        assert ran == ["k"]  # one task, one run


async def post_with(port: int, message: dict[str, Any], extra: dict[str, str]) -> Any:
    hdrs = {
        "mcp-protocol-version": V,
        "mcp-method": message["method"],
        "mcp-name": message["params"]["name"],
        "accept": "application/json, text/event-stream",
        **extra,
    }
    client = await Client.connect(port)
    try:
        reply = await client.request("POST", "/mcp", message, headers=hdrs)
        return reply.json() if reply.body.startswith(b"{") else _last_sse(reply.body)
    finally:
        await client.aclose()


@RUNTIMES
async def test_a_handler_sets_its_tasks_status_message(runtime: str) -> None:
    async with serving(runtime) as server:
        handle = await result(
            server.port, rpc(1, "tools/call", {"name": "stages", "arguments": {}})
        )
        tid = handle["taskId"]
        assert await eventually(lambda: ran == ["stages"], timeout=5)
        assert (await get(server.port, tid))["statusMessage"] == "stage 1 of 2"
        release.set()
        done = await settled(server.port, tid, "completed")
        assert done["statusMessage"] == "x" * 1024  # kept at most 1 KiB


# ---------------------------------------------------------------- input
@RUNTIMES
async def test_questions_are_answered_in_parts_and_the_task_resumes_once_all_are(
    runtime: str,
) -> None:
    async with serving(runtime) as server:
        handle = await result(
            server.port, rpc(1, "tools/call", {"name": "ask_two", "arguments": {}})
        )
        tid = handle["taskId"]
        waiting = await settled(server.port, tid, "input_required")
        assert sorted(waiting["inputRequests"]) == ["a", "b"]
        answer = {"action": "accept", "content": {"n": "1"}}
        ack = await result(
            server.port,
            rpc(2, "tasks/update", {"taskId": tid, "inputResponses": {"a": answer, "zz": {}}}),
        )
        assert ack["resultType"] == "complete"
        still = await get(server.port, tid)
        assert still["status"] == "input_required" and list(still["inputRequests"]) == ["b"]
        answer_b = {"action": "accept", "content": {"n": "2"}}
        await result(
            server.port, rpc(3, "tasks/update", {"taskId": tid, "inputResponses": {"b": answer_b}})
        )
        done = await settled(server.port, tid, "completed")
        assert done["result"]["content"][0]["text"] == "1+2"
        assert ran == ["ask_two", "ask_two"]  # asked once, then ran with both answers
        bad = await post(server.port, rpc(4, "tasks/update", {"taskId": tid, "inputResponses": 7}))
        assert bad.status == 400 and bad.json()["error"]["code"] == -32602


# ---------------------------------------------------------------- bounds, ownership
@RUNTIMES
async def test_a_principal_holds_at_most_its_cap_of_tasks(runtime: str) -> None:
    async with serving(runtime, ServerConfig(port=0, max_tasks_per_principal=2)) as server:
        for i in range(2):
            await result(
                server.port, rpc(i, "tools/call", {"name": "work", "arguments": {"label": str(i)}})
            )
        third = await post(
            server.port, rpc(3, "tools/call", {"name": "work", "arguments": {"label": "3"}})
        )
        assert third.status == 429 and third.json()["error"]["data"]["reason"] == "task_limit"
        assert await eventually(lambda: sorted(ran) == ["0", "1"], timeout=5)
        release.set()


@RUNTIMES
async def test_the_embedded_stores_budget_bounds_what_tasks_hold(runtime: str) -> None:
    config = ServerConfig(port=0, memory_budget=2000, session_retain_bytes=2000)
    async with serving(runtime, config) as server:
        statuses = []
        for i in range(20):
            reply = await post(
                server.port, rpc(i, "tools/call", {"name": "work", "arguments": {"label": str(i)}})
            )
            statuses.append(reply.status)
            if reply.status != 200:
                assert reply.status == 503
                assert reply.json()["error"]["data"]["reason"] == "overloaded"
                break
        assert statuses[0] == 200 and statuses[-1] == 503
        made = len(statuses) - 1
        assert await eventually(lambda: len(ran) == made, timeout=5)  # the refused one never ran
        store = server.store
        assert isinstance(store, MemoryStore) and store.budget is not None
        assert store.budget.held <= 2000
        release.set()


@RUNTIMES
async def test_another_principals_task_is_not_found_exactly_as_an_unknown_one(runtime: str) -> None:
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery)
        async with serving(runtime, ServerConfig(port=0, auth=auth)) as server:
            alice, bob = token("alice"), token("bob")
            handle = await result(
                server.port,
                rpc(1, "tools/call", {"name": "work", "arguments": {"label": "a"}}),
                alice,
            )
            tid = handle["taskId"]
            theirs = await post(server.port, rpc(2, "tasks/get", {"taskId": tid}), bob)
            unknown = await post(server.port, rpc(2, "tasks/get", {"taskId": "no-such-task"}), bob)
            assert theirs.status == unknown.status == 400
            assert theirs.json()["error"] == unknown.json()["error"]
            assert theirs.json()["error"]["code"] == -32602
            assert theirs.json()["error"]["data"]["reason"] == "task_not_found"
            cancel = await post(server.port, rpc(3, "tasks/cancel", {"taskId": tid}), bob)
            assert cancel.json()["error"]["code"] == -32602
            assert (await get(server.port, tid, alice))["status"] == "working"
            release.set()
            await settled_as(server.port, tid, alice)
        nursery.cancel_scope.cancel()


async def settled_as(port: int, task_id: str, bearer: str) -> None:
    with trio.fail_after(10):
        while (await get(port, task_id, bearer))["status"] == "working":
            await trio.sleep(0.05)


# ---------------------------------------------------------------- leases, shutdown
@RUNTIMES
async def test_a_task_whose_runner_stopped_renewing_is_failed_by_the_next_reader(
    runtime: str,
) -> None:
    async with serving(runtime) as server:
        wall = time.time()
        dead = new_task("ghost-task", {"name": "work"}, wall=wall - 100, ttl_ms=60_000,
                        poll_ms=1000, owner="replica-gone", lease=15)  # fmt: skip
        live = new_task("live-task", {"name": "work"}, wall=wall, ttl_ms=60_000,
                        poll_ms=1000, owner="replica-alive", lease=15)  # fmt: skip
        for record in (dead, live):
            await server.store.put_task("anonymous", record.id, encode_record(record),
                                        version=0, ttl=60, cap=100)  # fmt: skip
        failed = await get(server.port, "ghost-task")
        assert failed["status"] == "failed" and failed["error"]["data"]["reason"] == "interrupted"
        assert (await get(server.port, "live-task"))["status"] == "working"


@RUNTIMES
async def test_a_graceful_shutdown_records_its_running_tasks_failed(runtime: str) -> None:
    async with serving(runtime) as server:
        handle = await result(
            server.port, rpc(1, "tools/call", {"name": "work", "arguments": {"label": "s"}})
        )
        assert await eventually(lambda: ran == ["s"], timeout=5)
        store = server.store
    stored = await store.get_task("anonymous", handle["taskId"])
    assert stored is not None
    record = decode_record(stored.data)
    assert record.status == "failed" and record.error is not None
    assert record.error["data"]["reason"] == "interrupted" and unwound == ["s"]


# ---------------------------------------------------------------- replicas
async def test_replicas_share_tasks_through_the_store(valkey_url: str) -> None:
    """Created on A, read on B, answered on C, cancelled on B: one record, one run."""
    async with (
        await RedisStore.connect(valkey_url, prefix=f"tasks-{time.time_ns()}") as store,
        serving("trio", ServerConfig(port=0, replica_id="a"), store) as a,
        serving("trio", ServerConfig(port=0, replica_id="b"), store) as b,
        serving("trio", ServerConfig(port=0, replica_id="c"), store) as c,
    ):
        handle = await result(a.port, rpc(1, "tools/call", {"name": "ask_two", "arguments": {}}))
        tid = handle["taskId"]
        assert (await get(b.port, tid))["taskId"] == tid  # durable before the handle came
        waiting = await settled(b.port, tid, "input_required")
        assert sorted(waiting["inputRequests"]) == ["a", "b"]
        both = {k: {"action": "accept", "content": {"n": k}} for k in ("a", "b")}
        await result(c.port, rpc(2, "tasks/update", {"taskId": tid, "inputResponses": both}))
        done = await settled(b.port, tid, "completed")
        assert done["result"]["content"][0]["text"] == "a+b"
        assert ran == ["ask_two", "ask_two"]
        # A running task cancelled on another replica stops where it runs.
        running = await result(
            a.port, rpc(3, "tools/call", {"name": "work", "arguments": {"label": "r"}})
        )
        assert await eventually(lambda: ran[-1:] == ["r"], timeout=5)
        await result(b.port, rpc(4, "tasks/cancel", {"taskId": running["taskId"]}))
        assert (await get(c.port, running["taskId"]))["status"] == "cancelled"


# ---------------------------------------------------------------- weir's client
@RUNTIMES
async def test_weirs_client_drives_a_task_to_its_result_answering_its_questions(
    runtime: str,
) -> None:
    from weir.engine.client import CallTrace, SessionlessClient, open_client

    async def elicit(params: dict[str, Any]) -> dict[str, Any]:
        return {"action": "accept", "content": {"n": params["message"][0]}}

    async with serving(runtime) as server:
        url = f"http://127.0.0.1:{server.port}/mcp"
        async with open_client(url, elicitation=elicit) as client:
            trace = CallTrace()
            out = await client.call_tool("ask_two", trace=trace)
            assert out.text == "A+B" and trace.task_id is not None
            assert isinstance(client, SessionlessClient)
            task = await client.get_task(trace.task_id)
            assert task["status"] == "completed"
            release.set()
            plain = await client.call_tool("work", {"label": "w"})
            assert plain.text == "done w"


@RUNTIMES
async def test_a_caller_that_gives_up_cancels_its_task(runtime: str) -> None:
    from weir.engine.client import CallTrace, open_client

    async with serving(runtime) as server:
        url = f"http://127.0.0.1:{server.port}/mcp"
        async with open_client(url) as client:
            trace = CallTrace()
            async with trio.open_nursery() as nursery:

                async def call() -> None:
                    await client.call_tool("work", {"label": "g"}, trace=trace)

                nursery.start_soon(call)
                assert await eventually(
                    lambda: ran == ["g"] and trace.task_id is not None, timeout=5
                )
                nursery.cancel_scope.cancel()  # the caller gives up
            assert trace.task_id is not None
            assert await eventually(lambda: unwound == ["g"], timeout=5)
            assert (await get(server.port, trace.task_id))["status"] == "cancelled"


async def test_a_sigkilled_replicas_task_ends_failed_within_the_lease_on_every_survivor(
    valkey_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the ``weir serve`` process running a task: nothing in it runs, so only
    the lapsed lease (``--claim-lease 2``) tells the others.  Each survivor then
    answers the task ``failed`` (``interrupted``) -- the creating client long gone --
    within the lease plus the allowed clock skew, and the task never runs again."""
    from .serverproc import WeirProcess

    ledger = tmp_path / "ledger"
    ledger.write_text("")
    monkeypatch.setenv("WEIR_TEST_LEDGER", str(ledger))
    args = ["--store", valkey_url, "--claim-lease", "2", "--shutdown-grace", "0"]
    files = [(tmp_path / f"{n}.out").open("w+b") for n in range(6)]
    procs: list[WeirProcess] = []
    try:
        for n in range(3):
            extra = [*args, "--replica-id", f"t{n}"]
            procs.append(
                WeirProcess(
                    "tests.integration.lease_app:app", files[2 * n], files[2 * n + 1], extra
                )
            )
        victim, survivors = procs[0], procs[1:]
        with trio.fail_after(40):
            call = rpc(1, "tools/call", {"name": "charge_task", "arguments": {"key": "k1"}})
            handle = await result(victim.port, call)
            tid = handle["taskId"]
            while "start k1" not in ledger.read_text():
                await trio.sleep(0.05)
            for other in survivors:
                assert (await get(other.port, tid))["status"] == "working"
            victim.proc.kill()  # SIGKILL: no cleanup, nothing recorded
            victim.proc.wait()
            killed_at = trio.current_time()
            for other in survivors:
                while (task := await get(other.port, tid))["status"] == "working":
                    await trio.sleep(0.1)
                assert task["status"] == "failed"
                assert task["error"]["data"]["reason"] == "interrupted"
            waited = trio.current_time() - killed_at
        # The lease (2 s) from its last renewal, plus the 2 s of allowed skew; the
        # rest is slack for a loaded machine (the promise is the first 4 s).
        assert waited < 2 + 2 + 6, waited
        assert ledger.read_text().count("start k1") == 1  # never run again
    finally:
        for proc in procs:
            proc.stop()
        for f in files:
            f.close()


# ---------------------------------------------------------------- status notifications
async def _listening(port: int, task_ids: list[str], caps: dict[str, Any] | None = None) -> Client:
    """A ``subscriptions/listen`` for ``task_ids``, once acknowledged."""
    from .rawhttp import raw_request

    listen = rpc(50, "subscriptions/listen", {"notifications": {"taskIds": task_ids}}, caps)
    hdrs = {"mcp-protocol-version": V, "mcp-method": "subscriptions/listen"}
    hdrs["accept"] = "application/json, text/event-stream"
    client = await Client.connect(port)
    await client.send_raw(
        raw_request("POST", "/mcp", body=json.dumps(listen).encode(), headers=hdrs)
    )
    return client


async def _read_until(client: Client, seen: bytearray, needle: bytes) -> list[dict[str, Any]]:
    from .rawhttp import sse_messages

    with trio.fail_after(10):
        while needle not in seen:
            seen += await client.stream.receive_some(65536)
    return sse_messages(bytes(seen))


@RUNTIMES
async def test_a_listener_hears_its_own_tasks_change_and_nothing_else(runtime: str) -> None:
    async with serving(runtime) as server:
        handle = await result(
            server.port, rpc(1, "tools/call", {"name": "ask_two", "arguments": {}})
        )
        tid = handle["taskId"]
        await settled(server.port, tid, "input_required")
        client = await _listening(server.port, [tid, "not-a-task-of-mine"])
        seen = bytearray()
        try:
            (ack,) = await _read_until(client, seen, b"acknowledged")
            assert ack["params"]["notifications"]["taskIds"] == [tid]
            both = {k: {"action": "accept", "content": {"n": k}} for k in ("a", "b")}
            await result(
                server.port, rpc(2, "tasks/update", {"taskId": tid, "inputResponses": both})
            )
            messages = await _read_until(client, seen, b'"completed"')
            states = [m["params"] for m in messages if m.get("method") == "notifications/tasks"]
            assert states[-1]["taskId"] == tid and states[-1]["status"] == "completed"
            assert states[-1]["result"]["content"][0]["text"] == "a+b"
            assert all("resultType" not in s for s in states)
        finally:
            await client.aclose()
        refused = await post(
            server.port,
            rpc(3, "subscriptions/listen", {"notifications": {"taskIds": [tid]}}, caps={}),
        )
        assert refused.status == 400 and refused.json()["error"]["code"] == -32021


async def test_a_listener_on_one_replica_hears_a_task_that_runs_on_another(
    valkey_url: str,
) -> None:
    async with (
        await RedisStore.connect(valkey_url, prefix=f"tasks-{time.time_ns()}") as store,
        serving("trio", ServerConfig(port=0, replica_id="a"), store) as a,
        serving("trio", ServerConfig(port=0, replica_id="b"), store) as b,
    ):
        handle = await result(
            a.port, rpc(1, "tools/call", {"name": "work", "arguments": {"label": "x"}})
        )
        tid = handle["taskId"]
        client = await _listening(b.port, [tid])
        seen = bytearray()
        try:
            await _read_until(client, seen, b"acknowledged")
            assert await eventually(lambda: ran == ["x"], timeout=5)
            release.set()
            messages = await _read_until(client, seen, b'"completed"')
            (state,) = [m["params"] for m in messages if m.get("method") == "notifications/tasks"]
            assert state["taskId"] == tid and state["result"]["content"][0]["text"] == "done x"
        finally:
            await client.aclose()
