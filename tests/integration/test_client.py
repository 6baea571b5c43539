"""weir's client (:mod:`engine.client`) against weir, a scripted fake, and the official SDK.

Every server listens on 127.0.0.1 and every exchange crosses a real loopback socket.

* **weir in-process** (``Server(...).run`` started in the test's nursery): the demo app,
  the conformance app's ``test_reconnection``, and a small app of this module's own
  for progress, slow and hanging calls and server-to-client requests.  What does not
  need channel tokens or replicas (plain calls, progress, resumption, idempotency
  keys, a duplicate of a running call, ``DELETE``, server-to-client requests,
  cancellation) runs on both runtimes (``runtime``: the server in a thread of its
  own, :mod:`tests.integration.runtimes`); the asyncio runtime names no replica in
  its events.  The fencing
  scenarios use the real server: a corrupted channel token (409 ``channel_unbound``:
  auto-rebind and a fresh key), a rebind by a second client of the same session (409
  ``cursor_stale``: raised, nothing runs), a duplicate delivery of a running call
  (409 ``in_progress``: same key re-sent, one execution).
* **a scripted fake** (:class:`FakeServer`, h11 on Trio) for what a healthy weir
  never does on demand: 429/503 refusals with ``Retry-After``, streams cut twice,
  resumed streams that skip, repeat or go back (event ids), a connection that dies
  before its first event.
* **the official MCP Python SDK server** (``mcp`` 2.3.0, uvicorn) in a subprocess,
  answering SSE or JSON: plain calls without channel tokens or replica comments.

Time is the real clock (the SDK server runs in another process); every wait is
bounded by ``trio.fail_after`` and every loop by a count.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import pytest
import sniffio
import trio

from tests.integration.runtimes import RUNTIMES, Served, serving
from weir.app.samples import conformance, demo
from weir.engine import App, Context, McpError, Server, ServerConfig
from weir.engine.client import (
    CallToolResult,
    CallTrace,
    ChannelUnbound,
    CursorStale,
    HalfOpenError,
    IdempotencyKeyReused,
    InProgress,
    RetryPolicy,
    RpcError,
    SessionGone,
    StreamResumeViolation,
    TextContent,
    Unavailable,
    WeirError,
    open_session,
)

HOST = "127.0.0.1"
TEST_TIMEOUT = 20.0
FAST = RetryPolicy(base_delay=0.01, max_delay=2.0)

# ---------------------------------------------------------------- an app of our own
app = App("client-tests", "1.0.0")
executions: dict[str, int] = {}
ended: dict[str, float] = {}


async def sleep(seconds: float) -> None:
    """Sleep on whichever runtime serves the tool."""
    if sniffio.current_async_library() == "trio":
        await trio.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


@app.tool()
async def slow(label: str, seconds: float = 0.5) -> str:
    """Not idempotent: count one execution of ``label``, then sleep."""
    executions[label] = executions.get(label, 0) + 1
    await sleep(seconds)
    return f"{label} done"


@app.tool()
async def steps(ctx: Context, n: int = 3) -> str:
    """Report ``n`` progress steps, then finish."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
    return "stepped"


@app.tool()
async def ask_client(ctx: Context) -> str:
    """Ask the client for sampling, elicitation and roots; report what came back."""
    asks: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("sampling", lambda: ctx.sample([{"role": "user", "content": "hi"}], max_tokens=5)),
        ("elicitation", lambda: ctx.elicit("name?", {"type": "object", "properties": {}})),
        ("roots", ctx.list_roots),
    ]
    out = []
    for what, ask in asks:
        try:
            out.append(f"{what}={json.dumps(await ask(), sort_keys=True)}")
        except McpError as exc:
            out.append(f"{what}=error {exc.code}")
    return "; ".join(out)


@app.tool()
async def hang(label: str) -> str:
    """Sleep (cancellably) for a long time; record when it ended."""
    try:
        await sleep(30)
    finally:
        ended[label] = time.monotonic()
    return "woke"


@pytest.fixture(autouse=True)
def _fresh_books() -> None:
    """Each test (and each runtime's case) counts its own executions."""
    executions.clear()
    ended.clear()


