"""Hostile clients: what one abusive client costs the server and its polite neighbour.

``python -m benchmarks.hostile [--server weir|sdk|both] [--attacks NAME,...] [--scale F]``

Each (attack, server) row gets a fresh server on 127.0.0.1: weir's demo app (``python -m
engine serve demo``, default options unless the row's "weir options" say otherwise) or
the official SDK (:mod:`benchmarks.sdk_server`, an ``echo`` tool only).  On it, side by
side: a polite client (one session, sequential 64-byte ``tools/call echo``, ``--gap``
60 ms apart) makes 200 calls on the idle server; then the attack starts in a niced
child process (so that its CPU does not delay this event loop) and, once it is
engaged, the polite client calls again at the same pace for as long as it runs (at
most 2000 calls; 200 for ``batch``, which repeats until told to stop).  The gap is
60 ms because the SDK reads the next request on a keep-alive connection only ~45 ms
after answering the previous one; closer calls would measure that wait.

Attacks at ``--scale 1`` (counts and durations scale, message sizes do not; each is
cut after 50 s, or when the server's RSS passes 4 GiB):

* ``big-results``: 2 sessions x 100 ``echo`` of 3.5 MB, read (weir: ``--credit-bytes
  8388608`` so such a result fits); ``big-results-default``: 2 x 10 at weir's default
  1 MiB credit (refused ``result_too_large``; weir only).
* ``init-flood``: 50,000 ``initialize`` on one keep-alive connection, never deleted.
* ``batch``: a 2025-03-26 batch of 90,000 ``ping`` (3.85 MiB), resent once answered.
* ``slowloris``: 900 connections trickle a request head, a byte every 5 s, for 30 s,
  then wait 5 s; here the polite client opens a new connection per call.
* ``stalled-sse``/``stalled-json``: 20 sessions POST a call with a 900 KB result from a
  socket with ``SO_RCVBUF`` 4096 and never read; 8 s later (weir: past ``--drain-window
  2 --liveness-timeout 5``) the attacker reads ``/metrics``.

Reading a row: RSS (``VmRSS`` every 100 ms from a thread here; the peak also takes
``VmHWM``) before the attack, at its peak and 1 s after the attacker exited; peak open
descriptors; the polite p50/p99 without / with the attack and the p99 ratio; what the
server answered the attacker, as ``status reason`` (the JSON-RPC ``error.data.reason``)
or ``closed``/``reset``/``timeout``/``still open``.  Latency runs from writing the POST
to the end of its response.  All processes share the machine's cores.

Output: one ``hostile: {json}`` line per row as it finishes, then a markdown table, on
stdout; ``--json FILE`` appends the JSON lines to FILE.  Every loop is bounded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h11
import trio

REPO = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
BUDGET = 50.0  # seconds one attack may run
RSS_GUARD = 4096 * MiB  # the attack is stopped when the server's RSS passes this
POLITE_CALLS, POLITE_MAX = 200, 2000
STALL_ARGS = ("--drain-window", "2", "--liveness-timeout", "5")
STALL_WAIT = 8.0
VERSION = "2025-06-18"
NET_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)
Headers = dict[str, str]


class Failure(Exception):
    """No complete response; ``str()`` says why (timeout, closed, reset, ...)."""


@dataclass(slots=True)
class Reply:
    status: int
    headers: Headers
    body: bytes

    def message(self) -> dict[str, Any] | None:
        """The JSON-RPC response: the JSON body, or the SSE ``data:`` line holding it."""
        sse = self.headers.get("content-type", "").startswith("text/event-stream")
        lines = [x[5:] for x in self.body.split(b"\n") if x.startswith(b"data:")] if sse else []
        for raw in lines if sse else [self.body]:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict) and ("result" in msg or "error" in msg):
                return msg
        return None

    def answer(self) -> str:
        """The status, with the JSON-RPC error's ``data.reason`` when there is one."""
        error = (self.message() or {}).get("error")
        data = error.get("data") if isinstance(error, dict) else None
        reason = data.get("reason") if isinstance(data, dict) else None
        return f"{self.status} {reason}" if reason else str(self.status)


