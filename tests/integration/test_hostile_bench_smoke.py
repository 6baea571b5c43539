"""``python -m benchmarks.hostile`` still runs and reports what it claims (a tiny run).

Not a timing test: no number here is a speed.  It runs two attacks against weir at
``--scale 0.05`` as a subprocess (bounded by a timeout, loopback only) and checks the
JSON lines: every field is there, the oversized batch was refused with 400, and the
stalled row read weir's ``/metrics``.  (What weir bounds is asserted in test_hostile.)
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
PREFIX = "hostile: "


def test_hostile_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    cmd = [sys.executable, "-m", "benchmarks.hostile", "--attacks", "batch,stalled-sse"]
    cmd += ["--scale", "0.05", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX + "{")]
    rows: list[dict[str, Any]] = [json.loads(line[len(PREFIX) :]) for line in lines]
    assert [json.loads(x) for x in out.read_text().splitlines()] == rows
    assert [(r["attack"], r["server"]) for r in rows] == [
        ("batch", "weir"),
        ("stalled-sse", "weir"),
    ]
    for row in rows:
        for key in ("base", "peak", "after"):
            assert row["rss_mib"][key] > 0
        assert row["fds"]["peak"] >= 1
        polite = row["polite"]
        for phase in ("without", "with"):
            assert polite[phase]["calls"] >= 1
            assert 0 < polite[phase]["p50_ms"] <= polite[phase]["p99_ms"]
        assert polite["p99_ratio"] > 0 and polite["after_attack"] == "ok"
        assert row["attacker"]["statuses"] and row["server_exited"] is None
    batch, stalled = rows
    assert set(batch["attacker"]["statuses"]) == {"400"}
    assert batch["attacker"]["answers"].get("400 batch_too_large", 0) >= 1
    assert batch["attacker"]["answer_s"]["first"] > 0
    assert stalled["attacker"]["metrics"] == 200
    assert stalled["attacker"]["sessions"] == 1
    assert isinstance(stalled["attacker"]["teardowns"], float)  # read from weir's /metrics
    assert "| batch | weir |" in done.stdout and "| stalled-sse | weir |" in done.stdout
