"""A store that lost acknowledged writes hands out a session's stream epoch again.

Found under load (``benchmarks.cluster_failover``, scenario ``lose``): a primary died
before its replica had the session's epoch counter, the promoted replica issued an
epoch the session's live replica had already used, and opening the stream raised out
of the connection handler (a traceback, the connection dropped).  Now the request is
refused like any store failure -- 503 ``store_unavailable``, nothing run, the claimed
key given back -- and its retry, under the next epoch, runs once.  Real Valkey; the
lost write is made by setting the session's epoch counter back, as the promoted
replica has it.
"""

from __future__ import annotations

import logging

import coredis
import pytest
import trio

from tests.integration.inprocess import valkey_replicas
from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import initialize
from weir.engine import App, ServerConfig

VERSION = {"mcp-protocol-version": "2025-11-25", "accept": "application/json, text/event-stream"}
runs: list[str] = []
app = App("epochs")


@app.tool(idempotent=False)
async def charge(key: str) -> str:
    """Not idempotent: counts its runs."""
    runs.append(key)
    return f"charged {key}"


def call(rid: int, key: str) -> dict[str, object]:
    params = {"name": "charge", "arguments": {"key": key}}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def test_an_epoch_issued_twice_is_refused_and_the_retry_runs_once(
    valkey_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs.clear()
    caplog.set_level(logging.INFO, logger="weir")
    config = ServerConfig(port=0)
    async with valkey_replicas(valkey_url, 1, app, config, label="epochs") as ([server], store):
        with trio.fail_after(30):
            client = await RawClient.connect(server.port)
            sid = await initialize(client)
            first = await client.request("POST", "/mcp", call(1, "a"), session=sid, headers=VERSION)
            assert first.status == 200 and first.json()["result"]["content"][0]["text"] == (
                "charged a"
            )
            record = store._keys("anonymous", sid)[0]
            async with coredis.Redis.from_url(valkey_url, decode_responses=False) as raw:
                issued = int(await raw.hget(record, "epochs") or 0)
                assert issued >= 1
                await raw.hset(record, {"epochs": issued - 1})  # the last issue, lost
            again = await client.request("POST", "/mcp", call(2, "b"), session=sid, headers=VERSION)
            assert (again.status, again.reason) == (503, "store_unavailable"), again
            assert runs == ["a"]  # nothing ran under the reused epoch
            retry = await client.request("POST", "/mcp", call(2, "b"), session=sid, headers=VERSION)
            assert retry.status == 200, retry
            assert retry.json()["result"]["content"][0]["text"] == "charged b"
            assert runs == ["a", "b"]
    weir = [r for r in caplog.records if r.name.startswith("weir")]
    assert not [r for r in weir if r.exc_info], [r.getMessage() for r in weir]
    assert any("a second time" in r.getMessage() for r in weir)