class Conn:
    """One loopback connection: requests written as raw bytes, answers parsed by h11."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream, self.port, self.reusable = stream, port, True
        self.parser = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int, rcvbuf: int | None = None) -> Conn:
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        try:
            with trio.fail_after(10):
                await sock.connect(("127.0.0.1", port))
        except (OSError, trio.TooSlowError) as exc:
            sock.close()
            raise Failure("connect_failed") from exc
        return cls(trio.SocketStream(sock), port)

    def head(self, method: str, path: str, headers: Headers, body: bytes = b"") -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{self.port}"]
        lines += ["accept: application/json, text/event-stream"]
        if method == "POST":
            lines += ["content-type: application/json", f"content-length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return "\r\n".join([*lines, "", ""]).encode("latin-1") + body

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except NET_ERRORS as exc:
            raise Failure("reset") from exc

    async def reply(self, timeout: float, method: str = "POST") -> Reply:
        """Read one whole response (h11 is told only that a ``method`` request went out)."""
        p = self.parser
        if p.our_state is h11.IDLE:
            p.send(h11.Request(method=method, target="/", headers=[("host", "h")]))
            p.send(h11.EndOfMessage())
        status, headers, chunks = 0, {}, []
        try:
            with trio.fail_after(timeout):
                while not isinstance(event := p.next_event(), h11.EndOfMessage):
                    if event is h11.NEED_DATA:
                        p.receive_data(await self.stream.receive_some(1 << 20))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                        headers = {k.decode(): v.decode("latin-1") for k, v in event.headers}
                    elif isinstance(event, h11.Data):
                        chunks.append(bytes(event.data))
                    elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                        raise Failure("closed")
        except trio.TooSlowError:
            raise Failure("timeout") from None
        except h11.RemoteProtocolError:
            raise Failure("bad_http" if status else "closed") from None
        except NET_ERRORS:
            raise Failure("reset") from None
        if p.our_state is h11.DONE and p.their_state is h11.DONE:
            p.start_next_cycle()
        else:
            self.reusable = False
        return Reply(status, headers, b"".join(chunks))

    async def post(self, body: bytes, headers: Headers, timeout: float = 10.0) -> Reply:
        await self.send(self.head("POST", "/mcp", headers, body))
        return await self.reply(timeout)

    async def get(self, path: str) -> Reply:
        await self.send(self.head("GET", path, {}))
        return await self.reply(10.0, "GET")

    async def aclose(self) -> None:
        with trio.move_on_after(1):
            await self.stream.aclose()


def rpc(rid: int | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    msg = {"jsonrpc": "2.0", "method": method, "id": rid, "params": params}
    return json.dumps({k: v for k, v in msg.items() if v is not None}).encode()


def echo(rid: int, text: str) -> bytes:
    return rpc(rid, "tools/call", {"name": "echo", "arguments": {"text": text}})


def initialize(version: str = VERSION) -> bytes:
    client = {"name": "hostile", "version": "0"}
    return rpc(
        0, "initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": client}
    )


async def open_session(conn: Conn, version: str = VERSION) -> Headers:
    """``initialize`` + ``notifications/initialized``; the headers the session's requests carry."""
    reply = await conn.post(initialize(version), {})
    if reply.status != 200 or "mcp-session-id" not in reply.headers:
        raise Failure(f"initialize answered {reply.answer()}")
    headers = {"mcp-session-id": reply.headers["mcp-session-id"], "mcp-protocol-version": version}
    await conn.post(rpc(None, "notifications/initialized"), headers)
    return headers


def metrics_of(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"^(weir_\S+) (\S+)$", text, re.M)}


