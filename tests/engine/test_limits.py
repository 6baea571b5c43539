"""Session limits, batch limits and the gate's tombstones, in virtual time (per-entry
batch admission is checked on both runtimes in ``tests/integration/test_half_open_runtimes``)."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing

from weir.engine import App, MemoryStore, Server, ServerConfig
from weir.engine._memory_store import INTERNAL_RECORD_BYTES
from weir.engine._store_errors import RetentionFull
from weir.engine._store_records import SESSIONLESS_NAMESPACE, Retention, SessionRecord
from weir.protocol._gate import ENTRY_OVERHEAD
from weir.protocol.budget import RetentionBudget
from weir.protocol.gate import CallOutcome

from .helpers import Reply, SseReply, connect, open_session, running_server

app = App("limits", "0")


@app.tool()
async def echo(text: str) -> str:
    """Echo."""
    return text


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-03-26",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}


async def test_sessions_past_the_limit_are_refused_and_existing_ones_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(max_sessions=2, initialize_timeout=10)
    async with running_server(app, config) as (server, nursery):
        first, sid = await open_session(server, nursery)
        await open_session(server, nursery)
        third = connect(server, nursery)
        refused = await third.post(INIT)
        assert isinstance(refused, Reply) and refused.status == 503
        assert refused.json()["error"]["data"] == {
            "reason": "session_limit",
            "retryAfterMs": 10_000,
            "limit": 2,
            "scope": "server",
        }
        assert refused.headers["retry-after"] == "10"
        assert len(server.sessions) == 2
        ping = await first.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert isinstance(ping, SseReply) and ping.status == 200
        # Both were used (notifications/initialized), so neither is provisional.
        await trio.sleep(30)
        assert sid in server.sessions and len(server.sessions) == 2


async def test_per_principal_limit_is_429(autojump_clock: trio.testing.MockClock) -> None:
    config = ServerConfig(max_sessions=10, max_sessions_per_principal=1)
    async with running_server(app, config) as (server, nursery):
        await open_session(server, nursery)
        refused = await connect(server, nursery).post(INIT)
        assert isinstance(refused, Reply) and refused.status == 429
        assert refused.json()["error"]["data"]["scope"] == "principal"


async def test_an_abandoned_initialize_expires_after_the_initialize_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(max_sessions=1, initialize_timeout=5, session_idle_timeout=None)
    async with running_server(app, config) as (server, nursery):
        reply = await connect(server, nursery).post(INIT)
        assert isinstance(reply, Reply) and reply.status == 200
        assert len(server.sessions) == 1
        full = await connect(server, nursery).post(INIT)
        assert isinstance(full, Reply) and full.status == 503
        await trio.sleep(7)  # never used: forgotten
        assert len(server.sessions) == 0 and server.metrics.sessions_expired == 1
        again = await connect(server, nursery).post(INIT)
        assert isinstance(again, Reply) and again.status == 200


async def test_a_batch_larger_than_the_limit_runs_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app, ServerConfig(max_batch=3)) as (server, nursery):
        client = connect(server, nursery)
        init = await client.post(INIT)
        assert isinstance(init, Reply)
        client.session_id = init.headers["mcp-session-id"]
        client.protocol_version = "2025-03-26"
        batch = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(4)]
        reply = await client.post(batch)
        assert isinstance(reply, Reply) and reply.status == 400
        assert reply.json()["error"]["data"] == {"reason": "batch_too_large", "limit": 3}
        assert server.metrics.admissions == 0


async def test_memory_store_tombstones_evicted_results_and_never_reexecutes() -> None:
    budget = RetentionBudget(total=1000, per_owner=500)  # 3 entries of 129 B + results
    store = MemoryStore(Retention(calls_per_session=3), budget=budget)
    record = SessionRecord(session_id="s", principal="p", protocol_version="v", created_at=0.0)
    await store.create_session(record)
    budget.register("s", partial(store.shed_results, "p", "s"))  # as the server does
    for key in "abcd":
        start = await store.begin_call("p", "s", key, b"fp", None)
        assert start.outcome is CallOutcome.EXECUTE
        await store.finish_call("p", "s", key, b"x" * 60)
    # Over 500 bytes: the oldest results were dropped but remembered ...
    evicted = await store.begin_call("p", "s", "b", b"fp", None)
    assert evicted.outcome is CallOutcome.EVICTED
    assert budget.owner_held("s") <= 500
    done = await store.begin_call("p", "s", "d", b"fp", None)
    assert done.outcome is CallOutcome.DONE and done.payload == b"x" * 60
    # ... and past the count (3 finished calls), the oldest key is forgotten: the
    # only way a key goes (the session's own volume; memory pressure never does it).
    forgotten = await store.begin_call("p", "s", "a", b"fp", None)
    assert forgotten.outcome is CallOutcome.EXECUTE
    assert (await store.begin_call("p", "s", "b", b"fp", None)).outcome is CallOutcome.EVICTED
    await store.finish_call("p", "s", "a", b"x" * 60)
    assert budget.owner_held("s") <= 500  # claims count too: many small calls are bounded
    await store.delete_session("p", "s")
    assert budget.held == 0


async def test_memory_store_refuses_a_new_key_rather_than_forget_a_tombstone() -> None:
    """When the budget is full of keys that must stay, a new call is refused 503
    (nothing run) instead of another session's finished call being forgotten."""
    budget = RetentionBudget(total=400, per_owner=400)
    store = MemoryStore(budget=budget)
    for sid in ("s1", "s2"):
        await store.create_session(
            SessionRecord(session_id=sid, principal="p", protocol_version="v", created_at=0.0)
        )
        budget.register(sid, partial(store.shed_results, "p", sid))  # as the server does
    old = "k" * 100
    assert (await store.begin_call("p", "s1", old, b"fp", None)).outcome is CallOutcome.EXECUTE
    await store.finish_call("p", "s1", old, b"x" * 50)
    with pytest.raises(RetentionFull):
        await store.begin_call("p", "s2", "j" * 200, b"fp", None)
    assert (
        budget.held == len(old) + ENTRY_OVERHEAD <= budget.total
    )  # the answer went, the key stayed
    again = await store.begin_call("p", "s1", old, b"fp", None)
    assert again.outcome is CallOutcome.EVICTED  # never run again
    await store.delete_session("p", "s1")  # room again: the new call is accepted
    assert (await store.begin_call("p", "s2", "j" * 200, b"fp", None)).outcome is (
        CallOutcome.EXECUTE
    )


