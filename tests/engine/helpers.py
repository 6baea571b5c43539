"""Test peers for the engine: an h11 client over any Trio stream, and an in-memory server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio
import trio.testing

from weir.engine import App, Server, ServerConfig
from weir.protocol.sse import SseDecoder, SseEvent

ACCEPT_BOTH = "application/json, text/event-stream"
#: A 2025-03-26 batch (the only revision with batches): a ping, a call of an ``echo``
#: tool answering "b", and a notification (which gets no answer).
BATCH_2025_03_26: list[dict[str, Any]] = [
    {"jsonrpc": "2.0", "id": 1, "method": "ping"},
    {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "b"}},
    },
    {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": 1},
    },
]


@dataclass
class Reply:
    """A complete HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class SseReply:
    """An SSE response being read."""

    status: int
    headers: dict[str, str]
    client: H11Client
    decoder: SseDecoder = field(default_factory=SseDecoder)
    ended: bool = False
    raw: bytearray = field(default_factory=bytearray)

    async def events(self) -> list[SseEvent]:
        """Read until the response ends; every event (comments dropped)."""
        out: list[SseEvent] = []
        while not self.ended:
            out.extend(await self.next_batch())
        return out

    async def next_batch(self) -> list[SseEvent]:
        """Read at least one more chunk of the body and return the events it completed."""
        while True:
            ev = await self.client.next_h11_event()
            if isinstance(ev, h11.Data):
                self.raw += ev.data
                items = [i for i in self.decoder.feed(bytes(ev.data)) if isinstance(i, SseEvent)]
                if items:
                    return items
            elif isinstance(ev, h11.EndOfMessage):
                self.ended = True
                self.client.conn.start_next_cycle()
                return []

    async def messages(self) -> list[dict[str, Any]]:
        """Read to the end; the JSON-RPC messages (the priming event skipped)."""
        return [json.loads(e.data) for e in await self.events() if e.data]


class H11Client:
    """A minimal HTTP/1.1 client on one Trio stream, speaking MCP headers."""

    def __init__(self, stream: trio.abc.Stream, host: str = "127.0.0.1:8000") -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        self.host = host
        self.session_id: str | None = None
        self.protocol_version: str | None = "2025-11-25"

    async def next_h11_event(self) -> h11.Event:
        while True:
            ev = self.conn.next_event()
            if ev is h11.NEED_DATA:
                self.conn.receive_data(bytes(await self.stream.receive_some(65536)))
                continue
            assert not isinstance(ev, type), ev
            return ev

    def _headers(self, extra: dict[str, str] | None, body: bytes | None) -> list[tuple[str, str]]:
        hdrs = {"host": self.host, "accept": ACCEPT_BOTH}
        if body is not None:
            hdrs["content-type"] = "application/json"
            hdrs["content-length"] = str(len(body))
        if self.session_id:
            hdrs["mcp-session-id"] = self.session_id
        if self.protocol_version:
            hdrs["mcp-protocol-version"] = self.protocol_version
        hdrs.update(extra or {})
        return [(k, v) for k, v in hdrs.items() if v != ""]

    async def send(
        self,
        method: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        target: str = "/mcp",
    ) -> Reply | SseReply:
        req = h11.Request(method=method, target=target, headers=self._headers(headers, body))
        data = self.conn.send(req) or b""
        if body:
            data += self.conn.send(h11.Data(data=body)) or b""
        data += self.conn.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)
        ev = await self.next_h11_event()
        assert isinstance(ev, h11.Response), ev
        hdrs = {k.decode().lower(): v.decode() for k, v in ev.headers}
        if hdrs.get("content-type", "").startswith("text/event-stream"):
            return SseReply(ev.status_code, hdrs, self)
        body_parts = bytearray()
        while True:
            nxt = await self.next_h11_event()
            if isinstance(nxt, h11.Data):
                body_parts += nxt.data
            elif isinstance(nxt, h11.EndOfMessage):
                break
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return Reply(ev.status_code, hdrs, bytes(body_parts))

    async def post(
        self, message: dict[str, Any] | list[Any], headers: dict[str, str] | None = None
    ) -> Reply | SseReply:
        return await self.send("POST", json.dumps(message).encode(), headers)

    async def initialize(self, version: str = "2025-11-25") -> Reply:
        reply = await self.post(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": {"sampling": {}, "elicitation": {}},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            },
            headers={"mcp-protocol-version": ""},
        )
        assert isinstance(reply, Reply) and reply.status == 200, reply
        self.session_id = reply.headers["mcp-session-id"]
        self.protocol_version = reply.json()["result"]["protocolVersion"]
        ack = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert isinstance(ack, Reply) and ack.status == 202
        return reply

    async def call(
        self,
        request_id: int,
        name: str,
        arguments: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> SseReply:
        params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
        if meta:
            params["_meta"] = meta
        reply = await self.post(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        )
        assert isinstance(reply, SseReply), reply
        return reply


@asynccontextmanager
async def running_server(
    app: App, config: ServerConfig | None = None
) -> AsyncIterator[tuple[Server, trio.Nursery]]:
    """A server with no listener; connect clients with :func:`connect`.

    On the way out it checks the credit invariant over every session the test made:
    none ever held more unacknowledged frames than its frame credit.
    """
    async with trio.open_nursery() as nursery:
        server = Server(app, config or ServerConfig())
        await nursery.start(partial(server.run, listen=False))
        yield server, nursery
        frames, _ = server.metrics.credit_peaks(server.sessions.values())
        assert frames <= server.config.credit.frames, (frames, server.config.credit)
        server.shutdown()
        await server.stopped.wait()


def connect(server: Server, nursery: trio.Nursery) -> H11Client:
    """A client wired to ``server`` through an in-memory stream pair."""
    client_side, server_side = trio.testing.memory_stream_pair()
    nursery.start_soon(server.serve_connection, server_side)
    return H11Client(client_side)


async def open_session(server: Server, nursery: trio.Nursery) -> tuple[H11Client, str]:
    """A connected client that has initialized a session, and that session's id."""
    client = connect(server, nursery)
    await client.initialize()
    assert client.session_id is not None
    return client, client.session_id