# ============================================================== attacks (child process)
@dataclass
class Ctx:
    """What an attack is given, and where it leaves what it saw."""

    port: int
    scale: float
    answers: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)

    def n(self, full: int) -> int:
        return max(1, round(full * self.scale))

    def engaged(self) -> None:
        print("engaged", flush=True)

    async def post(self, conn: Conn, body: bytes, headers: Headers, timeout: float) -> bool:
        """POST and count the answer; False when none came (or the connection is done)."""
        try:
            reply = await conn.post(body, headers, timeout)
        except Failure as exc:
            self.answers[str(exc)] += 1
            return False
        self.answers[reply.answer()] += 1
        self.extra["read_mib"] = self.extra.get("read_mib", 0.0) + len(reply.body) / MiB
        return conn.reusable


async def big_results(ctx: Ctx, calls: int = 100) -> None:
    n, text = ctx.n(calls), "x" * 3_500_000
    ctx.extra.update(calls=2 * n, result_mb=3.5)

    async def session() -> None:
        conn = await Conn.open(ctx.port)
        headers = await open_session(conn)
        for rid in range(1, n + 1):
            if not await ctx.post(conn, echo(rid, text), headers, 30):
                conn = await Conn.open(ctx.port)

    ctx.engaged()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session)
        nursery.start_soon(session)


async def init_flood(ctx: Ctx) -> None:
    n, conn = ctx.n(50_000), await Conn.open(ctx.port)
    ctx.extra.update(requests=n, sent=0)
    ctx.engaged()
    for i in range(n):
        ctx.extra["sent"] = i + 1
        if not await ctx.post(conn, initialize(), {}, 10):
            conn = await Conn.open(ctx.port)


async def batch(ctx: Ctx) -> None:
    n = ctx.n(90_000)
    body = b"[%b]" % b",".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}' % i for i in range(n))
    conn = await Conn.open(ctx.port)
    headers, times = await open_session(conn, "2025-03-26"), list[float]()
    ctx.extra.update(entries=n, body_mib=round(len(body) / MiB, 2), answer_s=times)
    ctx.engaged()
    for _ in range(10_000):  # until the parent says stop
        t0 = time.perf_counter()
        ok = await ctx.post(conn, body, headers, 45)
        times.append(time.perf_counter() - t0)
        if not ok:
            conn = await Conn.open(ctx.port)


async def slowloris(ctx: Ctx, step: float = 5.0, grace: float = 5.0) -> None:
    n, duration, cut = ctx.n(900), max(1.0, 30.0 * ctx.scale), list[float]()
    head = b"GET /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: text/event-stream\r\n\r\n"
    ctx.extra.update(connections=n, duration_s=duration, opened=0, cut_after_s=cut)
    end = trio.current_time() + duration
    ready = [0]

    def started() -> None:
        ready[0] += 1
        if ready[0] == n:
            ctx.engaged()

    async def trickle(conn: Conn) -> str:
        """Send a byte every ``step`` s until ``end``; what the server did, and when."""
        first, sent = trio.current_time(), 0
        while (now := trio.current_time()) < end + grace:
            if now < end and sent < len(head) and now >= first + sent * step:
                await conn.send(head[sent : sent + 1])
                sent += 1
                if sent == 1:
                    started()
            wake = first + sent * step if now < end and sent < len(head) else end + grace
            with trio.move_on_at(min(wake, end + grace)):
                try:
                    data = await conn.stream.receive_some(65536)
                except NET_ERRORS:
                    raise Failure("reset") from None
                cut.append(trio.current_time() - first)
                if not data:
                    return "closed"
                conn.parser.receive_data(data)  # an answer: read the rest of it
                return (await conn.reply(2.0, "GET")).answer()
        return "still open"

    async def one(k: int) -> None:
        await trio.sleep(k * 0.002)
        try:
            conn = await Conn.open(ctx.port)
            ctx.extra["opened"] += 1
            ctx.answers[await trickle(conn)] += 1
        except Failure as exc:
            ctx.answers[str(exc)] += 1
            if str(exc) == "connect_failed":
                started()

    async with trio.open_nursery() as nursery:
        for k in range(n):
            nursery.start_soon(one, k)