@asynccontextmanager
async def served(runtime: str, app_: App, **options: Any) -> AsyncIterator[Served]:
    """``app_`` served by ``runtime`` on 127.0.0.1, in a thread of its own."""
    with serving(runtime, app_, **options) as server:
        yield server


@asynccontextmanager
async def weir(app_: App, **config: Any) -> AsyncIterator[Server]:
    """The real weir server on 127.0.0.1 (port 0), shut down on exit."""
    config.setdefault("shutdown_grace", 0.5)
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app_, ServerConfig(port=0, **config)).run)
        try:
            yield server
        finally:
            server.shutdown()


def text_of(result: CallToolResult) -> str:
    """The text of a one-block tool result."""
    assert isinstance(result, CallToolResult) and not result.is_error, result
    (block,) = result.content
    assert isinstance(block, TextContent), result
    return block.text


def assert_contiguous(trace: CallTrace, replica: str | None = "any") -> None:
    """One epoch, seq 0, 1, 2, ... with ``replica`` named on every event (``any``:
    some replica; ``None``: none, as the asyncio runtime names none)."""
    observed = trace.observed_events
    assert observed, trace
    assert {epoch for _, epoch, _ in observed} == {observed[0][1]}
    assert [seq for _, _, seq in observed] == list(range(len(observed)))
    if replica == "any":
        assert all(r for r, _, _ in observed)
    else:
        assert all(r == replica for r, _, _ in observed), observed


# ---------------------------------------------------------------- weir: plain calls
async def test_call_tool_against_the_demo_app_reuses_one_connection() -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with weir(demo.app) as server, open_session(server.url) as s:
            assert s.session_id and s.channel_token and s.channel_token.startswith("1.")
            assert s.protocol_version == "2025-11-25" and s.supports_rebind
            assert {t.name for t in await s.list_tools()} >= {"echo", "increment"}
            trace = CallTrace()
            assert text_of(await s.call_tool("echo", {"text": "hi"}, trace=trace)) == "hi"
            first = int(text_of(await s.call_tool("increment", {"by": 1})))
            assert int(text_of(await s.call_tool("increment", {"by": 2}))) == first + 2
            # The priming event (seq 0), then the response (seq 1), by this replica.
            assert [(r, seq) for r, _, seq in trace.observed_events] == [
                (server.replica_id, 0),
                (server.replica_id, 1),
            ]
            assert len(trace.idempotency_keys) == 1 and trace.resume_cursors == []
            assert s.connections_opened == 1  # sequential requests share one keep-alive


@RUNTIMES
async def test_concurrent_calls_use_one_connection_each(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, app) as server, open_session(server.url) as s:
            results: list[str] = []

            async def one(i: int) -> None:
                results.append(
                    text_of(await s.call_tool("slow", {"label": f"c{i}", "seconds": 0.2}))
                )

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i)
            assert sorted(results) == ["c0 done", "c1 done", "c2 done"]
            # initialize's connection is one of the three; nothing more is opened after.
            assert s.connections_opened == 3
            await s.list_tools()
            assert s.connections_opened == 3


@RUNTIMES
async def test_json_response_server(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            served(runtime, demo.app, json_response=True) as server,
            open_session(server.url) as s,
        ):
            trace = CallTrace()
            assert text_of(await s.call_tool("echo", {"text": "j"}, trace=trace)) == "j"
            assert trace.observed_events == []


@RUNTIMES
async def test_progress_callback(runtime: str) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, app) as server, open_session(server.url) as s:
            trace, replica = CallTrace(), server.replica_id
            result = await s.call_tool("steps", {"n": 3}, on_progress=on_progress, trace=trace)
            assert text_of(result) == "stepped"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert_contiguous(trace, replica)
    assert len(trace.observed_events) == 5  # priming, three progress, the response


@RUNTIMES
async def test_unknown_method_is_an_rpc_error(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, demo.app) as server, open_session(server.url) as s:
            with pytest.raises(RpcError) as info:
                await s.request("no/such-method")
            assert info.value.code == -32601 and info.value.status == 200


