"""The fan-out benchmark still runs and still counts right (tiny runs, loopback only).

These are not timing tests -- no number here is a speed.  They guarantee that
``python -m benchmarks.fanout`` starts weir and the ceiling, drives them, and
reports what it claims to: every call answered once, executions counted exactly,
and, with a half-open peer, refusals, a bounded queue and no duplicates; with
``--half-open-control``, the same peer reading its stream and never refused; with
``--ab``, a run without the peer and one with it (in its own, lowered process, the
server pinned to its own CPU), compared; with ``--server sdk-compare``, the SDK's app
served by weir and by the SDK's own transport, side by side; with ``--client``, an
independent client (``benchmarks/h11_client.py``) driving weir and the floor on both
eras, and a client that reports nothing failing the run loudly; with ``--server
table``, the floor, weir and the SDK on both eras and response modes, and the grid of
their ratios; ``benchmarks.idle_memory``, what an idle session holds by line.
Each run is a subprocess bounded by a timeout, on 127.0.0.1.  Marked ``bench``
(about half a minute in all): ``python3 -m pytest -m bench`` runs them, as CI does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
FRAMES, BYTES = 16, 65536
#: Four weir sessions paced at 20 calls/s, one peer with 16 KiB results, a small credit.
PEER_RUN = (
    *("--server", "weir", "--sessions", "4", "--rate", "20", "--half-open", "1"),
    *("--half-open-pad", "16384", "--credit-frames", str(FRAMES), "--credit-bytes", str(BYTES)),
    *("--drain-window", "1"),
)


def fanout_record(tmp_path: Path, *args: str, timeout: float = 90.0) -> dict[str, Any]:
    """Run the benchmark with ``args``; return its JSON line."""
    out = tmp_path / "run.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.fanout",
        "--no-progress",
        "--plot",
        "",
        "--out-json",
        str(out),
        "--warmup",
        "1",
        *args,
    ]
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "INVALID RUN" not in done.stderr, done.stderr[-2000:]
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def fanout(tmp_path: Path, *args: str, timeout: float = 90.0) -> dict[str, Any]:
    """Run the benchmark with ``args``; return its one run's JSON record."""
    record = fanout_record(tmp_path, *args, timeout=timeout)
    assert len(record["runs"]) == 1
    run: dict[str, Any] = record["runs"][0]
    return run


@pytest.mark.parametrize("server", ["weir", "ceiling"])
def test_closed_loop_run_answers_every_call_once(tmp_path: Path, server: str) -> None:
    run = fanout(tmp_path, "--server", server, "--sessions", "6", "--calls", "4")
    assert run["server"] == server
    assert run["calls"] == 24
    assert run["errors"] == 0
    assert run["cpu_us_per_call"] >= 0  # CPU ticks are 10 ms: a tiny run may read 0
    assert run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    if server == "weir":
        # The server's own tally: exactly one execution per call sent.
        assert run["executions"] == run["requests_sent"] == 24
        assert run["duplicates"] == 0


@pytest.mark.parametrize("server", ["weir", "ceiling"])
def test_the_sessionless_mode_answers_every_call(tmp_path: Path, server: str) -> None:
    run = fanout(tmp_path, "--server", server, "--sessions", "6", "--calls", "4", "--sessionless")
    assert run["server"] == server and run["calls"] == 24 and run["errors"] == 0
    assert run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]


def test_half_open_peer_is_refused_its_queue_stays_within_credit(tmp_path: Path) -> None:
    run = fanout(
        tmp_path,
        *PEER_RUN,
        *("--duration", "6", "--liveness-timeout", "30"),
        *("--gateway-retries", "1", "--gateway-scope", "half-open"),
    )
    half = run["half_open"]
    assert half["refused_429_half_open"] > 0
    assert 0 < half["max_queue_depth"] <= FRAMES
    assert half["max_queue_bytes"] <= BYTES
    assert half["mark"]["duplicates"] == 0
    assert run["errors"] == 0
    assert run["duplicates"] == 0


