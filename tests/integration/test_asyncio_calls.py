"""Calls on the asyncio driver that the conformance suite does not reach: client
cancellation, a request id reused while it runs, and the subscription bound.

Real loopback sockets; the handler under test signals through a ``threading.Event``
(the server's loop runs in another thread), so nothing waits on a timer.
"""

from __future__ import annotations

import threading
from typing import Any

from weir.app import App, Context
from weir.app.samples.demo import app as demo_app

from .test_asyncio_driver import TIMEOUT, Client, Reply, running_driver


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


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Reply]]:
    out: list[Reply] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_cancelled_call_unwinds_its_handler_and_sends_no_response() -> None:
    app, started, ended = _waiting_app()
    with running_driver(app) as running, Client(running.port) as c, Client(running.port) as other:
        c.initialize()
        other.session_id, other.version = c.session_id, c.version
        thread, replies = _in_thread(lambda: c.call("tools/call", {"name": "wait"}))
        assert started.wait(TIMEOUT)
        call_id = c.next_id

        # The same id again while the first runs: refused, the first untouched.
        dup = other.post({"id": call_id, "method": "tools/call", "params": {"name": "wait"}})
        error = dup.message()["error"]
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