# ---------------------------------------------------------------- weir: resumption
@RUNTIMES
async def test_reconnection_resumes_after_early_close(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, conformance.app) as server, open_session(server.url) as s:
            trace, replica = CallTrace(), server.replica_id
            result = await s.call_tool("test_reconnection", {}, trace=trace)
    assert text_of(result) == "Reconnection test completed successfully"
    # The server closed the POST's response after the priming event; the client
    # resumed from it with GET and received the rest, contiguously.
    epoch = trace.observed_events[0][1]
    assert trace.resume_cursors == [f"{epoch}:0"]
    assert_contiguous(trace, replica)
    assert len(trace.request_ids) == 1  # resumed, never re-sent


# ---------------------------------------------------------------- weir: idempotency (fencing)
@RUNTIMES
async def test_same_idempotency_key_executes_once(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, demo.app) as server, open_session(server.url) as s:
            first = await s.call_tool("increment", {"by": 1}, idempotency_key="k-1")
            again = await s.call_tool("increment", {"by": 1}, idempotency_key="k-1")
            assert again == first  # the stored result, replayed
            fresh = await s.call_tool("increment", {"by": 1})
            assert int(text_of(fresh)) == int(text_of(first)) + 1  # one execution in between
            with pytest.raises(IdempotencyKeyReused) as info:
                await s.call_tool("increment", {"by": 5}, idempotency_key="k-1")
            assert info.value.status == 422


@RUNTIMES
async def test_duplicate_of_a_running_call_waits_and_gets_the_replay(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            served(runtime, app, in_progress_wait=0.1, retry_ms=100) as server,
            open_session(server.url, rng=lambda: 0.0, retry=FAST) as s,
        ):
            traces = [CallTrace(), CallTrace()]
            results: list[CallToolResult] = []

            async def deliver(i: int) -> None:
                args = {"label": "dup", "seconds": 0.6}
                results.append(
                    await s.call_tool("slow", args, idempotency_key="same", trace=traces[i])
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(deliver, 0)
                await trio.sleep(0.1)
                nursery.start_soon(deliver, 1)
    assert executions["dup"] == 1
    assert [text_of(r) for r in results] == ["dup done", "dup done"]
    duplicate = traces[1]
    assert duplicate.refusals and all(isinstance(r, InProgress) for r in duplicate.refusals)
    assert duplicate.idempotency_keys == ["same"]  # re-sent with the same key
    assert len(duplicate.request_ids) == len(duplicate.refusals) + 1


async def test_a_token_that_proves_nothing_cannot_rebind_and_nothing_runs() -> None:
    # A client whose token is not the session's (here: the right generation, the
    # wrong secret) is refused channel_unbound; its rebind is refused too, because a
    # rebind needs the current token -- else anyone with the session id could fence
    # the owner.  Nothing runs.
    keys = itertools.count()
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            weir(demo.app) as server,
            open_session(server.url, key_factory=lambda: f"key-{next(keys)}") as s,
        ):
            before = int(text_of(await s.call_tool("increment", {"by": 0})))  # key-0
            good = s.channel_token
            assert good is not None
            s.channel_token = good.split(".")[0] + ".not-the-secret"
            with pytest.raises(ChannelUnbound):
                await s.call_tool("increment", {"by": 1})
            s.channel_token = good  # the owner's token still works, at generation 1
            after = int(text_of(await s.call_tool("increment", {"by": 0})))
            assert after == before  # the refused call never ran
            assert s.channel_token.startswith("1.")


async def test_a_rebind_during_an_accepted_call_never_runs_it_twice() -> None:
    # Our own rebind ends the call's stream (old generation); its resume GET then gets
    # channel_unbound.  The call was accepted, so it is re-sent with the SAME key and the
    # gate replays it: a fresh key here would run the non-idempotent tool again.
    with trio.fail_after(TEST_TIMEOUT):
        async with weir(app) as server, open_session(server.url, retry=FAST) as s:
            trace = CallTrace()
            results: list[CallToolResult] = []

            async def call() -> None:
                args = {"label": "rebound", "seconds": 0.5}
                results.append(await s.call_tool("slow", args, trace=trace))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await trio.sleep(0.1)
                assert (await s.rebind()).generation == 2
    assert executions["rebound"] == 1
    assert [text_of(r) for r in results] == ["rebound done"]
    assert trace.rebinds == 1 and isinstance(trace.refusals[0], ChannelUnbound)
    assert len(trace.idempotency_keys) == 1 and len(trace.request_ids) == 2
    assert len(trace.resume_cursors) == 1


