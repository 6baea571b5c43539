"""The load: S sessions calling ``echo``, timed, while the server is watched.

Theory of operation
-------------------
A run (:class:`Run`) has three phases.  **Setup**: S sessions each open one
keep-alive TCP connection, ``initialize``, send ``notifications/initialized`` and
make ``--warmup`` calls.  **Measured phase**: every session makes K ``tools/call`` of
``echo`` (or calls until ``--duration`` has passed), at most ``--concurrency`` in
flight, optionally paced to ``--rate`` calls/s in total; the server's CPU time
(nanosecond ``schedstat``, else ``utime + stime`` ticks: see
:mod:`benchmarks.fanout.system`) is read at both ends, and so is the
whole machine's busy time (``/proc/stat``), so that CPU taken by other processes on a
shared machine shows in the report (``--quiet-wait`` waits for a quiet moment first).
**Report** (:mod:`benchmarks.fanout.report`).

Latency is measured per call from the moment the POST is written to the moment the
JSON-RPC response event is parsed (before the end of the SSE stream arrives).  RSS
is sampled from ``/proc/PID/status`` every 100 ms; the peak is the larger of the
samples and ``VmHWM``.  RSS per session is (peak - RSS before any session) / S.
For weir, ``/metrics`` is scraped every ``--sample-interval`` seconds (queue depth
over time, for the plot) and at both ends of the phase (executions, refusals,
teardowns, duplicates stopped by the idempotency gate).

The half-open peers (:class:`benchmarks.fanout.peers.HalfOpenPeers`, a base of
:class:`Run`) run beside the sessions in the same event loop, or in a child process
with ``--peer-process`` (:func:`run_peers_only` is that child's run), and stop with
them.

**Duplicates** (with the retrying gateway, :mod:`benchmarks.gateway`) are counted
exactly for the half-open peers (every ``mark`` key is unique; the server's tally
says how many keys ran more than once) and, for the other sessions, as
``weir_tool_executions_total`` growth minus ``mark`` executions minus distinct
requests sent (every request is sent once by the client; only the gateway repeats).
Against a server without the tally, the peers' calls still make frames (as tool
errors) and duplicates are executions beyond all distinct requests sent.

Every loop is bounded in count and in time: the measured phase has a budget of
``--duration`` + 600 s, and each call ``--call-timeout``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import trio

from .client import Client, Endpoint, HttpError, McpSession
from .common import BenchError, Options
from .metrics import _series, scrape, store_round_trips
from .peers import HalfOpenPeers
from .report import HalfOpenStats, RunResult, Sample, p99_timeline, percentile
from .system import (
    cpu_reading,
    cpu_used,
    machine_busy_seconds,
    own_cpu_seconds,
    proc_cpu_seconds,
    proc_memory,
)

_PAGE_LIMIT = 10_000_000  # upper bound on calls per session in --duration mode
#: Sessions per loopback source address (the kernel's ephemeral ports, 32768-60999
#: by default, give about 28,000 connections to one address and port).
PER_SOURCE = 25_000


class Progress:
    """A one-line ``\\r`` progress bar on stderr (only when it is a terminal)."""

    def __init__(self, label: str, total: int | None, duration: float | None, on: bool) -> None:
        self.label = label
        self.total = total
        self.duration = duration
        self.on = on and sys.stderr.isatty()
        self.done = 0
        self.start = time.monotonic()

    async def run(self) -> None:
        if not self.on:
            return
        for _ in range(1_000_000):
            self.draw()
            await trio.sleep(0.25)

    def draw(self) -> None:
        elapsed = time.monotonic() - self.start
        if self.duration:
            frac = min(1.0, elapsed / self.duration)
        elif self.total:
            frac = min(1.0, self.done / self.total)
        else:
            frac = 0.0
        width = 30
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        sys.stderr.write(
            f"\r{self.label:<8} [{bar}] {self.done:>8} calls {elapsed:6.1f} s "
            f"{self.done / max(elapsed, 1e-9):8.0f}/s"
        )
        sys.stderr.flush()

    def finish(self) -> None:
        if self.on:
            self.draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


class Run(HalfOpenPeers):
    """One measured run against one server (see the module docstring)."""

    def __init__(
        self,
        opts: Options,
        name: str,
        endpoint: Endpoint,
        pid: int | None,
        main_endpoint: Endpoint,
        half_endpoint: Endpoint,
        gateway_pid: int | None = None,
    ) -> None:
        self.opts = opts
        self.gateway_pid = gateway_pid
        self.endpoint = endpoint  # the server itself (metrics, legacy stream, tallies)
        self.pid = pid
        self.main_endpoint = main_endpoint  # where the sessions' POSTs go (maybe the gateway)
        self.half_endpoint = half_endpoint  # where the half-open peers' POSTs go
        mode = "json" if opts.json_response else "sse"
        self.result = RunResult(
            name, f"http://{endpoint.authority}{endpoint.path}", mode, opts.sessions
        )
        self.half = HalfOpenStats(peers=opts.half_open)
        self.phase_start = 0.0
        self.phase_perf = 0.0
        self.rss_peak = 0
        self.store_rtt: int | None = None  # store round trips in the measured phase
        self.metrics_ok = False
        self.sent = 0
        self.logdir: Path | None = None  # where a peer process logs (set by run_one)
        #: ``--peers-only``: called with each new half-open session's label.
        self.announce: Callable[[str], None] | None = None
        self.peer_done = trio.Event()  # ``--peer-process``: the peer process has ended
        self.peer_stats_ok = False

    # ------------------------------------------------------------------ samplers
    async def sample_memory(self) -> None:
        if self.pid is None:
            return
        for _ in range(100_000_000):
            try:
                rss, _hwm = proc_memory(self.pid)
            except OSError:
                return
            self.rss_peak = max(self.rss_peak, rss)
            if self.phase_start:
                self.result.samples.append(Sample(time.monotonic() - self.phase_start, rss))
            await trio.sleep(0.1)

    async def sample_metrics(self, client: Client) -> None:
        if not self.metrics_ok:
            return
        for _ in range(100_000_000):
            await trio.sleep(self.opts.sample_interval)
            m = await scrape(client, self.opts.metrics_path)
            if m is None:
                continue
            depths = _series(m, "weir_session_queue_depth")
            labels = self.half.labels
            half = [v for label, v in depths.items() if label in labels]
            half_bytes = [
                v for label, v in _series(m, "weir_session_credit_bytes").items() if label in labels
            ]
            if half:
                self.half.max_queue_depth = max(self.half.max_queue_depth, *half)
            if half_bytes:
                self.half.max_queue_bytes = max(self.half.max_queue_bytes, *half_bytes)
            rss = proc_memory(self.pid)[0] if self.pid is not None else 0
            self.result.samples.append(
                Sample(
                    time.monotonic() - self.phase_start,
                    rss,
                    frames_in_use=m.get("weir_credit_in_use_frames"),
                    max_queue_depth=max(depths.values(), default=0.0),
                    half_open_depth=max(half, default=0.0),
                    half_open_sessions=m.get("weir_half_open_sessions"),
                    half_open_bytes=max(half_bytes, default=0.0),
                )
            )

    # ------------------------------------------------------------------ sessions
    def new_sessions(self) -> list[McpSession]:
        """The sessions; past :data:`PER_SOURCE` of them against a 127.x server, spread
        over as many loopback source addresses (127.0.0.1, .2, ...) as they need."""
        opts = self.opts
        host = self.main_endpoint.host
        sources = -(-opts.sessions // PER_SOURCE) if host.startswith("127.") else 1
        return [
            McpSession(
                self.main_endpoint,
                f"fanout-{i}",
                sessionless=opts.sessionless,
                idempotency_keys=opts.idempotency_keys,
                local_address=f"127.0.0.{1 + i % sources}" if sources > 1 else None,
            )
            for i in range(opts.sessions)
        ]

    async def open_one(self, s: McpSession, warmup: int, failures: list[str]) -> bool:
        """Connect and ``initialize`` (timed into ``init_ms``), then ``warmup`` calls."""
        text = "x" * self.opts.text_size
        start = time.perf_counter()
        try:
            with trio.fail_after(30):
                await s.open()
                self.result.init_ms.append((time.perf_counter() - start) * 1000.0)
                for _ in range(warmup):
                    reply, _ = await s.call("echo", {"text": text})
                    if reply.message is None:
                        raise HttpError(f"warm-up call: HTTP {reply.status}")
        except (HttpError, trio.TooSlowError) as exc:
            failures.append(f"{s.name}: {exc!r}")
            return False
        return True

    async def open_sessions(self, at_once: int = 64) -> list[McpSession]:
        """Open every session, ``at_once`` at a time (setup: not measured)."""
        sessions = self.new_sessions()
        limiter = trio.CapacityLimiter(at_once)
        failures: list[str] = []

        async def one(s: McpSession) -> None:
            async with limiter:
                await self.open_one(s, self.opts.warmup, failures)

        with trio.move_on_after(120 + len(sessions) / 200):
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    nursery.start_soon(one, s)
        if failures or any(s.prefix == "" for s in sessions):
            raise BenchError(f"{len(failures)} sessions failed to open; first: {failures[:3]}")
        return sessions

    async def life(
        self, s: McpSession, index: int, limiter: trio.CapacityLimiter, progress: Progress
    ) -> None:
        """``--measure session``: the whole session, opening included."""
        failures: list[str] = []
        if await self.open_one(s, 0, failures):
            await self.drive(s, index, limiter, progress)
        else:
            self._error("open: " + failures[0].split(": ", 1)[1][:60])

    async def drive(
        self, s: McpSession, index: int, limiter: trio.CapacityLimiter, progress: Progress
    ) -> None:
        opts = self.opts
        result = self.result
        text = "x" * opts.text_size
        args = {"text": text}
        deadline = self.phase_start + opts.duration if opts.duration else math.inf
        interval = opts.sessions / opts.rate if opts.rate else 0.0
        calls = opts.calls if not opts.duration else _PAGE_LIMIT
        if interval:
            await trio.sleep(interval * index / opts.sessions)  # stagger the schedule
        first = time.monotonic()
        for n in range(calls):
            if time.monotonic() >= deadline:
                break
            async with limiter:
                self.sent += 1
                try:
                    with trio.fail_after(opts.call_timeout):
                        reply, start = await s.call("echo", args)
                except (HttpError, trio.TooSlowError) as exc:
                    self._error(type(exc).__name__ + (f": {exc}"[:60] if str(exc) else ""))
                    continue
            msg = reply.message
            if reply.status == 200 and msg is not None and "result" in msg and reply.done_at:
                latency = (reply.done_at - start) * 1000.0
                result.latencies_ms.append(latency)
                result.timed_ms.append((start - self.phase_perf, latency))
                progress.done += 1
            elif reply.status == 429:
                result.refused_429 += 1
            else:
                self._error(f"HTTP {reply.status} {reply.body[:60]!r}")
            if interval:
                wait = first + (n + 1) * interval - time.monotonic()
                if wait > 0:
                    await trio.sleep(wait)

    def _error(self, kind: str) -> None:
        self.result.errors += 1
        kinds = self.result.error_kinds
        if kind in kinds or len(kinds) < 20:
            kinds[kind] = kinds.get(kind, 0) + 1

    # ------------------------------------------------------------------ whole run
    async def execute_idle(self) -> RunResult:
        """``--measure idle``: open every session, leave it idle, weigh the server."""
        opts, result = self.opts, self.result
        result.measure = "idle"
        if self.pid is None:
            raise BenchError("--measure idle needs the server's pid (--pid with --url)")
        result.rss_baseline_mib = proc_memory(self.pid)[0] / 2**20
        t0 = time.monotonic()
        sessions = await self.open_sessions(at_once=256)
        result.setup_s = time.monotonic() - t0
        await trio.sleep(opts.idle_hold)  # let anything deferred (timers, GC, parking) settle
        rss = proc_memory(self.pid)[0]
        result.rss_after_setup_mib = result.peak_rss_mib = rss / 2**20
        result.idle_rss_per_session_kib = (
            (rss / 2**20 - result.rss_baseline_mib) * 1024 / opts.sessions
        )
        for s in sessions:
            await s.client.close()
        return result

    async def execute(self) -> RunResult:
        opts = self.opts
        result = self.result
        if opts.measure == "idle":
            return await self.execute_idle()
        metrics_client = Client(self.endpoint.host, self.endpoint.port)
        async with trio.open_nursery() as samplers:
            if self.pid is not None:
                result.rss_baseline_mib = proc_memory(self.pid)[0] / 2**20
                samplers.start_soon(self.sample_memory)
            before = await scrape(metrics_client, opts.metrics_path)
            self.metrics_ok = before is not None
            whole = opts.measure == "session"
            result.measure = opts.measure
            t0 = time.monotonic()
            sessions = self.new_sessions() if whole else await self.open_sessions()
            result.setup_s = time.monotonic() - t0
            if self.pid is not None:
                result.rss_after_setup_mib = proc_memory(self.pid)[0] / 2**20
            before = await scrape(metrics_client, opts.metrics_path)
            result.loadavg_before = os.getloadavg()[0]
            split0 = cpu_reading(self.pid) if self.pid is not None else None
            cpu0 = 0.0 if split0 is not None else None
            rtt0 = store_round_trips(opts.store) if opts.store and result.server == "weir" else None
            gw0 = proc_cpu_seconds(self.gateway_pid) if self.gateway_pid else None
            own0, busy0 = own_cpu_seconds(), machine_busy_seconds()
            self.phase_start = time.monotonic()
            self.phase_perf = time.perf_counter()
            if self.pid is not None:
                result.rss_phase_start_mib = proc_memory(self.pid)[0] / 2**20
                self.rss_peak = 0
            total = None if opts.duration else opts.sessions * opts.calls
            progress = Progress(result.server, total, opts.duration, opts.progress)
            limiter = trio.CapacityLimiter(opts.concurrency)
            samplers.start_soon(progress.run)
            if not whole:  # scraping costs the server CPU the others are not charged
                samplers.start_soon(
                    self.sample_metrics, Client(self.endpoint.host, self.endpoint.port)
                )
            budget = (opts.duration or 0) + 600.0
            separate = opts.half_open > 0 and opts.peer_process
            with trio.move_on_after(budget):
                async with trio.open_nursery() as load:
                    if separate:
                        await load.start(self.peer_process)
                    async with trio.open_nursery() as main:
                        step = self.life if whole else self.drive
                        for i, s in enumerate(sessions):
                            main.start_soon(step, s, i, limiter, progress)
                        if not separate:
                            for i in range(opts.half_open):
                                load.start_soon(self.half_open_peer, i)
                    if separate:  # it stops at the same deadline; give it time to report
                        with trio.move_on_after(30):
                            await self.peer_done.wait()
                    load.cancel_scope.cancel()  # the peers stop with the main load
            elapsed = time.monotonic() - self.phase_start
            split1 = cpu_reading(self.pid) if self.pid is not None else None
            # (cpu0 is 0: cpu1 is what the phase used, exact where the kernel says)
            cpu1 = cpu_used(split0, split1) if split0 is not None and split1 is not None else None
            rtt1 = store_round_trips(opts.store) if rtt0 is not None and opts.store else None
            if rtt0 is not None and rtt1 is not None:
                self.store_rtt = rtt1 - rtt0
            if split0 is not None and split1 is not None:
                ticks = split1.user + split1.system - split0.user - split0.system
                if ticks > 0:
                    result.server_sys_share = (split1.system - split0.system) / ticks
            gw1 = proc_cpu_seconds(self.gateway_pid) if self.gateway_pid else None
            result.client_cpu_s = own_cpu_seconds() - own0
            result.machine_busy_s = machine_busy_seconds() - busy0
            if gw0 is not None and gw1 is not None:
                result.gateway_cpu_s = gw1 - gw0
            if cpu0 is not None and cpu1 is not None:
                result.foreign_cpu_s = max(
                    0.0,
                    result.machine_busy_s
                    - (cpu1 - cpu0)
                    - result.client_cpu_s
                    - (result.gateway_cpu_s or 0.0)
                    - (result.peer_cpu_s or 0.0),
                )
            phase_peak = self.rss_peak
            if self.pid is not None and self._alive():
                phase_peak = max(phase_peak, proc_memory(self.pid)[0])
            progress.finish()
            after = await scrape(metrics_client, opts.metrics_path)
            samplers.cancel_scope.cancel()
        stats = await self._mark_stats() if self.metrics_ok else None
        for s in sessions:
            await s.client.close()
        await metrics_client.close()
        self._finish(elapsed, cpu0, cpu1, phase_peak, before, after, stats)
        return result

    async def _mark_stats(self) -> dict[str, int] | None:
        s = McpSession(self.endpoint, "fanout-stats")
        try:
            with trio.fail_after(10):
                await s.open()
                reply, _ = await s.call("mark_stats", {})
        except (HttpError, trio.TooSlowError):
            return None
        finally:
            await s.client.close()
        msg = reply.message or {}
        structured = (msg.get("result") or {}).get("structuredContent")
        if not isinstance(structured, dict):
            return None
        return {k: int(v) for k, v in structured.items()}

    def _finish(
        self,
        elapsed: float,
        cpu0: float | None,
        cpu1: float | None,
        phase_peak: int,
        before: dict[str, float] | None,
        after: dict[str, float] | None,
        marks: dict[str, int] | None,
    ) -> None:
        r = self.result
        init = sorted(r.init_ms)
        r.init_ms = init
        if init and r.measure == "session":
            r.init_p50_ms, r.init_p99_ms = percentile(init, 0.5), percentile(init, 0.99)
            r.init_max_ms = init[-1]
        lat = sorted(r.latencies_ms)
        r.latencies_ms = lat
        r.p99_timeline_ms = [round(p99, 1) for p99 in p99_timeline(r.timed_ms)]
        r.calls = len(lat)
        r.requests_sent = self.sent
        r.elapsed_s = elapsed
        r.calls_per_s = r.calls / elapsed if elapsed > 0 else 0.0
        r.p50_ms, r.p90_ms, r.p99_ms = (percentile(lat, q) for q in (0.5, 0.9, 0.99))
        r.max_ms = lat[-1] if lat else 0.0
        r.mean_ms = sum(lat) / len(lat) if lat else 0.0
        if self.store_rtt is not None and r.calls:
            r.store_rtt_per_call = self.store_rtt / r.calls
        if cpu0 is not None and cpu1 is not None and self.pid is not None:
            r.server_cpu_s = cpu1 - cpu0
            r.cpu_us_per_call = r.server_cpu_s / r.calls * 1e6 if r.calls else None
            hwm = proc_memory(self.pid)[1] if self._alive() else 0
            peak = max(self.rss_peak, hwm, phase_peak)
            r.peak_rss_mib = peak / 2**20
            if r.rss_baseline_mib is not None:
                r.rss_per_session_kib = (peak / 2**20 - r.rss_baseline_mib) * 1024 / r.sessions
            if r.rss_phase_start_mib is not None:
                r.rss_growth_mib = phase_peak / 2**20 - r.rss_phase_start_mib
        if before is not None and after is not None:
            r.teardowns = int(
                after.get("weir_teardowns_total", 0) - before.get("weir_teardowns_total", 0)
            )
            r.executions = int(
                after.get("weir_tool_executions_total", 0)
                - before.get("weir_tool_executions_total", 0)
            )
            for key, value in after.items():
                if key.startswith("weir_refusals_total{"):
                    reason = key.split('"')[1]
                    r.refusals[reason] = int(value - before.get(key, 0))
                elif key.startswith("weir_duplicate_requests_total{"):
                    outcome = key.split('"')[1]
                    r.gate_stopped[outcome] = int(value - before.get(key, 0))
            r.credit = self.opts.credit
            if marks is not None:  # exact for the peers; executions beyond requests for the rest
                r.duplicates_others = max(0, r.executions - marks["executions"] - self.sent)
                r.duplicates_half_open = marks["duplicates"]
                r.duplicates = r.duplicates_others + marks["duplicates"]
            else:  # no tally (not weir_app): executions beyond distinct requests sent
                r.duplicates = max(0, r.executions - self.sent - self.half.sent)
        if self.opts.half_open:
            half = self.half
            d = asdict(half)
            d["labels"] = half.labels[:10]
            if marks is not None:
                d["mark"] = marks
            r.half_open = d
            r.refused_429 += half.refused_429

    def _alive(self) -> bool:
        try:
            os.kill(self.pid or 0, 0)
        except OSError:
            return False
        return True


async def run_peers_only(opts: Options, url: str, via: str, phase_start: float) -> HalfOpenStats:
    """``--peers-only`` (the child of ``--peer-process``): just the half-open peers."""
    endpoint = Endpoint.parse(url)
    run = Run(opts, "peers", endpoint, None, endpoint, Endpoint.parse(via))
    run.phase_start = phase_start
    run.announce = lambda label: print(f"label {label}", flush=True)
    async with trio.open_nursery() as nursery:
        for i in range(opts.half_open):
            nursery.start_soon(run.half_open_peer, i)
    return run.half
