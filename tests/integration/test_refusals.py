"""Every refusal reason of the MCP endpoint, on both runtimes, over real sockets.

Bad input gets a clear error -- the right HTTP status and a JSON-RPC error whose
``data.reason`` names it -- never a crash.  The reasons come from the core
(:mod:`weir.protocol`), so each runtime must give the same ones: each test takes
``runtime`` and serves through :mod:`tests.integration.runtimes` (the server in a
thread of its own).  Every request here goes on a fresh connection, so that a
refusal that closes its connection is not mistaken for the next one's.

Where the runtimes differ by design the test says so: the asyncio runtime answers a
POST that accepts only JSON with a JSON body (the Trio engine, unless it runs with
``--json-response``, asks for both types).  The Trio engine's own endpoints
(``/metrics``, the 2024-11-05 transport's ``/sse`` and ``/messages``) have a test of
their own, expected to fail on the asyncio runtime (strictly) until it serves them.

Clock: real time; nothing here waits for a timer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from tests.engine.helpers import H11Client, Reply, SseReply
from tests.integration.runtimes import RUNTIMES, Served, serving
from tests.integration.test_half_open_loopback import open_client
from weir.engine import App
from weir.protocol import HttpLimits

app = App("refusals")
TIMEOUT = 20.0


@app.tool()
async def echo(text: str) -> str:
    """Echo."""
    return text


def rpc(rid: int | str | None, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def refused(reply: Reply | SseReply, status: int, reason: str) -> dict[str, Any]:
    """Assert an exact refusal; return the JSON-RPC error body."""
    assert isinstance(reply, Reply), f"expected a refusal, got a {reply.status} stream"
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["content-type"] == "application/json"
    body: dict[str, Any] = reply.json()
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["data"]["reason"] == reason, body
    return body


class Session:
    """An initialized session; each request of it goes on a fresh connection."""

    def __init__(self, server: Served, sid: str, version: str) -> None:
        self.server, self.sid, self.version = server, sid, version
        self.clients: list[H11Client] = []  # closed by session_of

    async def peer(self, *, session: bool = True) -> H11Client:
        client = await open_client(self.server.port)
        self.clients.append(client)
        if session:
            client.session_id, client.protocol_version = self.sid, self.version
        return client

    async def send(
        self,
        method: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        target: str = "/mcp",
    ) -> Reply | SseReply:
        client = await self.peer()
        return await client.send(method, body, headers, target)

    async def post(
        self, message: dict[str, Any] | list[Any], headers: dict[str, str] | None = None
    ) -> Reply | SseReply:
        return await self.send("POST", json.dumps(message).encode(), headers)


@asynccontextmanager
async def session_of(runtime: str, **options: Any) -> AsyncIterator[Session]:
    """``app`` on ``runtime`` (with ``options``), and one session of it."""
    with trio.fail_after(TIMEOUT), serving(runtime, app, **options) as server:
        first = await open_client(server.port)
        async with first.stream:
            await first.initialize()
        assert first.session_id is not None and first.protocol_version is not None
        session = Session(server, first.session_id, first.protocol_version)
        try:
            yield session
        finally:
            for client in session.clients:
                await client.stream.aclose()


@RUNTIMES
async def test_parse_error_and_invalid_request(runtime: str) -> None:
    async with session_of(runtime) as s:
        body = refused(await s.send("POST", b"{not json"), 400, "parse_error")
        assert body["id"] is None and body["error"]["code"] == -32700
        body = refused(
            await s.post({"jsonrpc": "1.0", "id": 4, "method": "ping"}), 400, "invalid_request"
        )
        assert body["id"] == 4 and body["error"]["code"] == -32600
        refused(await s.post({"jsonrpc": "2.0", "id": 5}), 400, "invalid_request")
        refused(await s.post(rpc(None, "ping")), 400, "invalid_request")
        # initialize in a batch, and initialize without its params
        s.version = "2025-03-26"
        init = rpc(9, "initialize", {"protocolVersion": "2025-03-26"})
        refused(await s.post([init]), 400, "invalid_request")
        fresh = await s.peer(session=False)
        body = refused(
            await fresh.post(
                rpc(10, "initialize", {"capabilities": {}}), {"mcp-protocol-version": ""}
            ),
            400,
            "invalid_request",
        )
        assert body["id"] == 10 and body["error"]["code"] == -32602


@RUNTIMES
async def test_an_id_too_long_to_repeat_is_refused_without_it(runtime: str) -> None:
    """An id as long as a session's whole byte credit could never be answered (each
    answer repeats it): Trio sent an empty stream and logged the id with a traceback,
    asyncio sent one frame past the credit.  Ids are capped (1,024 characters); a
    longer one is refused before anything runs, and the refusal does not repeat it."""
    async with session_of(runtime) as s:
        reply = await s.post(rpc("i" * (1024 * 1024), "ping"))
        body = refused(reply, 400, "invalid_request")
        assert isinstance(reply, Reply)
        assert len(reply.body) < 512, reply.body[:200]
        assert body["id"] is None
        longest = "i" * 1024
        answered = await s.post(rpc(longest, "ping"))
        assert answered.status == 200, answered
        messages = (
            await answered.messages() if isinstance(answered, SseReply) else [answered.json()]
        )
        assert [m["id"] for m in messages] == [longest]


@RUNTIMES
async def test_not_found_and_method_not_allowed(runtime: str) -> None:
    async with session_of(runtime) as s:
        ping = json.dumps(rpc(1, "ping")).encode()
        refused(await s.send("POST", ping, target="/nope"), 404, "not_found")
        put = await s.send("PUT", ping)
        refused(put, 405, "method_not_allowed")
        assert put.headers["allow"] == "GET, POST, DELETE"
        refused(await s.send("PATCH", b"{}"), 405, "method_not_allowed")


@RUNTIMES
async def test_the_engines_own_endpoints_refuse_what_they_do_not_serve(runtime: str) -> None:
    async with session_of(runtime) as s:
        metrics = await s.send("POST", b"{}", target="/metrics")
        refused(metrics, 405, "method_not_allowed")
        assert metrics.headers["allow"] == "GET, HEAD"
        sse = await s.send("DELETE", target="/sse")
        refused(sse, 405, "method_not_allowed")
        assert sse.headers["allow"] == "GET"
        messages = await s.send("GET", target="/messages?session_id=x")
        refused(messages, 405, "method_not_allowed")
        assert messages.headers["allow"] == "POST"
        refused(
            await s.send("GET", headers={"accept": "application/json"}, target="/sse"),
            406,
            "not_acceptable",
        )
        refused(
            await s.send(
                "POST",
                json.dumps(rpc(1, "ping")).encode(),
                {"content-type": "text/plain"},
                target="/messages?session_id=x",
            ),
            415,
            "unsupported_media_type",
        )
        refused(
            await s.send("GET", headers={"origin": "null"}, target="/metrics"),
            403,
            "forbidden_origin",
        )


@RUNTIMES
async def test_not_acceptable_and_unsupported_media_type(runtime: str) -> None:
    async with session_of(runtime) as s:
        ping = json.dumps(rpc(1, "ping")).encode()
        json_only = await s.send("POST", ping, {"accept": "application/json"})
        if runtime == "trio":  # both types, or 406
            refused(json_only, 406, "not_acceptable")
        else:  # the asyncio runtime answers such a client with JSON
            assert isinstance(json_only, Reply) and json_only.status == 200, json_only
            assert json_only.json()["result"] == {}
        refused(await s.send("POST", ping, {"accept": "text/event-stream"}), 406, "not_acceptable")
        refused(await s.send("GET", headers={"accept": "application/json"}), 406, "not_acceptable")
        refused(
            await s.send("POST", ping, {"content-type": "text/plain"}),
            415,
            "unsupported_media_type",
        )


@RUNTIMES
async def test_forbidden_host_and_origin(runtime: str) -> None:
    async with session_of(runtime) as s:
        ping = json.dumps(rpc(1, "ping")).encode()
        refused(await s.send("POST", ping, {"host": "evil.example:8000"}), 403, "forbidden_host")
        refused(
            await s.send("POST", ping, {"origin": "http://evil.example"}), 403, "forbidden_origin"
        )
        ok = await s.send("POST", ping, {"origin": "http://localhost:3000"})
        assert isinstance(ok, SseReply) and ok.status == 200


@RUNTIMES
async def test_unsupported_protocol_version_and_session_invalid(runtime: str) -> None:
    async with session_of(runtime) as s:
        ping = json.dumps(rpc(1, "ping")).encode()
        body = refused(
            await s.send("POST", ping, {"mcp-protocol-version": "1999-01-01"}),
            400,
            "unsupported_protocol_version",
        )
        assert "2025-11-25" in body["error"]["data"]["supported"]
        refused(
            await s.send("GET", headers={"mcp-protocol-version": "2024-11-05"}),
            400,
            "unsupported_protocol_version",
        )
        refused(await s.send("POST", ping, {"mcp-session-id": "bad id"}), 400, "session_invalid")
        refused(
            await s.send("DELETE", headers={"mcp-session-id": "s" * 257}), 400, "session_invalid"
        )


@RUNTIMES
async def test_payload_and_headers_too_large(runtime: str) -> None:
    limits = HttpLimits(max_header_bytes=4096, max_body_bytes=1024)
    async with session_of(runtime, limits=limits) as s:
        big = json.dumps(rpc(1, "ping", {"pad": "x" * 2048})).encode()
        refused(await s.send("POST", big), 413, "payload_too_large")
        refused(await s.send("GET", headers={"x-pad": "y" * 8192}), 431, "headers_too_large")
        # the session is unharmed
        pong = await s.post(rpc(2, "ping"))
        assert isinstance(pong, SseReply) and pong.status == 200
        [answer] = [m for m in await pong.messages() if m.get("id") == 2]
        assert answer["result"] == {}
