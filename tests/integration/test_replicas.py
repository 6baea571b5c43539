"""Fencing and event ids across replicas: several weir servers, one Valkey, a round-robin balancer.

Every test runs real :class:`weir.engine.Server` replicas in-process, each listening on its
own loopback port with its own :class:`~weir.engine._redis_store.RedisStore` connection to
the same ``valkey-server`` (the ``valkey_url`` fixture; ``private_valkey`` for the
outage test).  Clients never talk to a replica directly: they go through
:class:`Balancer`, written here, which opens a connection to the *next* replica in
rotation for every HTTP request (request-level round robin, no affinity at all), so
a client's POST, its answers and each of its resumptions land on different replicas
-- exactly the routing the fencing and event-id guarantees are about.  It names the
replica that served each response in an ``X-Upstream`` header, which is how the clients
prove that a resumption crossed replicas whatever the ``: replica=`` comment says (it names the
replica that *produced* an event, which a replay on another replica preserves).

Clock: real time (the store is a real process with real timeouts).  Every wait is
bounded, in time by ``trio.fail_after``/``move_on_after`` and in count by ``range``.

What is checked, and where
--------------------------
1. ``test_replicas_survive_kills_without_duplicates_or_gaps`` -- the incident weir exists for:
   5 sessions x 20 calls of a slow, non-idempotent tool (and of one that hangs up
   its stream early with ``ctx.close_stream``), retried by the clients with the same
   ``Idempotency-Key`` on every failure, while a chaos task kills replicas (cancelled
   run, or shutdown with no grace) and restarts them on the same port.  Zero
   duplicate executions, every stream contiguous in ``(epoch, seq)`` across
   reconnects (whichever replica serves the resumption, whatever ``: replica=``
   says), at least one resumption served by another replica, and -- checked last --
   every call answered, those a kill interrupted mid-call included (a JSON-RPC error
   counts as an answer; another execution would count as a duplicate).  Prints a
   one-line summary (run with ``-s`` to see it).
   ``test_a_call_interrupted_by_a_replica_kill_is_answered_once`` isolates the
   interrupted-call case: kill the replica running a call, retry on another one.
   ``test_a_kill_before_the_tool_starts_never_strands_the_key`` sweeps the kill
   across the instants between a call's arrival and its tool's start: the claimed
   key goes back, and the retry runs the call once.
2. ``test_bad_cursors_fail_closed_on_every_replica`` -- ``42`` is 400
   ``cursor_invalid``; an unknown epoch, a trimmed seq or one beyond the head is 409
   ``cursor_unknown``, on every replica; a good cursor resumes exactly after itself.
3. ``test_store_outage_fails_closed_and_forgets_sessions`` -- Valkey stops mid-run:
   503 ``store_unavailable`` with ``Retry-After``, nothing executes; Valkey comes
   back empty: old sessions are 404 (never resumed from head), a new one works,
   nothing ran twice.
4. ``test_sampling_answer_posted_to_another_replica_completes_the_call`` -- a tool on
   replica A asks the client (``sampling/createMessage``); the answer is POSTed
   through the balancer and lands on replica B, which relays it through the store.
5. ``test_sigkill_mid_call_is_answered_interrupted_on_every_replica`` -- a kill with
   no grace at all: three ``weir serve`` *processes*; the one running two calls gets
   SIGKILL.  Within the claim lease, a retry and a resume on each survivor get
   ``interrupted``; neither call runs again.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import secrets
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import pytest
import trio

from tests.integration.conftest import ValkeyProcess
from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import raw_request
from weir.engine import App, Context, Server, ServerConfig
from weir.engine._redis_store import RedisStore
from weir.engine._store_records import Retention
from weir.protocol import CreditLimits
from weir.protocol.sse import SseComment, SseDecoder, SseEvent

HOST = "127.0.0.1"
VERSION = "2025-11-25"
RECV = 65536

# The chaos run (test 1).
SESSIONS = 5
CALLS_PER_SESSION = 20
HANG_UP_EVERY = 4  # every 4th call uses the tool that closes its stream early
TOOL_STEP_SECONDS = 0.1  # the counting tool: 3 steps -> 0.3 s per execution
MAX_KILLS = 8
CALL_DEADLINE = 6.0  # one call, all its attempts (a normal call takes ~0.35 s)
MAX_ATTEMPTS = 60
IDLE_SECONDS = 2.0  # a response with no byte for this long is given up (and retried)

# Replicas: answer duplicates of running calls quickly, and end streams at once.
REPLICA_CONFIG: dict[str, Any] = {
    "in_progress_wait": 1.0,
    "retry_ms": 100,
    "shutdown_grace": 0.0,
}


# --------------------------------------------------------------------------- the app
@dataclass
class Ledger:
    """What the tools did, by idempotency key (the tools' ``key`` argument)."""

    executions: Counter[str] = field(default_factory=Counter)
    running: set[str] = field(default_factory=set)
    #: Executions cancelled mid-call (by a replica kill), and by which kind of kill.
    interrupted: dict[str, str] = field(default_factory=dict)
    #: Set by the chaos task while it kills a replica ("hard" or "graceful").
    killing: str = "-"


def make_app(ledger: Ledger) -> App:
    """Tools: a slow non-idempotent counter, one that hangs up early, a chatterbox, an asker."""
    app = App("replicas")

    @app.tool()
    async def charge(key: str, ctx: Context, steps: int = 3) -> str:
        """Non-idempotent: every execution counts (like payments.capture)."""
        ledger.executions[key] += 1
        ledger.running.add(key)
        try:
            for step in range(1, steps):
                await trio.sleep(TOOL_STEP_SECONDS)
                await ctx.report_progress(step, steps)
            await trio.sleep(TOOL_STEP_SECONDS)
        except trio.Cancelled:
            ledger.interrupted[key] = ledger.killing
            raise
        finally:
            ledger.running.discard(key)
        return f"charged {key} #{ledger.executions[key]}"

    @app.tool()
    async def charge_and_hang_up(key: str, ctx: Context) -> str:
        """Non-idempotent; ends its SSE connection early (``retry:``), then finishes."""
        ledger.executions[key] += 1
        ledger.running.add(key)
        try:
            await ctx.report_progress(1, 3)
            ctx.close_stream(retry_ms=20)
            await trio.sleep(TOOL_STEP_SECONDS)
            await ctx.report_progress(2, 3)
            await trio.sleep(TOOL_STEP_SECONDS)
        except trio.Cancelled:
            ledger.interrupted[key] = ledger.killing
            raise
        finally:
            ledger.running.discard(key)
        return f"charged {key} #{ledger.executions[key]}"

    @app.tool()
    async def chatter(key: str, count: int, ctx: Context) -> str:
        """Send ``count`` progress notifications, then answer."""
        ledger.executions[key] += 1
        for i in range(1, count + 1):
            await ctx.report_progress(i, count)
        return f"said {count}"

    @app.tool()
    async def announce(ctx: Context) -> str:
        """Announce that the tool list changed (heard by listeners on every replica)."""
        ctx.changed("tools")
        return "announced"

    @app.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Ask the client's model (a server-to-client request), return its answer."""
        reply = await ctx.sample(
            [{"role": "user", "content": {"type": "text", "text": question}}], max_tokens=5
        )
        content = reply.get("content", {})
        return f"the model said {content.get('text')!r}"

    return app


# ---------------------------------------------------------------------- replicas
@dataclass
class Replica:
    """One weir server process stand-in: start, kill (two ways), restart on the same port."""

    app: App
    replica_id: str
    store_url: str
    prefix: str
    config: dict[str, Any]
    retention: Retention | None = None
    port: int = 0
    server: Server | None = None
    scope: trio.CancelScope | None = None
    done: trio.Event | None = None
    starts: int = 0

    async def start(self, nursery: trio.Nursery) -> None:
        """Start on ``self.port`` (0 the first time: a free one, kept for restarts)."""
        store = await RedisStore.connect(
            self.store_url, prefix=self.prefix, retention=self.retention, timeout=0.5
        )
        config = ServerConfig(port=self.port, replica_id=self.replica_id, **self.config)
        server = Server(self.app, config, store=store)
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Server]) -> None:
            try:
                with scope:
                    await server.run(task_status=task_status)
            finally:
                with trio.CancelScope(shield=True):
                    for listener in server.listeners:
                        await listener.aclose()
                    await store.aclose()
                done.set()

        try:
            await nursery.start(run)
        except BaseException:
            with trio.CancelScope(shield=True):
                await store.aclose()
            raise
        self.server, self.scope, self.done = server, scope, done
        self.port = server.port
        self.starts += 1

    @property
    def up(self) -> bool:
        return self.done is not None and not self.done.is_set()

    async def restart(self, nursery: trio.Nursery) -> None:
        """Start again on the same port (which may linger for a moment after a kill)."""
        for _ in range(20):
            try:
                await self.start(nursery)
                break
            except OSError:
                await trio.sleep(0.05)
        assert self.up, f"{self.replica_id} did not come back on {self.port}"

    async def kill(self, *, hard: bool) -> None:
        """``hard``: cancel the server's run (a crash); else ``shutdown()`` with 0 s grace."""
        assert self.server is not None and self.scope is not None and self.done is not None
        if hard:
            self.scope.cancel()
        else:
            self.server.shutdown()
        with trio.fail_after(5):
            await self.done.wait()