async def test_server_retention_is_bounded_per_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(session_retain_bytes=8_000, memory_budget=16_000)
    async with running_server(app, config) as (server, nursery):
        client, sid = await open_session(server, nursery)
        for i in range(40):
            reply = await client.call(10 + i, "echo", {"text": "z" * 1000})
            assert (await reply.messages())[-1]["result"]["content"][0]["text"] == "z" * 1000
        assert server.budget.owner_held(sid) <= 8_000
        assert server.budget.evictions > 0
        # The first call's replay history is gone: resuming it is cursor_unknown.
        assert len(server.sessions[sid].streams) < 40


def test_config_validates_the_new_limits() -> None:
    for bad in (
        {"max_sessions": 0},
        {"head_timeout": 0},
        {"session_retain_bytes": 10, "memory_budget": 5},
        {"max_connections": 0},
        {"sse_keepalive": 0.0},
        {"linger_timeout": -1.0},
        {"linger_timeout": 600.0},
    ):
        try:
            ServerConfig(**bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")
    assert ServerConfig(max_connections=7).connection_limit == 7
    assert ServerConfig().connection_limit >= 16
    assert Server(app).gate.limit == ServerConfig().connection_limit


async def test_an_initialize_whose_answer_cannot_be_written_is_undone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    import json

    async with running_server(app, ServerConfig()) as (server, _nursery):
        client_side, server_side = trio.testing.memory_stream_pair()
        body = json.dumps(INIT).encode()
        head = (
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"accept: application/json, text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        await client_side.send_all(head + body)
        await client_side.aclose()  # gone before the answer: writing it fails
        await server.serve_connection(server_side)
        assert server.sessions == {}
        assert len(server.store) == 0  # type: ignore[arg-type]


def test_a_closed_session_keeps_nothing_and_leaves_no_budget_record() -> None:
    from weir.engine._session import Session

    budget = RetentionBudget(total=10_000, per_owner=1_000)
    record = SessionRecord(session_id="s", principal="p", protocol_version="v", created_at=0.0)
    session = Session(record, budget=budget)
    session.keep_result("k1", b"x" * 100)
    assert budget.owner_held("s") == 100
    session.close()
    assert budget.owner_held("s") == 0 and len(budget) == 0
    session.keep_result("k2", b"y" * 100)  # a call that finished after the session ended
    assert len(budget) == 0 and not session.finished


async def test_an_overlong_idempotency_key_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(app, ServerConfig()) as (server, nursery):
        client, _ = await open_session(server, nursery)
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x"}},
        }
        reply = await client.post(call, {"idempotency-key": "k" * 257})
        assert isinstance(reply, Reply) and reply.status == 400
        assert reply.json()["error"]["data"] == {"reason": "invalid_request", "limit": 256}
        ok = await client.post(call, {"idempotency-key": "k" * 256})
        assert isinstance(ok, SseReply) and ok.status == 200


async def test_many_small_calls_are_bounded_by_their_keys_too() -> None:
    store = MemoryStore(Retention(calls_per_session=10_000, call_bytes_per_session=4_000))
    record = SessionRecord(session_id="s", principal="p", protocol_version="v", created_at=0.0)
    await store.create_session(record)
    for i in range(200):
        key = f"key-{i:04d}"
        assert (await store.begin_call("p", "s", key, b"fp", None)).outcome is CallOutcome.EXECUTE
        await store.finish_call("p", "s", key, b"ok")
    s = store._sessions[("p", "s")]
    assert s.calls.held <= 4_000 and len(s.calls) < 200  # the oldest keys went, whole
    newest = await store.begin_call("p", "s", "key-0199", b"fp", None)
    assert newest.outcome is CallOutcome.DONE  # ... and the newest are still answered


async def test_an_initialize_with_megabytes_of_capabilities_makes_no_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One such request used to leave ~40 MiB of decoded objects in the session.
    async with running_server(app, ServerConfig()) as (server, nursery):
        client = connect(server, nursery)
        huge = {"experimental": {f"k{i}": {"x": i} for i in range(100_000)}}
        params = {**INIT["params"], "capabilities": huge}  # type: ignore[dict-item]
        refused = await client.post({**INIT, "params": params})
        assert isinstance(refused, Reply) and refused.status == 400
        error = refused.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32602, "invalid_request")
        assert error["data"]["limit"] == 8192
        assert server.sessions == {}
        info = {"name": "t", "version": "0", "icons": [{"src": "data:," + "x" * 100_000}]}
        small = {**params, "capabilities": {}, "clientInfo": info}
        ok = await connect(server, nursery).post({**INIT, "params": small})
        assert isinstance(ok, Reply) and ok.status == 200
        (session,) = server.sessions.values()
        assert session.caller.client_info == {"name": "t", "version": "0"}


