"""The load generator's HTTP/1.1 client and its MCP sessions.

Theory of operation
-------------------
:class:`Client` holds one keep-alive TCP connection and writes prebuilt request
bytes.  It parses just enough of the answer -- status, headers, a ``Content-Length``
or chunked body, and SSE events as they arrive -- so that the JSON-RPC response with
the wanted id is timed (:attr:`Reply.done_at`) the moment it is parsed, before the
end of the SSE stream arrives.  That is where every latency in the report ends; it
starts when :meth:`McpSession.call` writes the POST.

A kept-alive connection the server closed while idle (EOF before any byte of the
response) is replaced and the request sent once more, as HTTP clients do: the
server never read it.  Every other failure raises :class:`HttpError` and leaves the
connection closed (the next exchange reconnects); a cancelled exchange closes it too.
Callers bound every exchange in time (``trio.fail_after``).

:class:`McpSession` is one MCP session on one :class:`Client`: ``initialize``, then
``notifications/initialized``, then ``tools/call`` requests carrying the session's
``Mcp-Session-Id`` and ``MCP-Protocol-Version`` headers.  The ``_post``,
``_initialize_body``, ``_INITIALIZED`` and ``_call_body`` builders are shared with
the half-open peers (:mod:`benchmarks.fanout.peers`), which speak the legacy SSE
transport with the same bodies.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec
import trio

from .common import BenchError

PROTOCOL_VERSION = "2025-06-18"
_RECV = 65536
_decode = msgspec.json.decode
_encode = msgspec.json.encode


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

    __slots__ = ("buf", "host", "local_address", "port", "stream")

    def __init__(self, host: str, port: int, local_address: str | None = None) -> None:
        self.host = host
        self.port = port
        #: The source address to connect from (None: the kernel's choice); past about
        #: 28,000 connections to one address and port, loopback runs out of source
        #: ports, so large runs spread sessions over 127.0.0.x.
        self.local_address = local_address
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
                    self.stream = await trio.open_tcp_stream(
                        self.host, self.port, local_address=self.local_address
                    )
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


def _call_body(
    request_id: int, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
) -> bytes:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return _encode({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


#: The sessionless revision, and what each of its requests says about its client.
SESSIONLESS_VERSION = "2026-07-28"


def _sessionless_meta(name: str) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": SESSIONLESS_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": name, "version": "0.1.0"},
    }


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

    __slots__ = (
        "client",
        "endpoint",
        "key_prefix",
        "meta",
        "name",
        "next_id",
        "prefix",
        "session_id",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        name: str,
        *,
        sessionless: bool = False,
        idempotency_keys: bool = False,
        local_address: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self.client = Client(endpoint.host, endpoint.port, local_address)
        self.session_id: str | None = None
        self.next_id = 1
        self.prefix = ""
        #: Sessionless (2026-07-28): the ``_meta`` every request carries, else None.
        self.meta = _sessionless_meta(name) if sessionless else None
        #: Sessionless: each call carries ``Idempotency-Key: <name>-<random>-<id>``,
        #: never reused (a shared store outlives a run; a reused key would replay).
        keyed = sessionless and idempotency_keys
        self.key_prefix = f"{name}-{secrets.token_hex(6)}" if keyed else ""

    async def open(self) -> None:
        """``initialize`` and ``notifications/initialized`` -- or, sessionless,
        ``server/discover`` (raises :class:`HttpError`)."""
        ep = self.endpoint
        if self.meta is not None:
            body = _encode(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "server/discover",
                    "params": {"_meta": self.meta},
                }
            )
            extra = (
                f"MCP-Protocol-Version: {SESSIONLESS_VERSION}\r\nMcp-Method: server/discover\r\n"
            )
            reply = await self.client.exchange(_post(ep.authority, ep.path, body, extra), 0)
            if reply.status != 200 or reply.message is None or "result" not in reply.message:
                raise HttpError(f"server/discover: HTTP {reply.status} {reply.body[:200]!r}")
            self.prefix = (
                f"MCP-Protocol-Version: {SESSIONLESS_VERSION}\r\nMcp-Method: tools/call\r\n"
            )
            return
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
        extra = self.prefix if self.meta is None else f"{self.prefix}Mcp-Name: {tool}\r\n"
        if self.key_prefix:
            extra += f"Idempotency-Key: {self.key_prefix}-{rid}\r\n"
        data = _post(ep.authority, ep.path, _call_body(rid, tool, arguments, self.meta), extra)
        start = time.perf_counter()
        return await self.client.exchange(data, rid), start