@asynccontextmanager
async def replica_set(
    app: App,
    store_url: str,
    count: int,
    *,
    config: dict[str, Any] | None = None,
    retention: Retention | None = None,
) -> AsyncIterator[tuple[list[Replica], Balancer, trio.Nursery]]:
    """``count`` replicas sharing one store key prefix, behind a fresh :class:`Balancer`."""
    prefix = f"weir-replicas-{secrets.token_hex(4)}"
    cfg = {**REPLICA_CONFIG, **(config or {})}
    replicas = [Replica(app, f"r{i + 1}", store_url, prefix, cfg, retention) for i in range(count)]
    async with trio.open_nursery() as nursery:
        for replica in replicas:
            await replica.start(nursery)
        balancer = Balancer([r.port for r in replicas])
        await balancer.start(nursery)
        try:
            yield replicas, balancer, nursery
        finally:
            nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- the balancer
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade"}
)


@dataclass
class Routed:
    """One request the balancer handled: where it went and what came back."""

    method: str
    target: str
    port: int | None = None
    status: int | None = None
    complete: bool = False


class Balancer:
    """A round-robin HTTP/1.1 load balancer on Trio + h11, for tests.

    For **each request** it connects to the next replica in rotation (no affinity,
    not even per connection), forwards the request, and streams the response back as
    it arrives (SSE included) until the replica ends it or the client goes away,
    naming the replica that served it in an ``X-Upstream`` header (its port).  The
    rotation is global, but it never sends two consecutive requests of one client
    connection to the same replica (it skips ahead once instead): lockstep clients
    could otherwise keep landing where they were, and a resumption right after its
    POST is then guaranteed to cross replicas, as a load balancer may do.  A
    replica that refuses the connection is skipped (the next one is tried); if none
    accepts, or the chosen one fails before answering, the client gets 502.  If the
    replica breaks mid-response, the client connection is cut too (the client sees
    the response truncated, as behind any real proxy).
    """

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.port = 0
        self.log: list[Routed] = []
        self.failovers = 0  # connections refused by a replica that was down
        self.bad_gateways = 0
        self._turn = 0

    async def start(self, nursery: trio.Nursery) -> None:
        listeners: list[trio.SocketListener] = await nursery.start(
            partial(trio.serve_tcp, self._client, 0, host=HOST)
        )
        self.port = int(listeners[0].socket.getsockname()[1])

    async def _client(self, client: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        last: list[int] = []  # the replica port of this connection's previous request
        try:
            for _ in range(10_000):
                got = await self._read_request(client, conn)
                if got is None:
                    return
                if not await self._forward(client, conn, *got, last):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    @staticmethod
    async def _read_request(
        client: trio.SocketStream, conn: h11.Connection
    ) -> tuple[h11.Request, bytes] | None:
        request: h11.Request | None = None
        body = bytearray()
        for _ in range(100_000):
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = b""
                with trio.move_on_after(30):
                    data = bytes(await client.receive_some(RECV))
                if not data:
                    return None
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                return request, bytes(body)
            else:
                return None
        return None

    async def _forward(
        self,
        client: trio.SocketStream,
        conn: h11.Connection,
        request: h11.Request,
        body: bytes,
        last: list[int],
    ) -> bool:
        """Send ``request`` to the next replica that accepts; False: cut the client."""
        routed = Routed(request.method.decode(), request.target.decode())
        self.log.append(routed)
        if self.ports[self._turn % len(self.ports)] in last[-1:]:
            self._turn += 1  # never twice in a row to one replica for one connection
        for _ in range(len(self.ports)):
            port = self.ports[self._turn % len(self.ports)]
            self._turn += 1
            try:
                upstream = await trio.open_tcp_stream(HOST, port)
            except OSError:
                self.failovers += 1
                continue
            routed.port = port
            last[:] = [port]
            async with upstream:
                return await self._relay(client, conn, upstream, request, body, routed)
        await self._bad_gateway(client, conn, routed, "no replica accepted the connection")
        return True

    async def _bad_gateway(
        self, client: trio.SocketStream, conn: h11.Connection, routed: Routed, why: str
    ) -> None:
        self.bad_gateways += 1
        routed.status = 502
        body = why.encode()
        head = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        data = conn.send(h11.Response(status_code=502, headers=head)) or b""
        data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await client.send_all(data)

    async def _relay(
        self,
        client: trio.SocketStream,
        conn: h11.Connection,
        upstream: trio.SocketStream,
        request: h11.Request,
        body: bytes,
        routed: Routed,
    ) -> bool:
        up = h11.Connection(h11.CLIENT)
        skip = _HOP_BY_HOP | {b"content-length", b"transfer-encoding"}
        headers = [(k, v) for k, v in request.headers if k.lower() not in skip]
        if body or request.method in (b"POST", b"PUT"):
            headers.append((b"content-length", str(len(body)).encode()))
        out = up.send(h11.Request(method=request.method, target=request.target, headers=headers))
        out = out or b""
        if body:
            out += up.send(h11.Data(data=body)) or b""
        out += up.send(h11.EndOfMessage()) or b""
        try:
            await upstream.send_all(out)
            response = await _next_event(upstream, up)
            while isinstance(response, h11.InformationalResponse):
                response = await _next_event(upstream, up)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            response = None
        if not isinstance(response, h11.Response):
            await self._bad_gateway(client, conn, routed, "the replica failed before answering")
            return True
        routed.status = response.status_code
        head = [
            (k, v)
            for k, v in response.headers
            if k.lower() not in _HOP_BY_HOP and k.lower() != b"transfer-encoding"
        ]
        head.append((b"x-upstream", str(routed.port).encode()))  # like X-Served-By
        await client.send_all(
            conn.send(h11.Response(status_code=response.status_code, headers=head)) or b""
        )
        routed.complete = await self._pump(client, conn, upstream, up)
        return routed.complete

    @staticmethod
    async def _pump(
        client: trio.SocketStream,
        conn: h11.Connection,
        upstream: trio.SocketStream,
        up: h11.Connection,
    ) -> bool:
        """Copy the response body as it comes; stop when either side goes away."""
        ended = False

        async def watch_client(cancel: trio.CancelScope) -> None:
            try:
                data = bytes(await client.receive_some(RECV))
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if data:
                conn.receive_data(data)  # the client's next request: read after this one
                return
            cancel.cancel()  # the client went away: drop the replica's response too

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_client, nursery.cancel_scope)
            try:
                for _ in range(1_000_000):
                    event = await _next_event(upstream, up)
                    if isinstance(event, h11.Data):
                        await client.send_all(conn.send(h11.Data(data=event.data)) or b"")
                    elif isinstance(event, h11.EndOfMessage):
                        await client.send_all(conn.send(h11.EndOfMessage()) or b"")
                        ended = True
                        break
                    else:
                        break
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                pass
            nursery.cancel_scope.cancel()
        return ended


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> h11.Event:
    for _ in range(1_000_000):
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(RECV)))
            continue
        assert not isinstance(event, type), event  # PAUSED
        return event
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------- the client
class Dropped(Exception):
    """The connection broke, or went quiet, before the response ended."""


