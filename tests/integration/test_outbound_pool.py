"""The process's cap on unacknowledged response bytes (``max_outbound_bytes``).

Credit is per owner, and without authorization every connection is an owner of its
own: the per-owner bound alone lets many connections that stop reading hold many
credits' worth of answers.  Here two anonymous connections ask for answers large
enough to fill a small cap and never read them (real sockets with small receive
buffers, so the bytes stay unacknowledged); then a reader's new requests, of either
era, are refused 503 ``overloaded`` before anything runs, and are served again once
the stalled connections are gone and their bytes returned.  Both runtimes.

What the pool counts is the answer's bytes; a stalled answer must not keep a second,
uncounted copy of itself alive -- in JSON the caller's encoded body beside the framed
bytes being written, in SSE the write's joined chunk beside the frame the stream's log
keeps -- which Python's allocator trace shows; nor the request it answers, whose
handler has returned (searched for by its content among the live objects).  (A
2026-07-28 call without an ``Idempotency-Key``: a session-era call's result is also
kept for a retry's replay, a copy the retention budget counts.)
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from weir.engine import App, ServerConfig
from weir.protocol import CreditLimits

from .configured import RUNTIMES, serve_configured
from .rawhttp import Client, call, initialize, raw_request, scrape

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}
ANSWER = 48 * 1024

app = App("outbound")
runs: list[int] = []


@app.tool()
async def bulk(size: int) -> str:
    """``size`` bytes of text; counts its runs (a refused request must not run)."""
    runs.append(size)
    return "x" * size


@app.tool()
async def shout(text: str) -> str:
    """``text`` in capitals: a large answer to a large request, told apart from it."""
    return text.upper()


def sessionless(rid: int, size: int) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 ``tools/call bulk`` of ``size`` bytes, and its headers."""
    params = {"name": "bulk", "arguments": {"size": size}, "_meta": META}
    message = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    headers = {"mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": "bulk"}
    return message, headers


async def until_credit_in_use(port: int, done: Any) -> float:
    """Poll ``weir_credit_in_use_bytes`` until ``done(value)`` (bounded: 400 reads, 20 s)."""
    value = await scrape(port, "weir_credit_in_use_bytes")
    for _ in range(400):
        if done(value):
            break
        await trio.sleep(0.05)
        value = await scrape(port, "weir_credit_in_use_bytes")
    return value


@RUNTIMES
async def test_stalled_owners_that_fill_the_cap_get_new_requests_refused_until_they_go(
    runtime: str,
) -> None:
    credit = CreditLimits(frames=8, bytes=64 * 1024, drain_window=0.3, liveness_timeout=60.0)
    config = ServerConfig(port=0, credit=credit, max_outbound_bytes=2 * ANSWER)
    with trio.fail_after(60):
        async with serve_configured(runtime, app, config) as port:
            reader = await Client.connect(port)
            stalled = [await Client.connect(port, rcvbuf=4096) for _ in range(2)]
            try:
                sid = await initialize(reader)
                for rid, peer in enumerate(stalled, start=1):
                    await post(peer, *sessionless(rid, ANSWER))
                # What anonymous owners hold is in the credit gauge, as a session's is.
                held = await until_credit_in_use(port, lambda v: v >= 2 * ANSWER)
                assert held >= 2 * ANSWER  # each owner within its 64 KiB, the two over the cap
                assert await scrape(port, "weir_sessionless_owners") == 2
                assert await scrape(port, "weir_outbound_limit_bytes") == 2 * ANSWER
                assert await scrape(port, "weir_outbound_peak_bytes") >= held
                ran = len(runs)

                message, headers = sessionless(10, 10)
                refused = await reader.request("POST", "/mcp", message, headers=headers)
                assert refused.status == 503 and refused.reason == "overloaded", refused
                assert refused.json()["id"] == 10 and int(refused.headers["retry-after"]) >= 1
                refused = await reader.request(
                    "POST", "/mcp", call(11, "bulk", {"size": 10}), session=sid
                )
                assert refused.status == 503 and refused.reason == "overloaded", refused
                assert len(runs) == ran  # nothing refused ran

                for peer in stalled:
                    await peer.aclose()
                assert await until_credit_in_use(port, lambda v: v == 0) == 0
                served = await reader.request("POST", "/mcp", message, headers=headers)
                assert served.status == 200, served
                assert served.json()["result"]["content"][0]["text"] == "x" * 10
                served = await reader.request(
                    "POST", "/mcp", call(12, "bulk", {"size": 10}), session=sid
                )
                assert served.status == 200 and "result" in served.json(), served
            finally:
                for peer in stalled:
                    await peer.aclose()
                await reader.aclose()


