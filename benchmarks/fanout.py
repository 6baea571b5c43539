"""Fan-out benchmark: hundreds of MCP sessions calling ``tools/call`` over keep-alive.

Theory of operation
-------------------
One run measures one server.  The server is either given (``--url``, any MCP
Streamable HTTP endpoint with an ``echo`` tool; ``--pid`` lets CPU and RSS be read)
or started here as a subprocess on 127.0.0.1 (``--server weir|ceiling|sdk``;
``all`` runs the three one after another and compares them):

* ``weir`` -- ``python -m weir serve benchmarks.weir_app:app`` (the demo's
  ``echo`` plus a ``mark`` tally used to count duplicate executions exactly);
* ``ceiling`` -- :mod:`benchmarks.ceiling`, a minimal Trio + h11 server answering
  the same requests in the same wire format without any MCP machinery;
* ``sdk`` -- :mod:`benchmarks.sdk_server`, the official Python SDK on uvicorn.

A run has three phases.  **Setup**: S sessions each open one keep-alive TCP
connection, ``initialize``, send ``notifications/initialized`` and make
``--warmup`` calls.  **Measured phase**: every session makes K ``tools/call`` of
``echo`` (or calls until ``--duration`` has passed), at most ``--concurrency`` in
flight, optionally paced to ``--rate`` calls/s in total; the server's CPU time
(``utime + stime`` from ``/proc/PID/stat``) is read at both ends, and so is the
whole machine's busy time (``/proc/stat``), so that CPU taken by other processes on a
shared machine shows in the report (``--quiet-wait`` waits for a quiet moment first).
**Report**.

Latency is measured per call from the moment the POST is written to the moment the
JSON-RPC response event is parsed (before the end of the SSE stream arrives).  RSS
is sampled from ``/proc/PID/status`` every 100 ms; the peak is the larger of the
samples and ``VmHWM``.  RSS per session is (peak - RSS before any session) / S.
For weir, ``/metrics`` is scraped every ``--sample-interval`` seconds (queue depth
over time, for the plot) and at both ends of the phase (executions, refusals,
teardowns, duplicates stopped by the idempotency gate).

**Half-open peers** (``--half-open N``, weir or any server with the 2024-11-05
``GET /sse`` endpoint): each opens the legacy SSE stream -- the one stream that
carries every response of its session -- on a socket whose ``SO_RCVBUF`` is
shrunk to the minimum, reads the ``endpoint`` event, and never reads again.  It
keeps POSTing a non-idempotent ``tools/call`` (``mark``, with ``--half-open-pad``
bytes echoed back so frames spend byte credit) at ``--half-open-rate`` calls/s in
total over ``--half-open-posters`` keep-alive connections, ignoring ``Retry-After``.
A ``404`` means the server tore the session down: the peer opens a new one.  It
counts 202s, 429s (reason ``stream_half_open``) and 404s.

``--half-open-control`` turns the same peers into a control: they read their
streams to the end (normal receive buffer), so their sessions stay healthy while
sending exactly the same requests.  Comparing the other sessions' latency with
half-open peers and with control peers separates what a *stalled* stream costs its
neighbours from what the peers' traffic itself costs on a shared machine.

**Gateway retries** (``--gateway-retries R``): the POSTs (of every session, or
only of the half-open peers with ``--gateway-scope half-open``) go through
:mod:`benchmarks.gateway`, which re-sends a POST on a new upstream connection when
no response headers arrive within ``--gateway-timeout``.  Duplicates are counted
exactly for the half-open peers (every ``mark`` key is unique; the server's tally
says how many keys ran more than once) and, for the other sessions, as
``weir_tool_executions_total`` growth minus ``mark`` executions minus distinct
requests sent (every request is sent once by the client; only the gateway repeats).
Against a server without the tally, the peers' calls still make frames (as tool
errors) and duplicates are executions beyond all distinct requests sent.

**Isolating what the server does** from what the peers' own traffic costs a shared
machine (the load generator, the peers, the gateway and the server otherwise share the
same cores, and every one of the peers' POSTs costs all of them CPU):

* ``--peer-process`` runs the half-open peers in a child process (``--peers-only``,
  internal), so the load generator's event loop times only the other sessions.  The
  child reports each session it opens (so their queue depth is still followed in
  ``/metrics``) and its counts at the end; a child that ends without them marks the run
  invalid.
* ``--peer-nice N`` lowers that child's priority (and the gateway's, when it serves only
  the peers, ``--gateway-scope half-open``); 19 stands in for the peer being on another
  machine.  The *server's* work for the peer is never deprioritized: it is what is
  measured.
* ``--pin-server`` pins the server to the first CPU and everything else started here to
  the others, as a server has its own machine.
* ``--ab PAIRS`` answers "the other sessions' p99 with the peers against a run without
  them" in one invocation: PAIRS runs without the peers and PAIRS with them, in ABBA
  order, each on a fresh server with the same options.  The headline ratio compares the
  p99 of all the other sessions' calls pooled per arm; the mean of the per-run p99s and
  each pair's ratio are reported beside it.

Output: a progress bar on stderr when it is a terminal, then a table and exactly
one JSON line on stdout (with the p99 of every 5 s of the phase), and a PNG (latency
CDF, p99 over time, queue depth over time, RSS over time) when matplotlib is
installed.  A server that exits during its run marks the run invalid.  Every loop is
bounded in count and in time.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import trio

PROTOCOL_VERSION = "2025-06-18"
REPO = Path(__file__).resolve().parent.parent
WEIR_APP = "benchmarks.weir_app:app"
DEFAULT_PLOT = REPO / "benchmarks" / "out" / "fanout.png"
_RECV = 65536
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_LIMIT = 10_000_000  # upper bound on calls per session in --duration mode
_decode = msgspec.json.decode
_encode = msgspec.json.encode


class BenchError(Exception):
    """A run could not be carried out (a server did not start, setup failed, ...)."""


# ====================================================================== HTTP client
class HttpError(Exception):
    """The connection failed or the peer sent something this client cannot parse."""


class _Stale(Exception):
    """The connection ended before any byte of the response."""


@dataclass(slots=True)
class Reply:
    """One HTTP response, and the JSON-RPC message found in it."""

    status: int
    headers: dict[str, str]
    body: bytes
    message: dict[str, Any] | None = None
    done_at: float | None = None  # perf_counter() when the message was parsed


class Client:
    """A minimal HTTP/1.1 client on one keep-alive connection (reconnects on demand).

    It writes prebuilt request bytes and parses just enough of the answer:
    status, headers, a ``Content-Length`` or chunked body, and SSE events -- as
    they arrive, so the JSON-RPC response with the wanted id is timed when it is
    parsed, not when the stream ends.
    """

    __slots__ = ("buf", "host", "port", "stream")

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.buf = bytearray()

    async def close(self) -> None:
        stream, self.stream = self.stream, None
        self.buf.clear()
        if stream is not None:
            with trio.move_on_after(1):
                await stream.aclose()

    async def _fill(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(_RECV)
        if not data:
            raise HttpError("connection closed by the server")
        self.buf += data

    async def exchange(self, request: bytes, want_id: int | None) -> Reply:
        """Send ``request``; read one whole response (raises :class:`HttpError`).

        A kept-alive connection that the server closed while idle (EOF before any
        byte of the response) is replaced and the request sent once more, as HTTP
        clients do: the server never read it.
        """
        for attempt in range(2):
            reused = self.stream is not None
            if self.stream is None:
                try:
                    self.stream = await trio.open_tcp_stream(self.host, self.port)
                except OSError as exc:
                    raise HttpError(f"connect: {exc}") from exc
            try:
                await self.stream.send_all(request)
                return await self._read(want_id)
            except _Stale:
                await self.close()
                if not reused or attempt:
                    raise HttpError("connection closed by the server") from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                await self.close()
                raise HttpError(str(exc)) from exc
            except BaseException:
                await self.close()  # a cancelled exchange leaves the connection unusable
                raise
        raise HttpError("unreachable")

    async def _read(self, want_id: int | None) -> Reply:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > 65536:
                raise HttpError("response head too large")
            try:
                await self._fill()
            except (HttpError, trio.BrokenResourceError, OSError) as exc:
                if not buf:
                    raise _Stale from exc
                raise
            end = buf.find(b"\r\n\r\n")
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[: end + 4]
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise HttpError(f"bad status line {lines[0]!r}") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        reply = Reply(status, headers, b"")
        sse = headers.get("content-type", "").startswith("text/event-stream")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            reply.body = await self._chunked(reply, want_id if sse else None)
        elif "content-length" in headers:
            n = int(headers["content-length"])
            while len(buf) < n:
                await self._fill()
            reply.body = bytes(buf[:n])
            del buf[:n]
        elif status >= 200 and status not in (204, 304):
            raise HttpError("response without a length")  # never sent by the servers here
        if reply.message is None and reply.body:
            if sse:
                _scan_events(reply, reply.body, want_id, 0)
            elif headers.get("content-type", "").startswith("application/json"):
                try:
                    msg = _decode(reply.body)
                except msgspec.DecodeError:
                    msg = None
                if isinstance(msg, dict):
                    reply.message = msg
                    reply.done_at = time.perf_counter()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return reply

    async def _chunked(self, reply: Reply, want_id: int | None) -> bytes:
        buf = self.buf
        body = bytearray()
        seen = 0  # SSE events of ``body`` already looked at
        for _ in range(1_000_000):
            i = buf.find(b"\r\n")
            while i < 0:
                await self._fill()
                i = buf.find(b"\r\n")
            try:
                size = int(bytes(buf[:i]).split(b";", 1)[0], 16)
            except ValueError as exc:
                raise HttpError("bad chunk size") from exc
            if size == 0:
                j = buf.find(b"\r\n", i)  # the empty line after the (absent) trailers
                while buf.find(b"\r\n\r\n", i) < 0 and buf[i : i + 4] != b"\r\n\r\n":
                    await self._fill()
                j = buf.find(b"\r\n\r\n", i)
                del buf[: j + 4]
                return bytes(body)
            need = i + 2 + size + 2
            while len(buf) < need:
                await self._fill()
            body += buf[i + 2 : i + 2 + size]
            del buf[:need]
            if want_id is not None and reply.message is None:
                seen = _scan_events(reply, body, want_id, seen)
        raise HttpError("too many chunks")


def _scan_events(reply: Reply, body: bytes | bytearray, want_id: int | None, seen: int) -> int:
    """Parse complete SSE events after the first ``seen``; set ``reply.message``."""
    events = bytes(body).replace(b"\r\n", b"\n").split(b"\n\n")[:-1]
    for event in events[seen:]:
        data = [
            line[6:] if line.startswith(b"data: ") else line[5:]
            for line in event.split(b"\n")
            if line.startswith(b"data:")
        ]
        if not data or not any(data):
            continue
        try:
            msg = _decode(b"\n".join(data))
        except msgspec.DecodeError:
            continue
        if (
            isinstance(msg, dict)
            and ("result" in msg or "error" in msg)
            and (want_id is None or msg.get("id") == want_id)
        ):
            reply.message = msg
            reply.done_at = time.perf_counter()
            break
    return len(events)


# ====================================================================== MCP sessions
def _post(host: str, path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _initialize_body(request_id: int, name: str) -> bytes:
    return _encode(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": name, "version": "0.1.0"},
            },
        }
    )


_INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'


def _call_body(request_id: int, tool: str, arguments: dict[str, Any]) -> bytes:
    return _encode(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
    )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: ``host:port`` and the MCP path."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise BenchError(f"need http://HOST:PORT/PATH, got {url!r}")
        return cls(parts.hostname, parts.port, parts.path or "/")

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


class McpSession:
    """One MCP session on one keep-alive connection."""

    __slots__ = ("client", "endpoint", "name", "next_id", "prefix", "session_id")

    def __init__(self, endpoint: Endpoint, name: str) -> None:
        self.endpoint = endpoint
        self.name = name
        self.client = Client(endpoint.host, endpoint.port)
        self.session_id: str | None = None
        self.next_id = 1
        self.prefix = ""

    async def open(self) -> None:
        """``initialize`` and ``notifications/initialized`` (raises :class:`HttpError`)."""
        ep = self.endpoint
        reply = await self.client.exchange(
            _post(ep.authority, ep.path, _initialize_body(0, self.name)), 0
        )
        sid = reply.headers.get("mcp-session-id")
        if reply.status != 200 or reply.message is None or "result" not in reply.message:
            raise HttpError(f"initialize: HTTP {reply.status} {reply.body[:200]!r}")
        self.session_id = sid
        self.prefix = f"MCP-Protocol-Version: {PROTOCOL_VERSION}\r\n"
        if sid is not None:
            self.prefix += f"Mcp-Session-Id: {sid}\r\n"
        reply = await self.client.exchange(
            _post(ep.authority, ep.path, _INITIALIZED, self.prefix), None
        )
        if reply.status not in (200, 202):
            raise HttpError(f"notifications/initialized: HTTP {reply.status}")

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[Reply, float]:
        """One ``tools/call``; returns the reply and the time the POST was written."""
        rid = self.next_id
        self.next_id += 1
        ep = self.endpoint
        data = _post(ep.authority, ep.path, _call_body(rid, tool, arguments), self.prefix)
        start = time.perf_counter()
        return await self.client.exchange(data, rid), start


# ====================================================================== processes
@dataclass
class ServerProcess:
    """A server (or the gateway) started as a subprocess."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


