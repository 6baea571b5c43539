"""The asyncio runtime (aio/, installed as weir.asyncio) over real loopback HTTP.

The server runs in a background thread's asyncio event loop; the client is h11 over
a plain blocking socket, so neither side uses Trio.  These are plain sync tests
(not Trio tests), and every wait is bounded by ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import pytest
import sniffio

from weir.app.samples.demo import app as demo_app
from weir.asyncio import AsyncioDriver
from weir.engine import App
from weir.protocol import LOOPBACK_HOSTS, CreditLimits, EndpointConfig
from weir.protocol.sse import SseDecoder, SseEvent

from .rawhttp import raw_request, send_regardless
from .runtimes import client_socket

TIMEOUT = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]
BOTH = "application/json, text/event-stream"
_EVENT_ID = re.compile(r"([0-9a-f]{8}):(\d+)")


@dataclass
class Running:
    """A driver serving on 127.0.0.1 in a background event loop."""

    port: int
    driver: AsyncioDriver
    loop: asyncio.AbstractEventLoop

    def probe(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (its state is the loop's alone)."""

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(TIMEOUT)


@contextmanager
def running_driver(
    app: App | None = None, credit: CreditLimits | None = None, **options: Any
) -> Iterator[Running]:
    """Run an :class:`AsyncioDriver` (``options`` passed on) in a background event loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="asyncio-weir", daemon=True)
    thread.start()
    endpoint = EndpointConfig(allowed_hosts=LOOPBACK_HOSTS, json_response=True)
    driver = AsyncioDriver(app or demo_app, endpoint, credit, **options)
    try:
        start = asyncio.start_server(driver.connection, "127.0.0.1", 0)
        server = asyncio.run_coroutine_threadsafe(start, loop).result(TIMEOUT)
        try:
            yield Running(int(server.sockets[0].getsockname()[1]), driver, loop)
        finally:

            async def stop() -> None:
                server.close()
                await asyncio.wait_for(server.wait_closed(), TIMEOUT)
                # Connections still open (a stream nobody reads) end with the test.
                others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in others:
                    task.cancel()
                await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), TIMEOUT)

            asyncio.run_coroutine_threadsafe(stop(), loop).result(TIMEOUT)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the server's event loop did not stop"
        loop.close()


@contextmanager
def running_server(app: App | None = None) -> Iterator[int]:
    """Run the driver (as ``serve()`` sets it up) in a background loop; yield its port."""
    with running_driver(app) as running:
        yield running.port


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with running_server() as p:
        yield p


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json"
        return json.loads(self.body)

    def events(self) -> list[SseEvent]:
        assert self.headers["content-type"] == "text/event-stream"
        decoder = SseDecoder()
        items = decoder.feed(self.body) + decoder.close()
        return [i for i in items if isinstance(i, SseEvent)]

    def message(self) -> Any:
        """The one JSON-RPC message of an SSE or JSON body."""
        if self.headers["content-type"] == "application/json":
            return self.json()
        data = [e.data for e in self.events() if e.data]
        assert len(data) == 1, data
        return json.loads(data[0])


class Client:
    """A minimal MCP client: h11 over one keep-alive socket to 127.0.0.1."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = client_socket(port, timeout=TIMEOUT)  # (TLS to a server serving it)
        self.h11 = h11.Connection(h11.CLIENT)
        self.session_id: str | None = None
        self.version = "2025-11-25"
        self.next_id = 0

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(
        self, method: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        if self.h11.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
            self.h11.start_next_cycle()  # keep-alive: the same socket again
        hdrs = {"host": f"127.0.0.1:{self.port}", "content-length": str(len(body))}
        hdrs.update(headers or {})
        request = h11.Request(method=method, target="/mcp", headers=list(hdrs.items()))
        out = self.h11.send(request) or b""
        if body:
            out += self.h11.send(h11.Data(data=body)) or b""
        self.sock.sendall(out + (self.h11.send(h11.EndOfMessage()) or b""))
        status, resp_headers, chunks = 0, {}, []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                resp_headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return Reply(status, resp_headers, b"".join(chunks))
            else:
                raise AssertionError(f"unexpected {event!r}")

    def post(self, message: dict[str, Any], *, accept: str = BOTH) -> Reply:
        headers = {"content-type": "application/json", "accept": accept}
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
            headers["mcp-protocol-version"] = self.version
        return self.request("POST", json.dumps({"jsonrpc": "2.0", **message}).encode(), headers)

    def call(self, method: str, params: dict[str, Any] | None = None, **kw: str) -> Reply:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        return self.post(msg, **kw)

    def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t"}}
        reply = self.call("initialize", params)
        assert reply.status == 200, reply
        self.session_id = reply.headers["mcp-session-id"]
        self.version = version
        result: dict[str, Any] = reply.json()["result"]
        initialized = self.post({"method": "notifications/initialized"})
        assert (initialized.status, initialized.body) == (202, b"")
        return result


def _tool_text(reply: Reply) -> str:
    msg = reply.message()
    assert msg["id"] is not None and "error" not in msg, msg
    assert msg["result"].get("isError") is not True, msg
    content = msg["result"]["content"]
    assert len(content) == 1 and content[0]["type"] == "text"
    return str(content[0]["text"])


def test_full_session_over_one_keepalive_connection(port: int) -> None:
    with Client(port) as c:
        result = c.initialize()
        assert result["protocolVersion"] == "2025-11-25"
        assert result["serverInfo"]["name"] == "weir-demo"
        assert "tools" in result["capabilities"]
        assert len(c.session_id or "") >= 32

        tools = c.call("tools/list")
        assert tools.status == 200
        assert tools.headers["mcp-session-id"] == c.session_id
        listed = {t["name"] for t in tools.message()["result"]["tools"]}
        assert listed == {"echo", "increment", "countdown"}

        echo = c.call("tools/call", {"name": "echo", "arguments": {"text": "héllo"}})
        assert echo.status == 200
        prime, answer = echo.events()
        assert prime.data == ""  # the 2025-11-25 priming event comes first
        m0, m1 = _EVENT_ID.fullmatch(prime.id or ""), _EVENT_ID.fullmatch(answer.id or "")
        assert m0 and m1 and m0[1] == m1[1], (prime.id, answer.id)
        assert (int(m0[2]), int(m1[2])) == (0, 1)
        rpc = json.loads(answer.data)
        assert rpc["id"] == c.next_id
        assert rpc["result"] == {"content": [{"type": "text", "text": "héllo"}]}
        tools_epoch = _EVENT_ID.fullmatch(tools.events()[0].id or "")
        assert tools_epoch and tools_epoch[1] != m0[1]  # each stream has its own epoch

        first = int(_tool_text(c.call("tools/call", {"name": "increment"})))
        second = int(_tool_text(c.call("tools/call", {"name": "increment"})))
        assert second == first + 1
        # Every request above went over the one socket: h11 would have raised otherwise.
        assert c.h11.our_state is h11.DONE and c.h11.their_state is h11.DONE


def test_json_only_client_gets_a_json_body(port: int) -> None:
    with Client(port) as c:
        c.initialize()
        reply = c.call(
            "tools/call", {"name": "echo", "arguments": {"text": "x"}}, accept="application/json"
        )
        assert reply.status == 200
        assert reply.headers["mcp-session-id"] == c.session_id
        assert _tool_text(reply) == "x"


def test_no_priming_event_before_2025_11_25(port: int) -> None:
    with Client(port) as c:
        assert c.initialize("2025-06-18")["protocolVersion"] == "2025-06-18"
        (only,) = c.call("tools/call", {"name": "echo", "arguments": {"text": "y"}}).events()
        assert only.id is not None and only.id.endswith(":0")
        assert json.loads(only.data)["result"]["content"][0]["text"] == "y"


def test_unknown_session_is_404(port: int) -> None:
    with Client(port) as c:
        c.session_id = "no-such-session"
        reply = c.call("tools/list")
        assert reply.status == 404
        error = reply.json()
        assert error["id"] == c.next_id
        assert error["error"]["data"]["reason"] == "session_not_found"


def test_unknown_methods_and_bad_arguments_are_answered_not_crashed(port: int) -> None:
    with Client(port) as c:
        c.initialize()
        unknown = c.call("no/such/method").message()
        assert unknown["error"]["code"] == -32601
        bad = c.call("tools/call", {"name": "increment", "arguments": {"by": "many"}}).message()
        assert bad["result"]["isError"] is True
        nothing = c.call("resources/read", {"uri": "demo://nothing"}).message()
        assert nothing["error"]["code"] == -32002


def test_refusals_come_from_the_core(port: int) -> None:
    with Client(port) as c:
        c.initialize()
        assert c.session_id is not None
        sid = {"mcp-session-id": c.session_id}
        bad_cursor = {"accept": "text/event-stream", "last-event-id": "ffffffff:0", **sid}
        unknown = c.request("GET", headers=bad_cursor)
        assert unknown.status == 409
        assert unknown.json()["error"]["data"]["reason"] == "cursor_unknown"
        not_acceptable = c.call("tools/list", accept="text/plain")
        assert not_acceptable.status == 406
        assert not_acceptable.json()["error"]["data"]["reason"] == "not_acceptable"
        assert c.request("DELETE", headers=sid).status == 200
        gone = c.call("tools/list")
        assert gone.status == 404
        assert gone.json()["error"]["data"]["reason"] == "session_not_found"


def test_malformed_http_gets_400_and_close(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):  # ends at EOF: the server closed
            received += chunk
    assert received.startswith(b"HTTP/1.1 400 ")
    assert b'"reason":"malformed_http"' in received


def test_a_body_too_large_still_arriving_is_answered_not_reset(port: int) -> None:
    size = 8 * 1024 * 1024  # over the default 4 MiB limit: 413 at the head
    head = raw_request("POST", "/mcp", headers={"content-length": str(size)})
    received = send_regardless(port, head, size, TIMEOUT)
    assert received.startswith(b"HTTP/1.1 413 ")
    assert b'"reason":"payload_too_large"' in received


def test_tools_run_on_the_asyncio_loop() -> None:
    app = App("probe")

    @app.tool()
    async def library() -> str:
        """Name the async library running this tool."""
        return sniffio.current_async_library()

    with running_server(app) as p, Client(p) as c:
        c.initialize()
        assert _tool_text(c.call("tools/call", {"name": "library"})) == "asyncio"


def test_cli_prints_the_url_and_serves() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "weir", "serve", "--runtime", "asyncio", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    reader = concurrent.futures.ThreadPoolExecutor(1)
    try:
        assert proc.stdout is not None
        line = reader.submit(proc.stdout.readline).result(TIMEOUT)
        found = re.fullmatch(r"weir: serving http://127\.0\.0\.1:(\d+)/mcp\n", line)
        assert found, line
        with Client(int(found[1])) as c:
            assert c.initialize()["serverInfo"]["name"] == "weir-demo"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        reader.shutdown(wait=True)  # the readline has returned: the process is gone
        if proc.stdout is not None:
            proc.stdout.close()
