"""The metric families both runtimes render: histograms, bounded labels, and the
merge of ``--workers`` snapshots through a private directory (real files)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
import trio

from weir.common import Metrics
from weir.common._exposition import BUCKETS, Family, Histogram, exposition
from weir.common._metrics_share import STALE_AFTER, MetricsShare, Snapshot, merge


def _sample(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{series} not in:\n{text}"
    return float(found.group(1))


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    hist = Histogram(("method", "outcome"))
    for seconds in (0.0001, 0.0005, 0.003, 0.2, 100.0):
        hist.observe(("tools/call", "ok"), seconds)
    text = exposition([Family("h", "histogram", "x", hist.samples())])
    base = 'method="tools/call",outcome="ok"'
    assert _sample(text, f'h_bucket{{{base},le="0.0005"}}') == 2  # (le: at most)
    assert _sample(text, f'h_bucket{{{base},le="0.005"}}') == 3
    assert _sample(text, f'h_bucket{{{base},le="0.25"}}') == 4
    assert _sample(text, f'h_bucket{{{base},le="60"}}') == 4
    assert _sample(text, f'h_bucket{{{base},le="+Inf"}}') == 5
    assert _sample(text, f"h_count{{{base}}}") == 5
    assert _sample(text, f"h_sum{{{base}}}") == pytest.approx(100.2036)
    buckets = re.findall(r'le="([^"]+)"', text)
    assert buckets == [f"{b:g}" for b in BUCKETS] + ["+Inf"]


def test_labels_are_bounded_to_known_methods_registered_tools_and_a_cap() -> None:
    metrics = Metrics(tools={"echo"})
    metrics.observe("tools/call", {"name": "echo"}, "ok", 0.01)
    metrics.observe("tools/call", {"name": 'nope\n"x'}, "error", 0.01)  # not registered
    metrics.observe("tools/call", {"name": 7}, "error", 0.01)
    metrics.observe("made/up", {}, "error", 0.01)
    assert set(metrics.tool_calls.series) == {("echo", "ok"), ("other", "error")}
    assert set(metrics.requests.series) == {
        ("tools/call", "ok"),
        ("tools/call", "error"),
        ("other", "error"),
    }
    for i in range(1000):  # a client inventing names holds nothing more
        metrics.observe("tools/call", {"name": f"n{i}"}, "error", 0.01)
        metrics.observe(f"m/{i}", {}, "error", 0.01)
        metrics.observe("tools/call", {"name": ["unhashable"]}, "error", 0.01)
    assert set(metrics.tool_calls.series) == {("echo", "ok"), ("other", "error")}
    assert len(metrics.requests.series) == 3 and len(metrics._rows) <= 1
    capped = Histogram(("tool", "outcome"), cap=3)
    for i in range(100):
        capped.observe((f"t{i}", "ok"), 0.001)
    assert len(capped.series) == 4 and capped.counts()[("other", "ok")] == 97


async def test_timed_names_the_outcome() -> None:
    metrics = Metrics(tools={"t"})

    async def result(value: dict[str, object]) -> dict[str, object]:
        return value

    async def fails() -> dict[str, object]:
        raise ValueError("no")

    class Asked(BaseException):
        pass

    async def asks() -> dict[str, object]:
        raise Asked

    params = {"name": "t"}
    await metrics.timed("tools/call", params, result({}))
    await metrics.timed("tools/call", params, result({"isError": True}))
    with pytest.raises(ValueError):
        await metrics.timed("tools/call", params, fails())
    with pytest.raises(Asked):
        await metrics.timed("tools/call", params, asks(), pending=(Asked,))
    with trio.move_on_after(0):
        await metrics.timed("tools/call", params, trio.sleep_forever())
    assert metrics.tool_calls.counts() == {
        ("t", o): 1 for o in ("ok", "tool_error", "error", "input_required", "cancelled")
    }


def _fams(executions: float, sessions: float) -> list[Family]:
    return [
        Family("c_total", "counter", "c", [("", "", executions)]),
        Family("g", "gauge", "g", [("", "", sessions), ("", '{s="a"}', 1)]),
    ]


def test_merge_sums_counters_labels_fresh_gauges_and_keeps_a_dead_workers_counts() -> None:
    now = 1000.0
    mine = Snapshot("w0", now, _fams(3, 1))
    live = Snapshot("w1", now - 1, _fams(4, 2))
    dead = Snapshot("w2", now - STALE_AFTER - 1, _fams(5, 9))
    text = exposition(merge([mine, live, dead], now))
    assert _sample(text, "c_total") == 12
    assert _sample(text, 'g{worker="w0"}') == 1
    assert _sample(text, 'g{worker="w1"}') == 2
    assert _sample(text, 'g{s="a",worker="w1"}') == 1
    assert 'worker="w2"' not in text  # a dead worker has no live gauges...


def test_share_publishes_atomically_and_refuses_an_unsafe_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "m"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("WEIR_METRICS_DIR", str(private))
    a = MetricsShare.from_environment("a-0")
    b = MetricsShare.from_environment("../../etc/passwd")  # not a file name: hashed
    assert a is not None and b is not None and "/" not in b.worker
    b.publish(_fams(4, 2))
    (private / "junk.snap").write_bytes(b"\xff not msgpack")  # skipped, not fatal
    os.symlink("/etc/hostname", private / "link.snap")  # not followed
    text = exposition(a.merged(_fams(3, 1)))
    assert _sample(text, "c_total") == 7
    assert {p.name for p in private.iterdir()} == {
        "a-0.snap",
        f"{b.worker}.snap",
        "junk.snap",
        "link.snap",
    }
    assert stat.S_IMODE((private / "a-0.snap").stat().st_mode) == 0o600

    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("WEIR_METRICS_DIR", str(shared))
    assert MetricsShare.from_environment("a-0") is None
    monkeypatch.setenv("WEIR_METRICS_DIR", str(private / "a-0.snap"))  # not a directory
    assert MetricsShare.from_environment("a-0") is None
