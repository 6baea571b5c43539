"""Which of weir's source files one ``tools/call`` runs through, traced as it runs.

``python -m benchmarks.course_files [--runtime trio|asyncio] [--era session|sessionless]``

Serves a one-tool app (``echo``) on 127.0.0.1 in a background thread, opens a
session (or, for the 2026-07-28 era, sends ``server/discover``), makes one warm-up
call, then traces the server's thread (``threading.setprofile``) while one more
``tools/call`` goes out over a raw keep-alive socket and its whole answer comes back.
It prints the weir files whose Python functions ran (relative to the package, in
first-run order), how many times control moved from one file into another ("moves"),
and the files entered most often.  Only Python function calls of the server's thread
count: C functions, the standard library, h11 and msgspec are not weir's files.
It also counts the Python functions that ran in all (any file's, generator and
coroutine resumptions included) for this and four more traced calls, and prints
the least and the median: a count of the call's steps, which varies from call to
call only with what else the server's thread did meanwhile (a read that finds no
data yet and waits, the acknowledgement poller's turns), so the least of five is
the steps of the call itself, near enough to compare two checkouts without a
timing.

The count is of what ran, not of what imports what: it is the number the course's
design is judged by (how many places a reader follows to see one call through).
Run it against another checkout with ``PYTHONPATH=<checkout> python -m ...`` from
outside the checkout (the Trio runtime only, for a checkout without ``weir.asyncio``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import trio

import weir

#: Bound (seconds) on every wait: the server's start, one answer.
TIMEOUT = 10.0
#: Traced calls whose Python calls are counted (the first also gives the files).
COUNTED = 5
SESSIONLESS = "2026-07-28"
SESSION_ERA = "2025-11-25"


class Tracer:
    """Records the weir files whose functions run in the threads it is installed in,
    while :attr:`on` is set."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.on = False
        self.order: list[str] = []
        self.entered: Counter[str] = Counter()
        self.moves = 0
        #: Python functions (and generator or coroutine resumptions) that ran, any
        #: file's, per traced call.
        self.calls: list[int] = []
        #: Only count the calls (the files are the first traced call's).
        self.counting = False
        self._last: str | None = None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        self.calls[-1] += 1
        if self.counting:
            return
        path = frame.f_code.co_filename
        if not path.startswith(self.root):
            return
        rel = os.path.relpath(path, self.root)
        if rel not in self.entered:
            self.order.append(rel)
        if rel != self._last:
            self.entered[rel] += 1
            if self._last is not None:
                self.moves += 1
            self._last = rel


def _app() -> Any:
    from weir.engine import App

    app = App("course-files")

    @app.tool()
    async def echo(text: str) -> str:
        """Answer ``text``."""
        return text

    return app


@contextmanager
def _serve_trio(port: int, json_response: bool) -> Iterator[None]:
    from weir.engine import Server, ServerConfig

    config = ServerConfig(port=port, json_response=json_response, shutdown_grace=0)
    ready: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()

    async def main() -> None:
        server = Server(_app(), config)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            ready.put(True)
            await trio.to_thread.run_sync(stop.wait, TIMEOUT * 6)
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    ready.get(timeout=TIMEOUT)
    try:
        yield
    finally:
        stop.set()
        thread.join(TIMEOUT)


