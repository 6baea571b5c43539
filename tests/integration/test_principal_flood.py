"""Many principals' keyed sessionless calls stay inside the retention budget.

With the embedded memory store, each principal's sessionless idempotency gate keeps
its finished calls' answers in a record of its own.  Those bytes are charged to the
server's :class:`~weir.protocol.budget.RetentionBudget` like any session's, each
principal's gate as an owner of its own that can be asked to shed -- so a flood of
distinct (validly signed) principals cannot make the process keep more than
``memory_budget``, nor is one principal's gate charged for another's.

The tests that set a budget run on both runtimes (``--memory-budget`` and
``--session-retain-bytes`` mean the same on each); what the server keeps is read
from ``/metrics`` (``weir_retained_bytes``), the gates from the memory store.
"""

from __future__ import annotations

from typing import Any

import trio

from weir.engine import App, Context, Server, ServerConfig
from weir.engine._memory_store import MemoryStore

from .configured import RUNTIMES, run_configured
from .rawhttp import Client, Reply, call, initialize, metric
from .test_auth import jwt_authorization, token

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}
BUDGET = 128 * 1024
ANSWER = 4096
PRINCIPALS = 80  # 80 answers of 4 KiB: well over the budget
#: Room for 80 principals' gates (each charged its record and its key, about 2.2 KB),
#: not for their answers (320 KiB).
GATES_BUDGET = 256 * 1024

app = App("principal-flood")
runs: dict[str, int] = {}


@app.tool()
async def big(label: str) -> str:
    """An answer of ``ANSWER`` bytes (counted per label)."""
    runs[label] = runs.get(label, 0) + 1
    return label + "x" * ANSWER


@app.tool()
async def small(label: str) -> str:
    """A short answer (counted per label)."""
    runs[label] = runs.get(label, 0) + 1
    return label


@app.tool()
async def confirm(ctx: Context, label: str) -> str:
    """Ask the client first: its first round's answer is ``input_required``."""
    answer = await ctx.elicit(f"Go ahead with {label}?", {"type": "object"}, key="ok")
    return f"{label}: {answer.get('action')}"


def keyed(sub: str, rid: int, tool: str = "big") -> tuple[dict[str, Any], dict[str, str]]:
    message = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"label": sub}, "_meta": META},
    }
    headers = {
        "authorization": f"Bearer {token(sub)}",
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": tool,
        "idempotency-key": "the-same-key",
    }
    return message, headers


async def retained(client: Client) -> float:
    """What the server keeps now, as its ``/metrics`` say (``weir_retained_bytes``)."""
    reply = await client.request("GET", "/metrics")
    assert reply.status == 200, reply.status
    return metric(reply.body.decode(), "weir_retained_bytes")


def replayed_or_evicted(reply: Reply, label: str) -> bool:
    """A retry's only two allowed answers: the stored result, or 409 ``outcome_evicted``."""
    if reply.status == 409:
        return reply.reason == "outcome_evicted"
    body = reply.json()
    return reply.status == 200 and body["result"]["content"][0]["text"].startswith(label)


