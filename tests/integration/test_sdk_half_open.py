"""An SDK app's notifications to a client that stops reading: bounded, refused, torn down.

The app is :data:`server` below: a plain :class:`mcp.server.mcpserver.MCPServer`
written with the official MCP Python SDK's API only.  Its ``flood`` tool sends
``notes`` rounds of a large ``notifications/progress`` (``ctx.report_progress(...,
message=big)``) and a large ``notifications/message`` (``ctx.info(big)``) -- about
6 MB for the default ``notes``, far beyond any credit -- and records in
:data:`runs` how many of them it got past, whether it ran to its end, and, in its
``finally``, that it unwound and whether by cancellation.  weir serves it
unchanged through :func:`weir.app.sdk.from_sdk`, on the in-process
:class:`weir.engine.Server` listening on 127.0.0.1, exactly as
:mod:`tests.integration.test_half_open_loopback` serves its weir-native app (its
``serving``, ``open_client``, ``CreditSamples`` and ``eventually``; the same small
credit: 4 frames, 16 KiB, a 0.5 s drain window, a 2 s liveness timeout).  The
stalled peer shrinks its receive buffer to 4 KiB before it connects, reads the
response head of its call and then never reads again, so what the server may hold
for it is decided by the kernel's acknowledgements, which the server counts
byte-exactly.

What is proven
--------------
1. ``test_an_sdk_call_whose_client_stops_reading_is_bounded_refused_and_cancelled``
   -- session era (2025-11-25, ``initialize`` + ``Mcp-Session-Id``), on both runtimes
   (``runtime``: served in a thread of its own by :mod:`tests.integration.runtimes`,
   the credit read on the server's loop by a :class:`CreditWatch`; ``/metrics`` on
   Trio only):

   * **bounded**: every SDK notification waits for the session's drain credit, so
     the session's credit (sampled at every change, and its own high-water marks,
     also as ``/metrics`` reports them) never exceeds 4 frames / 16 KiB, the bytes
     appended to its stream logs and not acknowledged stay within the credit, and
     the tool gets past only a bounded number of its notifications (far fewer than
     it would send to a reader);
   * **held**: once a notification waits for credit the SDK coroutine does not
     advance -- the count it got past is the same once the session is refused as
     when it is torn down, and it never reaches its end;
   * **refused**: the session's next request (on a fresh connection) is answered
     429 with ``data.reason == "stream_half_open"``, ``Retry-After`` and
     ``retryAfterMs``, never before the drain window, and its tool never runs;
   * **others unaffected**: meanwhile another session of the same server calls
     the same SDK tool and reads every notification and the result, and a fresh
     ``initialize`` is answered 200;
   * **torn down**: no earlier than the liveness timeout after the last progress
     (and within ``SLACK``) the session is torn down, its credit released; the SDK
     handler is cancelled (its ``finally`` runs, by the cancellation exception,
     without the tool's end), and the session's later requests get 404.

2. ``test_a_sessionless_sdk_call_not_read_is_bounded_refused_and_cancelled``
   -- 2026-07-28, on the Trio engine (it needs authorization) (no session; the
   credit belongs to the authorized principal, as in test_sessionless_loopback's
   principal test): the same call from a principal
   whose connection stops reading holds no more than the credit and holds the SDK
   coroutine; the principal's other requests are refused 429 ``stream_half_open``
   with ``Retry-After``; another principal is served, notifications and all; after
   the liveness timeout the owner is torn down, the stalled connection closed and
   the SDK handler cancelled.

Clock: real time (no ``MockClock``: the kernel's I/O is under test).  Every wait is
bounded by ``trio.fail_after`` (or :func:`eventually`'s bound); nothing sleeps for
timing -- the tests wait for replies, and poll (:func:`eventually`) only what the
server's own timers, its ACK poller or its handler tasks make true.  Loopback
only.  Needs the ``sdk`` extra; skipped without it unless ``WEIR_REQUIRE_SDK=1``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pytest
import trio

try:
    import anyio
    from mcp.server.mcpserver import Context, MCPServer

    from weir.app.sdk import from_sdk
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("WEIR_REQUIRE_SDK") == "1":  # CI: a missing SDK is a failure
        raise
    pytest.skip(
        f"the MCP Python SDK is not installed (pip install -e '.[sdk]'): {exc}",
        allow_module_level=True,
    )

from tests.engine.helpers import Reply, SseReply
from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import metric, raw_request, sse_messages
from tests.integration.runtimes import RUNTIMES, CreditWatch, Served, serving
from tests.integration.test_auth import jwt_authorization, token
from tests.integration.test_half_open_loopback import (
    SLACK,
    CreditSamples,
    eventually,
    get_metrics,
    initialize_request,
    open_client,
    post_once,
    rpc,
)
from tests.integration.test_half_open_loopback import serving as serving_trio
from weir.engine import Server, ServerConfig
from weir.protocol import CreditLimits

# ``ctx.info`` is deprecated for 2026-07-28 by the SDK (SEP-2577); it is what an app
# written for the session era calls, so its warning is expected here.
pytestmark = pytest.mark.filterwarnings("ignore:The logging capability is deprecated")

DRAIN_WINDOW = 0.5
LIVENESS_TIMEOUT = 2.0
#: 4 frames of ~3 KB fit in 16 KiB: a waiting frame always means all 4 frames are
#: held, so admission never has room for a second request of the stalled session.
LIMITS = CreditLimits(
    frames=4, bytes=16384, drain_window=DRAIN_WINDOW, liveness_timeout=LIVENESS_TIMEOUT
)
NOTE_SIZE = 3000  # characters of each notification's message
NOTES = 1000  # rounds (a progress and a log each) the tool would send to a reader
#: What a stalled peer may let the tool get past beyond the credit: what its 4 KiB
#: receive buffer acknowledged (generous: a few KB; unbounded would be ~6 MB).
PEER_ABSORBS = 64 * 1024
RCVBUF = 4096
SESSIONLESS = "2026-07-28"

server: MCPServer[Any] = MCPServer("sdk-half-open", version="1.0.0", log_level="WARNING")


@dataclass
class Run:
    """What one ``flood`` run did, as it saw it."""

    sent: int = 0  # notifications it got past (each one awaited until enqueued)
    finished: bool = False  # it ran to its end
    unwound: bool = False  # its ``finally`` ran
    cancelled: bool = False  # ...because it was cancelled
    ended_by: str | None = None  # the exception it unwound with, if any


#: ``flood`` runs by label (the server runs in this process).
runs: dict[str, Run] = {}


@server.tool()
async def flood(label: str, ctx: Context, notes: int = NOTES, size: int = NOTE_SIZE) -> str:
    """Send ``notes`` rounds of a ``size``-character progress message and log entry."""
    run = runs[label] = Run()
    try:
        for i in range(notes):
            await ctx.report_progress(i + 1, notes, message=f"{label} {i}:" + "p" * size)
            run.sent += 1
            await ctx.info(f"{label} {i}:" + "l" * size)
            run.sent += 1
        run.finished = True
        return f"{label}: {run.sent} notifications"
    except BaseException as exc:
        run.ended_by = type(exc).__name__
        run.cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        raise
    finally:
        run.unwound = True


@pytest.fixture(autouse=True)
def _reset() -> None:
    runs.clear()


def flood_call(
    request_id: int, label: str, *, notes: int = NOTES, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    arguments = {"label": label, "notes": notes}
    params = {
        "name": "flood",
        "arguments": arguments,
        "_meta": {"progressToken": label, **(meta or {})},
    }
    return rpc(request_id, "tools/call", params)


def assert_bounded(credit: Any, samples: CreditSamples | CreditWatch | None = None) -> None:
    """The credit held never exceeded the limits (sampled, and the credit's own marks)."""
    assert credit.peak_frames <= LIMITS.frames and credit.peak_bytes <= LIMITS.bytes, (
        credit.peak_frames,
        credit.peak_bytes,
    )
    if samples is not None:
        assert samples.max_frames == LIMITS.frames  # it did fill up...
        assert samples.max_bytes <= LIMITS.bytes  # ...and no further
        assert samples.max_undrained <= LIMITS.bytes


def assert_held(run: Run) -> None:
    """The tool got past a bounded number of notifications and did not finish."""
    assert not run.finished and not run.unwound, run
    assert 0 < run.sent < 2 * NOTES, run
    assert run.sent * NOTE_SIZE <= LIMITS.bytes + PEER_ABSORBS, run


def assert_cancelled(run: Run, sent_while_held: int) -> None:
    """The SDK handler unwound by cancellation, without advancing or finishing."""
    assert run.unwound and run.cancelled and not run.finished, run
    assert run.sent == sent_while_held, (run, sent_while_held)


def assert_half_open_refusal(reply: Reply, request_id: int) -> None:
    assert reply.status == 429, (reply.status, reply.body)
    assert int(reply.headers["retry-after"]) >= 1
    body = reply.json()
    assert body["id"] == request_id
    assert body["error"]["data"]["reason"] == "stream_half_open"
    assert body["error"]["data"]["retryAfterMs"] >= 1000


def check_messages(messages: list[dict[str, Any]], label: str, notes: int, request_id: int) -> None:
    """A reader's stream: every progress and log, in order, then the result."""
    *notices, answer = messages
    assert [m["method"] for m in notices] == [
        "notifications/progress",
        "notifications/message",
    ] * notes
    progress = [m["params"] for m in notices[::2]]
    assert [p["progress"] for p in progress] == list(range(1, notes + 1))
    assert all(p["progressToken"] == label for p in progress)
    assert progress[0]["message"] == f"{label} 0:" + "p" * NOTE_SIZE
    assert notices[1]["params"]["data"] == f"{label} 0:" + "l" * NOTE_SIZE
    assert answer["id"] == request_id
    assert answer["result"]["content"][0]["text"] == f"{label}: {2 * notes} notifications"


# ---------------------------------------------------------------- 1. session era
async def healthy_session(port: int, notes: int) -> None:
    """Another session calls the same SDK tool and reads everything; and ``initialize``."""
    client = await open_client(port)
    async with client.stream:
        await client.initialize()
        reply = await client.post(flood_call(1, "healthy", notes=notes))
        assert isinstance(reply, SseReply) and reply.status == 200, reply
        check_messages(await reply.messages(), "healthy", notes, 1)
    init = await post_once(port, initialize_request(2))
    assert isinstance(init, Reply) and init.status == 200, init


@RUNTIMES
async def test_an_sdk_call_whose_client_stops_reading_is_bounded_refused_and_cancelled(
    runtime: str,
) -> None:
    with (
        trio.fail_after(LIVENESS_TIMEOUT + 30),
        serving(runtime, from_sdk(server), credit=LIMITS) as srv,
    ):
        await stalled_session(srv)


async def stalled_session(srv: Served) -> None:
    port = srv.port
    setup = await open_client(port)
    async with setup.stream:
        await setup.initialize()
    sid, version = setup.session_id, setup.protocol_version
    assert sid is not None and version is not None
    session = srv.probe(lambda: srv.sessions[sid])  # (read on its loop, by the watch)
    samples = CreditWatch(srv, session)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(samples.run)
        # The stalled peer: a 4 KiB receive buffer; it reads its call's response
        # head (SSE), then nothing more.
        peer = await open_client(port, rcvbuf=RCVBUF)
        peer.session_id, peer.protocol_version = sid, version
        sse = await peer.post(flood_call(1, "stalled"))
        assert isinstance(sse, SseReply) and sse.status == 200, sse

        # Held: a notification of the SDK tool waits for credit (the server's ACK
        # poller decides when: poll for it).
        assert await eventually(lambda: samples.take().waiting >= 1, timeout=10), samples.take()
        run = runs["stalled"]
        assert_held(run)

        # The session's next request: waits for admission while the credit is
        # exhausted, refused once the drain window has passed without progress.
        floor = samples.stall_floor()
        refused = await post_once(port, flood_call(2, "second"), session_id=sid, version=version)
        refused_at = trio.current_time()
        assert isinstance(refused, Reply), refused
        assert_half_open_refusal(refused, 2)
        assert refused_at - floor >= DRAIN_WINDOW
        assert refused_at - floor <= DRAIN_WINDOW + SLACK
        assert "second" not in runs  # its tool never ran
        now = samples.take()
        assert now.half_open and not now.closed
        sent_while_held = run.sent
        assert_held(run)

        if srv.runtime == "trio":  # (the asyncio runtime serves no /metrics yet)
            # While it is half-open: the metrics say so, within the credit...
            page = await get_metrics(port)
            assert metric(page, "weir_half_open_sessions") == 1
            assert metric(page, "weir_refusals_total", '{reason="stream_half_open"}') == 1
            assert metric(page, "weir_credit_peak_frames") <= LIMITS.frames
            assert metric(page, "weir_credit_peak_bytes") <= LIMITS.bytes
        # ...and another session is served normally, by the same SDK tool.
        await healthy_session(port, notes=3)
        now = samples.take()
        assert now.half_open and not now.closed  # that was during the stall
        assert runs["healthy"].finished

        # Torn down after the liveness timeout since the last progress.
        assert await eventually(lambda: samples.take().closed, timeout=LIVENESS_TIMEOUT + SLACK)
        nursery.cancel_scope.cancel()
    assert samples.closed_at is not None and samples.half_open_at is not None
    assert samples.closed_at >= samples.last_progress + LIVENESS_TIMEOUT
    assert samples.closed_at <= samples.last_progress + LIVENESS_TIMEOUT + SLACK
    assert samples.half_open_at < samples.closed_at
    end = samples.take()
    assert_bounded(end, samples)
    assert end.frames == 0 and end.nbytes == 0
    assert end.undrained == 0
    assert not srv.has_session(sid)
    # The SDK handler was cancelled where it was held (its finally runs as the
    # cancellation is delivered: poll for that).
    assert await eventually(lambda: run.unwound, timeout=SLACK), run
    assert_cancelled(run, sent_while_held)
    if srv.runtime == "trio":
        metrics = srv.target.metrics
        assert metrics.teardowns == 1
        assert metrics.refusals["stream_half_open"] == 1
        page = await get_metrics(port)
        assert metric(page, "weir_teardowns_total") == 1
        assert metric(page, "weir_half_open_sessions") == 0
        assert metric(page, "weir_credit_peak_bytes") <= LIMITS.bytes
    gone = await post_once(port, flood_call(3, "late"), session_id=sid, version=version)
    assert isinstance(gone, Reply) and gone.status == 404, gone
    assert gone.json()["error"]["data"]["reason"] == "session_not_found"
    assert "late" not in runs
    await peer.stream.aclose()


# ---------------------------------------------------------------- 2. 2026-07-28
def sessionless_call(request_id: int, label: str, *, notes: int = NOTES) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": SESSIONLESS,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/logLevel": "info",  # logs are a per-request opt-in
    }
    return flood_call(request_id, label, notes=notes, meta=meta)