async def test_cursor_stale_is_raised_and_nothing_runs() -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with weir(demo.app) as server, open_session(server.url) as a:
            before = int(text_of(await a.call_tool("increment", {"by": 0})))
            assert a.session_id is not None
            # b holds the channel too (it has the token): its rebind fences a.
            async with open_session(
                server.url, session_id=a.session_id, channel_token=a.channel_token
            ) as b:
                rebound = await b.rebind()
                assert rebound.generation == 2 and b.channel_token == rebound.channel_token
                trace = CallTrace()
                with pytest.raises(CursorStale) as info:
                    await a.call_tool("increment", {"by": 1}, trace=trace)
                assert info.value.status == 409 and info.value.reason == "cursor_stale"
                assert len(trace.request_ids) == 1  # never retried
                # Nothing ran: the next increment (on the new channel) is the first.
                assert int(text_of(await b.call_tool("increment", {"by": 1}))) == before + 1


@RUNTIMES
async def test_deleted_session_raises_session_gone(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, demo.app) as server, open_session(server.url) as a:
            assert a.session_id is not None
            async with open_session(
                server.url, session_id=a.session_id, channel_token=a.channel_token
            ) as b:
                await b.close()
            with pytest.raises(SessionGone) as info:
                await a.call_tool("echo", {"text": "x"})
            assert info.value.status == 404 and info.value.reason == "session_not_found"


# ---------------------------------------------------------------- weir: server-to-client
@RUNTIMES
async def test_server_requests_are_answered_by_callbacks_or_refused(runtime: str) -> None:
    async def sampling(params: dict[str, Any]) -> dict[str, Any]:
        assert params["maxTokens"] == 5
        return {"role": "assistant", "content": {"type": "text", "text": "sampled"}, "model": "m"}

    async def roots(params: dict[str, Any]) -> dict[str, Any]:
        return {"roots": [{"uri": "file:///tmp", "name": "tmp"}]}

    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, app) as server:
            async with open_session(server.url, sampling=sampling, roots=roots) as s:
                answer = text_of(await s.call_tool("ask_client", {}))
            async with open_session(server.url) as bare:
                refused = text_of(await bare.call_tool("ask_client", {}))
    assert '"text": "sampled"' in answer
    assert "elicitation=error -32601" in answer  # no elicitation callback
    assert '"uri": "file:///tmp"' in answer
    assert refused == "sampling=error -32601; elicitation=error -32601; roots=error -32601"


@RUNTIMES
async def test_cancelling_a_call_cancels_it_on_the_server(runtime: str) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with served(runtime, app) as server, open_session(server.url) as s:
            with trio.move_on_after(0.3):
                await s.call_tool("hang", {"label": "c1"})
            while "c1" not in ended:  # bounded by the fail_after above
                await trio.sleep(0.01)
            # The session stays usable after a cancelled call.
            after = await s.call_tool("slow", {"label": "after-cancel", "seconds": 0})
            assert text_of(after) == "after-cancel done"