@dataclass
class Answer:
    """A response head (and, once read, its body)."""

    status: int
    headers: dict[str, str]
    body: bytes = b""

    @property
    def sse(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def reason(self) -> str | None:
        try:
            data = self.json().get("error", {}).get("data") or {}
        except (ValueError, AttributeError):
            return None
        reason = data.get("reason") if isinstance(data, dict) else None
        return str(reason) if reason is not None else None


@dataclass
class Seen:
    """One SSE event, with the replica its ``: replica=`` comment named."""

    event: SseEvent
    replica: str | None


class Peer:
    """An MCP client's HTTP/1.1 connection to the balancer, reopened after any failure."""

    def __init__(self, port: int, session_id: str | None = None) -> None:
        self.port = port
        self.session_id = session_id
        self._stream: trio.SocketStream | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self._decoder = SseDecoder()
        self._items: deque[Seen] = deque()
        self._replica: str | None = None
        self._ended = True

    async def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _event(self) -> h11.Event:
        assert self._stream is not None
        try:
            for _ in range(1_000_000):
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    data = None
                    with trio.move_on_after(IDLE_SECONDS):
                        data = bytes(await self._stream.receive_some(RECV))
                    if data is None:
                        raise Dropped(f"nothing received for {IDLE_SECONDS} s")
                    self._conn.receive_data(data)
                    continue
                if isinstance(event, h11.ConnectionClosed | type):
                    raise Dropped("connection closed")
                return event
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise Dropped(repr(exc)) from exc
        except h11.ProtocolError as exc:
            raise Dropped(repr(exc)) from exc
        raise AssertionError("unreachable")

    async def start(
        self, method: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        """Send one request and read the response head.

        Raises:
            Dropped: the connection failed (it is closed; the next call reopens one).
        """
        try:
            if self._stream is None or self._conn.our_state is not h11.IDLE:
                await self.close()
                self._stream = await trio.open_tcp_stream(HOST, self.port)
                self._conn = h11.Connection(h11.CLIENT)
            hdrs = {
                "host": f"{HOST}:{self.port}",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": VERSION,
            }
            if self.session_id:
                hdrs["mcp-session-id"] = self.session_id
            if body is not None:
                hdrs["content-type"] = "application/json"
                hdrs["content-length"] = str(len(body))
            hdrs.update(headers or {})
            req = h11.Request(method=method, target="/mcp", headers=list(hdrs.items()))
            data = self._conn.send(req) or b""
            if body:
                data += self._conn.send(h11.Data(data=body)) or b""
            data += self._conn.send(h11.EndOfMessage()) or b""
            await self._stream.send_all(data)
            event = await self._event()
            while isinstance(event, h11.InformationalResponse):
                event = await self._event()
            assert isinstance(event, h11.Response), event
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            await self.close()
            raise Dropped("could not send") from None
        except Dropped:
            await self.close()
            raise
        answer = Answer(
            event.status_code, {k.decode().lower(): v.decode() for k, v in event.headers}
        )
        self._decoder, self._items, self._replica, self._ended = SseDecoder(), deque(), None, False
        if not answer.sse:
            answer.body = await self._body()
        return answer

    async def _body(self) -> bytes:
        parts = bytearray()
        try:
            for _ in range(1_000_000):
                event = await self._event()
                if isinstance(event, h11.Data):
                    parts += event.data
                elif isinstance(event, h11.EndOfMessage):
                    self._finish_cycle()
                    return bytes(parts)
        except Dropped:
            await self.close()
            raise
        raise AssertionError("unreachable")

    def _finish_cycle(self) -> None:
        self._ended = True
        if self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE:
            self._conn.start_next_cycle()

    async def next_seen(self) -> Seen | None:
        """The next SSE event of the response being read; None at its end.

        Raises:
            Dropped: the connection broke or went quiet (it is closed).
        """
        try:
            while not self._items:
                if self._ended:
                    return None
                event = await self._event()
                if isinstance(event, h11.Data):
                    for item in self._decoder.feed(bytes(event.data)):
                        if isinstance(item, SseComment) and item.text.startswith("replica="):
                            self._replica = item.text.removeprefix("replica=")
                        elif isinstance(item, SseEvent):
                            self._items.append(Seen(item, self._replica))
                            self._replica = None
                elif isinstance(event, h11.EndOfMessage):
                    self._finish_cycle()
            return self._items.popleft()
        except Dropped:
            await self.close()
            raise

    async def post(self, message: Any, headers: dict[str, str] | None = None) -> Answer:
        return await self.start("POST", json.dumps(message).encode(), headers)

    async def initialize(self) -> None:
        """``initialize`` + ``notifications/initialized`` (retried through outages, bounded)."""
        msg = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": VERSION,
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "replicas-test", "version": "1"},
            },
        }
        self.session_id = None
        for _ in range(50):
            try:
                answer = await self.post(msg)
            except Dropped:
                await trio.sleep(0.05)
                continue
            if answer.status == 200:
                self.session_id = answer.headers["mcp-session-id"]
                break
            assert answer.status in (502, 503), (answer.status, answer.body)
            await trio.sleep(0.05)
        assert self.session_id is not None, "initialize never succeeded"
        for _ in range(50):
            try:
                ack = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
            except Dropped:
                await trio.sleep(0.05)
                continue
            if ack.status == 202:
                return
            assert ack.status in (502, 503), (ack.status, ack.body)
            await trio.sleep(0.05)
        raise AssertionError("notifications/initialized never accepted")


