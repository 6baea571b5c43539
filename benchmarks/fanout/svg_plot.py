"""The table's plots as SVG, with the standard library only.

Theory of operation
-------------------
``--server table`` measures each server at a few session counts; what a reader wants
to see is how CPU per call and latency move as sessions grow, per server.  This
module draws that as one SVG of three panels -- CPU per call, p50 and p99 latency,
each against sessions on a logarithmic axis -- one line per server, era and response
mode, each point the median of the rounds.  It needs no plotting library (matplotlib
is not a dependency), so the plot is written wherever the table runs.

``python -m benchmarks.fanout.svg_plot OUT.svg RUN.json [RUN.json ...]`` draws the
same from fanout's JSON lines (``--out-json``), so runs made separately can be
drawn together; a run is placed by its ``sessions``, ``era`` and ``response_mode``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

_W, _H = 420, 320  # one panel
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 36, 48
_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939",
)  # fmt: skip
#: (field of a run, panel title, unit)
PANELS = (
    ("cpu_us_per_call", "server CPU per call", "µs"),
    ("p50_ms", "p50 latency", "ms"),
    ("p99_ms", "p99 latency", "ms"),
)

Series = dict[str, list[tuple[float, float]]]


@dataclass(frozen=True)
class Panel:
    """One chart: a title, the y axis' unit, and named lines of (sessions, value)."""

    title: str
    unit: str
    series: Series


def series_of(runs: Iterable[Mapping[str, Any]], field: str) -> Series:
    """``field`` per line (server, response mode, era) and session count: the median
    of the rounds; runs without the field (or with 0) are left out."""
    points: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        value = run.get(field)
        if not value:
            continue
        era = {"session": "session era", "sessionless": "2026-07-28"}.get(run.get("era") or "")
        label = f"{run['server']} {str(run.get('response_mode', '')).upper()}"
        label += f", {era}" if era else ""
        points.setdefault(label, {}).setdefault(float(run["sessions"]), []).append(float(value))
    return {
        label: sorted((x, statistics.median(ys)) for x, ys in by_x.items())
        for label, by_x in sorted(points.items())
    }


def _ticks(lo: float, hi: float) -> list[float]:
    """Round values between ``lo`` and ``hi`` (a log axis: 1, 2, 5 per decade)."""
    out = []
    for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**decade
            if lo <= v <= hi:
                out.append(v)
    return out or [lo, hi]


def _panel(panel: Panel, left: float, colours: Mapping[str, str]) -> list[str]:
    xs = [x for pts in panel.series.values() for x, _ in pts]
    ys = [y for pts in panel.series.values() for _, y in pts]
    if not xs:
        return []
    x_lo, x_hi = min(xs) / 1.3, max(xs) * 1.3
    y_lo, y_hi = min(ys) / 1.3, max(ys) * 1.3
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        return left + _LEFT + pw * math.log(x / x_lo) / math.log(x_hi / x_lo)

    def py(y: float) -> float:
        return _TOP + ph * (1 - math.log(y / y_lo) / math.log(y_hi / y_lo))

    out = [
        f'<text x="{left + _W / 2:.0f}" y="20" text-anchor="middle" font-weight="bold">'
        f"{escape(panel.title)} ({escape(panel.unit)}), log scales</text>",
        f'<rect x="{left + _LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" '
        'stroke="#888"/>',
        f'<text x="{left + _LEFT + pw / 2:.0f}" y="{_H - 10}" text-anchor="middle">sessions</text>',
    ]
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{x:g}</text>')
    for y in _ticks(y_lo, y_hi):
        out.append(
            f'<line x1="{left + _LEFT}" x2="{left + _LEFT + pw}" y1="{py(y):.1f}" '
            f'y2="{py(y):.1f}" stroke="#eee"/>'
            f'<text x="{left + _LEFT - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>'
        )
    for label, pts in panel.series.items():
        colour = colours[label]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
            f"<title>{escape(label)}</title></polyline>"
        )
        out.extend(
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts
        )
    return out


def render(panels: list[Panel]) -> str:
    """The panels side by side, with one legend beneath them, as an SVG document."""
    labels = sorted({label for p in panels for label in p.series})
    colours = {label: _COLOURS[i % len(_COLOURS)] for i, label in enumerate(labels)}
    width = _W * len(panels)
    legend_rows = math.ceil(len(labels) / 3)
    height = _H + 18 * legend_rows + 12
    body: list[str] = []
    for i, panel in enumerate(panels):
        body += _panel(panel, i * _W, colours)
    for i, label in enumerate(labels):
        x, y = 24 + (i % 3) * (width / 3), _H + 14 + 18 * (i // 3)
        body.append(
            f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="14" height="4" fill="{colours[label]}"/>'
            f'<text x="{x + 20:.0f}" y="{y - 3:.0f}">{escape(label)}</text>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">'
        f'<rect width="100%" height="100%" fill="white"/>{"".join(body)}</svg>\n'
    )


def table_svg(runs: Iterable[Mapping[str, Any]]) -> str:
    """CPU per call, p50 and p99 against sessions, for every line the runs make."""
    runs = list(runs)
    return render([Panel(title, unit, series_of(runs, field)) for field, title, unit in PANELS])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout.svg_plot",
        description="Draw fanout runs (JSON lines from --out-json) against sessions as SVG.",
    )
    p.add_argument("out", help="the SVG to write")
    p.add_argument("runs", nargs="+", help="fanout JSON lines (--out-json files)")
    args = p.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for name in args.runs:
        for line in Path(name).read_text().splitlines():
            if line.strip():
                runs += json.loads(line).get("runs", [])
    if not runs:
        raise SystemExit("svg_plot: no runs in " + ", ".join(args.runs))
    Path(args.out).write_text(table_svg(runs))
    print(f"svg_plot: wrote {args.out} ({len(runs)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
