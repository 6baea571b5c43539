"""Counters and gauges, rendered in the Prometheus text format at ``GET /metrics``.

Theory of operation
-------------------
Both runtimes count into one :class:`Metrics` and render the same text (what a
runtime does not have -- the asyncio runtime has no retention budget and no accept
loop of its own -- it does not pass, and those series are
left out rather than shown as zeros).  A runtime's sessions are seen through
:class:`Metered` (its Trio session is one; the asyncio runtime passes views).
The hot path only bumps integer attributes of :class:`Metrics`; everything else
(per-session gauges, label escaping) is computed when ``/metrics`` is scraped.
Per-session series are limited to the ``top`` sessions by bytes of credit in use,
and sessions are labelled by a short hash of their id (never the id itself: it
is a bearer secret), so label cardinality stays bounded however many sessions
exist; aggregates cover all sessions.

Request and tool durations
--------------------------
The runtimes wrap the app's handler (:func:`weir.app.dispatch`) in
:meth:`Metrics.timed` (a tool answered inline: :meth:`Metrics.observe`): one
observation per request that reached the app, in ``weir_request_duration_seconds``
by ``method`` and ``outcome``, and for ``tools/call`` in
``weir_tool_duration_seconds`` by ``tool`` and ``outcome`` too.  Labels are
bounded: ``method`` is one of :data:`METHODS` or ``other``; ``tool`` is a tool the
app registered (:attr:`Metrics.tools`) or ``other``; ``outcome`` is one of
:data:`OUTCOMES`; and each histogram holds at most 500 label sets (past that,
``other``).  ``weir_requests_total`` and ``weir_tool_calls_total`` are their counts.

With ``weir serve --workers N`` each worker also publishes its families
(:mod:`._metrics_share`), and a scrape of any worker answers for all of them.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections import Counter
from collections.abc import Awaitable, Collection, Container, Iterable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from ._exposition import (
    BUCKETS,
    OTHER,
    Family,
    Histogram,
    build_info,
    exposition,
    label_value,
    process_families,
)

if TYPE_CHECKING:
    from weir.protocol import CreditPool
    from weir.protocol.budget import RetentionBudget

    from ._metrics_share import MetricsShare

T = TypeVar("T")

#: The MCP methods that get their own ``method`` label (any other: ``other``).
METHODS: Final = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "server/discover",
        "subscriptions/listen",
    }
)
#: ``outcome`` label values: a result; a tool's result with ``isError``; a JSON-RPC
#: error (the handler raised); the handler asked the client for input first
#: (sessionless era); cancelled (by the client, or by shutdown).
OUTCOMES: Final = ("ok", "tool_error", "error", "input_required", "cancelled")


class Credit(Protocol):
    """What the metrics read of a session's drain credit (the core's ``SessionCredit``)."""

    @property
    def frames_in_use(self) -> int: ...
    @property
    def bytes_in_use(self) -> int: ...
    @property
    def peak_frames(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...


class Metered(Protocol):
    """What the metrics read of one session (or sessionless credit owner)."""

    @property
    def closed(self) -> bool: ...
    @property
    def half_open(self) -> bool: ...
    @property
    def credit(self) -> Credit: ...
    @property
    def session_id(self) -> str: ...


class Connections(Protocol):
    """What the metrics read of the runtime's connections: how many are open, the
    limit, and (where the runtime has them: None otherwise, and not rendered) the
    idle ones shed at the limit, the failed ``accept()`` calls and the idle ones
    parked without a task."""

    @property
    def open(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def shed_total(self) -> int | None: ...
    @property
    def accept_errors(self) -> int | None: ...
    @property
    def parked(self) -> int | None: ...


class Metrics:
    """The server's counters (see the module docstring)."""

    def __init__(self, *, top: int = 20, runtime: str = "trio", tools: Container[str] = ()) -> None:
        self.top, self.runtime = top, runtime
        #: The tool names that get their own ``tool`` label: the app's registry (live).
        self.tools = tools
        #: Where a worker of ``--workers N`` publishes its families (None: alone).
        self.share: MetricsShare | None = None
        self.requests = Histogram(("method", "outcome"))
        self.tool_calls = Histogram(("tool", "outcome"))
        self._rows: dict[tuple[str, str | None, str], tuple[list[float], ...]] = {}
        self.admissions = 0
        self.executions = 0
        self.teardowns = 0
        self.duplicates_replayed = 0
        self.duplicates_in_progress = 0
        self.sessions_expired = 0
        #: Times free memory went back to the operating system after a heavy session.
        self.reclaims = 0
        #: Client notifications not handed to the app: too many in its hands already.
        self.notifications_dropped = 0
        self.refusals: Counter[str] = Counter()
        #: Tool calls answered in the connection's task (no handler task), by tool: the
        #: keys are the app's own tool names, so the labels are bounded.
        self.inline_calls: Counter[str] = Counter()
        #: Of those, answers that had to wait for credit in a task ("primed": the
        #: priming event waited too).
        self.inline_deferred: Counter[str] = Counter()
        #: The highest credit use (frames, bytes) of any session that has ended.
        self.ended_peak_frames = 0
        self.ended_peak_bytes = 0

    def session_ended(self, session: Metered) -> None:
        """Keep an ending session's credit high-water marks."""
        credit = session.credit
        self.ended_peak_frames = max(self.ended_peak_frames, credit.peak_frames)
        self.ended_peak_bytes = max(self.ended_peak_bytes, credit.peak_bytes)

    def credit_peaks(self, live: Iterable[Metered]) -> tuple[int, int]:
        """The most frames and bytes of credit any session of this process has held."""
        frames, nbytes = self.ended_peak_frames, self.ended_peak_bytes
        for s in live:
            frames, nbytes = max(frames, s.credit.peak_frames), max(nbytes, s.credit.peak_bytes)
        return frames, nbytes

    def refused(self, reason: str) -> None:
        """Count one refusal by its ``reason``."""
        self.refusals[reason] += 1

    def observe(self, method: str, params: object, outcome: str, seconds: float) -> None:
        """Count one request the app answered (see the module docstring for the labels).

        One dict lookup finds the histogram rows of a known ``(method, tool,
        outcome)``; then one bisect and two additions per row.
        """
        name = params.get("name") if method == "tools/call" and isinstance(params, dict) else None
        key = (method, name if isinstance(name, str) else None, outcome)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._resolve(*key)
        i = bisect_left(BUCKETS, seconds)
        for row in rows:
            row[i] += 1
            row[-1] += seconds

    def _resolve(self, method: str, name: str | None, outcome: str) -> tuple[list[float], ...]:
        """The rows ``observe`` counts into; remembered when every label is a known one
        (so the cache is bounded like the labels, whatever names clients send)."""
        known = method in METHODS
        rows: tuple[list[float], ...] = (self.requests.row((method if known else OTHER, outcome)),)
        if method == "tools/call":
            tool = name if name is not None and name in self.tools else None
            known = known and tool is not None
            rows += (self.tool_calls.row((tool or OTHER, outcome)),)
        if known and len(self._rows) < 4 * self.requests.cap:
            self._rows[(method, name, outcome)] = rows
        return rows

    async def timed(
        self,
        method: str,
        params: object,
        run: Awaitable[T],
        *,
        pending: tuple[type[BaseException], ...] = (),
    ) -> T:
        """Await the handler ``run`` of a ``method`` request, and :meth:`observe` it.

        Its outcome: ``ok`` (``tool_error`` for a result with ``isError``), ``error``
        if it raised an exception, ``input_required`` for one of ``pending``,
        ``cancelled`` for anything else (a cancellation).  Exceptions pass through.
        """
        start, outcome = perf_counter(), "cancelled"
        try:
            result = await run
            error = isinstance(result, dict) and result.get("isError") is True
            outcome = "tool_error" if error else "ok"
            return result
        except Exception as exc:
            outcome = "input_required" if isinstance(exc, pending) else "error"
            raise
        except BaseException as exc:
            if isinstance(exc, pending):
                outcome = "input_required"
            raise
        finally:
            self.observe(method, params, outcome, perf_counter() - start)

    def render(self, sessions: Mapping[str, Metered], **kwargs: Any) -> str:
        """The Prometheus text of :meth:`families` (with ``--workers``: every worker's)."""
        families = self.families(sessions, **kwargs)
        if self.share is not None:
            families = self.share.merged(families)
        return exposition(families)

    def publish(self, sessions: Mapping[str, Metered], **kwargs: Any) -> None:
        """Publish :meth:`families` to the other workers (nothing without ``--workers``)."""
        if self.share is not None:
            self.share.publish(self.families(sessions, **kwargs))

    def families(
        self,
        sessions: Mapping[str, Metered],
        *,
        gate: Connections | None = None,
        budget: RetentionBudget | None = None,
        pool: CreditPool | None = None,
        owners: Collection[Metered] = (),
        listen_streams: int = 0,
    ) -> list[Family]:
        """Every metric family of this process.

        ``owners``: the sessionless era's credit owners (connections or principals);
        ``listen_streams``: its open ``subscriptions/listen`` streams; the retention
        series are left out without ``budget``, the connection series without
        ``gate``, the cap on unacknowledged bytes without ``pool``.
        """
        from weir import __version__

        live = [s for s in sessions.values() if not s.closed]
        held = [o for o in owners if not o.closed]
        out: list[Family] = [build_info(__version__, self.runtime), *process_families()]
        out += self._request_families(live)
        out += self._credit_families(live, held, pool)
        out += self._let_go_families()
        if budget is not None:
            out += [
                _one(
                    "weir_retained_bytes",
                    "gauge",
                    "Replay history and kept results, all sessions (bounded by --memory-budget).",
                    budget.held,
                ),
                _one(
                    "weir_retention_evictions_total",
                    "counter",
                    "Retained items evicted to stay within the retention budget.",
                    budget.evictions,
                ),
                _one(
                    "weir_retention_evicted_bytes_total",
                    "counter",
                    "Bytes freed by retention evictions.",
                    budget.evicted_bytes,
                ),
            ]
        if gate is not None:
            out += _connection_families(gate)
        out += self._owner_families(live, held, listen_streams)
        self._durations(out)
        return out

    def _request_families(self, live: list[Metered]) -> list[Family]:
        """Sessions, and what happened to requests: admitted, refused, answered inline,
        executed, stopped as duplicates; sessions torn down and expired."""
        return [
            _one("weir_sessions", "gauge", "Live sessions.", len(live)),
            _one(
                "weir_half_open_sessions",
                "gauge",
                "Sessions whose streams are half-open.",
                sum(1 for s in live if s.half_open),
            ),
            _one(
                "weir_admissions_total",
                "counter",
                "Requests admitted for dispatch.",
                self.admissions,
            ),
            _labelled(
                "weir_refusals_total",
                "counter",
                "Requests refused, by reason.",
                [(f'{{reason="{r}"}}', n) for r, n in sorted(self.refusals.items())],
            ),
            _labelled(
                "weir_inline_calls_total",
                "counter",
                "Tool calls answered without a handler task, by tool.",
                [(f'{{tool="{label_value(t)}"}}', n) for t, n in sorted(self.inline_calls.items())],
            ),
            _labelled(
                "weir_inline_deferred_total",
                "counter",
                "Inline answers that waited for credit in a task.",
                [(f'{{wait="{w}"}}', n) for w, n in sorted(self.inline_deferred.items())],
            ),
            _one(
                "weir_teardowns_total",
                "counter",
                "Sessions torn down after the liveness timeout.",
                self.teardowns,
            ),
            _one(
                "weir_tool_executions_total",
                "counter",
                "tools/call executions (after the idempotency gate).",
                self.executions,
            ),
            _labelled(
                "weir_duplicate_requests_total",
                "counter",
                "Duplicate deliveries stopped by the gate.",
                [
                    ('{outcome="replayed"}', self.duplicates_replayed),
                    ('{outcome="in_progress"}', self.duplicates_in_progress),
                ],
            ),
        ]

    def _credit_families(
        self, live: list[Metered], held: list[Metered], pool: CreditPool | None
    ) -> list[Family]:
        """Unacknowledged frames and bytes now and at their peak, and the process's
        cap on them (with ``pool``)."""
        out = [
            _one(
                "weir_credit_in_use_frames",
                "gauge",
                "Unacknowledged frames, all sessions and 2026-07-28 credit owners.",
                sum(s.credit.frames_in_use for s in (*live, *held)),
            ),
            _one(
                "weir_credit_in_use_bytes",
                "gauge",
                "Unacknowledged bytes, all sessions and 2026-07-28 credit owners.",
                sum(s.credit.bytes_in_use for s in (*live, *held)),
            ),
        ]
        if pool is not None:
            out += [
                _one(
                    "weir_outbound_limit_bytes",
                    "gauge",
                    "Unacknowledged bytes at which new requests get 503 (--max-outbound-bytes).",
                    pool.limit,
                ),
                _one(
                    "weir_outbound_peak_bytes",
                    "gauge",
                    "The most unacknowledged bytes all credit owners held at once since start.",
                    pool.peak_bytes,
                ),
            ]
        peak_frames, peak_bytes = self.credit_peaks(live)
        return [
            *out,
            _one(
                "weir_credit_peak_frames",
                "gauge",
                "The most unacknowledged frames any one session has held since start.",
                peak_frames,
            ),
            _one(
                "weir_credit_peak_bytes",
                "gauge",
                "The most unacknowledged bytes any one session has held since start.",
                peak_bytes,
            ),
        ]

    def _let_go_families(self) -> list[Family]:
        """What the server let go of: client notifications it had no room for,
        sessions it forgot, memory it gave back."""
        return [
            _one(
                "weir_notifications_dropped_total",
                "counter",
                "Client notifications not given to the app: too many were in its hands.",
                self.notifications_dropped,
            ),
            _one(
                "weir_sessions_expired_total",
                "counter",
                "Sessions forgotten after the idle or initialize timeout.",
                self.sessions_expired,
            ),
            _one(
                "weir_memory_reclaims_total",
                "counter",
                "Times free memory went back to the operating system after a heavy session ended.",
                self.reclaims,
            ),
        ]

    def _owner_families(
        self, live: list[Metered], held: list[Metered], listen_streams: int
    ) -> list[Family]:
        """The sessions holding the most credit (by hashed id), the sessionless era's
        credit owners, and its open listen streams."""
        worst = sorted(live, key=lambda s: s.credit.bytes_in_use, reverse=True)[: self.top]
        worst = [s for s in worst if s.credit.frames_in_use]
        return [
            Family(
                "weir_session_queue_depth",
                "gauge",
                f"Unacknowledged frames of the {self.top} sessions holding the most credit.",
                [("", f'{{session="{_label(s)}"}}', s.credit.frames_in_use) for s in worst],
            ),
            Family(
                "weir_session_credit_bytes",
                "gauge",
                f"Unacknowledged bytes of the {self.top} sessions holding the most credit.",
                [("", f'{{session="{_label(s)}"}}', s.credit.bytes_in_use) for s in worst],
            ),
            _one(
                "weir_sessionless_owners",
                "gauge",
                "Credit owners of 2026-07-28 requests (a connection, or a principal).",
                len(held),
            ),
            _one(
                "weir_sessionless_half_open",
                "gauge",
                "Of those, how many are half-open (refused 429).",
                sum(1 for o in held if o.half_open),
            ),
            _one(
                "weir_listen_streams",
                "gauge",
                "Open subscriptions/listen streams.",
                listen_streams,
            ),
        ]

    def _durations(self, out: list[Family]) -> None:
        """The duration histograms and their counts, by label set."""
        for name, hist, what in (
            ("weir_request", self.requests, "Requests answered by the app"),
            ("weir_tool", self.tool_calls, "tools/call requests answered by the app"),
        ):
            out.append(
                Family(
                    f"{name}_duration_seconds",
                    "histogram",
                    f"{what}: handler time, by {hist.labels[0]} and outcome.",
                    hist.samples(),
                )
            )
            first, second = hist.labels
            samples: list[tuple[str, str, float]] = [
                ("", f'{{{first}="{label_value(a)}",{second}="{b}"}}', n)
                for (a, b), n in sorted(hist.counts().items())
            ]
            total = "weir_requests_total" if hist is self.requests else "weir_tool_calls_total"
            out.append(
                Family(
                    total, "counter", f"{what}, by {first} and outcome.", samples or [("", "", 0)]
                )
            )