def sessionless_headers(bearer: str) -> dict[str, str]:
    return {
        "mcp-protocol-version": SESSIONLESS,
        "mcp-method": "tools/call",
        "mcp-name": "flood",
        "authorization": f"Bearer {bearer}",
    }


async def ask(port: int, message: dict[str, Any], bearer: str) -> Any:
    client = await RawClient.connect(port)
    try:
        return await client.request(
            "POST", "/mcp", message, headers=sessionless_headers(bearer), timeout=10
        )
    finally:
        await client.aclose()


async def test_a_sessionless_sdk_call_not_read_is_bounded_refused_and_cancelled() -> None:
    with trio.fail_after(LIVENESS_TIMEOUT + 30):
        async with trio.open_nursery() as nursery:
            auth = await jwt_authorization(nursery)
            config = ServerConfig(port=0, credit=LIMITS, auth=auth)
            async with serving_trio(from_sdk(server), config) as srv:
                await stalled_principal(srv)
            nursery.cancel_scope.cancel()


async def stalled_principal(srv: Server) -> None:
    port = srv.port
    alice, bob = token("alice"), token("bob")
    stalled = await RawClient.connect(port, rcvbuf=RCVBUF)
    message = sessionless_call(1, "stalled")
    await stalled.send_raw(
        raw_request(
            "POST", "/mcp", body=json.dumps(message).encode(), headers=sessionless_headers(alice)
        )
    )
    assert await eventually(lambda: len(srv.principal_owners) == 1, timeout=5)
    (owner,) = srv.principal_owners.values()
    samples = CreditSamples()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(samples.run, owner)
        assert await eventually(lambda: owner.flow.waiting >= 1, timeout=10), (
            owner.credit.frames_in_use,
            owner.credit.bytes_in_use,
        )
        run = runs["stalled"]
        assert_held(run)

        # The principal's next request, on another connection: refused once the
        # drain window has passed without progress.
        floor = samples.stall_floor(owner)
        refused = await ask(port, sessionless_call(2, "second", notes=1), alice)
        refused_at = trio.current_time()
        assert refused.status == 429, (refused.status, refused.body)
        assert refused.reason == "stream_half_open" and int(refused.headers["retry-after"]) >= 1
        assert refused_at - floor >= DRAIN_WINDOW
        assert "second" not in runs
        assert owner.half_open and not owner.closed
        sent_while_held = run.sent
        assert_held(run)

        # Another principal is served, notifications and all.
        answer = await ask(port, sessionless_call(3, "bob", notes=3), bob)
        assert answer.status == 200, (answer.status, answer.body)
        check_messages(sse_messages(answer.body), "bob", 3, 3)
        assert owner.half_open and not owner.closed  # that was during the stall

        # Torn down after the liveness timeout; the stalled connection is closed.
        assert await eventually(lambda: owner.closed, timeout=LIVENESS_TIMEOUT + SLACK)
        samples.take(owner)
        nursery.cancel_scope.cancel()
    assert samples.closed_at is not None
    assert samples.closed_at >= samples.last_progress + LIVENESS_TIMEOUT
    assert samples.closed_at <= samples.last_progress + LIVENESS_TIMEOUT + SLACK
    assert_bounded(owner.credit, samples)
    assert owner.credit.frames_in_use == 0 and owner.credit.bytes_in_use == 0
    # Cancelled by the teardown (the stalled client has not hung up: it still holds
    # its end, which the server closed).
    assert await eventually(lambda: run.unwound, timeout=SLACK), run
    assert_cancelled(run, sent_while_held)
    assert await stalled.closed_by_peer(timeout=SLACK)
    await stalled.aclose()
    assert srv.metrics.refusals["stream_half_open"] == 1