def parse_id(raw: str | None) -> tuple[str, int] | None:
    if raw is None:
        return None
    epoch, _, seq = raw.partition(":")
    return (epoch, int(seq)) if seq.isdigit() else None


def retry_after(answer: Answer, cap: float = 0.2) -> float:
    try:
        data = answer.json().get("error", {}).get("data") or {}
        ms = float(data.get("retryAfterMs", 100))
    except (ValueError, AttributeError, TypeError):
        ms = 100.0
    return min(cap, ms / 1000)


# ---------------------------------------------------------------- calls with retries
@dataclass
class Tally:
    """What the clients saw (test 1)."""

    calls: int = 0
    delivered: int = 0
    error_results: int = 0
    attempts: int = 0
    resumes: int = 0
    #: Resumptions served by another replica than the one the cursor was read from.
    cross_replica_resumes: int = 0
    #: ... of which the ``: replica=`` comment changed at the resumption point.
    cross_resumes_comment_changed: int = 0
    #: Consecutive events of one stream whose ``: replica=`` comments differ.
    replica_changes: int = 0
    events: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    gaps: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    undelivered: list[str] = field(default_factory=list)


async def call_until_answered(
    peer: Peer, tally: Tally, rid: int, tool: str, key: str, deadline: float = CALL_DEADLINE
) -> dict[str, Any] | None:
    """One ``tools/call``, retried until answered (bounded): same request, same key.

    On a dropped connection, a 5xx, a 409 ``in_progress`` or a stream that ended without
    the response, re-send the same POST with the same ``Idempotency-Key`` -- or, when a
    cursor is held, resume with GET + ``Last-Event-ID``.  Every event read is checked
    for contiguity: within one stream ``(epoch, seq)`` goes up by exactly 1, across a
    resumption too, whatever replica serves it.
    """
    tally.calls += 1
    body = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"key": key}, "_meta": {"progressToken": key}},
    }
    post_headers = {"idempotency-key": key}
    cursor: tuple[str, int] | None = None  # the newest event seen on the current stream
    cursor_replica: str | None = None  # its ": replica=" comment
    cursor_served: str | None = None  # the replica (port) whose response carried it
    epochs: set[str] = set()
    history: list[str] = []
    with trio.move_on_after(deadline):
        for _ in range(MAX_ATTEMPTS):
            tally.attempts += 1
            resuming = cursor is not None
            try:
                if cursor is not None:
                    tally.resumes += 1
                    answer = await peer.start(
                        "GET",
                        headers={
                            "accept": "text/event-stream",
                            "last-event-id": f"{cursor[0]}:{cursor[1]}",
                        },
                    )
                else:
                    answer = await peer.post(body, post_headers)
            except Dropped:
                history.append("drop-before-head")
                tally.statuses["dropped"] += 1
                await trio.sleep(0.02)
                continue
            label = f"{'GET' if resuming else 'POST'} {answer.status}"
            if answer.reason:
                label += f" {answer.reason}"
            history.append(label)
            tally.statuses[label] += 1
            if not answer.sse:
                if answer.status == 409 and answer.reason == "in_progress":
                    await trio.sleep(retry_after(answer))
                    continue
                if answer.status in (502, 503):
                    await trio.sleep(retry_after(answer, 0.1))
                    continue
                if answer.status == 200:  # a plain JSON answer (not expected here)
                    msg = answer.json()
                    if msg.get("id") == rid:
                        return _delivered(tally, msg)
                tally.anomalies.append(f"{key}: {label}: {answer.body[:200]!r}")
                if answer.status == 404:
                    break
                cursor = None  # anything else on a resume: fall back to the gate
                continue
            # An SSE stream: read it, checking contiguity event by event.
            served = answer.headers.get("x-upstream")
            first = True
            fresh = 0
            try:
                for _ in range(10_000):
                    seen = await peer.next_seen()
                    if seen is None:
                        break
                    tally.events += 1
                    eid = parse_id(seen.event.id)
                    if eid is None:
                        tally.gaps.append(f"{key}: event without an epoch:seq id: {seen.event}")
                        continue
                    if first and not resuming:
                        if eid[0] in epochs or eid[1] != 0:
                            tally.gaps.append(f"{key}: new stream began at {eid} (seen {epochs})")
                    else:
                        assert cursor is not None
                        if eid != (cursor[0], cursor[1] + 1):
                            tally.gaps.append(
                                f"{key}: {eid[0]}:{eid[1]} after {cursor[0]}:{cursor[1]}"
                                f"{' (first event of a resumption)' if first else ''}"
                            )
                        changed = seen.replica != cursor_replica
                        tally.replica_changes += changed
                        if first and served != cursor_served:
                            tally.cross_replica_resumes += 1
                            tally.cross_resumes_comment_changed += changed
                    if seen.replica is None:
                        tally.gaps.append(f"{key}: {eid} came without a ': replica=' comment")
                    first = False
                    fresh += 1
                    epochs.add(eid[0])
                    cursor, cursor_replica, cursor_served = eid, seen.replica, served
                    if seen.event.data:
                        msg = json.loads(seen.event.data)
                        if msg.get("id") == rid and ("result" in msg or "error" in msg):
                            await _drain_after_final(peer, tally, key)
                            return _delivered(tally, msg)
            except Dropped:
                history.append(f"drop-mid-stream after {fresh} events")
                tally.statuses["dropped mid-stream"] += 1
                if resuming and not fresh:
                    # A resumption that went quiet: ask the idempotency gate instead.
                    cursor = None
            await trio.sleep(0.02)
    tally.undelivered.append(f"{key}: {' | '.join(history[-8:])} ({len(history)} attempts)")
    await peer.close()
    return None


def _delivered(tally: Tally, msg: dict[str, Any]) -> dict[str, Any]:
    tally.delivered += 1
    if "error" in msg or msg.get("result", {}).get("isError"):
        tally.error_results += 1
    return msg


async def _drain_after_final(peer: Peer, tally: Tally, key: str) -> None:
    """After the final response the stream must end with nothing more on it."""
    try:
        with trio.move_on_after(IDLE_SECONDS):
            extra = await peer.next_seen()
            if extra is not None:
                tally.gaps.append(f"{key}: event after the final response: {extra.event}")
    except Dropped:
        pass


