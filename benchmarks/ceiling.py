"""The ceiling: the least a Trio + h11 server must do to answer the benchmark's requests.

It answers exactly what :mod:`benchmarks.fanout` sends -- ``initialize``,
``notifications/initialized`` and ``tools/call`` of ``echo`` -- in the same wire
format as weir's SSE mode:

* ``initialize`` -> ``200 application/json`` with a new ``Mcp-Session-Id``;
* a notification -> ``202``;
* ``tools/call`` -> ``200 text/event-stream`` (chunked), one ``id:``/``data:`` event
  carrying the JSON-RPC result, then the end of the stream; with ``--json-response``
  one ``application/json`` body instead.

With ``MCP-Protocol-Version: 2026-07-28`` (``fanout --sessionless``) there is no
session: ``server/discover`` gets a fixed result, and ``tools/call`` the same stream
without an event id, its result carrying ``resultType``.

A request naming an unknown session gets 404.  There is nothing else: no Host or
Origin checks, no version negotiation, no idempotency gate, no drain credit, no
event log, no separate handler tasks.  It is what weir is compared against: the
difference in server CPU per call is the price of weir's MCP machinery.

``python -m benchmarks.ceiling [--port 0] [--json-response]`` prints
``ceiling: serving http://HOST:PORT/PATH`` first on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
from typing import Any

import h11
import msgspec
import trio

_RECV = 65536
_IDLE = 75.0
_encode = msgspec.json.encode
_decode = msgspec.json.decode

_INIT_RESULT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {"listChanged": False}},
    "serverInfo": {"name": "ceiling", "version": "0.1.0"},
}


class Ceiling:
    """The minimal server (see the module docstring)."""

    def __init__(self, path: str, json_response: bool) -> None:
        self.path = path.encode()
        self.json_response = json_response
        self.sessions: dict[bytes, int] = {}  # session id -> streams opened (the epoch)

    async def connection(self, stream: trio.SocketStream) -> None:
        """Serve one keep-alive connection until the peer closes it."""
        conn = h11.Connection(h11.SERVER)
        body = bytearray()
        request: h11.Request | None = None
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    with trio.move_on_after(_IDLE):
                        conn.receive_data(await stream.receive_some(_RECV))
                        continue
                    return
                if isinstance(event, h11.Request):
                    request = event
                    body.clear()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    await stream.send_all(self.respond(conn, request, bytes(body)))
                    if conn.our_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                else:  # ConnectionClosed, or PAUSED after a bad cycle
                    return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await stream.aclose()

    def respond(self, conn: h11.Connection, request: h11.Request, body: bytes) -> bytes:
        """The complete response to one request, as bytes."""
        if request.target != self.path or request.method != b"POST":
            return _plain(conn, 404)
        try:
            msg: dict[str, Any] = _decode(body)
        except msgspec.DecodeError:
            return _plain(conn, 400)
        method = msg.get("method")
        version = next((v for k, v in request.headers if k == b"mcp-protocol-version"), b"")
        if version == b"2026-07-28":
            return self._sessionless(conn, msg)
        if method == "initialize":
            sid = secrets.token_urlsafe(32).encode()
            self.sessions[sid] = 0
            result = _encode({"jsonrpc": "2.0", "id": msg.get("id"), "result": _INIT_RESULT})
            return _whole(conn, 200, b"application/json", sid, result)
        sid = next((v for k, v in request.headers if k == b"mcp-session-id"), b"")
        epoch = self.sessions.get(sid)
        if epoch is None:
            return _plain(conn, 404)
        if "id" not in msg:
            return _plain(conn, 202)
        params = msg.get("params") or {}
        if method == "tools/call" and params.get("name") == "echo":
            text = (params.get("arguments") or {}).get("text", "")
            reply: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
            payload = _encode({"jsonrpc": "2.0", "id": msg["id"], "result": reply})
        else:
            error = {"code": -32601, "message": f"method {method!r} not found"}
            payload = _encode({"jsonrpc": "2.0", "id": msg["id"], "error": error})
        if self.json_response:
            return _whole(conn, 200, b"application/json", sid, payload)
        self.sessions[sid] = epoch = epoch + 1
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"mcp-session-id", sid),
        ]
        event = b"id: %08x:0\ndata: %s\n\n" % (epoch, payload)
        return b"".join(
            conn.send(e) or b""
            for e in (
                h11.Response(status_code=200, headers=headers, reason=b"OK"),
                h11.Data(data=event),
            )
        ) + (conn.send(h11.EndOfMessage()) or b"")

    def _sessionless(self, conn: h11.Connection, msg: dict[str, Any]) -> bytes:
        if msg.get("method") == "server/discover":
            result = _encode({"jsonrpc": "2.0", "id": msg.get("id"), "result": _DISCOVER})
            return _whole(conn, 200, b"application/json", b"", result)
        params = msg.get("params") or {}
        text = (params.get("arguments") or {}).get("text", "")
        reply = {"content": [{"type": "text", "text": text}], "resultType": "complete"}
        payload = _encode({"jsonrpc": "2.0", "id": msg.get("id"), "result": reply})
        if self.json_response:
            return _whole(conn, 200, b"application/json", b"", payload)
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        return b"".join(
            conn.send(e) or b""
            for e in (
                h11.Response(status_code=200, headers=headers, reason=b"OK"),
                h11.Data(data=b"data: %s\n\n" % payload),
            )
        ) + (conn.send(h11.EndOfMessage()) or b"")


_DISCOVER: dict[str, Any] = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "ttlMs": 0,
    "cacheScope": "private",
}

_REASONS = {200: b"OK", 202: b"Accepted", 400: b"Bad Request", 404: b"Not Found"}


def _plain(conn: h11.Connection, status: int) -> bytes:
    response = h11.Response(
        status_code=status, headers=[(b"content-length", b"0")], reason=_REASONS[status]
    )
    head = conn.send(response)
    return (head or b"") + (conn.send(h11.EndOfMessage()) or b"")


def _whole(conn: h11.Connection, status: int, ctype: bytes, sid: bytes, body: bytes) -> bytes:
    headers = [(b"content-type", ctype), (b"content-length", b"%d" % len(body))]
    if sid:
        headers.append((b"mcp-session-id", sid))
    head = conn.send(h11.Response(status_code=status, headers=headers, reason=b"OK")) or b""
    return head + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")


async def _main(host: str, port: int, path: str, json_response: bool) -> None:
    server = Ceiling(path, json_response)
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    print(f"ceiling: serving http://{host}:{bound}{path}", flush=True)
    await trio.serve_listeners(server.connection, listeners)


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.ceiling``."""
    p = argparse.ArgumentParser(prog="benchmarks.ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--path", default="/mcp")
    p.add_argument("--json-response", action="store_true")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(_main, args.host, args.port, args.path, args.json_response)


if __name__ == "__main__":
    main()
