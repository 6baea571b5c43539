"""Many principals' keyed sessionless calls stay inside the retention budget.

With the embedded memory store, each principal's sessionless idempotency gate keeps
its finished calls' answers in a record of its own.  Those bytes are charged to the
server's :class:`~weir.protocol.budget.RetentionBudget` like any session's, each
principal's gate as an owner of its own that can be asked to shed -- so a flood of
distinct (validly signed) principals cannot make the process keep more than
``memory_budget``, nor is one principal's gate charged for another's.
"""

from __future__ import annotations

from typing import Any

import trio

from weir.engine import App, Context, Server, ServerConfig
from weir.engine._store import MemoryStore

from .rawhttp import Client, Reply
from .test_auth import jwt_authorization, token

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}
BUDGET = 128 * 1024
ANSWER = 4096
PRINCIPALS = 80  # 80 answers of 4 KiB: well over the budget

app = App("principal-flood")
runs: dict[str, int] = {}


@app.tool()
async def big(label: str) -> str:
    """An answer of ``ANSWER`` bytes (counted per label)."""
    runs[label] = runs.get(label, 0) + 1
    return label + "x" * ANSWER


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


async def test_a_flood_of_principals_keyed_answers_stays_inside_the_budget() -> None:
    store = MemoryStore()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            auth = await jwt_authorization(nursery)
            config = ServerConfig(
                port=0, auth=auth, memory_budget=BUDGET, session_retain_bytes=BUDGET // 4
            )
            server = await nursery.start(Server(app, config, store=store).run)
            client = await Client.connect(server.port)  # a gateway: every principal
            try:
                for n in range(PRINCIPALS):
                    sub = f"flood-{n}"
                    message, headers = keyed(sub, n)
                    reply: Reply = await client.request("POST", "/mcp", message, headers=headers)
                    assert reply.status == 200, (reply.status, reply.body[:300])
                    held = server.budget.held
                    assert held <= BUDGET, (n, held)
                # The newest principal's retry is still answered from its record.
                message, headers = keyed(f"flood-{PRINCIPALS - 1}", 10_000)
                again = await client.request("POST", "/mcp", message, headers=headers)
                assert again.status == 200, again
            finally:
                await client.aclose()
                server.shutdown()
                await server.stopped.wait()
                nursery.cancel_scope.cancel()
    assert all(count == 1 for count in runs.values()), runs
    # The gates emptied by shedding are dropped, not kept as empty records.
    assert len(store._internal) < PRINCIPALS


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