# ------------------------------------------------------------------------ test 1
async def test_replicas_survive_kills_without_duplicates_or_gaps(valkey_url: str) -> None:
    ledger = Ledger()
    tally = Tally()
    seed = secrets.randbits(32)
    rng = random.Random(seed)
    kills: Counter[str] = Counter()
    keys: list[str] = []
    run = secrets.token_hex(3)

    async with replica_set(make_app(ledger), valkey_url, 3) as (replicas, balancer, nursery):

        async def chaos(stop: trio.Event) -> None:
            for i in range(MAX_KILLS):
                with trio.move_on_after(rng.uniform(0.3, 0.8)):
                    await stop.wait()
                if stop.is_set():
                    return
                victim = rng.choice(replicas)
                hard = i % 2 == 0
                ledger.killing = f"{'hard' if hard else 'graceful'} kill of {victim.replica_id}"
                await victim.kill(hard=hard)
                ledger.killing = "-"
                kills["hard" if hard else "graceful"] += 1
                await trio.sleep(rng.uniform(0.15, 0.4))
                await victim.restart(nursery)

        async def session(n: int) -> None:
            peer = Peer(balancer.port)
            with trio.fail_after(10):
                await peer.initialize()
            for i in range(CALLS_PER_SESSION):
                key = f"{run}-s{n}-c{i}"
                keys.append(key)
                tool = "charge_and_hang_up" if i % HANG_UP_EVERY == HANG_UP_EVERY - 1 else "charge"
                await call_until_answered(peer, tally, i + 1, tool, key)
                await trio.sleep(rng.uniform(0, 0.05))  # no lockstep between sessions
            await peer.close()

        with trio.fail_after(45):
            stop = trio.Event()
            async with trio.open_nursery() as work:
                work.start_soon(chaos, stop)
                async with trio.open_nursery() as clients:
                    for n in range(SESSIONS):
                        clients.start_soon(session, n)
                stop.set()

    restarts = sum(r.starts - 1 for r in replicas)
    executions = sum(ledger.executions[k] for k in keys)
    duplicates = sum(max(0, ledger.executions[k] - 1) for k in keys)
    never_ran = [k for k in keys if ledger.executions[k] == 0]
    summary = (
        f"replicas: calls={tally.calls} delivered={tally.delivered} "
        f"(errors={tally.error_results}) restarts={restarts} "
        f"interrupted_mid_call={len(ledger.interrupted)} "
        f"(kills: {kills['hard']} hard, {kills['graceful']} graceful) "
        f"executions={executions} distinct_keys={len(set(keys))} duplicates={duplicates} "
        f"gaps={len(tally.gaps)} cross_replica_resumes={tally.cross_replica_resumes} "
        f"(replica comment changed on {tally.cross_resumes_comment_changed}) "
        f"resumes={tally.resumes} replica_changes={tally.replica_changes} "
        f"attempts={tally.attempts} events={tally.events} "
        f"502s={balancer.bad_gateways} failovers={balancer.failovers} seed={seed}"
    )
    print(summary)
    print("statuses:", dict(tally.statuses.most_common()))
    interrupted = [f"{k} (interrupted by the {how})" for k, how in ledger.interrupted.items()]
    interrupted += [f"{k} never executed" for k in never_ran]
    details = "\n".join(
        [
            summary,
            *tally.undelivered[:12],
            *interrupted[:12],
            *tally.gaps[:10],
            *tally.anomalies[:10],
        ]
    )
    assert restarts >= 3, details
    assert duplicates == 0, (
        details + "\n" + str({k: ledger.executions[k] for k in keys if ledger.executions[k] > 1})
    )
    assert not tally.gaps, details
    assert not tally.anomalies, details
    assert tally.cross_replica_resumes >= 1, details
    # Liveness last: every call is answered, including those a kill interrupted.
    assert not tally.undelivered, details
    assert not never_ran, details
    assert executions == len(set(keys)), details
    assert tally.delivered == len(keys) == SESSIONS * CALLS_PER_SESSION, details


@pytest.mark.parametrize("hard", [True, False], ids=["cancelled-run", "shutdown-no-grace"])
async def test_a_call_interrupted_by_a_replica_kill_is_answered_once(
    valkey_url: str, hard: bool
) -> None:
    """Test 1's interrupted calls, alone: the replica running a call dies mid-call.

    The retry (same request, same key) lands on the surviving replica.  At most once:
    the tool must not run again.  Liveness: the retry must get *an* answer (the
    stored result, or an error saying the call was interrupted) -- not 409
    ``in_progress`` until the claim expires (``Retention.ttl``, an hour by default).
    """
    ledger = Ledger()
    async with replica_set(make_app(ledger), valkey_url, 2) as (replicas, balancer, _):
        by_port = {str(r.port): r for r in replicas}
        with trio.fail_after(20):
            peer = Peer(balancer.port)
            await peer.initialize()
            key = f"interrupted-{secrets.token_hex(3)}"
            msg = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "charge",
                    "arguments": {"key": key},
                    "_meta": {"progressToken": key},
                },
            }
            answer = await peer.post(msg, {"idempotency-key": key})
            assert answer.status == 200 and answer.sse, (answer.status, answer.body)
            first = await peer.next_seen()  # the priming event: the tool is running
            assert first is not None and key in ledger.running
            victim = by_port[answer.headers["x-upstream"]]
            ledger.killing = "hard kill" if hard else "graceful kill"
            await victim.kill(hard=hard)
            assert ledger.interrupted == {key: ledger.killing}
            await peer.close()
            tally = Tally()
            result = await call_until_answered(peer, tally, 1, "charge", key, deadline=4.0)
    assert ledger.executions[key] == 1, ledger  # at most once: never re-executed
    assert result is not None, (
        f"the interrupted call was never answered: {tally.undelivered} "
        f"(statuses {dict(tally.statuses)})"
    )


KILL_INSTANTS = [i * 0.003 for i in range(12)]  # 0 .. 33 ms after the POST is sent


async def _post_ignoring_drops(peer: Peer, msg: dict[str, Any], key: str) -> None:
    with contextlib.suppress(Dropped):
        await peer.post(msg, {"idempotency-key": key})


async def test_a_kill_before_the_tool_starts_never_strands_the_key(valkey_url: str) -> None:
    """A replica cancelled at any instant between a call's arrival and its tool's start.

    Claiming the key is a store round trip, then the priming event goes out, then
    the tool runs: a kill in between must give the key back (nothing ran), so the
    retry on the restarted replica runs it -- once.  A stranded claim would hold
    every retry at 409 ``in_progress`` for the whole claim lease (15 s), far past
    this test's 4 s per call; a claim answered ``interrupted`` although the tool
    never ran would leave the call never executed.  The kill instants sweep that
    window in 3 ms steps; whichever instant lands where, the invariant is the same.
    """
    ledger = Ledger()
    async with replica_set(make_app(ledger), valkey_url, 1) as (replicas, balancer, nursery):
        (victim,) = replicas
        peer = Peer(balancer.port)
        with trio.fail_after(10):
            await peer.initialize()
        for n, instant in enumerate(KILL_INSTANTS):
            key = f"early-kill-{n}-{secrets.token_hex(3)}"
            msg = {
                "jsonrpc": "2.0",
                "id": n + 1,
                "method": "tools/call",
                # The body call_until_answered re-sends (same fingerprint).
                "params": {
                    "name": "charge",
                    "arguments": {"key": key},
                    "_meta": {"progressToken": key},
                },
            }
            with trio.fail_after(10):
                async with trio.open_nursery() as race:
                    race.start_soon(_post_ignoring_drops, peer, msg, key)
                    await trio.sleep(instant)
                    ledger.killing = "early kill"
                    await victim.kill(hard=True)
                    race.cancel_scope.cancel()
                await peer.close()
                await victim.restart(nursery)
            tally = Tally()
            result = await call_until_answered(peer, tally, n + 1, "charge", key, deadline=4.0)
            assert result is not None, (instant, tally.undelivered, dict(tally.statuses))
            assert ledger.executions[key] == 1, (instant, ledger.executions[key], result)
            if key not in ledger.interrupted:
                assert "result" in result, (instant, result)


