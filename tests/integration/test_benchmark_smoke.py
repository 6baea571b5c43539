"""The fan-out benchmark still runs and still counts right (tiny runs, loopback only).

These are not timing tests -- no number here is a speed.  They guarantee that
``python -m benchmarks.fanout`` starts weir and the ceiling, drives them, and
reports what it claims to: every call answered once, executions counted exactly,
and, with a half-open peer, refusals, a bounded queue and no duplicates; with
``--half-open-control``, the same peer reading its stream and never refused.
Each run is a subprocess bounded by a timeout, on 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMES, BYTES = 16, 65536
#: Four weir sessions paced at 20 calls/s, one peer with 16 KiB results, a small credit.
PEER_RUN = (
    *("--server", "weir", "--sessions", "4", "--rate", "20", "--half-open", "1"),
    *("--half-open-pad", "16384", "--credit-frames", str(FRAMES), "--credit-bytes", str(BYTES)),
    *("--drain-window", "1"),
)


def fanout(tmp_path: Path, *args: str, timeout: float = 90.0) -> dict[str, Any]:
    """Run the benchmark with ``args``; return its one run's JSON record."""
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
    record = json.loads(out.read_text())
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
