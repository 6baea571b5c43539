"""``GET /metrics`` on both runtimes: the same Prometheus text, counting the same things.

The demo app is served on a loopback port by the Trio engine and by the asyncio
runtime (in a thread of its own); a raw HTTP client opens a session, calls a tool,
retries the call, asks for a session that does not exist, and reads ``/metrics``
between.  The series are the same on both, except the few the asyncio runtime
cannot have (no accept loop of its own), which it leaves out
rather than show as zeros.
"""

from __future__ import annotations

import re
import sys

import trio

import weir
from weir.app.samples.demo import app
from weir.engine import ServerConfig

from .configured import RUNTIMES, serve_configured
from .rawhttp import Client, Reply, call, initialize

PY = ".".join(str(n) for n in sys.version_info[:3])
#: Series only the Trio engine has.
TRIO_ONLY = {
    "weir_connections_shed_total",
    "weir_accept_errors_total",
    "weir_connections_parked",
}
#: Series both runtimes render.
BOTH = {
    "weir_retained_bytes",
    "weir_retention_evictions_total",
    "weir_retention_evicted_bytes_total",
    "weir_sessions",
    "weir_half_open_sessions",
    "weir_inline_calls_total",
    "weir_inline_deferred_total",
    "weir_admissions_total",
    "weir_refusals_total",
    "weir_teardowns_total",
    "weir_tool_executions_total",
    "weir_duplicate_requests_total",
    "weir_credit_in_use_frames",
    "weir_credit_in_use_bytes",
    "weir_outbound_limit_bytes",
    "weir_outbound_peak_bytes",
    "weir_credit_peak_frames",
    "weir_credit_peak_bytes",
    "weir_notifications_dropped_total",
    "weir_sessions_expired_total",
    "weir_memory_reclaims_total",
    "weir_connections",
    "weir_connection_limit",
    "weir_session_queue_depth",
    "weir_session_credit_bytes",
    "weir_sessionless_owners",
    "weir_sessionless_half_open",
    "weir_listen_streams",
    "weir_build_info",
    "weir_request_duration_seconds",
    "weir_requests_total",
    "weir_tool_duration_seconds",
    "weir_tool_calls_total",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
}


async def scrape(port: int, **headers: str) -> Reply:
    client = await Client.connect(port)
    try:
        return await client.request("GET", "/metrics", headers=headers)
    finally:
        await client.aclose()


def value(page: str, series: str) -> float:
    """The value of one sample (``series`` with its labels, if any) on ``page``."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", page, re.MULTILINE)
    assert found is not None, f"{series} not in:\n{page}"
    return float(found.group(1))


@RUNTIMES
async def test_the_same_series_count_the_same_things(runtime: str) -> None:
    with trio.fail_after(30):
        async with serve_configured(runtime, app, ServerConfig(port=0)) as port:
            first = await scrape(port)
            assert first.status == 200, first
            assert first.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            names = set(re.findall(r"^# TYPE (\S+) ", first.body.decode(), re.MULTILINE))
            expected = BOTH | TRIO_ONLY if runtime == "trio" else BOTH
            assert names == expected

            client = await Client.connect(port)
            try:
                sid = await initialize(client)
                message = call(7, "echo", {"text": "hi"})
                ran = await client.request("POST", "/mcp", message, session=sid)
                again = await client.request("POST", "/mcp", message, session=sid)
                assert ran.status == again.status == 200
                assert again.json()["result"] == ran.json()["result"]  # replayed, not run
                gone = await client.request("POST", "/mcp", call(8, "echo", {}), session="nope")
                assert gone.status == 404
            finally:
                await client.aclose()

            page = (await scrape(port)).body.decode()
            assert value(page, "weir_sessions") == 1
            assert value(page, "weir_tool_executions_total") == 1
            assert value(page, 'weir_duplicate_requests_total{outcome="replayed"}') == 1
            assert value(page, 'weir_refusals_total{reason="session_not_found"}') == 1
            assert value(page, "weir_admissions_total") >= 2
            assert value(page, "weir_connection_limit") > 0
            assert value(page, "weir_credit_peak_frames") >= 1
            assert (
                value(
                    page,
                    f'weir_build_info{{version="{weir.__version__}",python="{PY}",'
                    f'runtime="{runtime}"}}',
                )
                == 1
            )
            # The call ran once (the retry was replayed): one observation, by tool.
            assert value(page, 'weir_tool_calls_total{tool="echo",outcome="ok"}') == 1
            assert value(page, 'weir_requests_total{method="tools/call",outcome="ok"}') == 1
            tool = 'tool="echo",outcome="ok"'
            assert value(page, f"weir_tool_duration_seconds_count{{{tool}}}") == 1
            assert value(page, f'weir_tool_duration_seconds_bucket{{{tool},le="+Inf"}}') == 1
            assert value(page, "process_open_fds") > 0


@RUNTIMES
async def test_metrics_keep_the_endpoints_host_rules_and_take_get_only(runtime: str) -> None:
    with trio.fail_after(30):
        async with serve_configured(runtime, app, ServerConfig(port=0)) as port:
            client = await Client.connect(port)
            try:
                posted = await client.request("POST", "/metrics", {})
                assert posted.status == 405, posted
                assert posted.headers.get("allow") == "GET, HEAD", posted
                head = await client.request("HEAD", "/metrics")
                assert head.status == 200 and head.body == b"", head
                assert head.headers["content-type"].startswith("text/plain; version=0.0.4")
                # No body went out after the HEAD's head: the next answer parses whole.
                after = await client.request("GET", "/metrics")
                assert after.status == 200 and b"# TYPE weir_build_info gauge" in after.body
            finally:
                await client.aclose()
            foreign = await scrape(port, origin="https://evil.example")
            assert foreign.status == 403, foreign
            page = (await scrape(port)).body.decode()
            assert value(page, 'weir_refusals_total{reason="forbidden_origin"}') == 1