@RUNTIMES
@pytest.mark.parametrize("mode", ["json", "sse"])
async def test_a_stalled_answer_is_held_in_memory_once(runtime: str, mode: str) -> None:
    size = 2 * 1024 * 1024
    credit = CreditLimits(frames=8, bytes=4 * 1024 * 1024, drain_window=5.0, liveness_timeout=60.0)
    config = ServerConfig(port=0, credit=credit, json_response=mode == "json")
    async with traced_server(runtime, config) as port:
        peer = await Client.connect(port, rcvbuf=4096)
        try:
            await post(peer, *sessionless(1, size))
            assert await until_credit_in_use(port, lambda v: v >= size) >= size
            held = [t for t in tracemalloc.take_snapshot().traces if t.size >= size]
            # JSON: the framed bytes being written (or the part the kernel
            # has not taken).  SSE: the frame in the stream's log,
            # kept for a resumption -- the write sends it gathered, not joined.
            assert len(held) <= 1, [t.traceback.format()[-3:] for t in held]
        finally:
            await peer.aclose()


@app.tool()
async def numbered(count: int) -> str:
    """``count`` eight-digit numbers in a row: an answer whose every part is told apart."""
    return "%08d" * count % tuple(range(count))


@RUNTIMES
async def test_a_stalled_json_answer_keeps_only_what_the_kernel_has_not_taken(
    runtime: str,
) -> None:
    """A JSON answer is one write of its framed bytes.  A peer that reads part of
    it and stops leaves the rest waiting until it reads on or the liveness timeout
    ends it; what waits must be the part the kernel has not taken, not the whole
    answer.  A write lets go of what the kernel took once that is at least what is
    left, so what it holds is less than twice what the peer has not read; the peer
    here reads all but about an eighth of a 24 MiB answer (more than the kernel
    buffers for one socket: its send buffer grows to 4 MiB by default) and stops,
    so no block of a quarter of the answer may be left; then it reads the rest,
    and every byte must be as sent."""
    count = 3 * 1024 * 1024
    size = 8 * count
    credit = CreditLimits(frames=8, bytes=32 * 1024 * 1024, drain_window=5.0, liveness_timeout=60.0)
    config = ServerConfig(port=0, credit=credit, json_response=True)
    expected = "%08d" * count % tuple(range(count))
    async with traced_server(runtime, config) as port:
        peer = await Client.connect(port, rcvbuf=4096)
        try:
            params = {"name": "numbered", "arguments": {"count": count}, "_meta": META}
            message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
            headers = {"mcp-protocol-version": V, "mcp-method": "tools/call"}
            headers["mcp-name"] = "numbered"
            await post(peer, message, headers)
            received: list[bytes] = []  # (in pieces: the test's own copy is
            got = 0  # never one block as large as the half looked for)
            while got < size - size // 8 + 65536:
                received.append(bytes(await peer.stream.receive_some(65536)))
                got += len(received[-1])
            held = await until_no_blocks_of(size // 4)  # (the write is cut at once)
            assert not held, [t.traceback.format(most_recent_first=True)[:4] for t in held]
            # Still unacknowledged as a whole: the answer's credit is all held.
            assert await scrape(port, "weir_credit_in_use_bytes") >= size
            while not received[-1].endswith(b"}"):
                received.append(bytes(await peer.stream.receive_some(1024 * 1024)))
        finally:
            await peer.aclose()
    head, _, answer = b"".join(received).partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(answer) in head.lower()
    assert json.loads(answer)["result"]["content"][0]["text"] == expected


@RUNTIMES
@pytest.mark.parametrize("mode", ["json", "sse"])
@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_a_stalled_answer_does_not_keep_its_request(
    runtime: str, mode: str, era: str
) -> None:
    """The answer is what the credit and the pool count; the request it answers is
    done with once the handler returned.  A peer that sends a large request and never
    reads the answer must not also keep the request's bytes (raw or decoded) alive
    for as long as it stalls (up to the liveness timeout): nothing bounds those."""
    size = 1024 * 1024
    credit = CreditLimits(frames=8, bytes=4 * 1024 * 1024, drain_window=5.0, liveness_timeout=60.0)
    config = ServerConfig(port=0, credit=credit, json_response=mode == "json")
    with trio.fail_after(60):
        async with serve_configured(runtime, app, config) as port:
            peer = await Client.connect(port, rcvbuf=4096)
            try:
                arguments = {"text": "y" * size}
                if era == "session":
                    sid = await initialize(peer)
                    message, headers = call(1, "shout", arguments), {"mcp-session-id": sid}
                else:
                    params = {"name": "shout", "arguments": arguments, "_meta": META}
                    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
                    headers = {"mcp-protocol-version": V, "mcp-method": "tools/call"}
                    headers["mcp-name"] = "shout"
                    del params
                body = json.dumps(message).encode()
                raw = raw_request("POST", "/mcp", body=body, headers=headers)
                await peer.send_raw(raw)
                del raw, body, message, arguments
                assert await until_credit_in_use(port, lambda v: v >= size) >= size
                # The request (small letters) is not held; the answer (capitals) is,
                # where weir holds it whole: a stream's frame, or Trio's write while
                # the kernel has taken less than half of it (the asyncio transport
                # keeps only what the kernel has not taken, and its kernel, without
                # a low-water mark on unsent bytes, takes this much whole).
                assert not _held_texts(b"y" * 4096, size)
                if mode == "sse" or runtime == "trio":
                    assert _held_texts(b"Y" * 4096, size)
            finally:
                await peer.aclose()


def _held_texts(marker: bytes, size: int) -> list[str]:
    """What holds a live string or buffer of at least ``size`` bytes containing
    ``marker``: searched from every object the collector tracks, through untracked
    containers (a dict of strings is not tracked), a few levels deep."""
    gc.collect()
    text = marker.decode()
    found: list[str] = []

    def holds(obj: object, depth: int) -> bool:
        for ref in gc.get_referents(obj):
            if isinstance(ref, str) and len(ref) >= size and text in ref[:65536]:
                return True
            if isinstance(ref, (bytes, bytearray)) and len(ref) >= size and marker in ref:
                return True
            if isinstance(ref, memoryview) and ref.nbytes >= size and marker in ref.tobytes():
                return True
            deeper = depth < 4 and not gc.is_tracked(ref) and not isinstance(ref, (str, bytes))
            if deeper and holds(ref, depth + 1):
                return True
        return False

    for obj in gc.get_objects():
        if holds(obj, 0):
            code = getattr(obj, "cr_code", None) or getattr(obj, "f_code", None)
            found.append(code.co_qualname if code is not None else type(obj).__name__)
    return found


@RUNTIMES
async def test_stalled_answers_are_let_go_when_their_connections_close(runtime: str) -> None:
    """An owner that ends frees its answers at once: a closed session object can
    outlive its end (a stale deadline entry holds it until the heap is compacted),
    and must not keep its streams' frames alive meanwhile."""
    size, peers = 512 * 1024, 5
    credit = CreditLimits(frames=8, bytes=1024 * 1024, drain_window=5.0, liveness_timeout=60.0)
    config = ServerConfig(port=0, credit=credit)  # SSE: the answer is a stream's frame
    async with traced_server(runtime, config) as port:
        stalled = [await Client.connect(port, rcvbuf=4096) for _ in range(peers)]
        for rid, peer in enumerate(stalled, start=1):
            await post(peer, *sessionless(rid, size))
        assert await until_credit_in_use(port, lambda v: v >= peers * size) >= peers * size
        assert len(_blocks_of(size)) >= peers
        for peer in stalled:
            await peer.aclose()
        assert await until_credit_in_use(port, lambda v: v == 0) == 0
        held = await until_no_blocks_of(size)  # (far short of the 60 s liveness)
        assert not held, [t.traceback.format()[-3:] for t in held]
        assert await scrape(port, "weir_sessionless_owners") == 0


def _blocks_of(size: int) -> list[tracemalloc.Trace]:
    """The live allocations of at least ``size`` bytes (after a full collection)."""
    gc.collect()
    return [t for t in tracemalloc.take_snapshot().traces if t.size >= size]


async def until_no_blocks_of(size: int) -> list[tracemalloc.Trace]:
    """:func:`_blocks_of` ``size``, read again until none is left (bounded: 10 s)."""
    held = _blocks_of(size)
    for _ in range(100):
        if not held:
            break
        await trio.sleep(0.1)
        held = _blocks_of(size)
    return held


@asynccontextmanager
async def traced_server(runtime: str, config: ServerConfig) -> AsyncIterator[int]:
    """Serve :data:`app` on ``runtime`` (yields its port) with Python's allocator
    trace on, all of it bounded to 60 s."""
    tracemalloc.start()
    try:
        with trio.fail_after(60):
            async with serve_configured(runtime, app, config) as port:
                yield port
    finally:
        tracemalloc.stop()


async def post(peer: Client, message: dict[str, Any], headers: dict[str, str]) -> None:
    """Send ``message`` as a POST to ``/mcp`` with ``headers`` (the answer is not read)."""
    await peer.send_raw(
        raw_request("POST", "/mcp", body=json.dumps(message).encode(), headers=headers)
    )