async def start_process(
    name: str, argv: list[str], logdir: Path, setup: Callable[[], None] | None = None
) -> ServerProcess:
    """Start ``argv``; wait (at most 60 s) for its ``NAME: serving URL`` line.

    ``setup`` runs in the child before ``exec`` (CPU affinity, niceness).
    """
    log_path = logdir / f"{name}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            preexec_fn=setup,
        )
    sp = ServerProcess(name, proc, "", log_path)
    assert proc.stdout is not None
    line = b""
    with trio.move_on_after(60):
        line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
    match = re.search(rb"serving (http://\S+)", line)
    if match is None:
        await stop_process(sp)
        raise BenchError(f"{name} did not start (first line {line!r}):\n{sp.log_tail()}")
    sp.url = match.group(1).decode()
    return sp


async def stop_process(sp: ServerProcess) -> None:
    """SIGTERM, then SIGKILL after 5 s."""
    proc = sp.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(5):
            while proc.poll() is None:
                await trio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            await trio.to_thread.run_sync(proc.wait)
    if proc.stdout is not None:
        proc.stdout.close()


def child_setup(nice: int = 0, cpus: set[int] | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that lowers a child's priority by ``nice`` and pins it to ``cpus``."""
    if not nice and cpus is None:
        return None

    def setup() -> None:
        if nice:
            os.nice(nice)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


def pin_self(cpus: set[int]) -> None:
    """Pin every thread of this process to ``cpus`` (children started later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread may have just exited
            os.sched_setaffinity(int(tid), cpus)


def proc_children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``weir serve --workers N`` runs its workers there)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` and its live children so far."""
    user = system = 0.0
    for p in (pid, *proc_children(pid)):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11]) / _CLK_TCK
        system += int(fields[12]) / _CLK_TCK
    return user, system


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    return sum(proc_cpu_split(pid))


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy (not idle, not iowait) since boot."""
    with open("/proc/stat", "rb") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _CLK_TCK


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this (the load generator's) process."""
    t = os.times()
    return t.user + t.system


def proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` plus its live children, in bytes."""
    rss = hwm = 0
    for p in (pid, *proc_children(pid)):
        try:
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith(b"VmHWM:"):
                        hwm += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, hwm


def store_round_trips(url: str) -> int | None:
    """Commands clients sent to the Redis-protocol server at ``url`` so far.

    Counts the top-level commands weir's store issues (EVALSHA/EVAL scripts and
    HGETALL), from ``INFO commandstats``; commands run inside scripts are not
    round trips and are not counted.
    """
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 2) as c:
            c.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
            data = b""
            while not data.endswith(b"\r\n") or data.count(b"\r\n") < 2:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
                header, _, rest = data.partition(b"\r\n")
                if header.startswith(b"$") and len(rest) >= int(header[1:]):
                    break
    except OSError:
        return None
    total = 0
    for line in data.decode("utf-8", "replace").splitlines():
        name, _, stats = line.partition(":")
        if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_hgetall"):
            total += int(stats.split("calls=", 1)[1].split(",", 1)[0])
    return total


# ====================================================================== metrics
def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {``name{labels}``: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def _series(metrics: dict[str, float], name: str) -> dict[str, float]:
    """``{label value: sample}`` of a metric with one label (``name{session="…"}``)."""
    prefix = name + "{"
    return {k.split('"')[1]: v for k, v in metrics.items() if k.startswith(prefix) and '"' in k}


def session_label(session_id: str) -> str:
    """The label weir's ``/metrics`` uses for a session (a short hash of its id)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:12]


async def scrape(client: Client, url_path: str) -> dict[str, float] | None:
    """GET ``/metrics``; ``None`` if the server has none."""
    req = f"GET {url_path} HTTP/1.1\r\nHost: {client.host}:{client.port}\r\n\r\n".encode()
    try:
        with trio.fail_after(10):
            reply = await client.exchange(req, None)
    except (HttpError, trio.TooSlowError):
        return None
    if reply.status != 200:
        return None
    return parse_metrics(reply.body.decode(errors="replace"))


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
    client_cpu_s: float = 0.0
    gateway_cpu_s: float | None = None
    peer_cpu_s: float | None = None  # --peer-process: the whole peer process's CPU time
    machine_busy_s: float = 0.0
    foreign_cpu_s: float | None = None
    loadavg_before: float = 0.0
    busy_before_cores: float | None = None
    p99_timeline_ms: list[float] = field(default_factory=list)  # p99 per 5 s of the phase
    arm: str | None = None  # with --ab: "without" or "with" the half-open peers
    layout: dict[str, Any] | None = None  # with --pin-server / --peer-process: who ran where
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    timed_ms: list[tuple[float, float]] = field(default_factory=list, repr=False)
    samples: list[Sample] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        del out["latencies_ms"], out["samples"], out["timed_ms"]
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


# ====================================================================== the run
@dataclass
class Options:
    """The parsed command line (see :func:`parser`)."""

    sessions: int
    calls: int
    concurrency: int
    duration: float | None
    rate: float | None
    warmup: int
    text_size: int
    json_response: bool
    half_open: int
    half_open_rate: float
    half_open_pad: int
    half_open_posters: int
    half_open_control: bool
    gateway_retries: int
    gateway_timeout: float
    gateway_scope: str
    sample_interval: float
    call_timeout: float
    credit: dict[str, float]
    weir_app: str
    metrics_path: str
    legacy_sse_path: str
    progress: bool
    quiet_wait: float
    store: str | None = None
    workers: int = 1
    peer_process: bool = False
    peer_nice: int = 0
    pin_server: bool = False


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


class Run:
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
                    frames_in_use=m.get("weir_credit_frames_in_use"),
                    max_queue_depth=max(depths.values(), default=0.0),
                    half_open_depth=max(half, default=0.0),
                    half_open_sessions=m.get("weir_half_open_sessions"),
                    half_open_bytes=max(half_bytes, default=0.0),
                )
            )

    # ------------------------------------------------------------------ sessions
    async def open_sessions(self) -> list[McpSession]:
        opts = self.opts
        sessions = [McpSession(self.main_endpoint, f"fanout-{i}") for i in range(opts.sessions)]
        limiter = trio.CapacityLimiter(64)
        failures: list[str] = []
        text = "x" * opts.text_size

        async def one(s: McpSession) -> None:
            async with limiter:
                try:
                    with trio.fail_after(30):
                        await s.open()
                        for _ in range(opts.warmup):
                            reply, _ = await s.call("echo", {"text": text})
                            if reply.message is None:
                                raise HttpError(f"warm-up call: HTTP {reply.status}")
                except (HttpError, trio.TooSlowError) as exc:
                    failures.append(f"{s.name}: {exc!r}")

        with trio.move_on_after(120):
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    nursery.start_soon(one, s)
        if failures or any(s.prefix == "" for s in sessions):
            raise BenchError(f"{len(failures)} sessions failed to open; first: {failures[:3]}")
        return sessions

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

    # ------------------------------------------------------------------ half-open
    async def half_open_peer(self, index: int) -> None:
        opts = self.opts
        half = self.half
        deadline = self.phase_start + (opts.duration or 60.0)
        interval = 1.0 / opts.half_open_rate
        pad = "p" * opts.half_open_pad
        post_ep = self.half_endpoint
        for cycle in range(1000):
            if time.monotonic() >= deadline:
                return
            stream = await self._stalled_stream()
            if stream is None:
                half.errors += 1
                await trio.sleep(1)
                continue
            sse, endpoint_path = stream
            sid = endpoint_path.partition("session_id=")[2]
            half.labels.append(session_label(sid))
            if self.announce is not None:
                self.announce(half.labels[-1])
            half.sessions_opened += 1
            ids = itertools.count(1)  # JSON-RPC ids, unique within the session
            try:
                init = Client(post_ep.host, post_ep.port)
                await self._legacy_initialize(init, endpoint_path)
                await init.close()
                async with trio.open_nursery() as reader:
                    if opts.half_open_control:
                        reader.start_soon(self._read_all, sse)
                    await self._post_all(index, cycle, endpoint_path, ids, pad, interval, deadline)
                    reader.cancel_scope.cancel()
            finally:
                with trio.move_on_after(1):
                    await sse.aclose()

    async def peer_process(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """``--peer-process``: run the half-open peers in a child process; collect their counts.

        The child (``--peers-only``) prints one ``label L`` line per session it opens (so
        the queue-depth sampler here can follow that session in ``/metrics``) and one
        ``stats {...}`` line at the end.  It shares ``phase_start`` (``CLOCK_MONOTONIC`` is
        system-wide) and stops at the same deadline as the other sessions.
        """
        opts = self.opts
        ep, via = self.endpoint, self.half_endpoint
        argv = [sys.executable, "-m", "benchmarks.fanout", "--peers-only"]
        argv += ["--url", f"http://{ep.authority}{ep.path}"]
        argv += ["--half-open-via", f"http://{via.authority}{via.path}"]
        argv += ["--phase-start", repr(self.phase_start), "--duration", str(opts.duration or 60.0)]
        argv += ["--half-open", str(opts.half_open), "--half-open-rate", str(opts.half_open_rate)]
        argv += ["--half-open-pad", str(opts.half_open_pad)]
        argv += ["--half-open-posters", str(opts.half_open_posters)]
        argv += ["--legacy-sse-path", opts.legacy_sse_path]
        argv += ["--call-timeout", str(opts.call_timeout)]
        if opts.half_open_control:
            argv.append("--half-open-control")
        log_path = (self.logdir or Path(tempfile.gettempdir())) / "peers.log"
        with log_path.open("wb") as log:
            proc = await trio.lowlevel.open_process(
                argv,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=child_setup(opts.peer_nice),
            )
        task_status.started()
        try:
            assert proc.stdout is not None
            buf = b""
            for _ in range(10_000_000):  # ends with the child (its own deadline) or a cancel
                chunk = await proc.stdout.receive_some(_RECV)
                if not chunk:
                    break
                *lines, buf = (buf + chunk).split(b"\n")
                for line in lines:
                    self._peer_line(line)
            await proc.wait()
        finally:
            self.peer_done.set()
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
            if not self.peer_stats_ok:
                try:
                    tail = log_path.read_text(errors="replace")[-2000:]
                except OSError:
                    tail = ""
                why = f"the peer process ended without its counts:\n{tail}"
                self.result.died.append(why)
                print(f"fanout: INVALID RUN: {why}", file=sys.stderr)

    def _peer_line(self, line: bytes) -> None:
        """One line of the peer process's output (``label L`` or ``stats {...}``)."""
        kind, _, rest = line.partition(b" ")
        if kind == b"label":
            self.half.labels.append(rest.decode())
        elif kind == b"stats":
            counts = json.loads(rest)
            for key in _PEER_COUNTS:
                setattr(self.half, key, counts[key])
            self.result.peer_cpu_s = float(counts["cpu_s"])
            self.peer_stats_ok = True

    @staticmethod
    async def _read_all(sse: trio.SocketStream) -> None:
        """The control peer: read (and discard) its stream until it ends."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while await sse.receive_some(65536):
                pass

    async def _post_all(
        self,
        index: int,
        cycle: int,
        endpoint_path: str,
        ids: Iterator[int],
        pad: str,
        interval: float,
        deadline: float,
    ) -> None:
        """Run a peer's posters until the phase ends or its session is gone."""
        opts = self.opts
        post_ep = self.half_endpoint
        async with trio.open_nursery() as posters:
            for j in range(opts.half_open_posters):
                posters.start_soon(
                    self._keep_posting,
                    Client(post_ep.host, post_ep.port),
                    endpoint_path,
                    f"h{index}.{cycle}.{j}",
                    ids,
                    pad,
                    interval * opts.half_open_posters,
                    j * interval,
                    deadline,
                    posters.cancel_scope,
                )

    async def _stalled_stream(self) -> tuple[trio.SocketStream, str] | None:
        """Open the legacy SSE stream with a tiny receive buffer; read up to ``endpoint``.

        (A control peer keeps the normal receive buffer: it will read everything.)
        """
        ep = self.endpoint
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        if not self.opts.half_open_control:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 1024)
        try:
            await sock.connect((ep.host, ep.port))
        except OSError:
            sock.close()
            return None
        stream = trio.SocketStream(sock)
        req = (
            f"GET {self.opts.legacy_sse_path} HTTP/1.1\r\nHost: {ep.authority}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
        buf = b""
        try:
            with trio.fail_after(10):
                await stream.send_all(req)
                while (
                    b"/messages" not in buf or b"\n\n" not in buf.split(b"event: endpoint", 1)[-1]
                ):
                    data = await stream.receive_some(4096)
                    if not data or len(buf) > 65536:
                        raise HttpError("no endpoint event")
                    buf += data
        except (HttpError, trio.TooSlowError, trio.BrokenResourceError, OSError):
            await stream.aclose()
            return None
        match = re.search(rb"data: ?(\S+session_id=\S+)", buf)
        if match is None or not buf.startswith(b"HTTP/1.1 200"):
            await stream.aclose()
            return None
        return stream, match.group(1).decode()

    async def _legacy_initialize(self, poster: Client, path: str) -> None:
        ep = self.endpoint
        host = ep.authority
        with trio.move_on_after(10):
            await poster.exchange(_post(host, path, _initialize_body(0, "half-open")), None)
            await poster.exchange(_post(host, path, _INITIALIZED), None)

    async def _keep_posting(
        self,
        poster: Client,
        path: str,
        prefix: str,
        ids: Iterator[int],
        pad: str,
        interval: float,
        offset: float,
        deadline: float,
        cycle: trio.CancelScope,
    ) -> None:
        """One of a peer's posters: POST ``mark`` every ``interval`` s until 404 or the end."""
        half = self.half
        host = self.endpoint.authority
        await trio.sleep(offset)
        try:
            for n in range(1, 10_000_000):
                now = time.monotonic()
                if now >= deadline:
                    return
                body = _call_body(next(ids), "mark", {"key": f"{prefix}.{n}", "pad": pad})
                half.sent += 1
                try:
                    with trio.fail_after(self.opts.call_timeout):
                        reply = await poster.exchange(_post(host, path, body), None)
                except (HttpError, trio.TooSlowError):
                    half.errors += 1
                    await trio.sleep(interval)
                    continue
                since = time.monotonic() - self.phase_start
                if reply.status in (200, 202):
                    half.accepted += 1
                elif reply.status == 429:
                    half.refused_429 += 1
                    if b"stream_half_open" in reply.body:
                        half.refused_429_half_open += 1
                    if half.first_429_s is None:
                        half.first_429_s = since
                elif reply.status == 404:
                    half.gone_404 += 1
                    if half.first_404_s is None:
                        half.first_404_s = since
                    cycle.cancel()  # torn down: the peer opens a new half-open session
                    return
                else:
                    half.other += 1
                await trio.sleep(max(0.0, interval - (time.monotonic() - now)))
        finally:
            await poster.close()

    # ------------------------------------------------------------------ whole run
    async def execute(self) -> RunResult:
        opts = self.opts
        result = self.result
        metrics_client = Client(self.endpoint.host, self.endpoint.port)
        async with trio.open_nursery() as samplers:
            if self.pid is not None:
                result.rss_baseline_mib = proc_memory(self.pid)[0] / 2**20
                samplers.start_soon(self.sample_memory)
            before = await scrape(metrics_client, opts.metrics_path)
            self.metrics_ok = before is not None
            t0 = time.monotonic()
            sessions = await self.open_sessions()
            result.setup_s = time.monotonic() - t0
            if self.pid is not None:
                result.rss_after_setup_mib = proc_memory(self.pid)[0] / 2**20
            before = await scrape(metrics_client, opts.metrics_path)
            result.loadavg_before = os.getloadavg()[0]
            split0 = proc_cpu_split(self.pid) if self.pid is not None else None
            cpu0 = sum(split0) if split0 is not None else None
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
            samplers.start_soon(self.sample_metrics, Client(self.endpoint.host, self.endpoint.port))
            budget = (opts.duration or 0) + 600.0
            separate = opts.half_open > 0 and opts.peer_process
            with trio.move_on_after(budget):
                async with trio.open_nursery() as load:
                    if separate:
                        await load.start(self.peer_process)
                    async with trio.open_nursery() as main:
                        for i, s in enumerate(sessions):
                            main.start_soon(self.drive, s, i, limiter, progress)
                        if not separate:
                            for i in range(opts.half_open):
                                load.start_soon(self.half_open_peer, i)
                    if separate:  # it stops at the same deadline; give it time to report
                        with trio.move_on_after(30):
                            await self.peer_done.wait()
                    load.cancel_scope.cancel()  # the peers stop with the main load
            elapsed = time.monotonic() - self.phase_start
            split1 = proc_cpu_split(self.pid) if self.pid is not None else None
            cpu1 = sum(split1) if split1 is not None else None
            rtt1 = store_round_trips(opts.store) if rtt0 is not None and opts.store else None
            if rtt0 is not None and rtt1 is not None:
                self.store_rtt = rtt1 - rtt0
            if split0 is not None and split1 is not None and cpu1 != cpu0:
                assert cpu0 is not None and cpu1 is not None
                result.server_sys_share = (split1[1] - split0[1]) / (cpu1 - cpu0)
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


#: The counters a ``--peers-only`` child reports back (its ``stats`` line).
_PEER_COUNTS = (
    "sessions_opened",
    "sent",
    "accepted",
    "refused_429",
    "refused_429_half_open",
    "gone_404",
    "other",
    "errors",
    "first_429_s",
    "first_404_s",
)


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


# ====================================================================== orchestration
def server_argv(name: str, opts: Options, weir_flags: set[str]) -> tuple[str, list[str]]:
    """(process label, argv) of a server started here."""
    py = sys.executable
    if name == "weir":
        argv = [py, "-m", "weir", "serve", opts.weir_app, "--port", "0", "--shutdown-grace", "1"]
        if opts.json_response:
            argv.append("--json-response")
        if opts.store:
            argv += ["--store", opts.store]
        if opts.workers > 1:
            argv += ["--workers", str(opts.workers)]
        for key, flag in (
            ("frames", "--credit-frames"),
            ("bytes", "--credit-bytes"),
            ("drain_window", "--drain-window"),
            ("liveness_timeout", "--liveness-timeout"),
        ):
            if key in opts.credit and flag in weir_flags:
                value = opts.credit[key]
                argv += [flag, str(int(value) if key in ("frames", "bytes") else value)]
        return name, argv
    module = {"ceiling": "benchmarks.ceiling", "sdk": "benchmarks.sdk_server"}[name]
    argv = [py, "-m", module, "--port", "0"]
    if opts.json_response:
        argv.append("--json-response")
    return name, argv


async def _gateway_stats(url: str) -> dict[str, Any]:
    gep = Endpoint.parse(url + "/_gateway/stats")
    client = Client(gep.host, gep.port)
    req = f"GET /_gateway/stats HTTP/1.1\r\nHost: {gep.authority}\r\n\r\n".encode()
    try:
        with trio.fail_after(5):
            reply = await client.exchange(req, None)
        stats = json.loads(reply.body)
    except (HttpError, trio.TooSlowError, ValueError):
        return {"error": "no stats"}
    finally:
        await client.close()
    return dict(stats) if isinstance(stats, dict) else {"error": "no stats"}


async def wait_for_quiet(max_wait: float, cores: float = 0.3) -> float:
    """Wait (at most ``max_wait`` s) until the machine's busy CPU is below ``cores``.

    Other processes on a shared machine skew every number here; this waits for a
    quiet moment and returns the busy level last seen (in cores).
    """
    start = time.monotonic()
    busy = 0.0
    for i in range(100_000):
        b0 = machine_busy_seconds()
        await trio.sleep(2.0)
        busy = (machine_busy_seconds() - b0) / 2.0
        waited = time.monotonic() - start
        if busy < cores or waited >= max_wait:
            if i:
                print(f"fanout: waited {waited:.0f} s; busy now {busy:.2f} cores", file=sys.stderr)
            return busy
        if i % 15 == 0:
            print(f"fanout: machine busy ({busy:.2f} cores); waiting", file=sys.stderr)
    return busy


async def run_one(
    name: str, opts: Options, url: str | None, pid: int | None, logdir: Path
) -> RunResult:
    """Start the server (unless ``url``) and the gateway (if asked), run, stop them."""
    procs: list[ServerProcess] = []
    quiet = await wait_for_quiet(opts.quiet_wait) if opts.quiet_wait > 0 else None
    own_cpus = os.sched_getaffinity(0)
    server_cpus: set[int] | None = None
    if opts.pin_server:  # the server alone on the first CPU; everything else on the rest
        cpus = sorted(own_cpus)
        if len(cpus) < 2:
            raise BenchError(f"--pin-server needs at least 2 CPUs; this process may use {cpus}")
        server_cpus = {cpus[0]}
        pin_self(set(cpus[1:]))
    peer_side = opts.peer_process and opts.gateway_scope == "half-open"
    layout = {
        "server_cpus": sorted(server_cpus) if server_cpus else None,
        "client_cpus": sorted(os.sched_getaffinity(0)),
        "peer_process": opts.peer_process,
        "peer_nice": opts.peer_nice if opts.peer_process else None,
        "gateway_nice": opts.peer_nice if peer_side else 0,
    }
    try:
        if url is None:
            flags = weir_flags() if name == "weir" else set()
            label, argv = server_argv(name, opts, flags)
            server = await start_process(label, argv, logdir, child_setup(cpus=server_cpus))
            procs.append(server)
            url, pid = server.url, server.pid
        endpoint = Endpoint.parse(url)
        main_endpoint = half_endpoint = endpoint
        gateway_url = None
        if opts.gateway_retries > 0:
            argv = [sys.executable, "-m", "benchmarks.gateway"]
            argv += ["--upstream", f"http://{endpoint.authority}"]
            argv += ["--retries", str(opts.gateway_retries), "--timeout", str(opts.gateway_timeout)]
            # Serving only the peers, the gateway is on the peers' side of the network.
            nice = opts.peer_nice if peer_side else 0
            gateway = await start_process("gateway", argv, logdir, child_setup(nice))
            procs.append(gateway)
            gateway_url = gateway.url
            through = Endpoint.parse(gateway.url + endpoint.path)
            half_endpoint = through
            if opts.gateway_scope == "all":
                main_endpoint = through
        gateway_pid = procs[-1].pid if gateway_url is not None else None
        run = Run(opts, name, endpoint, pid, main_endpoint, half_endpoint, gateway_pid)
        run.logdir = logdir
        result = await run.execute()
        result.busy_before_cores = quiet
        result.layout = layout
        for p in procs:
            code = p.proc.poll()
            if code is not None:  # it must still be serving: nothing here stopped it
                result.died.append(f"{p.name} exited with {code} during the run")
                print(
                    f"fanout: INVALID RUN: {p.name} exited with {code} during the run:\n"
                    f"{p.log_tail()}",
                    file=sys.stderr,
                )
        if gateway_url is not None:
            result.gateway = {
                "scope": opts.gateway_scope,
                "retries": opts.gateway_retries,
                "timeout_s": opts.gateway_timeout,
                **{f"{k}_seen": v for k, v in (await _gateway_stats(gateway_url)).items()},
            }
        return result
    except BenchError:
        for p in procs:
            tail = p.log_tail()
            if tail:
                print(f"--- {p.name} log ---\n{tail}", file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            await stop_process(p)
        if server_cpus is not None:
            pin_self(own_cpus)


_WEIR_FLAGS = ("--credit-frames", "--credit-bytes", "--drain-window", "--liveness-timeout")


def weir_flags() -> set[str]:
    """The credit flags this checkout's ``weir serve`` understands."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "weir", "serve", "--help"],
            cwd=REPO,
            capture_output=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {f for f in _WEIR_FLAGS if f.encode() in out}


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
        rows.append(
            [fmt.format(d[key]) if d[key] is not None else "n/a" for _, key, fmt in _COLUMNS]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ratios(results: list[RunResult]) -> dict[str, Any]:
    """weir against the ceiling (CPU per call) and the SDK (calls/s), with the targets."""
    by = {r.server: r for r in results}
    out: dict[str, Any] = {}
    weir, ceiling, sdk = by.get("weir"), by.get("ceiling"), by.get("sdk")
    if weir and ceiling and weir.cpu_us_per_call and ceiling.cpu_us_per_call:
        value = weir.cpu_us_per_call / ceiling.cpu_us_per_call
        out["weir_cpu_per_call_vs_ceiling"] = {
            "value": value,
            "target_max": 1.3,
            "met": value <= 1.3,
        }
    if weir and sdk and sdk.calls_per_s:
        value = weir.calls_per_s / sdk.calls_per_s
        out["weir_calls_per_s_vs_sdk"] = {"value": value, "target_min": 5.0, "met": value >= 5.0}
    if weir and sdk and weir.cpu_us_per_call and sdk.cpu_us_per_call:
        out["sdk_cpu_per_call_vs_weir"] = {"value": sdk.cpu_us_per_call / weir.cpu_us_per_call}
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


# ====================================================================== command line
def parser() -> argparse.ArgumentParser:
    """The ``python -m benchmarks.fanout`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout",
        description="Fan-out benchmark of MCP Streamable HTTP servers (weir, a ceiling, the SDK).",
    )
    target = p.add_mutually_exclusive_group()
    target.add_argument("--url", help="benchmark this running server (needs an echo tool)")
    target.add_argument(
        "--server",
        choices=["weir", "ceiling", "sdk", "all"],
        default="weir",
        help="start this server here (all: weir, ceiling and sdk, one after another)",
    )
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for CPU and RSS")
    p.add_argument("--sessions", type=int, default=400, help="sessions (default 400)")
    p.add_argument("--calls", type=int, default=20, help="tools/call per session (default 20)")
    p.add_argument("--concurrency", type=int, help="most calls in flight (default: sessions)")
    p.add_argument("--duration", type=float, help="call for this many seconds instead")
    p.add_argument("--rate", type=float, help="pace all sessions to this many calls/s in total")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured calls per session (1)")
    p.add_argument("--text-size", type=int, default=32, help="bytes of echo text (32)")
    p.add_argument("--json-response", action="store_true", help="JSON instead of SSE responses")
    p.add_argument("--half-open", type=int, default=0, metavar="N", help="stalled peers (0)")
    p.add_argument("--half-open-rate", type=float, default=20.0, help="POSTs/s per peer (20)")
    p.add_argument("--half-open-pad", type=int, default=16384, help="bytes echoed per frame")
    p.add_argument(
        "--half-open-posters", type=int, default=8, help="concurrent POST connections per peer"
    )
    p.add_argument(
        "--half-open-control",
        action="store_true",
        help="the peers read their streams (same traffic, healthy sessions): a control",
    )
    p.add_argument(
        "--peer-process",
        action="store_true",
        help="run the half-open peers in their own process, so this event loop times "
        "only the other sessions",
    )
    p.add_argument(
        "--peer-nice",
        type=int,
        default=0,
        metavar="N",
        help="with --peer-process: its niceness (and the gateway's, with --gateway-scope "
        "half-open); 19 stands in for the peer being on another machine (0)",
    )
    p.add_argument(
        "--pin-server",
        action="store_true",
        help="pin the server to the first CPU and everything else started here to the rest",
    )
    p.add_argument(
        "--ab",
        type=int,
        default=0,
        metavar="PAIRS",
        help="with --half-open: PAIRS runs without the peers and PAIRS with them, "
        "alternately, a fresh server each; compares the other sessions' p99",
    )
    p.add_argument("--peers-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--half-open-via", help=argparse.SUPPRESS)
    p.add_argument("--phase-start", type=float, help=argparse.SUPPRESS)
    p.add_argument("--gateway-retries", type=int, default=0, metavar="R", help="retrying gateway")
    p.add_argument("--gateway-timeout", type=float, default=2.0, help="seconds to headers (2.0)")
    p.add_argument(
        "--gateway-scope",
        choices=["all", "half-open"],
        default="all",
        help="whose POSTs go through the gateway (all)",
    )
    p.add_argument("--credit-frames", type=int, help="weir: frame credit per session")
    p.add_argument("--credit-bytes", type=int, help="weir: byte credit per session")
    p.add_argument("--drain-window", type=float, help="weir: seconds to half-open")
    p.add_argument("--liveness-timeout", type=float, help="weir: seconds to teardown")
    p.add_argument(
        "--store",
        help="weir: --store URL (e.g. redis://127.0.0.1:6379); "
        "also reports store round trips per call",
    )
    p.add_argument("--workers", type=int, default=1, help="weir: --workers N (needs --store)")
    p.add_argument("--sample-interval", type=float, default=1.0, help="/metrics period (1.0 s)")
    p.add_argument("--call-timeout", type=float, default=30.0, help="seconds per call (30)")
    p.add_argument("--weir-app", default=WEIR_APP, help=f"app weir serves ({WEIR_APP})")
    p.add_argument("--metrics-path", default="/metrics")
    p.add_argument("--legacy-sse-path", default="/sse")
    p.add_argument(
        "--plot",
        default=str(DEFAULT_PLOT),
        help="PNG to write ('' for none; default benchmarks/out/fanout.png)",
    )
    p.add_argument("--out-json", help="also write the JSON line to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to go quiet",
    )
    return p


