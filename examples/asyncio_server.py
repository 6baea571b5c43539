"""A second driver for weir's sans-io core, on stdlib asyncio instead of Trio.

Theory of operation
-------------------
:mod:`weir.protocol` does no I/O and reads no clock, so any event loop can drive it.  This
module shows it: a small asyncio server around the same core ``engine._server`` drives
with Trio.  Each connection runs ``reader.read -> HttpConnection.receive_data ->
next_event -> respond -> writer.write``.  All HTTP framing (keep-alive, chunking,
automatic 400/413/431) comes from :class:`weir.protocol.HttpConnection`; every endpoint rule
(path, Host/Origin, method, Accept, Content-Type, JSON-RPC decoding, session header)
from :func:`weir.protocol.route`; every refusal body from :func:`weir.protocol.refusal`; every
SSE frame from a :class:`weir.protocol.StreamLog` (ids ``<epoch>:<seq>``, a priming event
for 2025-11-25 clients); session states from :func:`weir.protocol.session_transition`.  The
driver adds only what needs state or I/O: a dict of sessions and the sockets.

It serves an :class:`weir.engine.App` (the demo app by default): ``initialize``,
``notifications/initialized``, ``ping``, ``tools/list`` and ``tools/call``, answered
as an SSE stream, or as one JSON body when ``Accept`` lists only ``application/json``
(routing uses ``json_response=True`` so such clients pass; SSE is chosen per request).
``engine`` imports trio, but no trio code runs: tools are awaited on the asyncio loop.

Deliberately left out (the Trio engine has them all): tools taking an
:class:`weir.engine.Context` (they get a JSON-RPC error: no progress, logging, sampling or
cancellation here, and they are not listed); resources, prompts and completion; GET
streams and ``Last-Event-ID`` resumption (GET answers 405, which MCP allows); handlers
that outlive their connection (a request runs inline, one at a time per connection);
a session store, idle-session expiry and graceful shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import msgspec

from weir.engine import App, McpError, ToolError, text, tool_result
from weir.engine.apps.demo import app as demo_app
from weir.protocol import (
    INVALID_PARAMS,
    LOOPBACK_HOSTS,
    METHOD_NOT_FOUND,
    NEED_DATA,
    SERVER_ERROR,
    DeleteSession,
    EndpointConfig,
    HttpConnection,
    HttpError,
    HttpRequest,
    Notification,
    PostMessages,
    Reason,
    RemoteProtocolError,
    Request,
    SessionInput,
    SessionState,
    StreamInput,
    StreamKind,
    StreamLog,
    accepts,
    encode_error,
    encode_result,
    format_epoch,
    initialize_result,
    parse_initialize,
    refusal,
    route,
    session_refusal,
    session_transition,
    version_at_least,
)

log = logging.getLogger("weir.asyncio")
_KEEPALIVE_S = 75.0
_SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


@dataclass(slots=True)
class _Session:
    version: str  # the negotiated protocol revision
    state: SessionState = SessionState.NEW
    epochs: int = 0  # streams opened so far; the next one's epoch


class AsyncioDriver:
    """Serves one :class:`weir.engine.App`; :meth:`connection` is the ``start_server`` callback."""

    def __init__(self, app: App, endpoint: EndpointConfig) -> None:
        self.app, self.endpoint = app, endpoint
        self.sessions: dict[str, _Session] = {}

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _Connection(self, writer).run(reader)

    async def execute(self, req: Request) -> bytes:
        """One request's encoded JSON-RPC response."""
        try:
            if req.method == "ping":
                return encode_result(req.id, {})
            if req.method == "tools/list":
                tools = [t.listing() for t in self.app.tools.values() if t.context_param is None]
                return encode_result(req.id, {"tools": tools})
            if req.method == "tools/call":
                return encode_result(req.id, await self._call_tool(req.params or {}))
            raise McpError(METHOD_NOT_FOUND, f"method {req.method!r} not found")
        except McpError as exc:
            return encode_error(req.id, exc.code, exc.message, exc.data)

    async def _call_tool(self, params: dict[str, Any]) -> dict[str, Any]:
        name, arguments = params.get("name"), params.get("arguments") or {}
        tool = self.app.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise McpError(INVALID_PARAMS, f"unknown tool {name!r}")
        if tool.context_param is not None:
            raise McpError(
                SERVER_ERROR,
                f"tool {name!r} takes a Context (progress, logging, cancellation), "
                "which the asyncio example driver does not support; use the Trio engine",
                {"tool": name},
            )
        if not isinstance(arguments, dict):
            raise McpError(INVALID_PARAMS, "params.arguments must be an object")
        try:
            if tool.args_type is None:
                kwargs = dict(arguments) if tool.input_schema.get("properties") else {}
            else:
                args = msgspec.convert(arguments, tool.args_type, strict=False)
                kwargs = {f: getattr(args, f) for f in tool.args_type.__struct_fields__}
        except msgspec.ValidationError as exc:
            return {"content": [text(f"invalid arguments for {name}: {exc}")], "isError": True}
        try:
            out = tool.fn(**kwargs)
            return tool_result(await out if inspect.isawaitable(out) else out)
        except ToolError as exc:
            return {"content": [text(str(exc))], "isError": True}
        except McpError:
            raise
        except Exception as exc:
            log.exception("tool %s failed", name)
            return {"content": [text(f"tool {name} failed: {type(exc).__name__}")], "isError": True}


