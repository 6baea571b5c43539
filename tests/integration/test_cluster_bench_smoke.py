"""The store benchmarks of issue 26 still run and still count right (tiny runs).

Not timing tests: no number here is a speed.  ``benchmarks.store_durability`` runs
its stores and paths side by side and reports every one; ``benchmarks.cluster_failover``
forms its own 3+3 cluster, starts three weir replicas and the gateway, fails the
cluster over under a little load and reports every call answered, each run once,
counted from the tool's own ledger.  Each run is a subprocess bounded by a timeout,
on 127.0.0.1.  Marked ``bench``, as CI runs them (``-m bench``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]


def last_json(*args: str, timeout: float) -> Any:
    """Run ``python -m ARGS`` from the checkout; its last line, as JSON."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_store_durability_measures_every_store_and_path(valkey_url: str) -> None:
    out = last_json(
        *("benchmarks.store_durability", "--url", valkey_url, "--tasks", "4"),
        *("--per-task", "3", "--rounds", "1", "--replicas", "0", "--paths", "pipe,coredis"),
        timeout=120,
    )
    runs = {(r["path"], r["replicas"]): r for r in out["runs"]}
    assert set(runs) == {("pipe", 0), ("coredis", 0)}
    assert all(r["calls_per_s"] > 0 and r["p50_ms"] > 0 for r in runs.values())


def test_cluster_failover_runs_a_planned_failover_and_counts_every_call() -> None:
    (report,) = last_json(
        *("benchmarks.cluster_failover", "--scenarios", "failover", "--store-replicas", "0"),
        *("--sessions", "8", "--before", "2", "--after", "2", "--json"),
        timeout=240,
    )
    assert report["scenario"] == "failover" and report["calls"] > 0
    assert report["answered_ok"] == report["calls"] == report["executions"]
    assert report["duplicates"] == report["wrong"] == report["tracebacks"] == 0
    assert report["fault_s"] > 0  # the replica took over