# ------------------------------------------------------------------------ test 2
async def _one_call(peer: Peer, rid: int, tool: str, arguments: dict[str, Any]) -> list[Seen]:
    """A tools/call read to the end; every event (with its replica)."""
    msg = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": {"progressToken": rid}},
    }
    answer = await peer.post(msg, {"idempotency-key": f"{arguments.get('key', '')}-{rid}"})
    assert answer.status == 200 and answer.sse, (answer.status, answer.body)
    seen: list[Seen] = []
    for _ in range(10_000):
        item = await peer.next_seen()
        if item is None:
            break
        seen.append(item)
    return seen


async def _resume(peer: Peer, cursor: str) -> tuple[Answer, list[Seen]]:
    answer = await peer.start(
        "GET", headers={"accept": "text/event-stream", "last-event-id": cursor}
    )
    seen: list[Seen] = []
    if answer.sse:
        for _ in range(10_000):
            item = await peer.next_seen()
            if item is None:
                break
            seen.append(item)
    return answer, seen


async def test_bad_cursors_fail_closed_on_every_replica(valkey_url: str) -> None:
    """400 ``cursor_invalid`` / 409 ``cursor_unknown`` on every replica; never from head."""
    ledger = Ledger()
    # Small local logs and store logs, so a long stream really loses its oldest events.
    config = {"credit": CreditLimits(frames=32), "max_stream_events": 32}
    retention = Retention(events_per_stream=16)
    async with replica_set(make_app(ledger), valkey_url, 3, config=config, retention=retention) as (
        replicas,
        balancer,
        _,
    ):
        ports = {r.port: r.replica_id for r in replicas}
        with trio.fail_after(20):
            peer = Peer(balancer.port)
            await peer.initialize()
            events = await _one_call(peer, 1, "chatter", {"key": "long", "count": 300})
            epoch = (events[0].event.id or "").partition(":")[0]
            ids = [parse_id(s.event.id) for s in events]
            assert ids == [(epoch, n) for n in range(302)], ids[:5]  # priming, 300, response
            short = await _one_call(peer, 2, "charge", {"key": "short", "steps": 3})
            short_epoch = (short[0].event.id or "").partition(":")[0]
            assert len(short) == 4, short  # priming, 2 progress, the response

            def routed_since(mark: int) -> set[str]:
                return {ports[r.port] for r in balancer.log[mark:] if r.port in ports}

            cases = [
                ("42", 400, "cursor_invalid"),  # a per-process counter (event ids)
                ("ffffff00:1", 409, "cursor_unknown"),  # an epoch this session never had
                (f"{epoch}:5", 409, "cursor_unknown"),  # trimmed from every log
                (f"{short_epoch}:99", 409, "cursor_unknown"),  # beyond the stream's head
            ]
            for cursor, status, reason in cases:
                mark = len(balancer.log)
                for _ in range(len(replicas)):
                    answer, seen = await _resume(peer, cursor)
                    assert (answer.status, answer.reason) == (status, reason), (
                        cursor,
                        answer.status,
                        answer.body,
                        [s.event for s in seen][:3],
                    )
                    assert not answer.sse and not seen
                assert routed_since(mark) == set(ports.values()), (cursor, balancer.log[mark:])

            # A good cursor on the same streams resumes exactly after itself, everywhere.
            mark = len(balancer.log)
            for _ in range(len(replicas)):
                answer, seen = await _resume(peer, f"{short_epoch}:1")
                assert answer.status == 200, (answer.status, answer.body)
                got = [parse_id(s.event.id) for s in seen]
                assert got == [(short_epoch, 2), (short_epoch, 3)], got
                assert json.loads(seen[-1].event.data)["id"] == 2
            assert routed_since(mark) == set(ports.values())
            await peer.close()
    assert ledger.executions == Counter({"long": 1, "short": 1})


# ------------------------------------------------------------------------ test 3
def _refused(answer: Answer, status: int, reason: str) -> bool:
    return answer.status == status and answer.reason == reason


async def test_store_outage_fails_closed_and_forgets_sessions(
    private_valkey: ValkeyProcess,
) -> None:
    """Valkey stops: 503 store_unavailable, nothing runs; it returns empty: 404, fresh works."""
    ledger = Ledger()
    async with replica_set(make_app(ledger), private_valkey.url, 2) as (_, balancer, _):
        with trio.fail_after(40):
            peer = Peer(balancer.port)
            await peer.initialize()
            tally = Tally()
            first = await call_until_answered(peer, tally, 1, "charge", "before")
            assert first is not None and "result" in first, tally
            old_sid = peer.session_id

            # A call in flight when the store goes away: its next event cannot be
            # stored, so it is never sent (it waits, bounded, for the store to return).
            live = await peer.post(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {
                        "name": "charge",
                        "arguments": {"key": "in-flight", "steps": 8},
                        "_meta": {"progressToken": 2},
                    },
                },
                {"idempotency-key": "in-flight"},
            )
            assert live.status == 200 and live.sse
            seen = [await peer.next_seen()]  # the priming event: the call is running
            await trio.to_thread.run_sync(private_valkey.stop)
            before_outage = Counter(ledger.executions)
            try:
                for _ in range(100):
                    item = await peer.next_seen()
                    if item is None:
                        break
                    seen.append(item)
            except Dropped:
                pass
            assert not any(s is not None and '"result"' in s.event.data for s in seen), (
                "a response that could not be stored reached the wire"
            )

            # While the store is down: every request fails closed, on every replica.
            call = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "charge", "arguments": {"key": "during"}},
            }
            for _ in range(4):
                answer = await peer.post(call, {"idempotency-key": "during"})
                assert _refused(answer, 503, "store_unavailable"), (answer.status, answer.body)
                assert answer.headers.get("retry-after", "").isdigit(), answer.headers
            listing = await peer.post({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
            assert _refused(listing, 503, "store_unavailable"), (listing.status, listing.body)
            resume, _ = await _resume(peer, "00000001:0")
            assert _refused(resume, 503, "store_unavailable"), (resume.status, resume.body)
            assert listing.headers.get("retry-after") and resume.headers.get("retry-after")
            fresh = Peer(balancer.port)
            init = await fresh.post(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"},
                    },
                }
            )
            assert _refused(init, 503, "store_unavailable"), (init.status, init.body)
            assert ledger.executions == before_outage, "a tool ran while the store was down"

            # The store comes back empty (no persistence): old sessions are gone.
            await trio.to_thread.run_sync(private_valkey.start)
            gone: list[Answer] = []
            for _ in range(3):
                for _ in range(20):  # the first command on a broken pool may still 503
                    answer = await peer.post(call, {"idempotency-key": "during"})
                    if answer.status != 503:
                        break
                    await trio.sleep(0.05)
                gone.append(answer)
            assert all(_refused(a, 404, "session_not_found") for a in gone), [
                (a.status, a.body) for a in gone
            ]
            # The in-flight call's next event waited for the store (a failover would
            # have let it through); the store came back without its session, so it
            # ended there, never sent.
            while ledger.running:
                await trio.sleep(0.05)
            resume, seen_after = await _resume(peer, "00000002:0")
            assert _refused(resume, 404, "session_not_found"), (resume.status, resume.body)
            assert not seen_after

            # A new session works; nothing ran twice, "during" never ran.
            await peer.initialize()
            assert peer.session_id != old_sid
            after = await call_until_answered(peer, tally, 1, "charge", "after")
            assert after is not None and "result" in after, tally
            await peer.close()
            await fresh.close()
    assert ledger.executions == Counter({"before": 1, "in-flight": 1, "after": 1}), ledger


