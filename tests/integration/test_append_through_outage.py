"""An answer computed while the store is briefly away still reaches its client.

Found under load (``benchmarks.cluster_failover``, scenario ``kill``): calls whose tool
finished during the second a primary took to fail over had their final event refused
by the store, so their streams ended without an answer, and every resume found
nothing more -- the client gave up though the call had run.  Now an event's append is
retried through an outage (bounded; the append is idempotent), so the answer goes
out once the store answers again.  Real Valkey, frozen (SIGSTOP) past the store's
2 s deadline so the append really fails first.
"""

from __future__ import annotations

import trio

from tests.integration.conftest import ValkeyProcess
from tests.integration.inprocess import valkey_replicas
from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import initialize
from weir.engine import App, ServerConfig

VERSION = {"mcp-protocol-version": "2025-11-25", "accept": "application/json, text/event-stream"}
app = App("outage")
release = trio.Event()
runs: list[str] = []


@app.tool(idempotent=False)
async def charge(key: str) -> str:
    """Not idempotent; finishes when the test says so."""
    runs.append(key)
    await release.wait()
    return f"charged {key}"


async def test_an_answer_finished_during_an_outage_is_delivered_after_it(
    private_valkey: ValkeyProcess,
) -> None:
    global release
    release = trio.Event()
    runs.clear()
    config = ServerConfig(port=0)
    async with valkey_replicas(private_valkey.url, 1, app, config, label="outage") as (
        [server],
        _,
    ):
        with trio.fail_after(40):
            client = await RawClient.connect(server.port)
            sid = await initialize(client)
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "charge", "arguments": {"key": "k"}},
            }
            reply: list[object] = []

            async def post() -> None:
                reply.append(
                    await client.request(
                        "POST", "/mcp", call, session=sid, headers=VERSION, timeout=30
                    )
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                while not runs:
                    await trio.sleep(0.01)
                private_valkey.pause()
                try:
                    release.set()  # the answer is ready; the store is not
                    await trio.sleep(3.0)  # past the 2 s deadline: the append fails first
                finally:
                    private_valkey.resume()
    (answer,) = reply
    assert answer.status == 200, answer  # type: ignore[attr-defined]
    assert answer.json()["result"]["content"][0]["text"] == "charged k"  # type: ignore[attr-defined]
    assert runs == ["k"]
