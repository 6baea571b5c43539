"""``python -m benchmarks.tasks`` still runs and reports what it claims (a tiny run).

Not a timing test: no number here is a speed.  Ten clients each create a task that
works 0.2 s and poll it to its end, against the embedded store and against Valkey;
the row must account for every task and carry every field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


def _row(*extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.tasks", "--clients", "10", "--work", "0.2"]
    cmd += ["--poll", "0.05", *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("tasks: {")]
    row: dict[str, Any] = json.loads(line[len("tasks: ") :])
    return row


def test_tasks_benchmark_smoke_on_both_stores(valkey_url: str) -> None:
    for row, store in ((_row(), "memory"), (_row("--store", valkey_url), "redis")):
        assert row["store"] == store and row["clients"] == 10
        assert row["tasks_completed"] == 10 and row["tasks_other"] == 0
        assert row["polls_per_task"] >= 1
        assert 0 < row["create_ms"]["p50"] <= row["create_ms"]["p99"]
        assert 0 < row["get_ms"]["p50"] <= row["get_ms"]["p99"]
        assert row["server_cpu_ms_per_task"] > 0 and row["rss_mib"]["end"] > 0
    # One creation, one read per poll, and the run's own reads and writes.
    assert row["store_round_trips_per_task"] >= 1 + row["polls_per_task"]