# ------------------------------------------------------------------------ test 4
async def test_sampling_answer_posted_to_another_replica_completes_the_call(
    valkey_url: str,
) -> None:
    ledger = Ledger()
    async with replica_set(make_app(ledger), valkey_url, 3) as (replicas, balancer, _):
        ports = {r.port: r.replica_id for r in replicas}
        with trio.fail_after(15):
            peer = Peer(balancer.port)
            await peer.initialize()
            answers = Peer(balancer.port, peer.session_id)  # a second connection
            mark = len(balancer.log)
            stream = await peer.post(
                {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "tools/call",
                    "params": {"name": "ask", "arguments": {"question": "6 x 7?"}},
                }
            )
            assert stream.status == 200 and stream.sse, (stream.status, stream.body)
            call_port = balancer.log[mark].port
            assert call_port is not None and call_port in ports
            request: dict[str, Any] | None = None
            producer: str | None = None
            result: dict[str, Any] | None = None
            answer_port: int | None = None
            for _ in range(20):
                seen = await peer.next_seen()
                assert seen is not None, "the stream ended without the response"
                if not seen.event.data:
                    continue
                msg = json.loads(seen.event.data)
                if msg.get("method") == "sampling/createMessage":
                    request, producer = msg, seen.replica
                    mark = len(balancer.log)
                    reply = await answers.post(
                        {
                            "jsonrpc": "2.0",
                            "id": msg["id"],
                            "result": {
                                "role": "assistant",
                                "content": {"type": "text", "text": "42"},
                                "model": "test-model",
                            },
                        }
                    )
                    assert reply.status == 202, (reply.status, reply.body)
                    answer_port = balancer.log[mark].port
                elif msg.get("id") == 7:
                    result = msg
                    break
            assert request is not None and result is not None, (request, result)
            assert producer == ports[call_port], (producer, ports, call_port)
            assert answer_port is not None and answer_port != call_port, (
                "the balancer sent the answer to the same replica"
            )
            assert result["result"]["content"][0]["text"] == "the model said '42'", result
            print(
                f"sampling: tool on {ports[call_port]}, answer POSTed to {ports[answer_port]}, "
                "relayed through the store"
            )
            await peer.close()
            await answers.close()