def test_control_peer_sends_the_same_requests_and_is_never_refused(tmp_path: Path) -> None:
    run = fanout(
        tmp_path, *PEER_RUN, "--duration", "4", "--half-open-control", "--half-open-rate", "10"
    )
    half = run["half_open"]
    assert half["sent"] > 10
    assert half["accepted"] == half["sent"]
    assert half["refused_429"] == 0
    assert half["mark"]["executions"] == half["accepted"]
    assert half["mark"]["duplicates"] == 0
    assert run["errors"] == 0


def test_ab_runs_without_and_with_a_peer_in_its_own_process(tmp_path: Path) -> None:
    pin = len(os.sched_getaffinity(0)) >= 2  # --pin-server needs a CPU for each side
    record = fanout_record(
        tmp_path,
        *PEER_RUN,
        *("--duration", "5", "--liveness-timeout", "30", "--ab", "1"),
        *("--peer-process", "--peer-nice", "19", *(("--pin-server",) if pin else ())),
        *("--gateway-retries", "1", "--gateway-scope", "half-open"),
        timeout=150.0,
    )
    without, with_peer = record["runs"]
    assert (without["arm"], with_peer["arm"]) == ("without", "with")
    assert without["half_open"] is None
    assert without["refusals"].get("stream_half_open", 0) == 0
    # The peer ran in its own process: its counts came back, and its session was
    # followed in /metrics from here (so its queue depth is known, within credit).
    half = with_peer["half_open"]
    assert half["sent"] > 0
    assert half["refused_429_half_open"] > 0
    assert half["refused_429_half_open"] == with_peer["refusals"]["stream_half_open"]
    assert 0 < half["max_queue_depth"] <= FRAMES
    assert half["mark"]["duplicates"] == 0
    layout = with_peer["layout"]
    assert layout["peer_process"] is True
    assert layout["peer_nice"] == layout["gateway_nice"] == 19
    if pin:
        assert len(layout["server_cpus"]) == 1
        assert not set(layout["server_cpus"]) & set(layout["client_cpus"])
    for run in (without, with_peer):
        assert run["errors"] == 0
        assert run["duplicates"] == 0
        assert run["calls"] > 0
    ratio = record["ratios"]["others_p99_with_half_open_vs_without"]
    assert ratio["pairs"] == 1
    assert ratio["value"] == pytest.approx(
        ratio["pooled_p99_ms"]["with"] / ratio["pooled_p99_ms"]["without"]
    )
    assert ratio["met"] == (ratio["value"] <= 1.1)


def test_compare_rounds_report_the_floor_the_ceiling_and_the_initialize_tail(
    tmp_path: Path,
) -> None:
    record = fanout_record(
        tmp_path, "--server", "compare", "--sessions", "5", "--calls", "3", "--repeat", "2"
    )
    runs = record["runs"]
    assert [r["server"] for r in runs] == ["weir", "floor", "ceiling"] * 2
    for run in runs:
        assert run["measure"] == "session" and run["calls"] == 15 and run["errors"] == 0
        assert 0 < run["init_p50_ms"] <= run["init_p99_ms"] <= run["init_max_ms"]
    ratios = record["ratios"]  # (CPU ratios only for rounds whose 10 ms CPU ticks read > 0)
    assert len(ratios["weir_init_p99_vs_ceiling"]["rounds"]) == 2, ratios
    assert ratios["weir_init_p99_vs_ceiling"]["target_max"] == 3.0


def test_idle_mode_weighs_open_sessions(tmp_path: Path) -> None:
    record = fanout_record(
        tmp_path, "--server", "weir", "--measure", "idle", "--sessions", "20", "--idle-hold", "0.2"
    )
    (run,) = record["runs"]
    assert run["measure"] == "idle" and run["calls"] == 0
    assert run["idle_rss_per_session_kib"] is not None
    assert record["ratios"]["weir_idle_kib_per_session"]["target_max"] == 12.0


