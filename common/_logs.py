"""How ``weir serve`` logs: one handler on stderr, text or JSON, every line stamped.

Theory of operation
-------------------
:func:`configure` replaces ``logging.basicConfig``.  Every line carries the time
(ISO 8601, UTC, milliseconds), the level, the logger, and the worker (its
``--replica-id``, which a ``--workers`` parent gives each child as ``<id>-<n>``;
``main`` without one; ``supervisor`` for the ``--workers`` parent).  A record
that carries ``fields`` (the access log's
:class:`~weir.common._access.AccessRecord`, or a mapping a lifecycle line
passes as ``extra={"fields": {...}}``) gets them as JSON keys of their own; the
text line shows the message alone (which already names them).

Levels: ``--log-level`` sets the root; the access log (``weir.access``) is at INFO
while on, whatever the root; weir's lifecycle lines (``weir.ops``: store connected,
lost, recovered; the shutdown drain; workers) are at INFO and shown unless
``--log-level`` is error or critical; third-party libraries (coredis, h11, hpack,
asyncio, trio) at WARNING unless ``--log-level debug``, without the reports of their
work being cancelled (weir's shutdown cancels it; see :class:`_NoCancellations`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Mapping
from typing import TextIO, TypeVar

import msgspec

#: weir's lifecycle lines (store, drain, workers): operators' events, at INFO.
OPS = logging.getLogger("weir.ops")

_encode = msgspec.json.Encoder(enc_hook=str).encode

_E = TypeVar("_E", bound=BaseException)

_THIRD_PARTY = ("coredis", "h11", "hpack", "asyncio", "trio", "jwt", "urllib3")


def is_cancellation(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a runtime's cancellation (trio's ``Cancelled``, asyncio's
    ``CancelledError``); looked up among the loaded modules, importing neither."""
    for module, name in (("trio", "Cancelled"), ("asyncio", "CancelledError")):
        kind = getattr(sys.modules.get(module), name, None)
        if kind is not None and isinstance(exc, kind):
            return True
    return False


class _NoCancellations(logging.Filter):
    """Drops a library's report of its own work being cancelled.  weir cancels that
    work -- a store client's reconnection in progress, say -- when it shuts down,
    which is no error, yet the client library logs it as one, with a traceback, at
    random (whether a reconnection was under way).  Its real failures still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None or not is_cancellation(record.exc_info[1])


_NO_CANCELLATIONS = _NoCancellations()


class _Stamp:
    """``2026-12-02T14:23:33.123Z`` for a record's time (cached per second)."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((created - second) * 1000):03d}Z"


class TextFormatter(logging.Formatter):
    """``TIME LEVEL [worker] logger: message`` (tracebacks after, as usual)."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self._worker = worker
        self._stamp = _Stamp()

    def line(self, created: float, level: str, name: str, message: str, fields: object) -> str:
        """The line of a record with these parts (no traceback)."""
        return f"{self._stamp(created)} {level} [{self._worker}] {name}: {message}"

    def format(self, record: logging.LogRecord) -> str:
        line = self.line(record.created, record.levelname, record.name, record.getMessage(), None)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(TextFormatter):
    """One JSON object per line: ``ts``, ``level``, ``worker``, ``logger``, ``msg``,
    then the record's ``fields`` as keys of their own (and ``exc``: a traceback)."""

    def line(self, created: float, level: str, name: str, message: str, fields: object) -> str:
        return _encode(self._object(created, level, name, message, fields)).decode()

    def _object(
        self, created: float, level: str, name: str, message: str, fields: object
    ) -> dict[str, object]:
        out: dict[str, object] = {
            "ts": self._stamp(created),
            "level": level,
            "worker": self._worker,
            "logger": name,
            "msg": message,
        }
        if fields is not None:
            extra = fields if isinstance(fields, Mapping) else fields.fields()  # type: ignore[attr-defined]
            for key, value in extra.items():
                out.setdefault(key, value)
        return out

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        out = self._object(
            record.created, record.levelname, record.name, record.getMessage(), fields
        )
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _encode(out).decode()