def options(args: argparse.Namespace) -> Options:
    """Validate the command line into :class:`Options`."""
    if args.sessions < 1 or args.calls < 1:
        raise SystemExit("fanout: --sessions and --calls must be >= 1")
    if args.duration is not None and not 0 < args.duration <= 3600:
        raise SystemExit("fanout: --duration must be in (0, 3600]")
    if args.half_open and args.half_open_rate <= 0:
        raise SystemExit("fanout: --half-open-rate must be > 0")
    if args.half_open and args.server in ("ceiling", "sdk", "all") and args.url is None:
        raise SystemExit(
            "fanout: --half-open needs weir's legacy /sse (use --server weir or --url)"
        )
    if args.peer_process and not args.half_open:
        raise SystemExit("fanout: --peer-process needs --half-open N")
    if not 0 <= args.peer_nice <= 19:
        raise SystemExit("fanout: --peer-nice must be in [0, 19]")
    if args.peer_nice and not args.peer_process:
        raise SystemExit("fanout: --peer-nice needs --peer-process")
    if args.pin_server and args.url is not None:
        raise SystemExit("fanout: --pin-server pins a server started here (not with --url)")
    if args.ab < 0:
        raise SystemExit("fanout: --ab must be >= 0")
    if args.ab and (not args.half_open or args.url is not None or args.server == "all"):
        raise SystemExit("fanout: --ab needs --half-open N and one server started here")
    if args.peers_only and (args.url is None or args.phase_start is None or not args.half_open):
        raise SystemExit("fanout: --peers-only is internal (--peer-process starts it)")
    from weir.protocol import CreditLimits

    given = {
        "frames": args.credit_frames,
        "bytes": args.credit_bytes,
        "drain_window": args.drain_window,
        "liveness_timeout": args.liveness_timeout,
    }
    defaults = asdict(CreditLimits())
    credit = {k: float(v if v is not None else defaults[k]) for k, v in given.items()}
    return Options(
        sessions=args.sessions,
        calls=args.calls,
        concurrency=args.concurrency or args.sessions,
        duration=args.duration,
        rate=args.rate,
        warmup=args.warmup,
        text_size=args.text_size,
        json_response=args.json_response,
        half_open=args.half_open,
        half_open_rate=args.half_open_rate,
        half_open_pad=args.half_open_pad,
        half_open_posters=args.half_open_posters,
        half_open_control=args.half_open_control,
        gateway_retries=args.gateway_retries,
        gateway_timeout=args.gateway_timeout,
        gateway_scope=args.gateway_scope,
        sample_interval=args.sample_interval,
        call_timeout=args.call_timeout,
        credit=credit,
        weir_app=args.weir_app,
        metrics_path=args.metrics_path,
        legacy_sse_path=args.legacy_sse_path,
        progress=not args.no_progress,
        quiet_wait=args.quiet_wait,
        store=args.store,
        workers=args.workers,
        peer_process=args.peer_process,
        peer_nice=args.peer_nice,
        pin_server=args.pin_server,
    )


