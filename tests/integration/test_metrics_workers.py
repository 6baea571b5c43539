"""``weir serve --workers 2``: one scrape of ``/metrics`` answers for the whole server.

Two worker processes share one port (the kernel picks a worker per connection) and
a real Valkey store.  K tool calls, each on a connection of its own, land on
either worker; then every scrape, whichever worker answers it, counts all K
(counters summed across workers), shows each worker's gauges under a ``worker``
label, and no scrape ever reads less than an earlier one (Prometheus would take
that for a counter reset).
"""

from __future__ import annotations

import itertools
import re
import tempfile

import trio

from tests.integration.rawhttp import Client, echo_on_fresh_connections, initialize
from tests.integration.runtimes import RUNTIMES
from tests.integration.serverproc import WeirProcess

K = 16
CALLS = 'weir_tool_calls_total{tool="echo",outcome="ok"}'


async def _scrape(port: int) -> str:
    client = await Client.connect(port)  # (a new connection: any worker may answer)
    try:
        reply = await client.request("GET", "/metrics")
        assert reply.status == 200, reply
        return reply.body.decode()
    finally:
        await client.aclose()


def _value(page: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", page, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@RUNTIMES
async def test_one_scrape_counts_every_workers_calls(runtime: str, valkey_url: str) -> None:
    args = ["--workers", "2", "--store", valkey_url]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(60):
                first = await Client.connect(server.port)
                try:
                    sid = await initialize(first)
                finally:
                    await first.aclose()
                for reply in await echo_on_fresh_connections(server.port, sid, K):
                    assert reply.status == 200, (reply, server.output())
                seen: list[tuple[float, float]] = []
                # Each worker publishes its counts every second: wait (bounded) for
                # the last ones to be seen, then keep scraping.
                for _ in range(200):
                    page = await _scrape(server.port)
                    seen.append((_value(page, CALLS), _value(page, "weir_tool_executions_total")))
                    if seen[-1] == (K, K):
                        break
                    await trio.sleep(0.1)
                assert seen[-1] == (K, K), (seen, server.output())
                workers: set[str] = set()
                for _ in range(10):
                    page = await _scrape(server.port)
                    seen.append((_value(page, CALLS), _value(page, "weir_tool_executions_total")))
                    workers |= set(re.findall(r'^weir_build_info\{.*worker="([^"]+)"', page, re.M))
                assert seen[-10:] == [(K, K)] * 10, seen
                later = itertools.pairwise(seen)
                assert all(a <= c and b <= d for (a, b), (c, d) in later), seen
                assert len(workers) == 2, page  # both workers' gauges, labelled
        finally:
            server.stop()
