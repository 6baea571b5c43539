"""The record of a run and the report made of it: statistics, JSON, table, ratios, plot.

Theory of operation
-------------------
:class:`RunResult` is everything one run measured; :meth:`RunResult.public` is its
record in the JSON line (without the raw latencies and samples, which only the plot
uses).  :class:`HalfOpenStats` is what the half-open peers saw, :class:`Sample` one
point of the time series (seconds since the measured phase began).

Percentiles are nearest-rank over the sorted latencies (:func:`percentile`; 0 for
none), and :func:`p99_timeline` gives the p99 of every 5 s of the phase, calls
bucketed by the time they started.

The report: :func:`table` (one row per run), :func:`ratios` (weir against the ceiling
in CPU per call and against the SDK in calls/s, each with its target, and with
``--ab`` :func:`ab_ratio`: the other sessions' p99 with the half-open peers against
without them -- the headline pools every measured call of each arm; the mean of the
per-run p99s and each pair's ratio are given beside it, because single runs of a p99
this small are noisy), the provenance of the JSON line (:func:`machine`; and
:func:`source_tree`, the git HEAD and a SHA-256 over ``protocol/`` and ``engine/`` as
they are on disk, found from :data:`benchmarks.fanout.common.REPO`), and
:func:`plot`: a PNG of the latency CDF, p99 over time, queue depth over time and RSS
over time, when matplotlib is installed (with ``--ab``, one pooled line per arm).

Nothing here does I/O except :func:`source_tree` (reads the sources, runs ``git``),
:func:`machine` (reads ``/proc/cpuinfo``) and :func:`plot` (writes the PNG).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .common import REPO


# ====================================================================== stats
@dataclass
class HalfOpenStats:
    """What the half-open peers saw, and what the server said about them."""

    peers: int = 0
    sessions_opened: int = 0
    sent: int = 0
    accepted: int = 0
    refused_429: int = 0
    refused_429_half_open: int = 0
    gone_404: int = 0
    other: int = 0
    errors: int = 0
    first_429_s: float | None = None
    first_404_s: float | None = None
    labels: list[str] = field(default_factory=list)
    max_queue_depth: float = 0.0
    max_queue_bytes: float = 0.0


@dataclass
class Sample:
    """One point of the time series (seconds since the measured phase began)."""

    t: float
    rss: int
    frames_in_use: float | None = None
    max_queue_depth: float | None = None
    half_open_depth: float | None = None
    half_open_sessions: float | None = None
    half_open_bytes: float | None = None


@dataclass
class RunResult:
    """Everything one run measured (the JSON line holds a list of these)."""

    server: str
    url: str
    response_mode: str
    sessions: int
    calls: int = 0
    errors: int = 0
    refused_429: int = 0
    elapsed_s: float = 0.0
    calls_per_s: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    mean_ms: float = 0.0
    server_cpu_s: float | None = None
    server_sys_share: float | None = None
    cpu_us_per_call: float | None = None
    store_rtt_per_call: float | None = None
    rss_baseline_mib: float | None = None
    rss_after_setup_mib: float | None = None
    rss_phase_start_mib: float | None = None
    peak_rss_mib: float | None = None
    rss_per_session_kib: float | None = None
    rss_growth_mib: float | None = None
    teardowns: int | None = None
    executions: int | None = None
    duplicates: int | None = None
    duplicates_half_open: int | None = None
    duplicates_others: int | None = None
    requests_sent: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    died: list[str] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)
    gate_stopped: dict[str, int] = field(default_factory=dict)  # duplicates the gate caught
    credit: dict[str, float] | None = None
    half_open: dict[str, Any] | None = None
    gateway: dict[str, Any] | None = None
    setup_s: float = 0.0
    measure: str = "phase"
    #: ``--measure session``: from the start of connecting to the initialize answer.
    init_p50_ms: float | None = None
    init_p99_ms: float | None = None
    init_max_ms: float | None = None
    #: ``--measure idle``: RSS per open, idle session after the hold.
    idle_rss_per_session_kib: float | None = None
    client_cpu_s: float = 0.0
    gateway_cpu_s: float | None = None
    peer_cpu_s: float | None = None  # --peer-process: the whole peer process's CPU time
    machine_busy_s: float = 0.0
    foreign_cpu_s: float | None = None
    loadavg_before: float = 0.0
    busy_before_cores: float | None = None
    p99_timeline_ms: list[float] = field(default_factory=list)  # p99 per 5 s of the phase
    arm: str | None = None  # with --ab: "without" or "with" the half-open peers
    era: str | None = None  # with --server table: "session" or "sessionless"
    layout: dict[str, Any] | None = None  # with --pin-server / --peer-process: who ran where
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    init_ms: list[float] = field(default_factory=list, repr=False)
    timed_ms: list[tuple[float, float]] = field(default_factory=list, repr=False)
    samples: list[Sample] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        del out["latencies_ms"], out["samples"], out["timed_ms"], out["init_ms"]
        return out


def p99_timeline(timed: Iterable[tuple[float, float]]) -> list[float]:
    """The p99 of each 5 s of the phase, from (start s, latency ms) pairs."""
    buckets: dict[int, list[float]] = {}
    for t, latency in timed:
        buckets.setdefault(int(t // 5), []).append(latency)
    return [
        percentile(sorted(buckets.get(i, [])), 0.99) for i in range(max(buckets, default=-1) + 1)
    ]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# ====================================================================== report
_COLUMNS = (
    ("server", "server", "{}"),
    ("sessions", "sessions", "{}"),
    ("calls", "calls", "{}"),
    ("calls/s", "calls_per_s", "{:.0f}"),
    ("p50 ms", "p50_ms", "{:.1f}"),
    ("p90 ms", "p90_ms", "{:.1f}"),
    ("p99 ms", "p99_ms", "{:.1f}"),
    ("max ms", "max_ms", "{:.1f}"),
    ("CPU us/call", "cpu_us_per_call", "{:.0f}"),
    ("init p50/p99 ms", "init", "{}"),
    ("store RTT/call", "store_rtt_per_call", "{:.2f}"),
    ("peak RSS MiB", "peak_rss_mib", "{:.1f}"),
    ("RSS/session KiB", "rss_per_session_kib", "{:.1f}"),
    ("429s", "refused_429", "{}"),
    ("teardowns", "teardowns", "{}"),
    ("duplicates", "duplicates", "{}"),
    ("errors", "errors", "{}"),
)


def table(results: list[RunResult]) -> str:
    """The human-readable table (one row per run)."""
    rows = [[title for title, _, _ in _COLUMNS]]
    for r in results:
        d = asdict(r)
        if r.arm:
            d["server"] = f"{r.server} ({r.arm} peers)"
        d["init"] = (
            f"{r.init_p50_ms:.0f}/{r.init_p99_ms:.0f}"
            if r.init_p50_ms is not None and r.init_p99_ms is not None
            else None
        )
        if r.idle_rss_per_session_kib is not None:
            d["rss_per_session_kib"] = r.idle_rss_per_session_kib
        rows.append(
            [fmt.format(d[key]) if d[key] is not None else "n/a" for _, key, fmt in _COLUMNS]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def rounds(results: list[RunResult]) -> list[dict[str, RunResult]]:
    """The runs grouped into rounds (``--repeat``): a server seen again starts a new one."""
    out: list[dict[str, RunResult]] = []
    for r in results:
        if not out or r.server in out[-1]:
            out.append({})
        out[-1][r.server] = r
    return out


def _ratio(
    by_round: list[dict[str, RunResult]],
    value: Callable[[dict[str, RunResult]], float | None],
    target_max: float | None = None,
    target_min: float | None = None,
) -> dict[str, Any] | None:
    each = [v for rd in by_round if (v := value(rd)) is not None]
    if not each:
        return None
    mid = statistics.median(each)
    out: dict[str, Any] = {"value": mid, "rounds": [round(v, 3) for v in each]}
    if target_max is not None:
        out |= {"target_max": target_max, "met": mid <= target_max}
    if target_min is not None:
        out |= {"target_min": target_min, "met": mid >= target_min}
    return out


def _per(
    server: str, attr: str, other: str | None = None, other_attr: str | None = None
) -> Callable[[dict[str, RunResult]], float | None]:
    """A round's ``server.attr`` (or its ratio to ``other.other_attr``), None if missing."""

    def value(rd: dict[str, RunResult]) -> float | None:
        run = rd.get(server)
        top = getattr(run, attr, None) if run is not None else None
        if other is None:
            return top
        base = rd.get(other)
        bottom = getattr(base, other_attr or attr, None) if base is not None else None
        return top / bottom if top is not None and bottom else None

    return value