async def _main(args: argparse.Namespace, opts: Options) -> list[RunResult]:
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="fanout-") as tmp:
        if args.url is not None:
            results.append(await run_one("url", opts, args.url, args.pid, Path(tmp)))
            return results
        if args.ab:  # without and with the peers, alternately (ABBA), a fresh server each
            arms = [("without", replace(opts, half_open=0)), ("with", opts)]
            for i in range(args.ab):
                for arm, arm_opts in arms if i % 2 == 0 else arms[::-1]:
                    result = await run_one(args.server, arm_opts, None, None, Path(tmp))
                    result.arm = arm
                    results.append(result)
            return results
        names = ["weir", "ceiling", "sdk"] if args.server == "all" else [args.server]
        for name in names:
            if name == "sdk" and not _have_sdk():
                print(
                    "fanout: the mcp SDK is not installed (extra 'sdk'): skipped", file=sys.stderr
                )
                continue
            results.append(await run_one(name, opts, None, None, Path(tmp)))
    return results


def _have_sdk() -> bool:
    import importlib.util

    return importlib.util.find_spec("mcp") is not None


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.fanout``."""
    args = parser().parse_args(argv)
    opts = options(args)
    if args.peers_only:
        via = args.half_open_via or args.url
        half = trio.run(run_peers_only, opts, args.url, via, args.phase_start)
        counts = {key: getattr(half, key) for key in _PEER_COUNTS}
        print("stats " + json.dumps({**counts, "cpu_s": own_cpu_seconds()}))
        return 0
    try:
        results = trio.run(_main, args, opts)
    except BenchError as exc:
        print(f"fanout: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(table(results))
    found = ratios(results)
    for key, value in found.items():
        target = value.get("target_max", value.get("target_min"))
        verdict = (
            "" if target is None else (" (target met)" if value["met"] else " (target MISSED)")
        )
        bound = "<=" if "target_max" in value else ">="
        goal = "" if target is None else f", target {bound} {target}"
        print(f"{key}: {value['value']:.2f}{goal}{verdict}")
        if "pair_ratios" in value:
            print(
                f"  pooled p99 {value['pooled_p99_ms']['with']:.3f} ms with the peers, "
                f"{value['pooled_p99_ms']['without']:.3f} ms without; mean of run p99s "
                f"{value['mean_ratio']:.2f}x; each pair {value['pair_ratios']}"
            )
    peers = "control peers (reading)" if opts.half_open_control else "half-open"
    for r in results:
        if r.half_open:
            h = r.half_open
            print(
                f"{r.server} {peers}: {h['sessions_opened']} sessions, {h['sent']} POSTs, "
                f"{h['accepted']} accepted, {h['refused_429']} x 429, {h['gone_404']} x 404; "
                f"max queue depth {h['max_queue_depth']:.0f} frames / "
                f"{h['max_queue_bytes'] / 1024:.0f} KiB (credit "
                f"{(r.credit or {}).get('frames', 0):.0f} frames / "
                f"{(r.credit or {}).get('bytes', 0) / 1024:.0f} KiB); "
                f"RSS growth {r.rss_growth_mib or 0:.1f} MiB"
            )
        if r.gateway:
            print(f"{r.server} gateway: {r.gateway}")
        foreign = "n/a" if r.foreign_cpu_s is None else f"{r.foreign_cpu_s:.1f} s"
        print(
            f"{r.server} phase: {r.elapsed_s:.1f} s; CPU: server {r.server_cpu_s or 0:.1f} s, "
            f"load generator {r.client_cpu_s:.1f} s, gateway {r.gateway_cpu_s or 0:.1f} s, "
            + (f"peer process {r.peer_cpu_s:.1f} s, " if r.peer_cpu_s is not None else "")
            + f"other processes {foreign} (machine busy {r.machine_busy_s:.1f} s of "
            f"{r.elapsed_s * (os.cpu_count() or 1):.1f}); "
            f"load average before {r.loadavg_before:.2f}"
        )
        if r.error_kinds:
            print(f"{r.server} errors: {r.error_kinds}")
    line = json.dumps(
        {
            "benchmark": "fanout",
            "machine": machine(),
            "source": source_tree(),
            "argv": sys.argv[1:] if argv is None else argv,
            "options": asdict(opts),
            "runs": [r.public() for r in results],
            "ratios": found,
        },
        separators=(",", ":"),
    )
    print(line)
    if args.out_json:
        Path(args.out_json).write_text(line + "\n")
    if args.plot:
        problem = plot(results, args.plot)
        print(f"fanout: {problem}" if problem else f"fanout: wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
