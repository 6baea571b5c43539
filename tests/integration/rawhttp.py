"""A deliberately small HTTP/1.1 client for hostile-client tests: raw bytes out, h11 in.

The tests need to send what no polite client sends (a trickled head, conflicting
framing, a 90,000-entry batch) and to read exactly what the server answered, so
requests are written as raw bytes and responses parsed with h11's client side.
Every read is bounded by a timeout.
"""

from __future__ import annotations

import contextvars
import json
import resource
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import trio

INIT_PARAMS = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "hostile-test", "version": "0"},
}


@dataclass
class Reply:
    """One complete response."""

    status: int
    headers: dict[str, str]
    body: bytes
    informational: list[int] = field(default_factory=list)

    def json(self) -> Any:
        """The body as JSON, or the first SSE ``data:`` that holds a JSON-RPC response."""
        if self.headers.get("content-type", "").startswith("text/event-stream"):
            for msg in sse_messages(self.body):
                if "id" in msg and ("result" in msg or "error" in msg):
                    return msg
            raise AssertionError(f"no response in the SSE body {self.body[:300]!r}")
        return json.loads(self.body)

    @property
    def reason(self) -> str | None:
        """``error.data.reason`` of a JSON-RPC error body, if any."""
        err = self.json().get("error") or {}
        return (err.get("data") or {}).get("reason")


def sse_messages(body: bytes) -> list[dict[str, Any]]:
    """Every ``data:`` payload of an SSE body that parses as JSON."""
    out = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: ") and len(line) > 6:
            out.append(json.loads(line[6:]))
    return out