def ratios(results: list[RunResult]) -> dict[str, Any]:
    """weir against the floor and the ceiling (CPU per call, initialize p99, memory)
    and the SDK (calls/s), each the median over the rounds, with the targets."""
    by_round = rounds(results)
    weir = next((r for r in results if r.server == "weir"), None)
    cpu = "cpu_us_per_call"
    sse = weir is None or weir.response_mode == "sse"
    target = 1.2 if sse else 1.1
    # Against the raw floor: 1.8x in SSE mode, 1.5x in JSON mode (performance issue 27).
    floor_target = 1.8 if sse else 1.5
    found = {
        "weir_cpu_per_call_vs_ceiling": _ratio(by_round, _per("weir", cpu, "ceiling"), target),
        "weir_cpu_per_call_vs_floor": _ratio(by_round, _per("weir", cpu, "floor"), floor_target),
        "ceiling_cpu_per_call_vs_floor": _ratio(by_round, _per("ceiling", cpu, "floor")),
        "weir_init_p99_vs_ceiling": _ratio(by_round, _per("weir", "init_p99_ms", "ceiling"), 3.0),
        "weir_idle_kib_per_session": _ratio(
            by_round, _per("weir", "idle_rss_per_session_kib"), 12.0
        ),
        "weir_store_cpu_per_call_vs_memory": _ratio(by_round, _per("weir-store", cpu, "weir"), 1.8),
        # Two per tools/call, plus each session's setup spread over its calls.
        "weir_store_round_trips_per_call": _ratio(
            by_round, _per("weir-store", "store_rtt_per_call"), 2.1
        ),
        "weir_calls_per_s_vs_sdk": _ratio(
            by_round, _per("weir", "calls_per_s", "sdk"), target_min=5.0
        ),
        "sdk_cpu_per_call_vs_weir": _ratio(by_round, _per("sdk", cpu, "weir")),
    }
    out = {key: value for key, value in found.items() if value is not None}
    ab = ab_ratio(results)
    if ab is not None:
        out["others_p99_with_half_open_vs_without"] = ab
    return out


