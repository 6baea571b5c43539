"""One SDK app, two transports: weir (``sdk-weir``) against the SDK's own (``sdk``).

Theory of operation
-------------------
Both sides serve the identical app, :data:`benchmarks.sdk_server.server` (an SDK
``MCPServer`` with one tool, ``echo``):

* ``sdk-weir`` -- ``python -m weir serve benchmarks.sdk_server:server``, the app
  wrapped by :func:`weir.app.sdk.from_sdk` (started by
  :func:`benchmarks.fanout.servers.server_argv` with weir's flags, :data:`SDK_APP`
  in place of ``--weir-app``);
* ``sdk`` -- ``python -m benchmarks.sdk_server``, the same app on the SDK's own
  Streamable HTTP transport under uvicorn.

``--server sdk-compare`` runs :data:`ROTATION` -- those two and, for reference,
``weir`` serving its native app (:mod:`benchmarks.weir_app`, the same ``echo``) --
one after another in each round.  :func:`sdk_ratios` gives, as the median over the
rounds of each round's ratio, ``sdk-weir`` ÷ ``sdk`` in CPU per call, calls/s, RSS
per session and ``initialize`` p99, and ``sdk-weir`` ÷ ``weir`` in CPU per call
(what the bridge costs over a native weir app).  RSS per session is the idle figure
with ``--measure idle``, else the peak over the run (:func:`rss_per_session`).
:func:`side_by_side` is the same runs as one record per server (median, min and max
over the rounds; only RSS with ``--measure idle``), which :func:`side_by_side_table`
prints.

Nothing here does I/O.
"""

from __future__ import annotations

import statistics
from typing import Any

from .report import RunResult, _per, _ratio, rounds

#: The app ``sdk-weir`` serves: the SDK server the ``sdk`` side serves too.
SDK_APP = "benchmarks.sdk_server:server"
#: ``--server sdk-compare``: each round, in this order.
ROTATION = ["sdk-weir", "sdk", "weir"]
#: The servers that are ``weir serve`` (with weir's flags and ``/metrics``).
WEIR_KINDS = ("weir", "sdk-weir")

_METRICS = (  # (record key, table title, format)
    ("calls_per_s", "calls/s", "{:,.0f}"),
    ("cpu_us_per_call", "CPU us/call", "{:,.0f}"),
    ("rss_per_session_kib", "RSS/session KiB", "{:.1f}"),
    ("init_p99_ms", "init p99 ms", "{:,.0f}"),
)


def rss_per_session(run: RunResult) -> float | None:
    """KiB per session: the idle figure with ``--measure idle``, else the run's peak."""
    if run.idle_rss_per_session_kib is not None:
        return run.idle_rss_per_session_kib
    return run.rss_per_session_kib


def _rss_ratio(rd: dict[str, RunResult]) -> float | None:
    top, bottom = rd.get("sdk-weir"), rd.get("sdk")
    if top is None or bottom is None:
        return None
    a, b = rss_per_session(top), rss_per_session(bottom)
    return a / b if a is not None and b else None


def sdk_ratios(results: list[RunResult]) -> dict[str, Any]:
    """``sdk-weir`` against ``sdk`` (and against ``weir`` in CPU), medians of the rounds."""
    by_round = rounds(results)
    cpu = "cpu_us_per_call"
    found = {
        "sdk_weir_cpu_per_call_vs_sdk": _ratio(by_round, _per("sdk-weir", cpu, "sdk")),
        "sdk_weir_calls_per_s_vs_sdk": _ratio(by_round, _per("sdk-weir", "calls_per_s", "sdk")),
        "sdk_weir_rss_per_session_vs_sdk": _ratio(by_round, _rss_ratio),
        "sdk_weir_init_p99_vs_sdk": _ratio(by_round, _per("sdk-weir", "init_p99_ms", "sdk")),
        "sdk_weir_cpu_per_call_vs_weir": _ratio(by_round, _per("sdk-weir", cpu, "weir")),
    }
    return {key: value for key, value in found.items() if value is not None}


def side_by_side(results: list[RunResult]) -> dict[str, dict[str, dict[str, float]]]:
    """``{server: {metric: {median, min, max, n}}}`` over the rounds, for the servers of
    :data:`ROTATION` that ran (empty when ``sdk-weir`` did not)."""
    if not any(r.server == "sdk-weir" for r in results):
        return {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in ROTATION:
        runs = [r for r in results if r.server == name]
        if not runs:
            continue
        row: dict[str, dict[str, float]] = {}
        for key, _, _ in _METRICS:
            if key == "rss_per_session_kib":
                values = [v for r in runs if (v := rss_per_session(r)) is not None]
            else:  # an idle run makes no measured calls
                values = [
                    v for r in runs if r.measure != "idle" and (v := getattr(r, key)) is not None
                ]
            if values:
                row[key] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "n": len(values),
                }
        out[name] = row
    return out


def side_by_side_table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    """One line per server: each metric's median and (min-max) over the rounds."""
    rows = [["server", *(title for _, title, _ in _METRICS)]]
    for name, row in summary.items():
        cells = [name]
        for key, _, fmt in _METRICS:
            m = row.get(key)
            if m is None:
                cells.append("n/a")
                continue
            spread = "" if m["n"] < 2 else f" ({fmt.format(m['min'])}-{fmt.format(m['max'])})"
            cells.append(fmt.format(m["median"]) + spread)
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