def raw_request(
    method: str,
    path: str,
    *,
    body: bytes = b"",
    host: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
) -> bytes:
    """The bytes of one request with ``Content-Length`` (unless a framing header is given)."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}"]
    hdrs = {"accept": "application/json, text/event-stream"}
    if body:
        hdrs["content-type"] = "application/json"
    hdrs.update(headers or {})
    if "transfer-encoding" not in hdrs and (body or method == "POST"):
        hdrs.setdefault("content-length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in hdrs.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


#: When set (a test's transport parameter does it), :meth:`Client.connect` speaks TLS
#: over the connection with this client context (server name ``127.0.0.1``).
DIAL_TLS: contextvars.ContextVar[ssl.SSLContext | None] = contextvars.ContextVar(
    "DIAL_TLS", default=None
)


class Client:
    """One TCP (or TLS) connection speaking HTTP/1.1 through h11 (client side)."""

    def __init__(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @property
    def socket(self) -> trio.socket.SocketType:
        """The TCP socket under the connection (under TLS too)."""
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            return stream.transport_stream.socket
        return stream.socket

    @classmethod
    async def connect(cls, port: int, *, rcvbuf: int | None = None) -> Client:
        """Connect to 127.0.0.1:``port`` (``rcvbuf``: a tiny receive buffer, for
        stalling), over TLS when :data:`DIAL_TLS` says so."""
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect(("127.0.0.1", port))
        tls = DIAL_TLS.get()
        if tls is None:
            return cls(trio.SocketStream(sock))
        stream = trio.SSLStream(
            trio.SocketStream(sock), tls, server_hostname="127.0.0.1", https_compatible=True
        )
        await stream.do_handshake()
        return cls(stream)

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (h11 is told only what it must know to parse the answer)."""
        await self.stream.send_all(data)

    async def read_reply(self, timeout: float = 10.0, *, method: str = "POST") -> Reply:
        """Read one complete response (h11 is first told a request of ``method`` went out)."""
        conn = self.h11
        if conn.our_state is h11.IDLE:
            conn.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
            conn.send(h11.EndOfMessage())
        informational: list[int] = []
        status, headers, chunks = 0, {}, []
        with trio.fail_after(timeout):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(bytes(await self.stream.receive_some(65536)))
                    continue
                if isinstance(event, h11.InformationalResponse):
                    informational.append(event.status_code)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise EOFError("the server closed the connection before a whole response")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        return Reply(status, headers, b"".join(chunks), informational)

    async def request(
        self,
        method: str,
        path: str,
        message: Any = None,
        *,
        session: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Reply:
        """Send one request (``message`` JSON-encoded) and read its whole response."""
        hdrs = dict(headers or {})
        if session is not None:
            hdrs["mcp-session-id"] = session
        body = b"" if message is None else json.dumps(message, separators=(",", ":")).encode()
        await self.send_raw(raw_request(method, path, body=body, headers=hdrs))
        return await self.read_reply(timeout, method=method)

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True if the server closes the connection (EOF or reset) within ``timeout``."""
        with trio.move_on_after(timeout):
            try:
                while await self.stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
            return True
        return False

    async def aclose(self) -> None:
        """Close the connection."""
        with trio.move_on_after(1):
            await self.stream.aclose()


async def initialize(client: Client, path: str = "/mcp") -> str:
    """``initialize`` + ``notifications/initialized``; returns the session id."""
    reply = await client.request(
        "POST", path, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}
    )
    assert reply.status == 200, reply
    sid = reply.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await client.request("POST", path, note, session=sid)).status == 202
    return sid


def call(rid: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A ``tools/call`` request."""
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


async def echo_on_fresh_connections(port: int, sid: str, n: int) -> list[Reply]:
    """``n`` echo calls (``n0``, ``n1``, ...) of session ``sid``, each on a connection
    of its own (so that ``--workers`` spread them); their replies, in order."""
    replies = []
    for i in range(n):
        client = await Client.connect(port)
        try:
            replies.append(
                await client.request(
                    "POST", "/mcp", call(i, "echo", {"text": f"n{i}"}), session=sid
                )
            )
        finally:
            await client.aclose()
    return replies


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` has open."""
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def metric(text: str, name: str, labels: str = "") -> float:
    """One sample from a Prometheus text exposition (0 if absent)."""
    want = f"{name}{labels} "
    for line in text.splitlines():
        if line.startswith(want):
            return float(line.split()[-1])
    return 0.0


async def scrape(port: int, name: str) -> float:
    """One unlabelled sample of ``GET /metrics`` on 127.0.0.1:``port``, read on a
    connection of its own.

    Raises:
        AssertionError: the page has no such sample.
    """
    c = await Client.connect(port)
    try:
        page = (await c.request("GET", "/metrics")).body.decode()
    finally:
        await c.aclose()
    if not any(line.startswith(f"{name} ") for line in page.splitlines()):
        raise AssertionError(f"{name} not in /metrics")
    return metric(page, name)


async def percentile_latency(port: int, sid: str, n: int, q: float = 0.99) -> float:
    """The ``q`` latency (seconds) of ``n`` sequential ``ping`` requests on one session."""
    client = await Client.connect(port)
    times = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            reply = await client.request(
                "POST", "/mcp", {"jsonrpc": "2.0", "id": 10_000 + i, "method": "ping"}, session=sid
            )
            assert reply.status == 200, reply
            times.append(time.perf_counter() - t0)
    finally:
        await client.aclose()
    times.sort()
    return times[min(len(times) - 1, int(q * len(times)))]


def limit_fds(n: int) -> None:
    """``preexec_fn``: give the child process at most ``n`` open files."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def send_regardless(
    port: int,
    head: bytes,
    body_bytes: int,
    timeout: float = 10.0,
    *,
    tls: ssl.SSLContext | None = None,
) -> bytes:
    """As a client that never waits for an early answer: write ``head`` and
    ``body_bytes`` of body in one blocking ``sendall`` (over TLS with ``tls``), then
    return everything the server sent before it closed.  A server that closes on a
    refusal with the body still arriving, without draining it, resets the connection
    and this raises ``ConnectionResetError`` (or ``BrokenPipeError``) instead."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        sock = raw if tls is None else tls.wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(head + b" " * body_bytes)
        received = bytearray()
        try:
            while chunk := sock.recv(65536):  # ends at EOF (or the socket's timeout)
                received += chunk
        except ssl.SSLEOFError:  # a TLS close without close_notify: EOF all the same
            pass
    return bytes(received)
