"""An independent load generator for ``python -m benchmarks.fanout --client``.

It shares no code with fanout's own client: Trio and h11 only, one keep-alive
connection per session.  Session era: ``initialize``, ``notifications/initialized``,
then K sequential ``tools/call echo``, then ``DELETE``.  2026-07-28: one
``server/discover``, then K calls carrying ``_meta`` and ``Mcp-Method``/``Mcp-Name``.
An answer counts when its status is 200 and its JSON-RPC result echoes the text
(from a JSON body or from the SSE event that carries it).

What it is told comes from the environment fanout sets (a command of your own gets
the same): ``FANOUT_URL``, ``FANOUT_SESSIONS``, ``FANOUT_CALLS``, ``FANOUT_ERA``
(``session`` or ``sessionless``), ``FANOUT_TEXT_SIZE`` and ``FANOUT_JSON`` (``1``: the
server answers with JSON bodies; this client accepts both kinds either way, as MCP
clients do).  What it prints on stdout, the protocol fanout reads: the
line ``phase`` once every session is open (fanout counts the server's CPU from
there), then one JSON line ``{"calls", "errors", "p50_ms", "p90_ms", "p99_ms", "max_ms",
"elapsed_s"}``.
Every wait is bounded (30 s per request); it exits 1 if nothing succeeded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import h11
import trio

V26 = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V26,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "h11-client", "version": "1"},
}
TIMEOUT = 30.0


class Conn:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, stream: trio.SocketStream, authority: str, path: str, accept: str) -> None:
        self.stream, self.authority, self.path, self.accept = stream, authority, path, accept
        self.http = h11.Connection(h11.CLIENT)
        self.headers: dict[str, str] = {}

    async def request(
        self, method: str, body: bytes = b"", extra: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One request; its status, lower-cased headers and whole body."""
        heads = {"host": self.authority, "accept": self.accept, **self.headers, **(extra or {})}
        if body:
            heads.update({"content-type": "application/json", "content-length": str(len(body))})
        out = self.http.send(
            h11.Request(method=method, target=self.path, headers=list(heads.items()))
        )
        out = (out or b"") + (self.http.send(h11.Data(data=body)) or b"") if body else out or b""
        out += self.http.send(h11.EndOfMessage()) or b""
        with trio.fail_after(TIMEOUT):
            await self.stream.send_all(out)
            status, headers, data = 0, {}, bytearray()
            while True:
                event = self.http.next_event()
                if event is h11.NEED_DATA:
                    chunk = await self.stream.receive_some(65536)
                    if not chunk:
                        raise ConnectionError("the server closed the connection")
                    self.http.receive_data(chunk)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    data += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
        self.http.start_next_cycle()
        return status, headers, bytes(data)


def rpc_answer(headers: dict[str, str], body: bytes, rid: int) -> dict[str, Any] | None:
    """The JSON-RPC response with id ``rid`` in a JSON body or an SSE stream."""
    if headers.get("content-type", "").startswith("text/event-stream"):
        for line in body.decode().splitlines():
            if line.startswith("data:") and line[5:].strip():
                msg = json.loads(line[5:])
                if msg.get("id") == rid:
                    return msg  # type: ignore[no-any-return]
        return None
    msg = json.loads(body) if body else None
    return msg if isinstance(msg, dict) and msg.get("id") == rid else None


async def session(cfg: dict[str, Any], opened: Callable[[], None], go: trio.Event) -> list[float]:
    """One session's life; its successful calls' latencies (ms).  Calls ``opened``
    once its session is open, then waits for ``go``."""
    url = urlsplit(cfg["url"])
    stream = await trio.open_tcp_stream(url.hostname or "127.0.0.1", url.port or 80)
    conn = Conn(stream, url.netloc, url.path or "/", "application/json, text/event-stream")
    text = "x" * cfg["text_size"]
    latencies: list[float] = []
    try:
        if cfg["era"] == "session":
            init = {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": META["io.modelcontextprotocol/clientInfo"],
            }
            msg = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
            status, headers, _ = await conn.request("POST", json.dumps(msg).encode())
            if status != 200 or "mcp-session-id" not in headers:
                raise ConnectionError(f"initialize answered {status}")
            conn.headers = {
                "mcp-session-id": headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
            }
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await conn.request("POST", json.dumps(note).encode())
        else:
            conn.headers = {"mcp-protocol-version": V26}
            msg = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "server/discover",
                "params": {"_meta": META},
            }
            status, _, _ = await conn.request(
                "POST", json.dumps(msg).encode(), {"mcp-method": "server/discover"}
            )
            if status != 200:
                raise ConnectionError(f"server/discover answered {status}")
        opened()
        await go.wait()
        for i in range(1, cfg["calls"] + 1):
            params: dict[str, Any] = {"name": "echo", "arguments": {"text": text}}
            extra: dict[str, str] = {}
            if cfg["era"] != "session":
                params["_meta"] = META
                extra = {"mcp-method": "tools/call", "mcp-name": "echo"}
            msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
            t0 = time.perf_counter()
            status, headers, body = await conn.request("POST", json.dumps(msg).encode(), extra)
            answer = rpc_answer(headers, body, i) if status == 200 else None
            content = ((answer or {}).get("result") or {}).get("content") or [{}]
            if content[0].get("text") == text:
                latencies.append((time.perf_counter() - t0) * 1000)
        if cfg["era"] == "session":
            await conn.request("DELETE")
    finally:
        await stream.aclose()
    return latencies


async def main() -> int:
    env = os.environ
    cfg: dict[str, Any] = {
        "url": env["FANOUT_URL"],
        "sessions": int(env.get("FANOUT_SESSIONS", "10")),
        "calls": int(env.get("FANOUT_CALLS", "10")),
        "era": env.get("FANOUT_ERA", "session"),
        "text_size": int(env.get("FANOUT_TEXT_SIZE", "64")),
    }
    go, all_open = trio.Event(), trio.Event()
    results: list[list[float]] = [[] for _ in range(cfg["sessions"])]
    opened = 0

    def one_open() -> None:
        nonlocal opened
        opened += 1
        if opened == cfg["sessions"]:
            all_open.set()

    async def one(n: int) -> None:
        done = False

        def mark() -> None:
            nonlocal done
            done = True
            one_open()

        try:
            results[n] = await session(cfg, mark, go)
        except (OSError, ConnectionError, h11.ProtocolError, trio.TooSlowError, ValueError):
            if not done:
                one_open()  # (so that the others do not wait for it)

    started = 0.0
    async with trio.open_nursery() as nursery:
        for n in range(cfg["sessions"]):
            nursery.start_soon(one, n)
        with trio.fail_after(TIMEOUT * 4):
            await all_open.wait()
        print("phase", flush=True)
        started = time.perf_counter()
        go.set()
    elapsed = time.perf_counter() - started
    lat = sorted(x for r in results for x in r)
    calls = len(lat)
    errors = cfg["sessions"] * cfg["calls"] - calls  # every call that did not succeed

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

    line = {
        "calls": calls,
        "errors": errors,
        "p50_ms": pct(0.5),
        "p90_ms": pct(0.9),
        "p99_ms": pct(0.99),
        "max_ms": lat[-1] if lat else 0.0,
        "elapsed_s": elapsed,
    }
    print(json.dumps(line), flush=True)
    return 0 if calls else 1


if __name__ == "__main__":
    sys.exit(trio.run(main))
