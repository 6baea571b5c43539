"""The pieces of the Prometheus text format that are not weir's own counters.

Theory of operation
-------------------
A scrape is built as a list of :class:`Family` (name, type, help, samples) and only
then turned into text (:func:`exposition`), so that the families of several worker
processes can be merged first (:mod:`._metrics_share`).  A sample is
``(suffix, labels, value)``: ``suffix`` is ``""`` or a histogram's ``_bucket``,
``_sum``, ``_count``; ``labels`` is the rendered ``{name="value",...}`` (or ``""``).

:class:`Histogram` keeps, per label set, one count per fixed bucket and the sum;
:meth:`Histogram.observe` is a dict lookup, a :func:`bisect.bisect_left` into the
bucket bounds and two additions.  Label sets are capped (:attr:`Histogram.cap`):
past the cap, new label sets are counted under ``other``.

:func:`process_families` reads ``/proc/self`` (Linux): CPU seconds, resident
memory, open and maximum descriptors, start time.  Elsewhere it returns nothing,
and the ``process_*`` series are absent rather than wrong.
"""

from __future__ import annotations

import os
import sys
from bisect import bisect_left

import msgspec

#: The label value standing for anything outside a bounded set.
OTHER = "other"

#: Bucket upper bounds, in seconds (``+Inf`` is implicit): 0.5 ms to a minute.
BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class Family(msgspec.Struct, array_like=True):
    """One metric family: its samples are ``(suffix, labels, value)``."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, str, float]]


def exposition(families: list[Family]) -> str:
    """The Prometheus text (version 0.0.4) of ``families``, ``# HELP``/``# TYPE`` on each."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        out.extend(f"{fam.name}{sfx}{labels} {_number(v)}" for sfx, labels, v in fam.samples)
    return "\n".join(out) + "\n"


def _number(value: float) -> str:
    """``value`` exactly: an integer as one (``1234567``, not ``1.23457e+06``)."""
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def label_value(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    """Durations by a two-label key, in :data:`BUCKETS` (see the module docstring).

    Guarantees: at most :attr:`cap` label sets plus those with ``other`` as the first
    label (one per distinct second label, itself from a bounded set); ``observe`` is
    O(log buckets) and allocates only for a new label set.
    """

    __slots__ = ("bounds", "cap", "labels", "series")

    def __init__(self, labels: tuple[str, str], *, cap: int = 500) -> None:
        self.labels, self.cap, self.bounds = labels, cap, BUCKETS
        #: Per label set: a count per bucket (the last: above every bound), then the sum.
        self.series: dict[tuple[str, str], list[float]] = {}

    def observe(self, key: tuple[str, str], seconds: float) -> None:
        """Count one observation of ``seconds`` under ``key``."""
        row = self.row(key)
        row[bisect_left(self.bounds, seconds)] += 1
        row[-1] += seconds

    def row(self, key: tuple[str, str]) -> list[float]:
        """The counts of ``key`` (past the cap: of ``(other, key[1])``), made if new."""
        row = self.series.get(key)
        if row is None:
            if len(self.series) >= self.cap:
                key = (OTHER, key[1])
                row = self.series.get(key)
            if row is None:
                row = self.series[key] = [0.0] * (len(self.bounds) + 2)
        return row

    def counts(self) -> dict[tuple[str, str], float]:
        """How many observations each label set has (its ``_count``)."""
        return {key: sum(row[:-1]) for key, row in self.series.items()}

    def samples(self) -> list[tuple[str, str, float]]:
        """The ``_bucket`` (cumulative), ``_sum`` and ``_count`` samples, by label set."""
        first, second = self.labels
        out: list[tuple[str, str, float]] = []
        for (a, b), row in sorted(self.series.items()):
            base = f'{first}="{label_value(a)}",{second}="{label_value(b)}"'
            running = 0.0
            for bound, n in zip((*self.bounds, "+Inf"), row[:-1], strict=True):
                running += n
                le = bound if isinstance(bound, str) else f"{bound:g}"
                out.append(("_bucket", f'{{{base},le="{le}"}}', running))
            out.append(("_sum", f"{{{base}}}", row[-1]))
            out.append(("_count", f"{{{base}}}", running))
        return out


def build_info(version: str, runtime: str) -> Family:
    """``weir_build_info``: always 1, its labels say what is running."""
    python = ".".join(str(n) for n in sys.version_info[:3])
    labels = f'{{version="{label_value(version)}",python="{python}",runtime="{runtime}"}}'
    return Family(
        "weir_build_info", "gauge", "The running weir: version, Python, runtime.", [("", labels, 1)]
    )


def process_families() -> list[Family]:
    """The ``process_*`` families from ``/proc/self`` (none where there is no ``/proc``)."""
    try:
        import resource  # (Unix only)

        with open("/proc/self/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        fds = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, IndexError, StopIteration, ValueError):
        return []
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    # Fields after the command (from field 3, "state"): utime 14, stime 15,
    # starttime 22, rss 24 (1-based in proc(5)); index = field - 3.
    cpu = (int(stat[11]) + int(stat[12])) / ticks
    start = boot + int(stat[19]) / ticks
    rss = int(stat[21]) * page
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    def one(name: str, kind: str, help_: str, value: float) -> Family:
        return Family(name, kind, help_, [("", "", value)])

    out = [
        one("process_cpu_seconds_total", "counter", "User and system CPU time spent.", cpu),
        one("process_resident_memory_bytes", "gauge", "Resident memory size.", rss),
        one("process_open_fds", "gauge", "Open file descriptors.", fds),
        one("process_start_time_seconds", "gauge", "Start time since the epoch.", start),
    ]
    if soft != resource.RLIM_INFINITY:
        out.insert(3, one("process_max_fds", "gauge", "The descriptor limit (soft).", soft))
    return out