async def stalled(ctx: Ctx) -> None:
    n, socks = ctx.n(20), list[Conn]()
    ctx.extra.update(sessions=n, result_kb=900, wait_s=STALL_WAIT)
    for i in range(n):
        setup = await Conn.open(ctx.port)
        headers = await open_session(setup)
        await setup.aclose()
        s = await Conn.open(ctx.port, rcvbuf=4096)
        await s.send(s.head("POST", "/mcp", headers, echo(i + 1, "z" * 900_000)))
        socks.append(s)
    ctx.engaged()
    await trio.sleep(STALL_WAIT)
    probe = await Conn.open(ctx.port)
    reply = await probe.get("/metrics")
    found = metrics_of(reply.body.decode(errors="replace"))
    ctx.extra.update(metrics=reply.status, teardowns=found.get("weir_teardowns_total"))
    ctx.extra["sessions_left"] = found.get("weir_sessions")
    for s in socks:  # the start of what the server sent: all the attacker ever reads
        data = b"nothing"
        with trio.move_on_after(0.5):
            try:
                data = await s.stream.receive_some(4096) or b"closed"
            except NET_ERRORS:
                data = b"reset"
        match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
        ctx.answers[match.group(1).decode() if match else data.decode()[:10]] += 1


def spread(values: list[float]) -> dict[str, float] | None:
    s = sorted(values)
    return (
        {"n": len(s), "first": values[0], "min": s[0], "median": s[len(s) // 2], "max": s[-1]}
        if s
        else None
    )


async def attacker(name: str, port: int, scale: float) -> dict[str, Any]:
    """Run one attack until it ends, stdin closes, or :data:`BUDGET` passes."""
    ctx, t0, completed, stop = Ctx(port, scale), time.perf_counter(), False, trio.CancelScope()

    async def watch_stdin() -> None:
        await trio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
        stop.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_stdin)
        try:
            with stop, trio.move_on_after(BUDGET) as budget:
                await ATTACKS[name].fn(ctx)
                completed = True
        except* Failure as group:
            ctx.extra["error"] = str(group.exceptions[0])
        nursery.cancel_scope.cancel()
    statuses: Counter[str] = Counter()
    for answer, count in ctx.answers.items():
        statuses[answer.split()[0]] += count
    out = {k: spread(v) if isinstance(v, list) else v for k, v in ctx.extra.items()}
    out.update(answers=dict(ctx.answers), statuses=dict(statuses), completed=completed)
    out.update(stopped=stop.cancelled_caught, timed_out=budget.cancelled_caught)
    return {**out, "elapsed_s": round(time.perf_counter() - t0, 3)}


# ============================================================== the run (parent process)
@dataclass(frozen=True)
class Attack:
    name: str
    fn: Callable[[Ctx], Awaitable[None]]
    weir_args: tuple[str, ...] = ()
    sdk_args: tuple[str, ...] = ()
    sdk: bool = True
    repeats: bool = False  # repeats until the polite client is done


ATTACKS = {
    a.name: a
    for a in [
        Attack("big-results", big_results, ("--credit-bytes", "8388608")),
        Attack("big-results-default", lambda ctx: big_results(ctx, 10), sdk=False),
        Attack("init-flood", init_flood),
        Attack("batch", batch, repeats=True),
        Attack("slowloris", slowloris),
        Attack("stalled-sse", stalled, STALL_ARGS),
        Attack("stalled-json", stalled, (*STALL_ARGS, "--json-response"), ("--json-response",)),
    ]
}


class Sampler:
    """``VmRSS`` and open descriptors of ``pid`` every 100 ms, on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.rss_peak, self.fds_peak, self._stop = pid, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> tuple[int, int]:
        """RSS (bytes) and open descriptors now; the peaks take them (and ``VmHWM``) in."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
            kib = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
            rss, hwm = int(kib["VmRSS"]) * 1024, int(kib["VmHWM"]) * 1024
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        except (OSError, KeyError):
            return 0, 0
        self.rss_peak, self.fds_peak = max(self.rss_peak, rss, hwm), max(self.fds_peak, fds)
        return rss, fds

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.now()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def report(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def q(p: float) -> float | None:
            return round(lat[max(0, math.ceil(p * len(lat)) - 1)] * 1000, 3) if lat else None

        out = {"calls": len(lat), "errors": dict(self.errors)}
        return {**out, "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0)}


class Polite:
    """One session making sequential 64-byte ``echo`` calls, ``gap`` seconds apart."""

    def __init__(self, port: int, fresh: bool, gap: float) -> None:
        self.port, self.fresh, self.gap, self.rid = port, fresh, gap, 0
        self.conn: Conn | None = None
        self.headers: Headers = {}

    async def call(self) -> str | None:
        """One call: ``None`` when echoed, else what came instead."""
        self.rid += 1
        try:
            with trio.fail_after(15):
                self.conn = self.conn or await Conn.open(self.port)
                reply = await self.conn.post(echo(self.rid, "p" * 64), self.headers)
        except (Failure, trio.TooSlowError) as exc:
            self.conn = None
            return str(exc) if isinstance(exc, Failure) else "timeout"
        if self.fresh or not self.conn.reusable:
            await self.conn.aclose()
            self.conn = None
        return None if "result" in (reply.message() or {}) else reply.answer()

    async def run(self, limit: int, until: Callable[[], bool] = lambda: False) -> Phase:
        phase = Phase()
        for _ in range(limit):
            if until():
                break
            t0 = time.perf_counter()
            error = await self.call()
            phase.latencies.append(time.perf_counter() - t0)
            phase.errors.update([error] if error else [])
            await trio.sleep(self.gap)
        return phase


def spawn(argv: list[str], log: Path, stdin: int, nice: int = 0) -> subprocess.Popen[bytes]:
    env, setup = dict(os.environ, PYTHONUNBUFFERED="1"), (lambda: os.nice(nice)) if nice else None
    with log.open("ab") as err:
        pipe = subprocess.PIPE
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=stdin, stdout=pipe, stderr=err, preexec_fn=setup
        )


async def readline(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    return await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)


def drain(proc: subprocess.Popen[bytes]) -> None:
    """Read (and drop) a child's stdout to its end, so that it never blocks on a full pipe."""
    for _ in proc.stdout or ():
        pass


async def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        with trio.move_on_after(10):
            while proc.poll() is None:
                await trio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            await trio.to_thread.run_sync(proc.wait)


async def scrape(port: int) -> dict[str, Any]:
    """weir's non-zero ``/metrics`` samples (and teardowns); else what came back."""
    try:
        conn = await Conn.open(port)
        reply = await conn.get("/metrics")
        await conn.aclose()
    except Failure as exc:
        return {"status": str(exc)}
    found = metrics_of(reply.body.decode(errors="replace")) if reply.status == 200 else {}
    kept = {k: v for k, v in found.items() if v or k == "weir_teardowns_total"}
    return kept or {"status": reply.status}


async def attack_phase(
    attack: Attack, port: int, polite: Polite, sampler: Sampler, args: argparse.Namespace, log: Path
) -> tuple[Phase, dict[str, Any]]:
    """Start the attacker; time the polite client beside it until it is done."""
    cmd = [sys.executable, "-m", "benchmarks.hostile", "--attacker", attack.name]
    cmd += ["--port", str(port), "--scale", str(args.scale)]
    child = spawn(cmd, log, subprocess.PIPE, args.attacker_nice)
    engaged, done, during, result = trio.Event(), trio.Event(), Phase(), dict[str, Any]()

    async def follow() -> None:
        while line := await readline(child):
            if line.startswith(b"engaged"):
                engaged.set()
            elif line.startswith(b"result "):
                result.update(json.loads(line[7:]))
        engaged.set()
        done.set()

    def end() -> None:
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.close()

    async def guard() -> None:
        while sampler.rss_peak <= RSS_GUARD:
            await trio.sleep(0.1)
        result["rss_guard_tripped"] = True
        end()

    with trio.move_on_after(BUDGET + 30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            nursery.start_soon(guard)
            await engaged.wait()
            during = await polite.run(POLITE_CALLS if attack.repeats else POLITE_MAX, done.is_set)
            end()
            await done.wait()
            nursery.cancel_scope.cancel()
    end()
    await stop(child, signal.SIGINT)
    return during, result or {"error": "the attacker reported nothing"}


async def run_row(kind: str, attack: Attack, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One fresh server: the polite baseline, then the attack with the polite client beside it."""
    server_args = list(attack.weir_args if kind == "weir" else attack.sdk_args)
    describe = ["git", "describe", "--always", "--dirty"]
    git = subprocess.run(describe, cwd=REPO, capture_output=True, timeout=10, check=False)
    weir = ["weir", "serve", "demo", "--host", "127.0.0.1"]
    argv = [sys.executable, "-m", *(weir if kind == "weir" else ["benchmarks.sdk_server"])]
    server = spawn([*argv, "--port", "0", *server_args], tmp / f"{kind}.log", subprocess.DEVNULL)
    line = b""
    with trio.move_on_after(30):
        line = await readline(server)
    if (match := re.match(rb"\w+: serving http://127\.0\.0\.1:(\d+)/mcp", line)) is None:
        await stop(server)
        raise SystemExit(f"hostile: {kind} did not start: {line!r}")
    port, sampler = int(match.group(1)), Sampler(server.pid)
    threading.Thread(target=drain, args=(server,), daemon=True).start()
    try:
        polite = Polite(port, attack.name == "slowloris", args.gap)
        setup = await Conn.open(port)
        polite.headers = await open_session(setup)
        await setup.aclose()
        await trio.sleep(0.5)
        without = await polite.run(POLITE_CALLS)
        rss_base, fds_base = sampler.now()
        sampler.rss_peak = sampler.fds_peak = 0
        log = tmp / f"attacker-{kind}-{attack.name}.log"
        during, result = await attack_phase(attack, port, polite, sampler, args, log)
        await trio.sleep(1.0)
        rss_after, fds_after = sampler.now()
        after, metrics = await polite.call(), await scrape(port)
    finally:
        sampler.stop()
        exited = server.poll()
        await stop(server)
    a, b = without.report(), during.report()
    row: dict[str, Any] = {"benchmark": "hostile", "attack": attack.name, "server": kind}
    row.update(date=datetime.now(UTC).isoformat(timespec="seconds"), server_args=server_args)
    row.update(scale=args.scale, gap_s=args.gap, attacker_nice=args.attacker_nice)
    row["loadavg_1m"] = round(os.getloadavg()[0], 2)  # the machine may be shared
    row["source"] = git.stdout.decode().strip() or None  # the tree the server started from
    rss = {"base": rss_base, "peak": sampler.rss_peak, "after": rss_after}
    row["rss_mib"] = {k: round(v / MiB, 1) for k, v in rss.items()}
    row["fds"] = {"base": fds_base, "peak": sampler.fds_peak, "after": fds_after}
    row["polite"] = {"without": a, "with": b, "after_attack": after or "ok"}
    for q in ("p50", "p99"):
        x, y = a[f"{q}_ms"], b[f"{q}_ms"]
        row["polite"][f"{q}_ratio"] = round(y / x, 3) if x and y else None
    row.update(attacker=result, server_metrics=metrics, server_exited=exited)
    return row


def num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def notes(row: dict[str, Any]) -> str:
    """The row's notes column: the attack's own numbers."""
    r, name, m = row["attacker"], row["attack"], row["server_metrics"]
    if name.startswith("big-results"):
        text = f"{r.get('calls')} calls, {r.get('read_mib', 0):.0f} MiB read"
    elif name == "init-flood":
        live = f"; {num(m['weir_sessions'])} sessions live" if "weir_sessions" in m else ""
        text = f"{r.get('sent')} of {r.get('requests')} sent in {r['elapsed_s']:.0f} s{live}"
    elif name == "batch":
        t = r.get("answer_s") or {"first": 0.0, "max": 0.0, "n": 0}
        text = f"{r.get('entries')} pings ({r.get('body_mib')} MiB): answered in "
        text += f"{t['first']:.3f} s, max {t['max']:.3f} s; {t['n']} batches sent"
    elif name == "slowloris":
        t = r.get("cut_after_s")
        cut = f"answered/closed after {t['min']:.1f}-{t['max']:.1f} s" if t else "none cut"
        text = f"{r.get('opened')} of {r.get('connections')} opened; {cut}"
    elif r.get("metrics") == 200:
        text = f"teardowns {num(r.get('teardowns'))}, sessions left {num(r.get('sessions_left'))}"
    else:
        text = f"/metrics answered {r.get('metrics')}"
    flags = [f"error: {r['error']}"] if r.get("error") else []
    flags += ["cut at 50 s"] * bool(r.get("timed_out")) + ["RSS guard"] * ("rss_guard_tripped" in r)
    flags += [f"server exited {row['server_exited']}"] * (row["server_exited"] is not None)
    after = row["polite"]["after_attack"]
    return "; ".join([text, *flags, *([f"polite call after: {after}"] * (after != "ok"))])


def table(rows: list[dict[str, Any]]) -> str:
    head = "attack|server|weir options|answers to the attacker|RSS MiB base / peak / after"
    head += "|fds peak|polite p50 ms without / with|polite p99 ms without / with|p99 ratio"
    head += "|polite calls with (errors)|notes"
    lines = [f"| {head.replace('|', ' | ')} |", "|" + "---|" * (head.count("|") + 1)]
    for row in rows:
        rss, p = row["rss_mib"], row["polite"]
        a, b = p["without"], p["with"]
        answers = sorted(row["attacker"].get("answers", {}).items(), key=lambda kv: -kv[1])
        errors = sum(b["errors"].values()) + sum(a["errors"].values())
        options = " ".join(row["server_args"]) if row["server"] == "weir" else ""
        cells = [row["attack"], row["server"], options or "-"]
        cells += [", ".join(f"{k} x{v}" for k, v in answers) or "-"]
        cells += [f"{rss['base']:.0f} / {rss['peak']:.0f} / {rss['after']:.0f}"]
        cells += [str(row["fds"]["peak"]), f"{a['p50_ms']} / {b['p50_ms']}"]
        cells += [f"{a['p99_ms']} / {b['p99_ms']}", num(p["p99_ratio"] or "-")]
        cells += [f"{b['calls']} ({errors})", notes(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def run_all(args: argparse.Namespace, names: list[str]) -> list[dict[str, Any]]:
    kinds, rows = ["weir", "sdk"] if args.server == "both" else [args.server], []
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        for name in names:
            for kind in kinds:
                if kind == "sdk" and not ATTACKS[name].sdk:
                    print(f"hostile: {name} is weir-only: skipped for the sdk", file=sys.stderr)
                    continue
                print(f"hostile: {name} against {kind} ...", file=sys.stderr, flush=True)
                rows.append(row := await run_row(kind, ATTACKS[name], args, Path(tmp)))
                line = json.dumps(row, separators=(",", ":"))
                print("hostile: " + line, flush=True)
                if args.json:
                    with open(args.json, "a") as out:
                        out.write(line + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--server", choices=["weir", "sdk", "both"], default="weir")
    p.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated (default: all)")
    p.add_argument("--scale", type=float, default=1.0, help="scale attack counts and durations")
    p.add_argument("--json", metavar="FILE", help="append the JSON lines to FILE")
    p.add_argument("--gap", type=float, default=0.06, help="seconds between polite calls")
    p.add_argument("--attacker-nice", type=int, default=10, help="the attacker's niceness")
    p.add_argument("--attacker", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.attacker:
        result = trio.run(attacker, args.attacker, args.port, args.scale)
        print("result " + json.dumps(result), flush=True)
        return 0
    names = [n.strip() for n in args.attacks.split(",") if n.strip()]
    if unknown := [n for n in names if n not in ATTACKS]:
        p.error(f"unknown attacks {unknown} (known: {', '.join(ATTACKS)})")
    if not 0 < args.scale <= 1 or not 0 <= args.gap <= 1:
        p.error("--scale must be in (0, 1] and --gap in [0, 1]")
    rows = trio.run(run_all, args, names)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