@RUNTIMES
async def test_a_flood_of_principals_keyed_answers_stays_inside_the_budget(runtime: str) -> None:
    runs.clear()
    store = MemoryStore()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            auth = await jwt_authorization(nursery)
            config = ServerConfig(
                port=0, auth=auth, memory_budget=GATES_BUDGET, session_retain_bytes=BUDGET // 4
            )
            async with run_configured(runtime, app, config, store) as server:
                client = await Client.connect(server.port)  # a gateway: every principal
                try:
                    for n in range(PRINCIPALS):
                        sub = f"flood-{n}"
                        message, headers = keyed(sub, n)
                        reply = await client.request("POST", "/mcp", message, headers=headers)
                        assert reply.status == 200, (reply.status, reply.body[:300])
                        held = await retained(client)
                        assert 0 < held <= GATES_BUDGET, (n, held)
                    # The newest principal's retry is still answered from its record.
                    message, headers = keyed(f"flood-{PRINCIPALS - 1}", 10_000)
                    again = await client.request("POST", "/mcp", message, headers=headers)
                    assert again.status == 200, again
                    # Every principal's retry is replayed or refused, never run again.
                    for n in range(PRINCIPALS):
                        sub = f"flood-{n}"
                        message, headers = keyed(sub, 20_000 + n)
                        retry = await client.request("POST", "/mcp", message, headers=headers)
                        assert replayed_or_evicted(retry, sub), (n, retry.status, retry.body[:300])
                        held = await retained(client)
                        assert held <= GATES_BUDGET, (n, held)
                finally:
                    await client.aclose()
            nursery.cancel_scope.cancel()
    assert sum(runs.values()) == PRINCIPALS and all(c == 1 for c in runs.values()), runs
    # Shedding dropped answers, never a gate: each keeps its key (as a tombstone).
    assert len(store._internal) == PRINCIPALS


async def test_a_flood_of_principals_whose_keyed_calls_gave_their_key_back_leaves_nothing() -> None:
    """A keyed call whose first round asks for input gives its key back (it has no
    outcome yet): the principal's gate is then empty, and an empty gate is not kept
    -- however many principals did so, the store holds none of theirs."""
    store = MemoryStore()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            auth = await jwt_authorization(nursery)
            server = await nursery.start(
                Server(app, ServerConfig(port=0, auth=auth), store=store).run
            )
            client = await Client.connect(server.port)
            try:
                for n in range(PRINCIPALS):
                    message, headers = keyed(f"asked-{n}", n, "confirm")
                    reply: Reply = await client.request("POST", "/mcp", message, headers=headers)
                    assert reply.status == 200, (reply.status, reply.body[:300])
                    assert reply.json()["result"]["resultType"] == "input_required"
            finally:
                await client.aclose()
                server.shutdown()
                await server.stopped.wait()
                nursery.cancel_scope.cancel()
    assert len(store._internal) == 0


SESSIONS = 40  # 40 sessions x 2 answers of 4 KiB: well over the budget