class _Direct:
    """The access log's short way to stderr, taken only while nothing but
    :func:`configure`'s one handler would see its lines (no handler or filter of
    anyone else's on the way): the same line, without building a
    ``logging.LogRecord`` per request (most of what an access line costs)."""

    __slots__ = ("formatter", "handler")

    def __init__(self) -> None:
        self.handler: logging.StreamHandler[TextIO] | None = None
        self.formatter: TextFormatter | None = None

    def write(self, name: str, message: str, fields: object) -> bool:
        """Write an INFO line of logger ``name`` (a child of the root with no
        handler of its own); False if the way is not plain (use ``logging``)."""
        handler, formatter = self.handler, self.formatter
        root = logging.root
        if (
            handler is None
            or formatter is None
            or handler.filters
            or len(root.handlers) != 1
            or root.handlers[0] is not handler
            or root.filters
        ):
            return False
        text = formatter.line(time.time(), "INFO", name, message, fields) + "\n"
        with handler.lock or _NO_LOCK:
            stream = handler.stream
            stream.write(text)
            stream.flush()
        return True


_NO_LOCK = contextlib.nullcontext()

#: How :func:`configure` set logging up, for :meth:`_Direct.write`.
DIRECT = _Direct()


def configure(level: str, *, fmt: str = "text", worker: str = "main", access: bool = True) -> None:
    """Send every logger's lines to stderr in ``fmt`` (``text`` or ``json``), levels as
    the module docstring says.  Replaces any handler the root already has."""
    # No caller, thread or process lookups per record: the formatters use none, and
    # the access log is on the hot path.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter(worker) if fmt == "json" else TextFormatter(worker)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    DIRECT.handler, DIRECT.formatter = handler, formatter
    root_level = logging.getLevelName(level.upper())
    root.setLevel(root_level)
    debug = root_level <= logging.DEBUG
    for name in _THIRD_PARTY:
        library = logging.getLogger(name)
        library.setLevel(logging.NOTSET if debug else max(root_level, logging.WARNING))
        if debug:  # (everything, its cancellations too)
            library.removeFilter(_NO_CANCELLATIONS)
        else:
            library.addFilter(_NO_CANCELLATIONS)  # (once: a filter is added only once)
    OPS.setLevel(min(root_level, logging.INFO) if root_level < logging.ERROR else root_level)
    access_logger = logging.getLogger("weir.access")
    access_logger.setLevel(logging.INFO if access else logging.CRITICAL + 1)
    access_logger.disabled = not access


class StoreHealth:
    """The store's lifecycle lines: connected, lost (once per outage, however many
    requests fail in it), recovered (the first success after).  Both runtimes' stores
    call it from their one operation wrapper."""

    __slots__ = ("down", "served", "where")

    def __init__(self, where: str) -> None:
        self.where = where  # (redacted: no password)
        self.down = False
        #: It answered at start-up (before that, a failure is the start-up's to say).
        self.served = False

    def connected(self) -> None:
        """The store answered at start-up."""
        self.served = True
        OPS.info("store connected: %s", self.where, extra={"fields": {"event": "store_connected"}})

    def lost(self, exc: _E) -> _E:
        """An operation failed for want of the store; returns ``exc`` (to raise)."""
        if not self.down and self.served:
            self.down = True
            OPS.warning(
                "store lost: %s: %s",
                self.where,
                exc,
                extra={"fields": {"event": "store_lost", "store": self.where}},
            )
        return exc

    def up(self) -> None:
        """An operation succeeded."""
        if self.down:
            self.down = False
            OPS.warning(
                "store recovered: %s",
                self.where,
                extra={"fields": {"event": "store_recovered", "store": self.where}},
            )


class DrainReport:
    """The shutdown drain's lines: its start (calls running, the grace), progress when
    the count changes (at most one line a second), and its end (how many calls the
    grace did not cover: those are cancelled).  Times come from the runtime's clock."""

    def __init__(self, running: int, grace: float, now: float) -> None:
        self._end = now + grace
        self._last = running
        self._said = now
        OPS.info(
            "drain: %d calls running, %.1f s of grace",
            running,
            grace,
            extra={"fields": {"event": "drain_started", "running": running, "left_s": grace}},
        )

    def progress(self, running: int, now: float) -> None:
        """``running`` calls still run at ``now``."""
        if running != self._last and now - self._said >= 1.0:
            self._last, self._said = running, now
            left = max(0.0, self._end - now)
            OPS.info(
                "drain: %d calls still running, %.1f s left",
                running,
                left,
                extra={"fields": {"event": "drain_progress", "running": running, "left_s": left}},
            )

    def done(self, running: int) -> None:
        """The grace is over or nothing runs: ``running`` calls are cancelled."""
        OPS.info(
            "drain done: %d calls cancelled",
            running,
            extra={"fields": {"event": "drain_done", "cancelled": running}},
        )
