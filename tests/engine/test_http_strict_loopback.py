"""Malformed request heads over a real loopback socket: 400, then the close.

The engine's own listener on 127.0.0.1, a raw TCP client: each head that breaks
the line grammar (bare LF, bare CR, obs-fold, a control byte) is answered with
exactly one 400 ``malformed_http`` JSON-RPC error and ``Connection: close``, and
the request pipelined behind it is never answered.  (The sans-io core's rules
are tested in ``tests/protocol/test_http_strict.py``.)
"""

from __future__ import annotations

import json

import pytest
import trio

from weir.engine import App, Server, ServerConfig

app = App("strict-http")


@app.tool()
async def echo(text: str) -> str:
    """Echo."""
    return text


_INIT = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
).encode()
_CLEAN = (
    b"Host: 127.0.0.1\r\nAccept: application/json, text/event-stream\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(_INIT)
)
# Would be served if it were read as a request of its own.
SMUGGLED = b"POST /mcp HTTP/1.1\r\n" + _CLEAN + b"\r\n" + _INIT
BAD_HEADS = {
    "bare-lf": b"POST /mcp HTTP/1.1\n" + _CLEAN + b"\r\n",
    "bare-lf-blank-line": b"POST /mcp HTTP/1.1\r\n" + _CLEAN + b"\n",
    "bare-cr": b"POST /mcp HTTP/1.1\r\nX-A: a\rb\r\n" + _CLEAN + b"\r\n",
    "obs-fold": b"POST /mcp HTTP/1.1\r\nX-A: a\r\n b\r\n" + _CLEAN + b"\r\n",
    "control-0x01": b"POST /mcp HTTP/1.1\r\nX-A: a\x01b\r\n" + _CLEAN + b"\r\n",
    "control-0x1f": b"POST /mcp HTTP/1.1\r\nX-A: a\x1fb\r\n" + _CLEAN + b"\r\n",
    "control-0x7f": b"POST /mcp HTTP/1.1\r\nX-A: a\x7fb\r\n" + _CLEAN + b"\r\n",
    "nul": b"POST /mcp HTTP/1.1\r\nX-A: a\x00b\r\n" + _CLEAN + b"\r\n",
}


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read until the server closes (bounded in reads and time)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    with trio.fail_after(10):
        async with stream:
            await stream.send_all(data)
            for _ in range(1000):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return bytes(received)
                received += chunk
    raise AssertionError("the server never closed the connection")


def one_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """The one response in ``raw`` (nothing may follow it): status, headers, body."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])
    assert len(rest) == length, f"bytes after the response: {rest[length:]!r}"
    return int(status_line.split(" ")[1]), headers, rest


async def serve_and_exchange(data: bytes) -> bytes:
    server = Server(app, ServerConfig(port=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        try:
            return await exchange(server.port, data)
        finally:
            server.shutdown()
            await server.stopped.wait()


@pytest.mark.parametrize("head", BAD_HEADS.values(), ids=BAD_HEADS.keys())
async def test_a_malformed_head_is_400_and_closed_and_nothing_behind_it_is_served(
    head: bytes,
) -> None:
    status, headers, body = one_response(await serve_and_exchange(head + _INIT + SMUGGLED))
    assert status == 400
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["data"]["reason"] == "malformed_http"
    assert error["message"].startswith("malformed HTTP request: ")


async def test_the_same_request_with_clean_line_ends_is_served() -> None:
    # The control case: the refusals above are about the faults alone.
    raw = await serve_and_exchange(SMUGGLED.replace(b"Host:", b"Connection: close\r\nHost:"))
    assert raw.startswith(b"HTTP/1.1 200 ")


_CHUNKED = (
    b"POST /mcp HTTP/1.1\r\n"
    + _CLEAN.replace(b"Content-Length: %d" % len(_INIT), b"Transfer-Encoding: chunked")
    + b"\r\n"
    + b"%x\r\n" % len(_INIT)
    + _INIT
    + b"\r\n0\r\n"
)


@pytest.mark.parametrize(
    "data",
    [_CHUNKED + b"\n", _CHUNKED + b"X-A: a\nX-B: b\r\n\r\n", _CHUNKED + b"X-A: a\r\n b\r\n\r\n"],
    ids=["bare-lf-ends-trailers", "bare-lf-in-trailers", "obs-fold-in-trailers"],
)
async def test_a_chunked_body_with_a_bare_lf_ends_nothing_and_is_400(data: bytes) -> None:
    # To a strict front end the request behind it is still trailer bytes: weir must
    # not serve it as a request of its own (nor the chunked one).
    status, headers, body = one_response(await serve_and_exchange(data + SMUGGLED))
    assert status == 400 and headers["connection"] == "close"
    assert json.loads(body)["error"]["data"]["reason"] == "malformed_http"
