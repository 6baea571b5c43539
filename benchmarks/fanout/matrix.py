"""``--server table``: weir, the raw floor and the official SDK, both eras, both
response modes, at one or more session counts -- one command, one table.

Theory of operation
-------------------
For each session count (``--table-sessions``, default ``50,400``), each era (the
session era, then 2026-07-28) and each response mode (SSE, then JSON), the servers
run one after another (floor, weir, SDK), and that rotation repeats ``--repeat`` times,
so a machine that slows down slows each server alike.  Each run is an ordinary fanout
run (``--measure`` as given, fanout's own client or ``--client CMD``); its result is
tagged with its era.  The table gives each server's CPU per call divided by the
floor's in the same round (the median of the rounds, their range), the floor's own
CPU per call, and the p50 latency over the floor's for weir -- what the performance
issue's targets are stated in.  The SDK is left out, with a message, when the ``sdk``
extra is not installed or ``--table-no-sdk`` says so.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .common import Options
from .report import RunResult
from .servers import run_one

ERAS = ("session", "sessionless")
MODES = ("sse", "json")
ERA_NAMES = {"session": "session era", "sessionless": "2026-07-28"}


async def run_matrix(
    opts: Options, sessions: list[int], repeat: int, logdir: Path, have_sdk: bool
) -> list[RunResult]:
    """Every cell's rounds (see the module docstring); the runs, tagged with their era."""
    servers = ["floor", "weir"] + (["sdk"] if have_sdk else [])
    if not have_sdk:
        print("fanout: sdk skipped (--table-no-sdk, or the extra 'sdk' missing)", file=sys.stderr)
    results: list[RunResult] = []
    for n in sessions:
        for era in ERAS:
            for mode in MODES:
                cell = replace(
                    opts,
                    sessions=n,
                    concurrency=n,
                    sessionless=era == "sessionless",
                    json_response=mode == "json",
                )
                for _ in range(repeat):
                    for name in servers:
                        result = await run_one(name, cell, None, None, logdir)
                        result.era = era
                        results.append(result)
    return results


def _cell(results: list[RunResult], n: int, era: str, mode: str) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = {}
    for r in results:
        if r.sessions == n and r.era == era and r.response_mode == mode:
            out.setdefault(r.server, []).append(r)
    return out


def _ratios(
    top: list[RunResult], floor: list[RunResult], value: Callable[[RunResult], float | None]
) -> list[float]:
    """Round by round, ``value`` of ``top`` over the floor's (rounds missing one: skipped)."""
    out = []
    for a, b in zip(top, floor, strict=False):
        x, y = value(a), value(b)
        if x is not None and y:
            out.append(x / y)
    return out


def _show(values: list[float], digits: int = 2) -> str:
    if not values:
        return "n/a"
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:.{digits}f}"
    return f"{mid:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def matrix_summary(results: list[RunResult]) -> dict[str, dict[str, list[float]]]:
    """Row label -> column (``N sessions``) -> the per-round values, for the JSON line."""
    counts = sorted({r.sessions for r in results if r.era is not None})
    rows: dict[str, dict[str, list[float]]] = {}

    def cpu(r: RunResult) -> float | None:
        return r.cpu_us_per_call

    def p50(r: RunResult) -> float | None:
        return r.p50_ms or None

    for n in counts:
        col = f"{n} sessions"
        for era in ERAS:
            for mode in MODES:
                cell = _cell(results, n, era, mode)
                floor = cell.get("floor", [])
                label = f"{mode.upper()}, {ERA_NAMES[era]}"
                for server in ("weir", "sdk"):
                    if server not in cell:  # (left out: no row of n/a)
                        continue
                    values = _ratios(cell.get(server, []), floor, cpu)
                    rows.setdefault(f"{server} {label}: CPU per call / floor", {})[col] = values
                rows.setdefault(f"weir {label}: p50 / floor's", {})[col] = _ratios(
                    cell.get("weir", []), floor, p50
                )
                floor_cpu = [c for r in floor if (c := cpu(r)) is not None]
                rows.setdefault(f"floor {label}: CPU per call (us)", {})[col] = floor_cpu
    return rows


def matrix_table(results: list[RunResult]) -> str:
    """The human-readable table of :func:`matrix_summary`: medians with ranges."""
    rows = matrix_summary(results)
    if not rows:
        return ""
    cols = sorted({c for row in rows.values() for c in row}, key=lambda c: int(c.split()[0]))
    lines = ["| " + " | ".join(["", *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    for label, row in rows.items():
        digits = 0 if label.endswith("(us)") else 2
        cells = [_show(row.get(c, []), digits) for c in cols]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)
