"""Calls on the asyncio runtime (weir.asyncio) that the conformance suite does not reach: client
cancellation, a request id reused while it runs, the subscription bound, and the
idempotency gate (retries replay, never run twice).

Real loopback sockets; the handler under test signals through a ``threading.Event``
(the server's loop runs in another thread), so nothing waits on a timer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.engine.helpers import BATCH_2025_03_26
from weir.app import App, Context
from weir.app.samples.demo import app as demo_app
from weir.protocol import CreditLimits

from .rawhttp import raw_request
from .test_asyncio_driver import BOTH, TIMEOUT, Client, Reply, running_driver

T = TypeVar("T")


def _waiting_app() -> tuple[App, threading.Event, list[str]]:
    """An app whose ``wait`` tool signals that it started, then waits an hour."""
    app = App("waits")
    started = threading.Event()
    ended: list[str] = []

    @app.tool()
    async def wait(ctx: Context) -> str:
        """Wait an hour (or until cancelled)."""
        started.set()
        try:
            await ctx.sleep(3600)
        finally:
            ended.append("unwound")
        return "woke"

    return app, started, ended


def _in_thread(fn: Callable[[], T]) -> tuple[threading.Thread, list[T]]:
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_cancelled_call_unwinds_its_handler_and_sends_no_response() -> None:
    app, started, ended = _waiting_app()
    with (
        running_driver(app, in_progress_wait=0.05) as running,
        Client(running.port) as c,
        Client(running.port) as other,
    ):
        c.initialize()
        other.session_id, other.version = c.session_id, c.version
        thread, replies = _in_thread(lambda: c.call("tools/call", {"name": "wait"}))
        assert started.wait(TIMEOUT)
        call_id = c.next_id

        # The same call again while it runs: it is the same call (the gate's key is the
        # id), so it waits for the first -- here past the driver's patience: 409.
        again = {"id": call_id, "method": "tools/call", "params": {"name": "wait"}}
        waited = other.post(again)
        assert waited.status == 409
        assert waited.json()["error"]["data"]["reason"] == "in_progress"
        # The same id under another Idempotency-Key is another call, and two requests
        # under one id would be ambiguous: refused, the first untouched.
        headers = {"content-type": "application/json", "accept": BOTH}
        headers |= {"mcp-session-id": str(c.session_id), "idempotency-key": "another"}
        body = json.dumps({"jsonrpc": "2.0", **again}).encode()
        error = other.request("POST", body, headers).message()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32600, "invalid_request")
        assert not ended

        cancel = {"requestId": call_id, "reason": "the user gave up"}
        ack = other.post({"method": "notifications/cancelled", "params": cancel})
        assert ack.status == 202
        thread.join(TIMEOUT)
        assert not thread.is_alive()
        (reply,) = replies
        assert reply.status == 200
        assert [e.data for e in reply.events()] == [""]  # the priming event; no response
        assert ended == ["unwound"]
        sid = c.session_id
        assert running.probe(lambda: dict(running.driver.sessions[str(sid)].running)) == {}
        # The session is fine afterwards.
        assert c.call("ping").message()["result"] == {}


def test_cancelling_an_unknown_or_finished_request_changes_nothing() -> None:
    with running_driver(demo_app) as running, Client(running.port) as c:
        c.initialize()
        c.call("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        for rid in (c.next_id, 999, "nope", None):
            ack = c.post({"method": "notifications/cancelled", "params": {"requestId": rid}})
            assert ack.status == 202
        assert c.call("ping").message()["result"] == {}


def test_subscriptions_are_bounded_per_session() -> None:
    with running_driver(demo_app) as running, Client(running.port) as c:
        c.initialize()

        def subscribe(uri: str) -> dict[str, Any]:
            reply: dict[str, Any] = c.call("resources/subscribe", {"uri": uri}).message()
            return reply

        for n in range(256):
            assert subscribe(f"demo://thing/{n}")["result"] == {}
        assert subscribe("demo://thing/0")["result"] == {}  # already held: no new room
        refused = subscribe("demo://one-too-many")["error"]
        assert refused["code"] == -32602
        assert refused["data"] == {"reason": "subscription_limit", "limit": 256}
        c.call("resources/unsubscribe", {"uri": "demo://thing/7"})
        assert subscribe("demo://one-too-many")["result"] == {}
        too_long = subscribe("demo://" + "x" * 3000)["error"]
        assert too_long["data"]["reason"] == "subscription_limit"
        sid = str(c.session_id)
        held = running.probe(lambda: len(running.driver.sessions[sid].caller.subscriptions))
        assert held == 256


# ---------------------------------------------------------------- the idempotency gate
def _counting_app() -> tuple[App, threading.Event, list[int]]:
    """``bump`` is not idempotent: each execution appends to ``runs``; it takes a moment
    (``ctx.sleep``) so that a duplicate can arrive while it runs."""
    app = App("counts")
    started = threading.Event()
    runs: list[int] = []

    @app.tool(idempotent=False)
    async def bump(ctx: Context, by: int = 1, seconds: float = 0.0) -> str:
        """Add ``by`` to the tally, after ``seconds``."""
        runs.append(by)
        started.set()
        await ctx.sleep(seconds)
        return f"ran {len(runs)}"

    return app, started, runs


def _bump(c: Client, key: str | None, *, accept: str = BOTH, **arguments: Any) -> Reply:
    c.next_id += 1
    headers = {"content-type": "application/json", "accept": accept}
    headers |= {"mcp-session-id": str(c.session_id), "mcp-protocol-version": c.version}
    if key is not None:
        headers["idempotency-key"] = key
    msg = {"jsonrpc": "2.0", "id": c.next_id, "method": "tools/call"}
    body = json.dumps({**msg, "params": {"name": "bump", "arguments": arguments}}).encode()
    return c.request("POST", body, headers)


def test_a_retry_with_the_same_key_replays_and_never_runs_twice() -> None:
    app, _, runs = _counting_app()
    with running_driver(app) as running, Client(running.port) as c:
        c.initialize()
        first = _bump(c, "order-1").message()
        again = _bump(c, "order-1", accept="application/json").message()  # another format
        assert runs == [1]
        assert again["result"] == first["result"] == {"content": [text_block("ran 1")]}
        assert again["id"] == c.next_id != first["id"]  # re-addressed to the retry's id
        other = _bump(c, "order-2").message()
        assert other["result"]["content"] == [text_block("ran 2")] and runs == [1, 1]


def test_the_same_key_for_another_call_is_422() -> None:
    app, _, runs = _counting_app()
    with running_driver(app) as running, Client(running.port) as c:
        c.initialize()
        _bump(c, "k", by=1)
        reused = _bump(c, "k", by=2)
        assert reused.status == 422
        assert reused.json()["error"]["data"]["reason"] == "idempotency_key_reused"
        assert runs == [1]


def test_a_duplicate_that_arrives_while_the_call_runs_waits_and_replays() -> None:
    app, started, runs = _counting_app()
    with running_driver(app) as running, Client(running.port) as c, Client(running.port) as d:
        c.initialize()
        d.session_id, d.version = c.session_id, c.version
        thread, replies = _in_thread(lambda: _bump(c, "slow", seconds=0.3).message())
        assert started.wait(TIMEOUT)
        duplicate = _bump(d, "slow", seconds=0.3).message()
        thread.join(TIMEOUT)
        (first,) = replies
        assert runs == [1]
        assert duplicate["result"] == first["result"]


def test_a_duplicate_past_the_wait_is_409_in_progress_with_retry_after() -> None:
    app, started, runs = _counting_app()
    with running_driver(app, in_progress_wait=0.05) as running, Client(running.port) as c:
        c.initialize()
        with Client(running.port) as d, Client(running.port) as e:
            d.session_id = e.session_id = c.session_id
            thread, _ = _in_thread(lambda: _bump(d, "stuck", seconds=3600))
            assert started.wait(TIMEOUT)
            refused = _bump(c, "stuck", seconds=3600)
            assert refused.status == 409 and "retry-after" in refused.headers
            assert refused.json()["error"]["data"]["reason"] == "in_progress"
            # Cancel the stuck call after it started: its handler ran, so the key
            # keeps the `cancelled` outcome and a retry under it does not run again.
            cancel = {"requestId": d.next_id}
            e.post({"method": "notifications/cancelled", "params": cancel})
            thread.join(TIMEOUT)
            assert not thread.is_alive()
        retried = _bump(c, "stuck", seconds=3600).message()
        assert retried["error"]["data"]["reason"] == "cancelled" and runs == [1]
        fresh = _bump(c, "stuck-again").message()
        assert fresh["result"]["content"] == [text_block("ran 2")] and runs == [1, 1]


def text_block(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def test_a_close_asked_for_after_the_answer_is_written_leaves_nothing_behind() -> None:
    app = App("closes")

    @app.tool()
    async def close_then_answer(ctx: Context) -> str:
        """Ask for the stream to be closed, then answer at once."""
        ctx.close_stream(retry_ms=100)
        return "done"

    with running_driver(app) as running, Client(running.port) as c:
        c.initialize()
        for _ in range(20):
            reply = c.call("tools/call", {"name": "close_then_answer"})
            data = [e.data for e in reply.events() if e.data]
            assert len(data) == 1 and json.loads(data[0])["result"]["content"][0]["text"] == "done"
        sid = str(c.session_id)
        assert running.probe(lambda: dict(running.driver.sessions[sid].close_requests)) == {}


def test_in_a_batch_a_refused_entry_gets_its_own_error_and_the_rest_run() -> None:
    app, _, runs = _counting_app()
    with running_driver(app) as running, Client(running.port) as c:
        c.initialize("2025-03-26")  # the one revision with batches
        call = {"jsonrpc": "2.0", "method": "tools/call"}
        batch = [
            {**call, "id": 1, "params": {"name": "bump", "arguments": {"by": 1}}},
            {**call, "id": 1, "params": {"name": "bump", "arguments": {"by": 2}}},
            {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        ]
        headers = {"content-type": "application/json", "accept": BOTH}
        headers |= {"mcp-session-id": str(c.session_id), "mcp-protocol-version": c.version}
        reply = c.request("POST", json.dumps(batch).encode(), headers)
        assert reply.status == 200
        answers = [json.loads(e.data) for e in reply.events() if e.data]
        by_kind = sorted(("error" in a, a["id"]) for a in answers)
        assert by_kind == [(False, 1), (False, 2), (True, 1)]
        (refused,) = [a for a in answers if "error" in a]
        assert refused["error"]["data"]["reason"] == "idempotency_key_reused"
        assert runs == [1]  # the same id for another call ran nothing


def test_a_result_larger_than_the_credit_is_refused_and_recorded_not_queued() -> None:
    credit = CreditLimits(bytes=64 * 1024)
    with running_driver(credit=credit) as running, Client(running.port) as c:
        c.initialize()
        for accept in (BOTH, "application/json"):  # an SSE frame, then a JSON body
            c.next_id = 0 if accept == BOTH else 10
            huge = {"name": "echo", "arguments": {"text": "y" * 100_000}}
            big = c.call("tools/call", huge, accept=accept)
            error = big.message()["error"]
            assert error["data"]["reason"] == "result_too_large"
            assert error["data"]["limit"] == 64 * 1024 and error["data"]["size"] > 100_000
            ok = c.call("tools/call", {"name": "echo", "arguments": {"text": "ok"}}, accept=accept)
            assert ok.message()["result"]["content"][0]["text"] == "ok"
            # The refusal is the call's outcome: a retry (same id) replays it.
            c.next_id -= 2
            again = c.call("tools/call", huge, accept=accept)
            assert again.message()["error"]["data"]["reason"] == "result_too_large"
        sid = str(c.session_id)
        # The session never held more than its credit (a lone oversized frame would).
        peak = running.probe(lambda: running.driver.sessions[sid].flow.credit.peak_bytes)
        assert 0 < peak <= 64 * 1024


def test_a_torn_down_session_leaves_nothing_in_the_store() -> None:
    # Nothing adopts a record of a store of this process only: once a liveness
    # teardown ends the session here, it is gone for good, and so must be its record
    # and the outcomes its gate kept (before, every stalled session's result stayed
    # in the store for the life of the process: ~0.9 MB a session in the hostile test).
    credit = CreditLimits(bytes=64 * 1024, drain_window=0.5, liveness_timeout=1.0)
    with running_driver(credit=credit) as running, Client(running.port) as c:
        c.initialize()
        sid = str(c.session_id)
        store = running.driver.shared.store

        def stored() -> bool:
            read = store.get_session("anonymous", sid)
            found = asyncio.run_coroutine_threadsafe(read, running.loop).result(TIMEOUT)
            return found is not None

        assert stored()
        # A call whose answer its client never reads (a 4 KB receive window).
        stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", running.port))
        body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call"}
        body["params"] = {"name": "echo", "arguments": {"text": "z" * 60_000}}
        headers = {"mcp-session-id": sid, "mcp-protocol-version": c.version}
        stalled.sendall(
            raw_request("POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
        )
        try:
            deadline = time.monotonic() + credit.liveness_timeout + 5.0
            for _ in range(1000):
                gone = not running.probe(lambda: sid in running.driver.sessions)
                if (gone and not stored()) or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert running.probe(lambda: running.driver.metrics.teardowns) == 1
            assert not stored(), "the torn-down session's record stayed in the store"
        finally:
            stalled.close()


@pytest.mark.parametrize("always_json", [False, True], ids=["sse", "json"])
def test_a_2025_03_26_batch_is_answered_entry_by_entry(always_json: bool) -> None:
    # Batches exist only at 2025-03-26, which the conformance suite does not test.
    with running_driver(demo_app, always_json=always_json) as running, Client(running.port) as c:
        c.initialize("2025-03-26")
        headers = {"content-type": "application/json", "accept": BOTH}
        headers |= {"mcp-session-id": str(c.session_id), "mcp-protocol-version": "2025-03-26"}
        reply = c.request("POST", json.dumps(BATCH_2025_03_26).encode(), headers)
        assert reply.status == 200
        if always_json:
            answers = reply.json()  # one body: the batch's answers, as a batch
            assert isinstance(answers, list)
        else:
            events = reply.events()
            assert all(e.data for e in events)  # (no priming event below 2025-11-25)
            answers = [json.loads(e.data) for e in events]
        by_id = {a["id"]: a for a in answers}
        assert sorted(by_id) == [1, 2]  # the notification has no answer
        assert by_id[1]["result"] == {}
        assert by_id[2]["result"]["content"][0]["text"] == "b"
