"""``python -m benchmarks.course_files`` still traces a call on both runtimes.

Not a timing test, and no count is pinned (a refactoring moves them): it guarantees
that the tracer sees the traced call pass through the files that must carry it --
the POST's course in the core and each runtime's own POST handling -- that it counts
the Python functions that ran (the least of its traced calls no more than their
median), and that the asyncio runtime's server stops without leaving a task pending.
Marked ``bench`` (a few seconds): CI runs it with the other benchmark smoke tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
#: A file each runtime's session-era POST must pass through.
RUNTIME_POST = {"trio": "weir/engine/_calls.py", "asyncio": "weir/asyncio/_post.py"}


@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
def test_a_traced_call_names_the_course_and_the_runtime(runtime: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.course_files", "--runtime", runtime],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    lines = out.stdout.splitlines()
    files = {line.strip() for line in lines if line.startswith("   ")}
    assert {"weir/protocol/_post.py", RUNTIME_POST[runtime]} <= files, out.stdout
    (counted,) = [line for line in lines if line.startswith("Python calls")]
    least, median = map(int, counted.rsplit(":", 1)[1].split())
    assert len(files) <= least <= median, out.stdout  # each file ran at least one function
    assert "pending" not in out.stderr and "Traceback" not in out.stderr, out.stderr