def ab_ratio(results: list[RunResult]) -> dict[str, Any] | None:
    """``--ab``: the other sessions' p99 with the half-open peers against without them.

    The headline ``value`` pools every measured call of each arm (all its runs) and
    compares the two p99s; the ratio of the mean per-run p99s and each pair's ratio are
    given beside it, because single runs of a p99 this small are noisy.
    """
    arms = _arms(results)
    if not arms["without"] or not arms["with"]:
        return None
    pooled = {
        arm: percentile(sorted(x for r in runs for x in r.latencies_ms), 0.99)
        for arm, runs in arms.items()
    }
    means = {arm: sum(r.p99_ms for r in runs) / len(runs) for arm, runs in arms.items()}
    pairs = [
        w.p99_ms / wo.p99_ms
        for wo, w in zip(arms["without"], arms["with"], strict=False)
        if wo.p99_ms > 0
    ]
    if not pooled["without"]:
        return None
    value = pooled["with"] / pooled["without"]
    return {
        "value": value,
        "target_max": 1.1,
        "met": value <= 1.1,
        "pairs": len(pairs),
        "pooled_p99_ms": pooled,
        "mean_p99_ms": means,
        "mean_ratio": means["with"] / means["without"] if means["without"] else None,
        "pair_ratios": [round(x, 3) for x in pairs],
        "median_pair_ratio": statistics.median(pairs) if pairs else None,
    }


def machine() -> dict[str, Any]:
    """nproc, CPU model, Python, kernel."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg": os.getloadavg()[0],
    }


def source_tree() -> dict[str, Any]:
    """The git HEAD and a digest of the server's sources as they are on disk now."""
    head = ""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    digest = hashlib.sha256()
    for folder in ("protocol", "engine"):
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(path.relative_to(REPO).as_posix().encode())
            digest.update(path.read_bytes())
    return {"git_head": head, "sources_sha256": digest.hexdigest()[:12]}