def _one(name: str, kind: str, help_: str, value: float) -> Family:
    """A family of one unlabelled sample."""
    return Family(name, kind, help_, [("", "", value)])


def _labelled(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> Family:
    """A family of labelled samples (one unlabelled 0 while there is none)."""
    return Family(name, kind, help_, [("", labels, v) for labels, v in samples] or [("", "", 0)])


def _connection_families(gate: Connections) -> list[Family]:
    """The connections served and their limit; what only the Trio runtime counts
    (connections shed at the limit, parked, accept failures) where it does."""
    out = [
        _one(
            "weir_connections",
            "gauge",
            "Connections being served (bounded by --max-connections).",
            gate.open,
        ),
        _one("weir_connection_limit", "gauge", "The connection limit in force.", gate.limit),
    ]
    if gate.shed_total is not None:
        out.append(
            _one(
                "weir_connections_shed_total",
                "counter",
                "Idle keep-alive connections closed to make room at the limit.",
                gate.shed_total,
            )
        )
    if gate.parked is not None:
        out.append(
            _one(
                "weir_connections_parked",
                "gauge",
                "Idle keep-alive connections held without a task (--park-idle-after).",
                gate.parked,
            )
        )
    if gate.accept_errors is not None:
        out.append(
            _one(
                "weir_accept_errors_total",
                "counter",
                "accept() failures for lack of descriptors or memory (backed off).",
                gate.accept_errors,
            )
        )
    return out


def redact(secret: str) -> str:
    """A short, stable stand-in for a bearer secret (a session id, a token) in logs
    and labels: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


def _label(session: Metered) -> str:
    return redact(session.session_id)