# ------------------------------------------------------------------------ test 5
async def test_sigkill_mid_call_is_answered_interrupted_on_every_replica(
    valkey_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill without grace: SIGKILL the ``weir serve`` process running two calls.

    Nothing in the killed process runs, so nobody records an outcome: only the
    claim's lease (``--claim-lease 2``) tells the others it is gone.  Within the
    lease, on each surviving replica, a retry (same request, same key) and a resume
    (``Last-Event-ID`` from the call's priming event) both get the ``interrupted``
    error -- not 409 ``in_progress``, not a silent stream -- and neither call ever
    runs again.
    """
    from .rawhttp import Client, raw_request, sse_messages
    from .serverproc import WeirProcess

    ledger = tmp_path / "ledger"
    monkeypatch.setenv("WEIR_TEST_LEDGER", str(ledger))
    args = ["--store", valkey_url, "--claim-lease", "2", "--shutdown-grace", "0"]
    files = [(tmp_path / f"{n}.out").open("w+b") for n in range(6)]
    procs: list[WeirProcess] = []
    try:
        for n in range(3):
            extra = [*args, "--replica-id", f"k{n}"]
            procs.append(
                WeirProcess(
                    "tests.integration.lease_app:app", files[2 * n], files[2 * n + 1], extra
                )
            )
        victim, others = procs[0], procs[1:]
        params = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "kill", "version": "0"},
        }
        with trio.fail_after(40):
            c = await Client.connect(victim.port)
            init = await c.request(
                "POST",
                "/mcp",
                {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params},
            )
            sid = init.headers["mcp-session-id"]
            hdr = {"mcp-protocol-version": "2025-11-25"}
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert (await c.request("POST", "/mcp", note, session=sid, headers=hdr)).status == 202
            await c.aclose()
            cursors: dict[str, str] = {}
            streams = []
            for rid, key in ((1, "resumed"), (2, "retried")):
                s = await Client.connect(victim.port)
                body = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "method": "tools/call",
                    "params": {"name": "charge", "arguments": {"key": key}},
                }
                await s.send_raw(
                    raw_request(
                        "POST",
                        "/mcp",
                        body=json.dumps(body).encode(),
                        headers={"mcp-session-id": sid, "idempotency-key": key, **hdr},
                    )
                )
                seen = b""
                while b"\nid: " not in seen.partition(b"\r\n\r\n")[2]:
                    seen += await s.stream.receive_some(RECV)
                body_part = seen.partition(b"\r\n\r\n")[2]
                cursors[key] = body_part.split(b"\nid: ", 1)[1].split(b"\n", 1)[0].decode()
                streams.append(s)
            while ledger.read_text().count("start") < 2:
                await trio.sleep(0.05)
            victim.proc.kill()  # SIGKILL: no cleanup, no outcome recorded
            victim.proc.wait()
            killed_at = trio.current_time()
            for s in streams:
                await s.aclose()

            for other in others:
                # The resume: replay from the store; the interrupted final event
                # arrives once the lease has run out.
                r = await Client.connect(other.port)
                resumed = await r.request(
                    "GET",
                    "/mcp",
                    session=sid,
                    headers={
                        **hdr,
                        "accept": "text/event-stream",
                        "last-event-id": cursors["resumed"],
                    },
                    timeout=15,
                )
                await r.aclose()
                [final] = [m for m in sse_messages(resumed.body) if m.get("id") == 1]
                assert final["error"]["data"]["reason"] == "interrupted", resumed.body
                # The retry: the same request under the same key.
                r = await Client.connect(other.port)
                retry = {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "charge", "arguments": {"key": "retried"}},
                }
                answer = await r.request(
                    "POST",
                    "/mcp",
                    retry,
                    session=sid,
                    headers={**hdr, "idempotency-key": "retried"},
                    timeout=15,
                )
                await r.aclose()
                assert answer.status == 200, answer
                assert answer.json()["error"]["data"]["reason"] == "interrupted"
            assert trio.current_time() - killed_at < 2 + 8  # within the lease, plus polling
        lines = ledger.read_text().splitlines()
        assert sorted(line.split()[1] for line in lines) == ["resumed", "retried"], lines
        assert all(line.startswith("start") for line in lines)  # never finished, never re-run
    finally:
        for p in procs:
            p.stop()
        for f in files:
            f.close()


# ---------------------------------------------------------------- the sessionless revision
SESSIONLESS = "2026-07-28"
SESSIONLESS_META = {
    "io.modelcontextprotocol/protocolVersion": SESSIONLESS,
    "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
}


async def _sessionless_post(
    port: int, rid: int, name: str, params: dict[str, Any], **hdrs: str
) -> Any:
    msg = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": name, **params, "_meta": SESSIONLESS_META},
    }
    headers = {"mcp-protocol-version": SESSIONLESS, "mcp-method": "tools/call", "mcp-name": name}
    client = await RawClient.connect(port)
    try:
        reply = await client.request("POST", "/mcp", msg, headers={**headers, **hdrs})
    finally:
        await client.aclose()
    return reply


async def test_a_reissued_sessionless_call_runs_once_on_any_replica(valkey_url: str) -> None:
    """2026-07-28: a client that lost its stream re-issues the call with a new id; with
    the same ``Idempotency-Key`` it is answered from the store on whichever replica
    the balancer picks, and the tool runs once."""
    ledger = Ledger()
    async with replica_set(make_app(ledger), valkey_url, 3) as (_, balancer, _):
        with trio.fail_after(20):
            key = f"sessionless-{secrets.token_hex(3)}"
            args = {"arguments": {"key": key, "steps": 1}}
            replies = [
                await _sessionless_post(
                    balancer.port, rid, "charge", args, **{"idempotency-key": key}
                )
                for rid in (1, 2, 3)
            ]
    upstreams = {r.headers["x-upstream"] for r in replies}
    assert len(upstreams) == 3  # three replicas answered
    texts = [r.json()["result"]["content"][0]["text"] for r in replies]
    assert texts == [f"charged {key} #1"] * 3
    assert [r.json()["id"] for r in replies] == [1, 2, 3]
    assert ledger.executions[key] == 1


async def test_an_input_required_round_continues_on_another_replica(valkey_url: str) -> None:
    """The sealed request state of one replica opens on another (the key is shared
    through the store), so the client's next round may land anywhere."""
    ledger = Ledger()
    async with replica_set(make_app(ledger), valkey_url, 2) as (_, balancer, _):
        with trio.fail_after(20):
            first = await _sessionless_post(
                balancer.port, 1, "ask", {"arguments": {"question": "2+2?"}}
            )
            result = first.json()["result"]
            assert result["resultType"] == "input_required"
            (asked_key,) = result["inputRequests"]
            answer = {
                asked_key: {
                    "role": "assistant",
                    "content": {"type": "text", "text": "four"},
                    "model": "m",
                }
            }
            params = {
                "arguments": {"question": "2+2?"},
                "inputResponses": answer,
                "requestState": result["requestState"],
            }
            second = await _sessionless_post(balancer.port, 2, "ask", params)
    assert first.headers["x-upstream"] != second.headers["x-upstream"]
    assert second.json()["result"]["content"][0]["text"] == "the model said 'four'"


async def test_a_change_announced_on_one_replica_reaches_listeners_on_the_others(
    valkey_url: str,
) -> None:
    """Three replicas; a listen stream on one; the change is announced by a call the
    balancer sends to the next one, and arrives through the store's bus."""
    ledger = Ledger()
    async with replica_set(make_app(ledger), valkey_url, 3) as (_, balancer, _):
        with trio.fail_after(20):
            client, seen, upstream = await open_tools_listener(balancer.port, SESSIONLESS_META)
            announced = await _sessionless_post(balancer.port, 1, "announce", {"arguments": {}})
            assert announced.status == 200
            assert announced.headers["x-upstream"] != upstream
            await read_until(client, seen, b"notifications/tools/list_changed")
            await client.aclose()


async def open_tools_listener(port: int, meta: dict[str, Any]) -> tuple[RawClient, bytes, str]:
    """A ``subscriptions/listen`` stream for tool list changes, read up to its
    acknowledgement: the client, what it read, and the replica (``X-Upstream``) holding it."""
    listen = {
        "jsonrpc": "2.0",
        "id": "listen-1",
        "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": True}, "_meta": meta},
    }
    hdrs = {"mcp-protocol-version": SESSIONLESS, "mcp-method": "subscriptions/listen"}
    client = await RawClient.connect(port)
    body = json.dumps(listen).encode()
    await client.send_raw(raw_request("POST", "/mcp", body=body, headers=hdrs))
    seen = await read_until(client, b"", b"acknowledged")
    upstream = re.search(rb"x-upstream: (\d+)", seen.lower())
    assert upstream is not None, seen
    return client, seen, upstream.group(1).decode()


async def read_until(client: RawClient, seen: bytes, marker: bytes) -> bytes:
    """``seen`` and what ``client`` reads next, until ``marker`` is among it (the
    caller bounds the time)."""
    while marker not in seen:
        seen += await client.stream.receive_some(65536)
    return seen


@pytest.mark.parametrize("hard", [True, False], ids=["hard-kill", "graceful-kill"])
async def test_a_keyed_sessionless_call_whose_replica_dies_is_answered_never_rerun(
    valkey_url: str, hard: bool
) -> None:
    """The replica running a keyed 2026-07-28 call is killed; the client re-issues the
    call (new id, same key) and it lands elsewhere.  It is answered -- the stored
    ``interrupted`` error once the claim's lease runs out -- and never run again."""
    ledger = Ledger()
    config = {"claim_lease": 1.0}
    async with replica_set(make_app(ledger), valkey_url, 3, config=config) as (
        replicas,
        balancer,
        _,
    ):
        by_port = {str(r.port): r for r in replicas}
        with trio.fail_after(20):
            key = f"dies-{secrets.token_hex(3)}"
            msg = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "charge",
                    "arguments": {"key": key, "steps": 20},
                    "_meta": SESSIONLESS_META,
                },
            }
            hdrs = {
                "mcp-protocol-version": SESSIONLESS,
                "mcp-method": "tools/call",
                "mcp-name": "charge",
                "idempotency-key": key,
            }
            first = await RawClient.connect(balancer.port)
            await first.send_raw(
                raw_request("POST", "/mcp", body=json.dumps(msg).encode(), headers=hdrs)
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += await first.stream.receive_some(65536)
            found = re.search(rb"x-upstream: (\d+)", head.lower())
            assert found is not None and key in ledger.running
            ledger.killing = "hard kill" if hard else "graceful kill"
            await by_port[found.group(1).decode()].kill(hard=hard)
            await first.aclose()
            answer = None
            for rid in range(2, 80):
                reply = await _sessionless_post(
                    balancer.port,
                    rid,
                    "charge",
                    {"arguments": {"key": key, "steps": 20}},
                    **{"idempotency-key": key},
                )
                if reply.status == 200:
                    answer = reply.json()
                    break
                assert reply.status in (409, 502, 503), reply.status
                await trio.sleep(0.1)
    assert ledger.executions[key] == 1, ledger  # never run again
    assert answer is not None, "the re-issued call was never answered"
    assert answer["error"]["data"]["reason"] == "interrupted"