# ---------------------------------------------------------------- weir: two replicas (event ids)
class DrainingBalancer:
    """Round robin per TCP connection; :meth:`drain` severs a replica's connections
    and takes it out of rotation (a rolling restart)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.drained: set[int] = set()
        self.turn = 0
        self.routed: list[int] = []  # the replica each connection went to, in order
        self.scopes: dict[int, set[trio.CancelScope]] = {i: set() for i in range(len(ports))}

    def drain(self, index: int) -> None:
        self.drained.add(index)
        for scope in self.scopes[index]:
            scope.cancel()

    async def serve(self, client: trio.SocketStream) -> None:
        live = [i for i in range(len(self.ports)) if i not in self.drained]
        index = live[self.turn % len(live)]
        self.turn += 1
        self.routed.append(index)
        upstream = await trio.open_tcp_stream(HOST, self.ports[index])
        with trio.CancelScope() as scope:
            self.scopes[index].add(scope)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pipe, client, upstream, nursery.cancel_scope)
                nursery.start_soon(self._pipe, upstream, client, nursery.cancel_scope)
        self.scopes[index].discard(scope)
        await trio.aclose_forcefully(upstream)
        await trio.aclose_forcefully(client)

    @staticmethod
    async def _pipe(
        source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope
    ) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()


async def test_a_stream_resumes_contiguously_on_another_replica(valkey_url: str) -> None:
    from weir.engine._redis_store import RedisStore

    prefix = f"client-test-{uuid.uuid4().hex[:8]}"
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            replicas: list[Server] = []
            for name in ("alpha", "beta"):
                store = await RedisStore.connect(valkey_url, prefix=prefix)
                config = ServerConfig(port=0, replica_id=name, shutdown_grace=0.5)
                replicas.append(await nursery.start(Server(app, config, store=store).run))
            balancer = DrainingBalancer([r.port for r in replicas])
            listeners = await nursery.start(partial(trio.serve_tcp, balancer.serve, 0, host=HOST))
            url = f"http://{HOST}:{listeners[0].socket.getsockname()[1]}/mcp"
            trace = CallTrace()
            async with open_session(url, retry=FAST) as s, trio.open_nursery() as calls:
                args = {"label": "drained", "seconds": 0.6}
                calls.start_soon(partial(s.call_tool, "slow", args, trace=trace))
                while not trace.observed_events:  # the priming event, then drain
                    await trio.sleep(0.01)
                first = trace.observed_events[0][0]
                drained = ["alpha", "beta"].index(first or "")
                balancer.drain(drained)
                cut_at = len(balancer.routed)
            for server in replicas:
                server.shutdown()
            nursery.cancel_scope.cancel()
    assert executions["drained"] == 1
    assert_contiguous(trace)
    assert len(trace.resume_cursors) == 1 and len(trace.request_ids) == 1
    # The resume (and everything after the drain) went to the other replica, which
    # replayed the rest from the store: no gap, no repeat, nothing run twice.
    assert balancer.routed[cut_at:] and drained not in balancer.routed[cut_at:]


# ---------------------------------------------------------------- a scripted fake server
@dataclass
class Seen:
    """One request the fake received."""

    method: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> dict[str, Any]:
        msg = json.loads(self.body)
        assert isinstance(msg, dict)
        return msg


@dataclass
class Answer:
    """What the fake sends back: one body, or SSE chunks (then maybe a cut)."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    chunks: list[bytes] | None = None
    cut: bool = False  # drop the connection instead of ending the response


Script = Callable[[Seen], Awaitable[Answer]]
EPOCH = "0000002a"


def frame(seq: int, message: dict[str, Any] | None = None, replica: str = "r1") -> bytes:
    """One weir-style SSE event: replica comment, ``<epoch>:<seq>`` id, JSON data."""
    data = json.dumps(message) if message is not None else ""
    return f": replica={replica}\nid: {EPOCH}:{seq}\ndata: {data}\n\n".encode()