def test_compare_store_counts_round_trips_per_call(tmp_path: Path, valkey_url: str) -> None:
    record = fanout_record(
        tmp_path, "--compare-store", valkey_url, "--sessions", "4", "--calls", "5"
    )
    memory, shared = record["runs"]
    assert (memory["server"], shared["server"]) == ("weir", "weir-store")
    assert memory["calls"] == shared["calls"] == 20 and shared["errors"] == 0
    assert memory["store_rtt_per_call"] is None
    # Two per tools/call (claim, final append), plus each session's own setup
    # (initialize, the initialized notification: at most five).
    setup = (shared["store_rtt_per_call"] - 2.0) * 5
    assert 0 <= setup <= 5, shared
    # The CPU ratio exists exactly when the memory run's CPU reading is above zero: a
    # run this small can read 0 ticks of 10 ms on a quiet machine, and then the report
    # must leave the ratio out rather than divide by zero or invent one.
    ratio = record["ratios"].get("weir_store_cpu_per_call_vs_memory")
    if memory["cpu_us_per_call"]:
        assert ratio is not None, record["ratios"]
        expected = shared["cpu_us_per_call"] / memory["cpu_us_per_call"]
        assert ratio["value"] == pytest.approx(expected), ratio
    else:
        assert ratio is None, ratio


@pytest.mark.parametrize("keyed", [False, True])
def test_sessionless_calls_reach_the_store_only_with_idempotency_keys(
    tmp_path: Path, valkey_url: str, keyed: bool
) -> None:
    """2026-07-28 calls are gated (claimed, then recorded: two round trips each) only
    when they carry an ``Idempotency-Key``; without one, nothing touches the store."""
    keys = ("--idempotency-keys",) if keyed else ()
    record = fanout_record(
        tmp_path,
        "--compare-store",
        valkey_url,
        "--sessionless",
        *keys,
        "--sessions",
        "3",
        "--calls",
        "4",
    )
    shared = record["runs"][1]
    assert shared["server"] == "weir-store" and shared["calls"] == 12, shared
    assert shared["errors"] == 0 and shared["duplicates"] == 0, shared
    assert shared["store_rtt_per_call"] == (pytest.approx(2.0, abs=0.5) if keyed else 0.0)


