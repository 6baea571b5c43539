"""What the comparison servers answer, apart from how they frame HTTP.

Theory of operation
-------------------
:mod:`benchmarks.ceiling` (Trio + h11) and :mod:`benchmarks.floor` (Trio, HTTP
framed by hand) must answer the fan-out benchmark's requests identically, so that
the difference between them is the HTTP library's price and nothing else.  This
module is that shared part: :meth:`Answers.answer` turns one request (method,
target, the two headers that matter, body) into an :class:`Answer` (status,
content type, session id, body, and whether the body is one SSE event), doing the
least MCP work that yields correct bytes: a session table, an event id, the echo.

:func:`serve_batched` is the accept loop both use.  Trio's own
(:func:`trio.serve_listeners`) accepts one connection per scheduling round, so when
hundreds of clients connect at once the last of them wait behind hundreds of
rounds of the others' requests; taking every connection already waiting in the
backlog each time the socket is readable removes that wait.  weir's accept gate
(``engine/_listen.py``) does the same, so neither side of the comparison carries
an accept tail the other lacks.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

_encode = msgspec.json.encode
_decode = msgspec.json.decode

_INIT_RESULT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {"listChanged": False}},
    "serverInfo": {"name": "ceiling", "version": "0.1.0"},
}
_DISCOVER: dict[str, Any] = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "ttlMs": 0,
    "cacheScope": "private",
}
REASONS = {200: b"OK", 202: b"Accepted", 400: b"Bad Request", 404: b"Not Found"}


@dataclass(slots=True)
class Answer:
    """One response: ``event`` means the body goes out as one chunked SSE event."""

    status: int
    ctype: bytes = b""
    sid: bytes = b""
    body: bytes = b""
    event: bool = False


_NOT_FOUND = Answer(404)
_BAD = Answer(400)
_ACCEPTED = Answer(202)


class Answers:
    """The benchmark's requests answered with no checks (see the module docstring)."""

    def __init__(self, path: bytes, json_response: bool) -> None:
        self.path = path
        self.json_response = json_response
        self.sessions: dict[bytes, int] = {}  # session id -> streams opened (the epoch)

    def answer(
        self, method: bytes, target: bytes, sid: bytes, version: bytes, body: bytes
    ) -> Answer:
        """The answer to one request; ``sid``/``version`` are the headers' values (or ``b""``)."""
        if target != self.path or method != b"POST":
            return _NOT_FOUND
        try:
            msg: dict[str, Any] = _decode(body)
        except msgspec.DecodeError:
            return _BAD
        if version == b"2026-07-28":
            return self._sessionless(msg)
        rpc = msg.get("method")
        if rpc == "initialize":
            new = secrets.token_urlsafe(32).encode()
            self.sessions[new] = 0
            result = _encode({"jsonrpc": "2.0", "id": msg.get("id"), "result": _INIT_RESULT})
            return Answer(200, b"application/json", new, result)
        epoch = self.sessions.get(sid)
        if epoch is None:
            return _NOT_FOUND
        if "id" not in msg:
            return _ACCEPTED
        params = msg.get("params") or {}
        if rpc == "tools/call" and params.get("name") == "echo":
            text = (params.get("arguments") or {}).get("text", "")
            reply: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
            payload = _encode({"jsonrpc": "2.0", "id": msg["id"], "result": reply})
        else:
            error = {"code": -32601, "message": f"method {rpc!r} not found"}
            payload = _encode({"jsonrpc": "2.0", "id": msg["id"], "error": error})
        if self.json_response:
            return Answer(200, b"application/json", sid, payload)
        self.sessions[sid] = epoch = epoch + 1
        event = b"id: %08x:0\ndata: %s\n\n" % (epoch, payload)
        return Answer(200, b"text/event-stream", sid, event, event=True)

    def _sessionless(self, msg: dict[str, Any]) -> Answer:
        if msg.get("method") == "server/discover":
            result = _encode({"jsonrpc": "2.0", "id": msg.get("id"), "result": _DISCOVER})
            return Answer(200, b"application/json", b"", result)
        params = msg.get("params") or {}
        text = (params.get("arguments") or {}).get("text", "")
        reply = {"content": [{"type": "text", "text": text}], "resultType": "complete"}
        payload = _encode({"jsonrpc": "2.0", "id": msg.get("id"), "result": reply})
        if self.json_response:
            return Answer(200, b"application/json", b"", payload)
        return Answer(200, b"text/event-stream", b"", b"data: %s\n\n" % payload, event=True)


_ACCEPT_BATCH = 256


def run_server(
    name: str,
    description: str,
    connection: Callable[[str, bool], Callable[[trio.SocketStream], Awaitable[None]]],
    argv: list[str] | None,
) -> None:
    """``python -m benchmarks.NAME [--host] [--port] [--path] [--json-response]``: serve
    ``connection(path, json_response)`` on one listener, printing the serving line first."""
    p = argparse.ArgumentParser(prog=f"benchmarks.{name}", description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--path", default="/mcp")
    p.add_argument("--json-response", action="store_true")
    args = p.parse_args(argv)

    async def serve() -> None:
        listeners = await trio.open_tcp_listeners(args.port, host=args.host)
        bound = listeners[0].socket.getsockname()[1]
        print(f"{name}: serving http://{args.host}:{bound}{args.path}", flush=True)
        await serve_batched(connection(args.path, args.json_response), listeners[0])

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


async def serve_batched(
    handler: Callable[[trio.SocketStream], Awaitable[None]], listener: trio.SocketListener
) -> None:
    """Serve ``listener`` forever, taking every waiting connection at each wake-up."""
    raw = socket.socket(fileno=os.dup(listener.socket.fileno()))
    raw.setblocking(False)
    try:
        async with trio.open_nursery() as nursery:
            while True:
                await trio.lowlevel.wait_readable(raw)
                for _ in range(_ACCEPT_BATCH):
                    try:
                        sock, _addr = raw.accept()
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ECONNABORTED):
                            await trio.sleep(0.05)
                            break
                        raise
                    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                    nursery.start_soon(handler, stream)
    finally:
        raw.close()