def result(rid: Any, value: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": value}]}}


def json_answer(
    message: dict[str, Any], status: int = 200, headers: tuple[tuple[str, str], ...] = ()
) -> Answer:
    hdrs = [("content-type", "application/json"), *headers]
    return Answer(status, hdrs, json.dumps(message).encode())


def refusal(status: int, reason: str, retry_ms: int | None = None) -> Answer:
    """A weir refusal: the status, a JSON-RPC error with ``data.reason`` (and Retry-After)."""
    data: dict[str, Any] = {"reason": reason}
    headers: tuple[tuple[str, str], ...] = ()
    if retry_ms is not None:
        data["retryAfterMs"] = retry_ms
        headers = (("retry-after", str(max(1, -(-retry_ms // 1000)))),)
    error = {"code": -32000, "message": reason, "data": data}
    return json_answer({"jsonrpc": "2.0", "id": None, "error": error}, status, headers)


class FakeServer:
    """A scripted MCP server speaking weir's wire (h11 on Trio).

    ``initialize``, notifications, answers, ``weir/rebind`` and DELETE get fixed
    answers; every other request (``tools/call`` POSTs, resume GETs) goes to ``script``.
    """

    def __init__(self, script: Script, *, hang_up: bool = False) -> None:
        self.script = script
        self.hang_up = hang_up  # close each connection after one response, unannounced
        self.seen: list[Seen] = []
        self.connections = 0
        self.url = ""
        self.rid: Any = None  # the JSON-RPC id of the latest tools/call, for scripts

    def calls(self) -> list[Seen]:
        posts = [r for r in self.seen if r.method == "POST"]
        return [r for r in posts if r.json().get("method") == "tools/call"]

    def gets(self) -> list[Seen]:
        return [r for r in self.seen if r.method == "GET"]

    async def _answer(self, seen: Seen) -> Answer:
        if seen.method == "DELETE":
            return Answer(200)
        if seen.method == "POST":
            msg = seen.json()
            if msg.get("method") == "initialize":
                caps: dict[str, Any] = {"tools": {}, "experimental": {"weir/rebind": {}}}
                res = {"protocolVersion": "2025-11-25", "capabilities": caps, "serverInfo": {}}
                return json_answer(
                    {"jsonrpc": "2.0", "id": msg["id"], "result": res},
                    headers=(("mcp-session-id", "fake-session"), ("mcp-channel-token", "1.secret")),
                )
            if "id" not in msg or "method" not in msg:
                return Answer(202)
        return await self.script(seen)

    async def _next(self, conn: h11.Connection, stream: trio.SocketStream) -> Any:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            return event

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            for _ in range(1000):
                request = await self._next(conn, stream)
                if not isinstance(request, h11.Request):
                    return
                body = bytearray()
                while isinstance(event := await self._next(conn, stream), h11.Data):
                    body += event.data
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                seen = Seen(request.method.decode(), headers, bytes(body), trio.current_time())
                self.seen.append(seen)
                answer = await self._answer(seen)
                if not await self._send(conn, stream, answer) or self.hang_up:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    @staticmethod
    async def _send(conn: h11.Connection, stream: trio.SocketStream, answer: Answer) -> bool:
        headers = list(answer.headers)
        if answer.chunks is None:
            headers.append(("content-length", str(len(answer.body))))
        else:
            headers.append(("content-type", "text/event-stream"))
        out = conn.send(h11.Response(status_code=answer.status, headers=headers)) or b""
        if answer.chunks is None:
            out += conn.send(h11.Data(data=answer.body)) or b"" if answer.body else b""
            out += conn.send(h11.EndOfMessage()) or b""
            await stream.send_all(out)
            return True
        await stream.send_all(out)
        for chunk in answer.chunks:
            await stream.send_all(conn.send(h11.Data(data=chunk)) or b"")
            await trio.sleep(0.005)
        if answer.cut:
            return False
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        return True


@asynccontextmanager
async def fake(script: Script, *, hang_up: bool = False) -> AsyncIterator[FakeServer]:
    server = FakeServer(script, hang_up=hang_up)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, server.serve, 0, host=HOST))
        server.url = f"http://{HOST}:{listeners[0].socket.getsockname()[1]}/mcp"
        yield server
        nursery.cancel_scope.cancel()


def sse_answer(*chunks: bytes, cut: bool = False) -> Answer:
    return Answer(200, [("mcp-session-id", "fake-session")], chunks=list(chunks), cut=cut)


# ---------------------------------------------------------------- fake: refusals and backoff
async def test_half_open_429_is_retried_after_retry_after_then_succeeds() -> None:
    async def script(seen: Seen) -> Answer:
        if len(server.calls()) <= 2:
            return refusal(429, "stream_half_open", retry_ms=200)
        return json_answer(result(seen.json()["id"], "finally"))

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url, retry=FAST) as s:
            trace = CallTrace()
            assert text_of(await s.call_tool("t", {}, trace=trace)) == "finally"
    calls = server.calls()
    assert len(calls) == 3
    assert {c.headers["idempotency-key"] for c in calls} == set(trace.idempotency_keys)
    assert len(trace.idempotency_keys) == 1  # the same request, re-sent
    assert all(isinstance(r, HalfOpenError) for r in trace.refusals) and len(trace.refusals) == 2
    assert all(c.headers["mcp-channel-token"] == "1.secret" for c in calls)
    gaps = [b.at - a.at for a, b in itertools.pairwise(calls)]
    assert all(gap >= 0.2 for gap in gaps), gaps  # never sooner than Retry-After


async def test_overload_gives_up_after_bounded_attempts() -> None:
    async def script(seen: Seen) -> Answer:
        return refusal(503, "store_unavailable", retry_ms=10)

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server:
            policy = RetryPolicy(max_attempts=2, base_delay=0.01)
            async with open_session(server.url, retry=policy) as s:
                with pytest.raises(Unavailable) as info:
                    await s.call_tool("t", {})
    assert info.value.status == 503 and info.value.retry_after == pytest.approx(0.01)
    assert len(server.calls()) == 3  # the first try plus two retries


async def test_in_progress_resends_the_same_key() -> None:
    async def script(seen: Seen) -> Answer:
        if len(server.calls()) == 1:
            return refusal(409, "in_progress", retry_ms=50)
        return json_answer(result(seen.json()["id"], "replayed"))

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url, retry=FAST) as s:
            assert text_of(await s.call_tool("t", {}, idempotency_key="K")) == "replayed"
    first, second = server.calls()
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == "K"
    assert first.json()["params"] == second.json()["params"]
    assert first.json()["id"] != second.json()["id"]


async def test_refusal_without_retry_is_typed() -> None:
    async def script(seen: Seen) -> Answer:
        return refusal(409, "cursor_unknown")

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url) as s:
            with pytest.raises(WeirError) as info:
                await s.call_tool("t", {})
    assert info.value.reason == "cursor_unknown" and type(info.value).__name__ == "CursorUnknown"
    assert len(server.calls()) == 1


# ---------------------------------------------------------------- fake: resumption (event ids)
async def test_stream_cut_twice_resumes_from_the_newest_cursor() -> None:
    progress = {"jsonrpc": "2.0", "method": "notifications/progress"}

    async def script(seen: Seen) -> Answer:
        if seen.method == "POST":
            server.rid = seen.json()["id"]
            note = {**progress, "params": {"progressToken": "x", "progress": 1}}
            return sse_answer(frame(0), frame(1, note), cut=True)  # the connection dies
        if len(server.gets()) == 1:  # replica r2 serves the first resume, then polls off
            note = {**progress, "params": {"progressToken": "x", "progress": 2}}
            return sse_answer(frame(2, note, "r2"), frame(3, note, "r2") + b"retry: 20\n\n")
        return sse_answer(frame(4, result(server.rid, "resumed"), "r3"))

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url, retry=FAST) as s:
            trace = CallTrace()
            assert text_of(await s.call_tool("t", {}, trace=trace)) == "resumed"
    # The second resume starts from the second cut, not from the first resume's cursor.
    assert [g.headers["last-event-id"] for g in server.gets()] == [f"{EPOCH}:1", f"{EPOCH}:3"]
    assert trace.resume_cursors == [f"{EPOCH}:1", f"{EPOCH}:3"]
    assert all(g.headers["mcp-channel-token"] == "1.secret" for g in server.gets())
    assert trace.observed_events == [
        ("r1", EPOCH, 0),
        ("r1", EPOCH, 1),
        ("r2", EPOCH, 2),
        ("r2", EPOCH, 3),
        ("r3", EPOCH, 4),
    ]
    assert len(server.calls()) == 1  # resumed, never re-sent