def test_sdk_compare_runs_the_sdk_app_on_weir_and_on_the_sdk(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from weir.app import load_app

    # The app sdk-weir serves is the SDK server the sdk side serves, wrapped by weir.
    assert load_app("benchmarks.sdk_server:server").name == "sdk-bench"
    record = fanout_record(
        tmp_path, "--server", "sdk-compare", "--sessions", "4", "--calls", "3", timeout=150.0
    )
    runs = record["runs"]
    assert [r["server"] for r in runs] == ["sdk-weir", "sdk", "weir"]
    for run in runs:
        assert run["measure"] == "session" and run["calls"] == 12 and run["errors"] == 0
        assert 0 < run["init_p50_ms"] <= run["init_p99_ms"] <= run["init_max_ms"]
        assert run["cpu_us_per_call"] >= 0 and run["rss_per_session_kib"] is not None
    sdk_weir, sdk, _ = runs
    assert sdk_weir["executions"] == sdk_weir["requests_sent"] == 12  # weir's own /metrics
    assert sdk["executions"] is None  # the SDK's transport has no /metrics
    sides = record["side_by_side"]
    assert list(sides) == ["sdk-weir", "sdk", "weir"]
    for row in sides.values():
        assert set(row) == {"calls_per_s", "cpu_us_per_call", "rss_per_session_kib", "init_p99_ms"}
        for m in row.values():
            assert m["n"] == 1 and m["min"] == m["median"] == m["max"]
        assert row["calls_per_s"]["median"] > 0
    ratios = record["ratios"]  # (CPU ratios only when the 10 ms CPU ticks read > 0)
    for key in ("sdk_weir_calls_per_s_vs_sdk", "sdk_weir_init_p99_vs_sdk"):
        assert ratios[key]["value"] > 0 and len(ratios[key]["rounds"]) == 1
    assert ratios["sdk_weir_calls_per_s_vs_sdk"]["value"] == pytest.approx(
        sdk_weir["calls_per_s"] / sdk["calls_per_s"]
    )


def test_sdk_compare_weighs_idle_sessions_on_both_transports(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    record = fanout_record(
        tmp_path,
        *("--server", "sdk-compare", "--measure", "idle", "--sessions", "10"),
        *("--idle-hold", "0.2"),
        timeout=150.0,
    )
    runs = record["runs"]
    assert [r["server"] for r in runs] == ["sdk-weir", "sdk", "weir"]
    for run in runs:
        assert run["measure"] == "idle" and run["calls"] == 0
        assert run["idle_rss_per_session_kib"] is not None
    sides = record["side_by_side"]
    for name, run in zip(["sdk-weir", "sdk", "weir"], runs, strict=True):
        kib = run["idle_rss_per_session_kib"]
        assert sides[name] == {"rss_per_session_kib": dict(median=kib, min=kib, max=kib, n=1)}
    if runs[1]["idle_rss_per_session_kib"]:  # a ratio needs the SDK's growth to be nonzero
        assert "sdk_weir_rss_per_session_vs_sdk" in record["ratios"]


def _module_json(module: str, *args: str, timeout: float = 120.0) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_long_stream_reports_every_window() -> None:
    result = _module_json(
        "benchmarks.long_stream", "--streams", "2", "--events", "300", "--window", "100"
    )
    assert result["events_per_stream"] == 300
    assert len(result["cpu_us_per_event"]) == 3
    assert all(value >= 0 for value in result["cpu_us_per_event"])


def test_store_clients_measure_every_client(valkey_url: str) -> None:
    result = _module_json(
        "benchmarks.store_clients",
        *("--url", valkey_url, "--tasks", "4", "--per-task", "10", "--rounds", "1"),
    )
    assert set(result["clients"]) == {
        "coredis",
        "coredis-pool64",
        "coredis-no-timeout",
        "resp-pipe",
    }
    assert result["clients"]["coredis"]["vs_coredis"] == 1.0


@pytest.mark.parametrize("era", ["session", "sessionless"])
def test_weir_on_the_asyncio_runtime_answers_every_call_once(tmp_path: Path, era: str) -> None:
    """``--runtime asyncio`` serves weir on asyncio; the same tally holds."""
    mode = ["--sessionless"] if era == "sessionless" else []
    args = ("--server", "weir", "--runtime", "asyncio", "--sessions", "6", "--calls", "4")
    run = fanout(tmp_path, *args, *mode)
    assert run["calls"] == 24 and run["errors"] == 0
    assert run["executions"] == run["requests_sent"] == 24 and run["duplicates"] == 0


def test_across_commits_compares_revisions_side_by_side() -> None:
    """Two revisions (here the same one twice), one round each: both measured, the
    second's ratio to the first printed."""
    argv = ["benchmarks.across_commits", "HEAD", "HEAD:asyncio", "--sessions", "3"]
    done = subprocess.run(
        [sys.executable, "-m", *argv, "--calls", "2", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("session ")]
    assert [(r[1], r[2]) for r in rows] == [("HEAD", "trio"), ("HEAD", "asyncio")], done.stdout
    # (A run this small may read 0 µs of CPU, in 10 ms ticks: then no ratio.)
    assert rows[0][-1] in ("x1.00", "x-") and rows[1][-1].startswith("x")


CLIENT = f"{sys.executable} -m benchmarks.h11_client"


@pytest.mark.parametrize("era", ["session", "sessionless"])
@pytest.mark.parametrize("mode", ["sse", "json"])
def test_an_independent_client_drives_weir_and_the_floor(
    tmp_path: Path, era: str, mode: str
) -> None:
    args = ["--server", "compare", "--client", CLIENT, "--sessions", "3", "--calls", "4"]
    args += ["--sessionless"] if era == "sessionless" else []
    args += ["--json-response"] if mode == "json" else []
    record = fanout_record(tmp_path, *args)
    runs = {run["server"]: run for run in record["runs"]}
    assert set(runs) == {"weir", "floor", "ceiling"}
    for run in runs.values():  # every call answered, and measured on the server's side
        assert (run["calls"], run["errors"]) == (12, 0), run
        assert run["server_cpu_s"] is not None and run["cpu_us_per_call"] is not None
        assert run["p50_ms"] > 0 and run["response_mode"] == mode
    assert record["options"]["client"] == CLIENT


def test_a_client_that_reports_nothing_fails_the_run(tmp_path: Path) -> None:
    silent = f"{sys.executable} -c \"print('phase')\""
    cmd = [sys.executable, "-m", "benchmarks.fanout", "--no-progress", "--plot", ""]
    cmd += ["--server", "floor", "--client", silent, "--sessions", "2", "--calls", "2"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert 'must end its output with a JSON line holding "calls"' in done.stderr


def test_the_table_runs_every_server_on_both_eras_and_modes(tmp_path: Path) -> None:
    args = ["--server", "table", "--table-sessions", "2", "--calls", "3", "--sessions", "2"]
    record = fanout_record(tmp_path, *args, timeout=240)
    cells = {(r["server"], r["era"], r["response_mode"]) for r in record["runs"]}
    servers = {"floor", "weir", "sdk"}
    assert cells == {
        (s, e, m) for s in servers for e in ("session", "sessionless") for m in ("sse", "json")
    }
    assert all(r["errors"] == 0 and r["calls"] == 6 for r in record["runs"])
    grid = record["matrix"]
    for label in ("weir SSE, session era", "sdk JSON, 2026-07-28", "weir SSE, 2026-07-28"):
        assert "2 sessions" in grid[f"{label}: CPU per call / floor"]
    assert record["ratios"] == {}  # (per cell, in the grid)


def test_the_table_leaves_the_sdk_out_when_asked_and_plots_against_sessions(
    tmp_path: Path,
) -> None:
    plot = tmp_path / "grid.png"
    args = ["--server", "table", "--table-sessions", "2,3", "--calls", "2", "--table-no-sdk"]
    record = fanout_record(tmp_path, *args, "--plot", str(plot), timeout=240)
    assert {r["server"] for r in record["runs"]} == {"floor", "weir"}
    assert len(record["runs"]) == 16  # 2 counts x 2 servers x 2 eras x 2 modes
    assert not any(label.startswith("sdk") for label in record["matrix"])
    # The SVG: three panels (CPU per call, p50, p99), a line per series (server x era x
    # mode) through both session counts.  Latency is never 0; CPU per call of a run
    # this small can read 0 ticks, and a point without a value is left out.
    svg = ElementTree.parse(plot.with_suffix(".svg")).getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    titles = [line.findtext("{http://www.w3.org/2000/svg}title") for line in lines]
    series = {
        f"{s} {m}, {e}"
        for s in ("floor", "weir")
        for m in ("SSE", "JSON")
        for e in ("session era", "2026-07-28")
    }
    assert set(titles) == series
    assert len(lines) <= 3 * 8
    assert sum(len(line.attrib["points"].split()) == 2 for line in lines) >= 2 * 8
    # Drawn again from the JSON line alone, the same lines.
    again = tmp_path / "again.svg"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.fanout.svg_plot",
        str(again),
        str(tmp_path / "run.json"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert again.read_text() == plot.with_suffix(".svg").read_text()


def test_idle_memory_breaks_an_idle_session_down_by_line() -> None:
    """``benchmarks.idle_memory``: the server under tracemalloc, two snapshots, a table."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.idle_memory", "--sessions", "40", "--top", "60"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("40 idle sessions: ")
    per_session_kib = float(lines[0].split(": ")[1].split()[0])
    assert 1.0 < per_session_kib < 200.0  # something is held, and not absurdly much
    # The session's own record and its connection are among what it holds.
    assert any("engine/_session_table.py:" in line for line in lines), proc.stdout
    assert any("engine/_connections.py:" in line for line in lines), proc.stdout


def test_large_runs_spread_sessions_over_loopback_source_addresses() -> None:
    # Past ~28,000 connections to one address and port, loopback runs out of source
    # ports: fanout spreads the sessions over 127.0.0.1, .2, ... (checked without
    # opening them; this machine's descriptor limit allows 20,000 at most).
    from benchmarks.fanout.cli import options, parser
    from benchmarks.fanout.client import Endpoint
    from benchmarks.fanout.load import PER_SOURCE, Run

    here = Endpoint.parse("http://127.0.0.1:9/mcp")

    def sources(sessions: int) -> dict[str | None, int]:
        opts = options(parser().parse_args(["--server", "weir"]))
        opts.sessions = sessions
        counts: dict[str | None, int] = {}
        for s in Run(opts, "weir", here, None, here, here).new_sessions():
            counts[s.client.local_address] = counts.get(s.client.local_address, 0) + 1
        return counts

    assert sources(PER_SOURCE) == {None: PER_SOURCE}
    spread = sources(2 * PER_SOURCE + 3)
    assert set(spread) == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    assert max(spread.values()) - min(spread.values()) <= 1
