"""The half-open peers: sessions that stop reading their stream and keep sending.

Theory of operation
-------------------
**Half-open peers** (``--half-open N``, weir or any server with the 2024-11-05
``GET /sse`` endpoint): each opens the legacy SSE stream -- the one stream that
carries every response of its session -- on a socket whose ``SO_RCVBUF`` is
shrunk to the minimum, reads the ``endpoint`` event, and never reads again.  It
keeps POSTing a non-idempotent ``tools/call`` (``mark``, with ``--half-open-pad``
bytes echoed back so frames spend byte credit) at ``--half-open-rate`` calls/s in
total over ``--half-open-posters`` keep-alive connections, ignoring ``Retry-After``.
A ``404`` means the server tore the session down: the peer opens a new one.  It
counts 202s, 429s (reason ``stream_half_open``) and 404s.  Every ``mark`` key is
unique, so the server's tally says exactly how many of them ran more than once.

``--half-open-control`` turns the same peers into a control: they read their
streams to the end (normal receive buffer), so their sessions stay healthy while
sending exactly the same requests.  Comparing the other sessions' latency with
half-open peers and with control peers separates what a *stalled* stream costs its
neighbours from what the peers' traffic itself costs on a shared machine.

* ``--peer-process`` runs the half-open peers in a child process (``--peers-only``,
  internal), so the load generator's event loop times only the other sessions.  The
  child reports each session it opens (one ``label L`` line, so their queue depth is
  still followed in ``/metrics``) and its counts at the end (one ``stats {...}`` line
  with :data:`_PEER_COUNTS`); a child that ends without them marks the run invalid.
* ``--peer-nice N`` lowers that child's priority (and the gateway's, when it serves
  only the peers, ``--gateway-scope half-open``; see :mod:`benchmarks.fanout.servers`);
  19 stands in for the peer being on another machine.  The *server's* work for the peer
  is never deprioritized: it is what is measured.

:class:`HalfOpenPeers` is a mixin of :class:`benchmarks.fanout.load.Run`: the peers
share the run's options, endpoints, clock (``phase_start``) and counts
(:class:`benchmarks.fanout.report.HalfOpenStats`); the attributes it reads are
declared on it and set by ``Run.__init__``.  Every loop is bounded in count and in
time (the phase's deadline).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import trio

from .client import (
    _INITIALIZED,
    _RECV,
    Client,
    Endpoint,
    HttpError,
    _call_body,
    _initialize_body,
    _post,
)
from .common import REPO, Options
from .metrics import session_label
from .report import HalfOpenStats, RunResult
from .system import child_setup

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


class HalfOpenPeers:
    """The half-open (or control) peers of a :class:`~benchmarks.fanout.load.Run`."""

    # Set by ``Run.__init__`` (and ``phase_start`` by ``Run.execute`` or ``--peers-only``).
    opts: Options
    endpoint: Endpoint  # the server itself (the legacy stream, the tallies)
    half_endpoint: Endpoint  # where the peers' POSTs go (maybe the gateway)
    result: RunResult
    half: HalfOpenStats
    phase_start: float
    logdir: Path | None
    announce: Callable[[str], None] | None
    peer_done: trio.Event
    peer_stats_ok: bool

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