@pytest.mark.parametrize(
    ("resumed_id", "kind"),
    [
        (f"{EPOCH}:3", "a gap"),
        (f"{EPOCH}:1", "a repeat"),
        (f"{EPOCH}:0", "a decrease"),
        ("0000002b:2", "another epoch"),
        ("2", "namespace"),
    ],
)
async def test_a_resumed_stream_that_is_not_contiguous_raises(resumed_id: str, kind: str) -> None:
    async def script(seen: Seen) -> Answer:
        if seen.method == "POST":
            server.rid = seen.json()["id"]
            return sse_answer(frame(0), frame(1) + b"retry: 10\n\n")
        data = json.dumps(result(server.rid, "from somewhere else"))
        return sse_answer(f": replica=r9\nid: {resumed_id}\ndata: {data}\n\n".encode())

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url, retry=FAST) as s:
            with pytest.raises(StreamResumeViolation) as info:
                await s.call_tool("t", {})
    assert kind in info.value.message
    assert info.value.observed[:2] == [("r1", EPOCH, 0), ("r1", EPOCH, 1)]
    assert len(server.gets()) == 1 and len(server.calls()) == 1


async def test_connection_lost_before_any_event_reposts_with_the_same_key() -> None:
    async def script(seen: Seen) -> Answer:
        if len(server.calls()) == 1:
            return sse_answer(cut=True)  # headers, then nothing: no cursor to resume from
        return sse_answer(frame(0), frame(1, result(seen.json()["id"], "second try")))

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url, retry=FAST) as s:
            trace = CallTrace()
            assert text_of(await s.call_tool("t", {}, trace=trace)) == "second try"
    keys = [c.headers["idempotency-key"] for c in server.calls()]
    assert len(keys) == 2 and keys[0] == keys[1] and trace.reposts == 1