@RUNTIMES
async def test_a_flood_of_sessions_never_runs_a_finished_call_again(runtime: str) -> None:
    """The session era under the same pressure: every session's finished calls --
    one gated by its JSON-RPC id, one by an ``Idempotency-Key`` -- are replayed or
    refused ``outcome_evicted`` on retry, never run again, and the budget holds."""
    runs.clear()
    config = ServerConfig(port=0, memory_budget=BUDGET, session_retain_bytes=BUDGET // 4)
    with trio.fail_after(120):
        async with run_configured(runtime, app, config) as server:
            client = await Client.connect(server.port)
            sessions: list[str] = []
            version = {"mcp-protocol-version": "2025-06-18"}
            keyed_headers = version | {"idempotency-key": "k"}
            try:
                for n in range(SESSIONS):
                    sid = await initialize(client)
                    sessions.append(sid)
                    for label, headers in ((f"id-{n}", version), (f"key-{n}", keyed_headers)):
                        msg = call(7 if label.startswith("id") else 8, "big", {"label": label})
                        reply = await client.request(
                            "POST", "/mcp", msg, session=sid, headers=headers
                        )
                        assert reply.status == 200, (n, reply.status, reply.body[:300])
                        held = await retained(client)
                        assert 0 < held <= BUDGET, (n, held)
                for n, sid in enumerate(sessions):
                    for label, headers in ((f"id-{n}", version), (f"key-{n}", keyed_headers)):
                        msg = call(7 if label.startswith("id") else 8, "big", {"label": label})
                        retry = await client.request(
                            "POST", "/mcp", msg, session=sid, headers=headers
                        )
                        assert replayed_or_evicted(retry, label), (
                            label,
                            retry.status,
                            retry.body[:300],
                        )
                        held = await retained(client)
                        assert held <= BUDGET, (n, held)
            finally:
                await client.aclose()
    assert sum(runs.values()) == 2 * SESSIONS and all(c == 1 for c in runs.values()), runs


TINY_FLOOD = 80


@RUNTIMES
async def test_a_budget_full_of_tombstones_refuses_new_keyed_calls_and_runs_nothing_twice(
    runtime: str,
) -> None:
    """A budget too small for every principal's key: once the tombstones fill it, a
    new keyed call is refused 503 ``overloaded`` (nothing run) -- no earlier key is
    forgotten to make room, so every earlier retry is still refused, not run."""
    runs.clear()
    tiny = 8192  # room for a few dozen keys of 142 bytes
    store = MemoryStore()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            auth = await jwt_authorization(nursery)
            config = ServerConfig(port=0, auth=auth, memory_budget=tiny, session_retain_bytes=tiny)
            admitted: list[str] = []
            async with run_configured(runtime, app, config, store) as server:
                client = await Client.connect(server.port)
                try:
                    for n in range(TINY_FLOOD):
                        sub = f"tiny-{n}"
                        message, headers = keyed(sub, n, "small")
                        reply = await client.request("POST", "/mcp", message, headers=headers)
                        if reply.status == 503:
                            assert reply.reason == "overloaded", reply.body[:300]
                            assert "retry-after" in reply.headers
                        else:
                            assert reply.status == 200, (reply.status, reply.body[:300])
                            admitted.append(sub)
                        # The gates' keys stay within the budget (over it the server
                        # keeps only what cannot be shed: live streams' frames).
                        gates = sum(s.calls.held for s in list(store._internal.values()))
                        assert gates <= tiny, (n, gates)
                    assert 0 < len(admitted) < TINY_FLOOD
                    for n, sub in enumerate(admitted):
                        message, headers = keyed(sub, 100 + n, "small")
                        retry = await client.request("POST", "/mcp", message, headers=headers)
                        assert replayed_or_evicted(retry, sub), (
                            sub,
                            retry.status,
                            retry.body[:300],
                        )
                finally:
                    await client.aclose()
            nursery.cancel_scope.cancel()
    assert sorted(runs) == sorted(admitted) and all(c == 1 for c in runs.values()), runs
    assert len(store._internal) == len(admitted)  # a refused call leaves no record


@RUNTIMES
async def test_a_session_full_of_tombstones_refuses_new_calls_and_runs_nothing_twice(
    runtime: str,
) -> None:
    """The session era at the same limit: its calls' keys (their JSON-RPC ids) fill
    the budget; the next call is refused 503 ``overloaded`` and each earlier id's
    retry is replayed or refused, never run again."""
    runs.clear()
    tiny = 8192
    config = ServerConfig(port=0, memory_budget=tiny, session_retain_bytes=tiny)
    version = {"mcp-protocol-version": "2025-06-18"}
    admitted: list[int] = []
    refused: Reply | None = None
    with trio.fail_after(120):
        async with run_configured(runtime, app, config) as server:
            client = await Client.connect(server.port)
            try:
                sid = await initialize(client)
                for rid in range(1, TINY_FLOOD + 1):
                    msg = call(rid, "small", {"label": f"s-{rid}"})
                    reply = await client.request("POST", "/mcp", msg, session=sid, headers=version)
                    if reply.status != 200 or "error" in reply.json():
                        refused = reply
                        break
                    admitted.append(rid)
                for rid in admitted:
                    msg = call(rid, "small", {"label": f"s-{rid}"})
                    retry = await client.request("POST", "/mcp", msg, session=sid, headers=version)
                    assert replayed_or_evicted(retry, f"s-{rid}"), (rid, retry.body[:300])
            finally:
                await client.aclose()
    assert refused is not None and admitted, admitted
    assert refused.reason == "overloaded", (refused.status, refused.body[:300])
    assert sorted(runs) == sorted(f"s-{rid}" for rid in admitted), runs
    assert all(c == 1 for c in runs.values()), runs