class _Connection:
    """One TCP connection: the read/respond loop around one :class:`HttpConnection`."""

    def __init__(self, driver: AsyncioDriver, writer: asyncio.StreamWriter) -> None:
        self.driver, self.writer, self.conn = driver, writer, HttpConnection()

    async def send(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except BaseException:
            self.conn.send_failed()
            raise

    async def run(self, reader: asyncio.StreamReader) -> None:
        conn = self.conn
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    conn.receive_data(await asyncio.wait_for(reader.read(65536), _KEEPALIVE_S))
                elif isinstance(event, HttpRequest):
                    await self.respond(event)
                    if conn.should_close:
                        break
                elif isinstance(event, HttpError):
                    await self.send(conn.data_to_send())
                    break
                else:  # ConnectionClosed
                    break
        except (ConnectionError, TimeoutError):
            pass
        except Exception:
            log.exception("connection handler failed")
        finally:
            self.writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    async def respond(self, request: HttpRequest) -> None:
        sessions = self.driver.sessions
        try:
            mcp = route(request, self.driver.endpoint)
            if isinstance(mcp, PostMessages):
                await self._post(mcp)
                return
            sid = mcp.ctx.session_id or ""
            session = sessions.get(sid)
            if session is None:
                raise session_refusal(sid)
            if not isinstance(mcp, DeleteSession):
                raise RemoteProtocolError(
                    "this server offers no GET stream",
                    http_status=405,
                    reason=Reason.METHOD_NOT_ALLOWED,
                    headers=(("allow", "POST, DELETE"),),
                )
            session.state = session_transition(session.state, SessionInput.DELETE)
            del sessions[sid]
            await self.send(self.conn.send_response(200, ()))
        except RemoteProtocolError as exc:
            if self.conn.response_in_progress:
                raise
            status, headers, body = refusal(exc)
            await self.send(self.conn.send_response(status, headers, body))

    async def _post(self, post: PostMessages) -> None:
        if post.is_initialize:
            await self._initialize(post)
            return
        first, sid = post.messages[0], post.ctx.session_id or ""
        session = self.driver.sessions.get(sid)
        if session is None:
            raise session_refusal(sid, first.id if isinstance(first, Request) else None)
        for msg in post.messages:
            if isinstance(msg, Notification) and msg.method == "notifications/initialized":
                session.state = session_transition(session.state, SessionInput.INITIALIZED)
        requests = post.requests  # client responses and other notifications are dropped
        if not requests:
            await self.send(self.conn.send_response(202, ()))
            return
        session.state = session_transition(session.state, SessionInput.REQUEST)
        execute = self.driver.execute
        if not accepts(post.ctx.headers.get("accept"), "text/event-stream"):
            bodies = [await execute(req) for req in requests]
            body = b"[" + b",".join(bodies) + b"]" if post.is_batch else bodies[0]
            headers = [("content-type", "application/json"), ("mcp-session-id", sid)]
            await self.send(self.conn.send_response(200, headers, body))
            return
        stream = StreamLog(format_epoch(session.epochs), StreamKind.REQUEST)
        session.epochs += 1
        stream.handle(StreamInput.ATTACH)
        if any(
            version_at_least(v, "2025-11-25") for v in (session.version, post.ctx.protocol_version)
        ):
            stream.prime()
        await self.send(self.conn.start_stream(200, (*_SSE_HEADERS, ("mcp-session-id", sid))))
        written = 0
        for i, req in enumerate(requests):
            frames = stream.frames_from(written)  # the priming event, or earlier responses
            written += len(frames)
            await self.send(self.conn.send_stream_data(b"".join(frames)))
            stream.append((await execute(req)).decode(), final=i == len(requests) - 1)
        await self.send(self.conn.send_stream_data(b"".join(stream.frames_from(written))))
        stream.handle(StreamInput.DELIVERED)
        await self.send(self.conn.end_stream())

    async def _initialize(self, post: PostMessages) -> None:
        req, app = post.messages[0], self.driver.app
        assert isinstance(req, Request)
        asked = parse_initialize(req)  # the same checks and negotiation as weir's server
        sid = secrets.token_urlsafe(32)
        self.driver.sessions[sid] = _Session(asked.version)
        result = initialize_result(
            asked.version,
            {"tools": {"listChanged": False}},
            name=app.name,
            server_version=app.version,
            instructions=app.instructions,
        )
        headers = [("content-type", "application/json"), ("mcp-session-id", sid)]
        await self.send(self.conn.send_response(200, headers, encode_result(req.id, result)))


async def serve(
    host: str = "127.0.0.1", port: int = 0, *, app: App = demo_app, path: str = "/mcp"
) -> asyncio.Server:
    """Start serving ``app`` at ``http://host:port/path`` (port 0: a free one)."""
    hosts = LOOPBACK_HOSTS | {host.lower()}
    endpoint = EndpointConfig(path=path, allowed_hosts=hosts, json_response=True)
    return await asyncio.start_server(AsyncioDriver(app, endpoint).connection, host, port)


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.asyncio_server [--host H] [--port N]``; Ctrl-C stops it."""
    parser = argparse.ArgumentParser(prog="python -m examples.asyncio_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    async def run() -> None:
        server = await serve(args.host, args.port)
        host, port = server.sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"asyncio-weir: serving http://{shown}:{port}/mcp", flush=True)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