def _arms(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """``--ab``: the runs of each arm, in the order they ran."""
    arms: dict[str, list[RunResult]] = {"without": [], "with": []}
    for r in results:
        if r.arm in arms:
            arms[r.arm].append(r)
    return arms


def _per_arm(results: list[RunResult]) -> list[RunResult]:
    """``--ab``: one pooled line per arm (latencies and p99 per 5 s over all its runs;
    queue depth and RSS from its first run).  Otherwise the runs unchanged."""
    arms = {arm: runs for arm, runs in _arms(results).items() if runs}
    if not arms:
        return results
    merged = []
    for arm, runs in arms.items():
        lat = sorted(x for r in runs for x in r.latencies_ms)
        timeline = p99_timeline(pair for r in runs for pair in r.timed_ms)
        label = f"{runs[0].server}, {arm} peers ({len(runs)} runs)"
        merged.append(
            replace(
                runs[0],
                server=label,
                latencies_ms=lat,
                p99_ms=percentile(lat, 0.99),
                p99_timeline_ms=timeline,
            )
        )
    return merged


def plot(results: list[RunResult], path: str) -> str | None:
    """Latency CDF, queue depth over time, RSS over time; an error message or ``None``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot written"
    fig, (ax_cdf, ax_t, ax_q, ax_rss) = plt.subplots(1, 4, figsize=(22, 5))
    for r in _per_arm(results):
        lat = r.latencies_ms
        if lat:
            step = max(1, len(lat) // 2000)
            xs = [*lat[::step], lat[-1]]
            ys = [min(1.0, (i * step + 1) / len(lat)) for i in range(len(xs) - 1)] + [1.0]
            ax_cdf.plot(xs, ys, label=f"{r.server} (p99 {r.p99_ms:.2f} ms)")
        if r.p99_timeline_ms:
            ax_t.plot(
                [5 * i + 2.5 for i in range(len(r.p99_timeline_ms))],
                r.p99_timeline_ms,
                marker="o",
                label=r.server,
            )
        mem = [s for s in r.samples if s.frames_in_use is None]
        if mem:
            ax_rss.plot([s.t for s in mem], [s.rss / 2**20 for s in mem], label=r.server)
        q = [s for s in r.samples if s.frames_in_use is not None]
        if q:
            t = [s.t for s in q]
            ax_q.plot(t, [s.frames_in_use or 0 for s in q], label=f"{r.server}: all sessions")
            ax_q.plot(t, [s.max_queue_depth or 0 for s in q], label=f"{r.server}: deepest session")
            if r.half_open:
                ax_q.plot(t, [s.half_open_depth or 0 for s in q], label=f"{r.server}: half-open")
                if r.credit:
                    ax_q.axhline(
                        r.credit["frames"], linestyle="--", color="grey", label="frame credit"
                    )
                    ax_b = ax_q.twinx()
                    ax_b.plot(
                        t,
                        [(s.half_open_bytes or 0) / 1024 for s in q],
                        color="tab:red",
                        linestyle=":",
                        label="half-open KiB (right)",
                    )
                    ax_b.axhline(
                        r.credit["bytes"] / 1024, linestyle="-.", color="tab:red", alpha=0.5
                    )
                    ax_b.set_ylabel("half-open session's unacknowledged KiB (byte credit dash-dot)")
                    ax_b.set_ylim(0, r.credit["bytes"] / 1024 * 1.1)
                    ax_b.legend(fontsize=8, loc="lower right")
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("latency per tools/call (ms)")
    ax_cdf.set_ylabel("fraction of calls")
    ax_cdf.set_title("latency CDF")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("seconds into the measured phase (calls by start time)")
    ax_t.set_ylabel("p99 latency per 5 s (ms)")
    ax_t.set_title("p99 over time")
    ax_q.set_xlabel("seconds into the measured phase")
    ax_q.set_ylabel("unacknowledged frames (weir /metrics)")
    ax_q.set_title("queue depth over time")
    ax_rss.set_xlabel("seconds into the measured phase")
    ax_rss.set_ylabel("server RSS (MiB)")
    ax_rss.set_title("server RSS over time")
    for ax in (ax_cdf, ax_t, ax_q, ax_rss):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="center right" if ax is ax_q else "best")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
