"""Long-lived streams: does the server's CPU per event stay flat as a stream grows?

Theory of operation
-------------------
``python -m benchmarks.long_stream [--streams 20] [--events 20000] [--window 2000]``
starts ``weir serve benchmarks.weir_app:app`` and opens ``--streams`` legacy
(2024-11-05) sessions: each is one ``GET /sse`` stream that carries every answer
of its session, and a keep-alive connection that POSTs ``tools/call echo`` (64
bytes) one at a time, each call waiting for its answer to arrive on the stream.
So each stream grows by one event per call, for ``--events`` events -- past the
stream log's retention (4,096 frames), where old acknowledged frames are dropped
as new ones come.

The streams advance in lockstep windows of ``--window`` events; the server's CPU
time (``/proc/PID/stat``) is read at every window boundary.  The report is the
server CPU per event in each window and the last window's against the first: a
ratio near 1 means per-event work does not depend on how long the stream is
(drain bookkeeping, replay bounds and frame encoding are linear).  One JSON line
follows the table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from .fanout.client import _INITIALIZED, Client, Endpoint, _call_body, _initialize_body, _post
from .fanout.servers import start_process, stop_process
from .fanout.system import proc_cpu_seconds

_EVENT_ID = re.compile(rb'"id":(\d+)')


class LegacyStream:
    """One legacy session: its SSE stream and the connection that posts to it."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self.host, self.port, self.name = host, port, name
        self.authority = f"{host}:{port}"
        self.sse: trio.SocketStream | None = None
        self.poster = Client(host, port)
        self.path = ""
        self.buf = b""
        self.next_id = 1

    async def open(self) -> None:
        self.sse = await trio.open_tcp_stream(self.host, self.port)
        req = f"GET /sse HTTP/1.1\r\nHost: {self.authority}\r\nAccept: text/event-stream\r\n\r\n"
        await self.sse.send_all(req.encode())
        while b"session_id=" not in self.buf or b"\n\n" not in self.buf.split(b"endpoint", 1)[-1]:
            data = await self.sse.receive_some(65536)
            if not data:
                raise RuntimeError("the server closed the legacy stream before its endpoint")
            self.buf += data
        match = re.search(rb"data: ?(\S+session_id=\S+)", self.buf)
        if match is None:
            raise RuntimeError(f"no endpoint event in {self.buf[:200]!r}")
        self.path = match.group(1).decode()
        self.buf = b""
        await self._post(_initialize_body(0, self.name))
        await self._answer(0)
        await self._post(_INITIALIZED)

    async def _post(self, body: bytes) -> None:
        reply = await self.poster.exchange(_post(self.authority, self.path, body), None)
        if reply.status not in (200, 202):
            raise RuntimeError(f"POST answered {reply.status}: {reply.body[:200]!r}")

    async def _answer(self, rid: int) -> None:
        assert self.sse is not None
        while True:
            end = self.buf.find(b"\n\n")
            while end >= 0:
                event, self.buf = self.buf[:end], self.buf[end + 2 :]
                found = _EVENT_ID.search(event)
                if found is not None and int(found[1]) == rid:
                    return
                end = self.buf.find(b"\n\n")
            data = await self.sse.receive_some(65536)
            if not data:
                raise RuntimeError("the legacy stream ended")
            self.buf += data

    async def calls(self, n: int, text: str) -> None:
        for _ in range(n):
            rid = self.next_id
            self.next_id += 1
            await self._post(_call_body(rid, "echo", {"text": text}))
            await self._answer(rid)

    async def close(self) -> None:
        await self.poster.close()
        if self.sse is not None:
            await self.sse.aclose()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start weir, grow the streams window by window, and measure each window."""
    with tempfile.TemporaryDirectory(prefix="long-stream-") as tmp:
        argv = [sys.executable, "-m", "weir", "serve", "benchmarks.weir_app:app", "--port", "0"]
        server = await start_process("weir", argv, Path(tmp))
        try:
            ep = Endpoint.parse(server.url)
            streams = [LegacyStream(ep.host, ep.port, f"long-{i}") for i in range(args.streams)]
            with trio.fail_after(60):
                for s in streams:
                    await s.open()
            text = "x" * 64
            windows: list[float] = []
            cpu = proc_cpu_seconds(server.pid)
            for _ in range(args.events // args.window):
                with trio.fail_after(args.window_timeout):
                    async with trio.open_nursery() as nursery:
                        for s in streams:
                            nursery.start_soon(s.calls, args.window, text)
                now = proc_cpu_seconds(server.pid)
                windows.append((now - cpu) / (args.window * args.streams) * 1e6)
                cpu = now
            for s in streams:
                await s.close()
        finally:
            await stop_process(server)
    rest = windows[1:] or windows
    return {
        "benchmark": "long_stream",
        "streams": args.streams,
        "events_per_stream": args.events,
        "window": args.window,
        "cpu_us_per_event": [round(w, 1) for w in windows],
        "last_vs_first": windows[-1] / windows[0],
        "max_vs_median": max(rest) / statistics.median(rest),
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.long_stream``."""
    p = argparse.ArgumentParser(prog="benchmarks.long_stream", description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--events", type=int, default=20_000, help="events per stream")
    p.add_argument("--window", type=int, default=2_000, help="events per stream per window")
    p.add_argument("--window-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.streams < 1 or args.window < 1 or args.events < args.window:
        raise SystemExit("long_stream: --streams >= 1, --window >= 1, --events >= --window")
    result = trio.run(run, args)
    for i, value in enumerate(result["cpu_us_per_event"]):
        lo, hi = i * args.window, (i + 1) * args.window
        print(f"events {lo:>7,}-{hi:<7,} {value:8.1f} us server CPU per event")
    print(f"last window vs first: {result['last_vs_first']:.2f}")
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