@contextmanager
def _serve_asyncio(port: int, json_response: bool) -> Iterator[None]:
    from weir.asyncio import AsyncioDriver
    from weir.protocol import LOOPBACK_HOSTS, EndpointConfig

    loop = asyncio.new_event_loop()
    endpoint = EndpointConfig(allowed_hosts=LOOPBACK_HOSTS, allowed_origins=frozenset())
    driver = AsyncioDriver(_app(), endpoint, always_json=json_response)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = asyncio.run_coroutine_threadsafe(
        asyncio.start_server(driver.connection, "127.0.0.1", port), loop
    )
    server = started.result(TIMEOUT)
    try:
        yield
    finally:
        asyncio.run_coroutine_threadsafe(_stop_asyncio(server), loop).result(TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()


async def _stop_asyncio(server: asyncio.Server) -> None:
    """Stop listening and end every task still running (the connection's), so the
    loop stops with nothing pending."""
    server.close()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _post(sock: socket.socket, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    """Send one POST on the keep-alive socket; the whole answer (its body ends with
    the JSON-RPC response, SSE or JSON)."""
    data = json.dumps(body).encode()
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: 127.0.0.1:{sock.getpeername()[1]}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        f"Content-Length: {len(data)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    got = b""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
        if b"202 Accepted" in got.split(b"\r\n", 1)[0] and b"\r\n\r\n" in got:
            break
        if b'"result"' in got and (got.endswith(b"\n\n") or got.endswith(b"}")):
            break
        if got.endswith(b"0\r\n\r\n"):
            break
    return got


def _session_id(head: bytes) -> str:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"mcp-session-id:"):
            return line.split(b":", 1)[1].strip().decode()
    raise RuntimeError(f"no Mcp-Session-Id in {head[:300]!r}")


def _call(n: int, era: str) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "echo", "arguments": {"text": "x" * 64}}
    if era == "sessionless":
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": SESSIONLESS,
            "io.modelcontextprotocol/clientInfo": {"name": "trace", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}


def trace(runtime: str, era: str, json_response: bool) -> Tracer:
    """Trace one warm ``tools/call`` on ``runtime`` in ``era``."""
    root = os.path.dirname(os.path.realpath(os.path.dirname(weir.__file__)))
    tracer = Tracer(root + os.sep)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    threading.setprofile(tracer)
    serve: Callable[[int, bool], Any] = _serve_trio if runtime == "trio" else _serve_asyncio
    try:
        with serve(port, json_response), socket.create_connection(("127.0.0.1", port)) as sock:
            headers: dict[str, str] = {}
            if era == "session":
                init = {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": SESSION_ERA,
                        "capabilities": {},
                        "clientInfo": {"name": "trace", "version": "0"},
                    },
                }
                headers["Mcp-Session-Id"] = _session_id(_post(sock, init, {}))
                headers["MCP-Protocol-Version"] = SESSION_ERA
                note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                _post(sock, note, headers)
            else:
                headers = {
                    "MCP-Protocol-Version": SESSIONLESS,
                    "Mcp-Method": "tools/call",
                    "Mcp-Name": "echo",
                }
            warm = _post(sock, _call(1, era), headers)
            if b'"result"' not in warm:
                raise RuntimeError(f"the warm-up call failed: {warm[:400]!r}")
            for n in range(2, 2 + COUNTED):
                tracer.calls.append(0)
                tracer.on = True
                answer = _post(sock, _call(n, era), headers)
                tracer.on = False
                tracer.counting = True  # (the files are the first traced call's)
                if b'"result"' not in answer:
                    raise RuntimeError(f"the traced call failed: {answer[:400]!r}")
                time.sleep(0.3)  # (let the acknowledgement poller settle outside the trace)
    finally:
        threading.setprofile(None)
    return tracer


def main(argv: list[str] | None = None) -> None:
    """Print the files one traced call ran through."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--era", choices=("session", "sessionless"), default="session")
    parser.add_argument("--json-response", action="store_true")
    args = parser.parse_args(argv)
    tracer = trace(args.runtime, args.era, args.json_response)
    mode = "JSON" if args.json_response else "SSE"
    print(f"{args.runtime}, {args.era} era, {mode}: one tools/call")
    print(f"files: {len(tracer.order)}   moves between files: {tracer.moves}")
    calls = sorted(tracer.calls)
    print(
        f"Python calls (any file's, Trio's and the standard library's too), least and "
        f"median of {len(calls)} calls: {calls[0]} {calls[len(calls) // 2]}"
    )
    by_folder = Counter(path.split(os.sep)[0] for path in tracer.order)
    print("per folder:", dict(sorted(by_folder.items())))
    print("entered most:", ", ".join(f"{p} {n}" for p, n in tracer.entered.most_common(6)))
    for path in tracer.order:
        print("  ", path)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