async def test_a_principals_gate_is_charged_for_itself_while_it_holds_a_key() -> None:
    """A principal's sessionless gate stays as long as it holds a key, with no clock
    to end it: the budget counts the record too, so many principals' gates are
    bounded by what they cost (a new one past it is refused), not by their keys only."""
    per_gate = INTERNAL_RECORD_BYTES + 1 + ENTRY_OVERHEAD  # the record and a 1-byte key
    budget = RetentionBudget(total=3 * per_gate, per_owner=3 * per_gate)
    store = MemoryStore(budget=budget)
    for n in range(3):
        gate = SessionRecord(
            session_id=SESSIONLESS_NAMESPACE,
            principal=f"p{n}",
            protocol_version="v",
            created_at=0.0,
        )
        await store.create_session(gate)
        start = await store.begin_call(f"p{n}", SESSIONLESS_NAMESPACE, "k", b"fp", None)
        assert start.outcome is CallOutcome.EXECUTE
    assert budget.held == 3 * per_gate
    fourth = SessionRecord(
        session_id=SESSIONLESS_NAMESPACE, principal="p3", protocol_version="v", created_at=0.0
    )
    await store.create_session(fourth)
    with pytest.raises(RetentionFull):  # (its keys alone would have fit)
        await store.begin_call("p3", SESSIONLESS_NAMESPACE, "k", b"fp", None)
    assert budget.held == 3 * per_gate  # the refused gate was dropped, record and all
    await store.finish_call("p0", SESSIONLESS_NAMESPACE, "k", None)  # nothing ran: given back
    assert budget.held == 2 * per_gate  # an empty gate is not kept, nor charged