async def test_a_plain_request_is_not_reposted_after_a_lost_connection() -> None:
    async def script(seen: Seen) -> Answer:
        return sse_answer(cut=True)

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server, open_session(server.url, retry=FAST) as s:
            with pytest.raises(WeirError) as info:
                await s.request("resources/subscribe", {"uri": "x://y"})
    assert info.value.reason == "transport"
    posts = [r for r in server.seen if r.method == "POST" and "id" in r.json()]
    assert len(posts) == 2  # initialize and the one request, never re-sent


async def test_an_accepted_request_without_a_key_is_never_posted_again() -> None:
    # The POST was accepted (a stream with a cursor), the resume keeps being refused:
    # the refusal is raised; the request is not POSTed again (it has no key to dedup).
    async def script(seen: Seen) -> Answer:
        if seen.method == "POST":
            return sse_answer(frame(0) + b"retry: 10\n\n")
        return refusal(503, "store_unavailable", retry_ms=10)

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script) as server:
            policy = RetryPolicy(max_reconnects=2, base_delay=0.01)
            async with open_session(server.url, retry=policy) as s:
                with pytest.raises(Unavailable):
                    await s.request("resources/read", {"uri": "x://y"})
    posts = [r for r in server.seen if r.method == "POST" and "id" in r.json()]
    assert [p.json()["method"] for p in posts] == ["initialize", "resources/read"]
    assert len(server.gets()) == 3  # the first resume and two more


async def test_a_connection_closed_while_idle_is_replaced_transparently() -> None:
    async def script(seen: Seen) -> Answer:
        return json_answer(result(seen.json()["id"], "fine"))

    with trio.fail_after(TEST_TIMEOUT):
        async with fake(script, hang_up=True) as server, open_session(server.url) as s:
            for _ in range(3):
                await trio.sleep(0.05)  # let the server's close arrive first
                assert text_of(await s.call_tool("t", {})) == "fine"
    assert len(server.calls()) == 3  # each sent exactly once
    assert server.connections == s.connections_opened == len(server.seen)


# ---------------------------------------------------------------- the official SDK server
SDK_SERVER = """
import socket, sys
import uvicorn
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("sdk-under-test", log_level="WARNING")

@mcp.tool()
async def echo(text: str) -> str:
    '''Return the text unchanged.'''
    return text

@mcp.tool()
async def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

app = mcp.streamable_http_app(json_response=sys.argv[1] == "json", host="127.0.0.1")
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(64)
print(f"sdk: serving http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
"""


@asynccontextmanager
async def sdk_server(mode: str) -> AsyncIterator[str]:
    """The official SDK's Streamable HTTP server in a subprocess; yields its URL."""
    for module in ("mcp", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[sdk]')")
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", SDK_SERVER, mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while b"\n" not in line:
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, "the SDK server exited before serving"
                line += chunk
        yield line.decode().split("serving ", 1)[1].strip()
    finally:
        proc.terminate()
        with trio.move_on_after(10) as waited:
            await proc.wait()
        if waited.cancelled_caught:
            proc.kill()
            await proc.wait()


@pytest.mark.interop
@pytest.mark.parametrize("mode", ["sse", "json"])
async def test_plain_calls_against_the_official_sdk_server(mode: str) -> None:
    with trio.fail_after(60):
        async with sdk_server(mode) as url, open_session(url) as s:
            assert s.session_id and s.channel_token is None and not s.supports_rebind
            assert {t.name for t in await s.list_tools()} == {"echo", "add"}
            trace = CallTrace()
            assert text_of(await s.call_tool("echo", {"text": "hello"}, trace=trace)) == "hello"
            assert text_of(await s.call_tool("add", {"a": 2, "b": 3})) == "5"
            assert trace.observed_events == []  # no weir ids: nothing to check, nothing recorded
            missing = await s.call_tool("nope", {})
            assert missing.is_error is True
            assert s.connections_opened <= 2
