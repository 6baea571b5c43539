"""``weir serve --workers N``: one scrape of any worker answers for the whole server.

Theory of operation
-------------------
The supervisor makes a private directory (``mkdtemp``: mode 0700, its own user)
and names it to every worker in ``$WEIR_METRICS_DIR``.  Each worker publishes its
metric families there (:meth:`MetricsShare.publish`), msgpack-encoded, as
``<worker>.snap``: written to a temporary file opened with ``O_EXCL|O_NOFOLLOW``
(mode 0600) and renamed over the old one, so a reader sees a whole snapshot or the
previous one.  A worker publishes every :data:`PERIOD` seconds, at shutdown, and on
every scrape it answers.

A scrape (:meth:`MetricsShare.merged`) publishes this worker's families first, then
reads every other worker's latest snapshot and merges: counters and histograms
are summed across workers (label sets kept); gauges get a ``worker`` label, one
series per worker, and only from workers whose snapshot is fresh (at most
:data:`STALE_AFTER` seconds old: a dead worker has no live sessions).

Why sums never go down: each worker's published counters only grow (a snapshot
replaces an older one of the same process), and the scraping worker renders
exactly the values it has just published -- so every later scrape, whichever
worker answers, reads that worker's file at those values or later.  A worker that
died keeps its last snapshot (its counts do not vanish: no false reset); the
directory is removed when the supervisor exits.

Safety: the directory must be a real directory owned by this user with no group
or other access, or sharing is off (a warning says why); a file that is not a
regular file, is larger than :data:`MAX_BYTES`, or does not decode is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time

import msgspec

from ._exposition import Family
from ._metrics import redact

log = logging.getLogger("weir.metrics")

#: The environment variable naming the shared directory (set by the supervisor).
ENV = "WEIR_METRICS_DIR"
#: Seconds between a worker's publications.
PERIOD = 1.0
#: A snapshot older than this (seconds) is a dead or stuck worker's: no gauges.
STALE_AFTER = 5.0
#: The largest snapshot file read (bytes).
MAX_BYTES = 4 << 20

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class Snapshot(msgspec.Struct, array_like=True):
    """One worker's families, when it wrote them (seconds since the epoch)."""

    worker: str
    written: float
    families: list[Family]


class MetricsShare:
    """This worker's side of the shared directory (see the module docstring)."""

    def __init__(self, directory: str, worker: str) -> None:
        self.directory = directory
        #: The worker's name: its ``worker`` label and file name.
        self.worker = worker if _NAME.fullmatch(worker) else redact(worker)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Snapshot)

    @classmethod
    def from_environment(cls, worker: str) -> MetricsShare | None:
        """The share ``$WEIR_METRICS_DIR`` names, if it is safe to use; else None."""
        directory = os.environ.get(ENV)
        if not directory:
            return None
        try:
            st = os.lstat(directory)
        except OSError as exc:
            log.warning("metrics are not shared between workers: %s: %s", directory, exc)
            return None
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
        ):
            log.warning(
                "metrics are not shared between workers: %s is not a private directory "
                "of this user (mode 0700)",
                directory,
            )
            return None
        return cls(directory, worker)

    def publish(self, families: list[Family]) -> None:
        """Replace this worker's snapshot with ``families`` (a reader sees one whole)."""
        self._write(Snapshot(self.worker, time.time(), families))

    def _write(self, snap: Snapshot) -> None:
        final = os.path.join(self.directory, f"{self.worker}.snap")
        temp = os.path.join(self.directory, f".{self.worker}.{os.getpid()}.tmp")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)  # (a leftover of a crash)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(temp, flags, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self._encoder.encode(snap))
            os.replace(temp, final)
        except OSError as exc:
            log.warning("could not publish this worker's metrics: %s", exc)

    def merged(self, own: list[Family]) -> list[Family]:
        """``own`` (published first) and every other worker's families, merged."""
        now = time.time()
        mine = Snapshot(self.worker, now, own)
        self._write(mine)
        return merge([mine, *self._others()], now)

    def _others(self) -> list[Snapshot]:
        out: list[Snapshot] = []
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return out
        for name in names:
            if not name.endswith(".snap") or name == f"{self.worker}.snap":
                continue
            try:
                fd = os.open(os.path.join(self.directory, name), os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                        continue
                    out.append(self._decoder.decode(f.read(MAX_BYTES)))
            except (OSError, msgspec.DecodeError) as exc:
                log.debug("skipping the metrics snapshot %s: %s", name, exc)
        return out


def merge(snapshots: list[Snapshot], now: float) -> list[Family]:
    """The families of ``snapshots`` (the first is this worker's): counters and
    histograms summed by label set, fresh workers' gauges labelled ``worker``."""
    kinds: dict[str, tuple[str, str]] = {}
    samples: dict[str, dict[tuple[str, str], float]] = {}
    for i, snap in enumerate(snapshots):
        fresh = i == 0 or now - snap.written <= STALE_AFTER
        worker = f'worker="{snap.worker}"'
        for fam in snap.families:
            if fam.name not in kinds:
                kinds[fam.name] = (fam.kind, fam.help)
                samples[fam.name] = {}
            acc = samples[fam.name]
            if kinds[fam.name][0] == "gauge":
                if fresh:
                    for sfx, labels, value in fam.samples:
                        tagged = f"{labels[:-1]},{worker}}}" if labels else f"{{{worker}}}"
                        acc[(sfx, tagged)] = value
            else:
                for sfx, labels, value in fam.samples:
                    acc[(sfx, labels)] = acc.get((sfx, labels), 0.0) + value
    return [
        Family(name, kind, help_, [(sfx, labels, v) for (sfx, labels), v in samples[name].items()])
        for name, (kind, help_) in kinds.items()
    ]
