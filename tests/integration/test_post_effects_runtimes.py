"""Effects of a POST that no conformance scenario observes, on both runtimes and eras.

Each runtime performs the effects a POST's course asks for; these are the ones whose
omission no other test noticed on the asyncio runtime (found by removing them one at a
time): the end of a reservation for a request refused after its admission (session era
and 2026-07-28, whose credit owner is the connection's), the admissions and executions
counters, and a client notification handed to the app.  Real loopback sockets; the
notification hook signals a ``threading.Event``, so nothing sleeps.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from weir.app import App
from weir.protocol import INVALID_REQUEST, CreditLimits

from .runtimes import RUNTIMES, TIMEOUT, serving
from .test_asyncio_driver import BOTH, Client


def _echo_app() -> App:
    app = App("effects")

    @app.tool()
    async def echo(text: str) -> str:
        """Echo ``text``."""
        return text

    return app


@RUNTIMES
def test_a_call_refused_after_its_admission_gives_its_reservation_back(runtime: str) -> None:
    # Four frames of credit, six calls refused after admission (their Idempotency-Key is
    # over the limit, which the gate checks once the call is admitted): were their
    # reservations kept, the fifth would already wait for credit that never comes.
    credit = CreditLimits(frames=4, bytes=1 << 20)
    with serving(runtime, _echo_app(), credit=credit) as served, Client(served.port) as c:
        c.initialize()
        sid = str(c.session_id)
        headers = {"content-type": "application/json", "accept": BOTH, "mcp-session-id": sid}
        headers |= {"mcp-protocol-version": c.version, "idempotency-key": "k" * 257}
        for i in range(6):
            call = {"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call"}
            call["params"] = {"name": "echo", "arguments": {"text": "x"}}
            refused = c.request("POST", json.dumps(call).encode(), headers)
            assert refused.status == 400
            error = refused.json()["error"]
            assert (error["code"], error["data"]["reason"]) == (INVALID_REQUEST, "invalid_request")
            assert error["data"]["limit"] == 256

        def held(session: Any) -> tuple[int, int, int]:
            credit = session.flow.credit
            return session.flow.inflight, credit.reserved_frames, credit.reserved_bytes

        assert served.of(sid, held) == (0, 0, 0)
        answer = c.call("tools/call", {"name": "echo", "arguments": {"text": "still here"}})
        assert answer.message()["result"]["content"][0]["text"] == "still here"
        assert served.of(sid, held) == (0, 0, 0)
        # Every admission counts, the refused ones too (they were admitted, then refused).
        assert served.probe(lambda: served.target.metrics.admissions) == 7


@RUNTIMES
def test_a_client_notification_reaches_the_app_with_its_session(runtime: str) -> None:
    app = _echo_app()
    heard: list[tuple[str, dict[str, Any], str]] = []
    arrived = threading.Event()

    @app.on_notification
    async def hear(method: str, params: dict[str, Any], session_id: str) -> None:
        heard.append((method, params, session_id))
        arrived.set()

    with serving(runtime, app) as served, Client(served.port) as c:
        c.initialize()
        ack = c.post({"method": "notifications/roots/list_changed", "params": {"n": 1}})
        assert (ack.status, ack.body) == (202, b"")
        assert arrived.wait(TIMEOUT)
        # Only the app's notification: the transport's own (initialized) is not handed on.
        assert heard == [("notifications/roots/list_changed", {"n": 1}, c.session_id)]


_V = "2026-07-28"
_META = {
    "io.modelcontextprotocol/protocolVersion": _V,
    "io.modelcontextprotocol/clientCapabilities": {},
}


@RUNTIMES
@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
def test_a_sessionless_call_refused_after_admission_gives_its_reservation_back(
    runtime: str, json_response: bool
) -> None:
    # The same on the 2026-07-28 era, whose credit owner is the connection's own: six
    # calls refused after admission, then one answered, all on one connection.
    credit = CreditLimits(frames=4, bytes=1 << 20)
    with (
        serving(runtime, _echo_app(), credit=credit, json_response=json_response) as served,
        Client(served.port) as c,
    ):
        headers = {"content-type": "application/json", "accept": BOTH}
        headers |= {"mcp-protocol-version": _V, "mcp-method": "tools/call", "mcp-name": "echo"}

        def call(rid: int, text: str, **extra: str) -> Any:
            params = {"name": "echo", "arguments": {"text": text}, "_meta": _META}
            body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
            return c.request("POST", json.dumps(body).encode(), headers | extra)

        for i in range(6):
            refused = call(100 + i, "x", **{"idempotency-key": "k" * 257})
            assert refused.status == 400
            assert refused.message()["error"]["data"]["limit"] == 256
        answer = call(200, "still here", **{"idempotency-key": "fresh"})
        assert answer.status == 200
        assert answer.message()["result"]["content"][0]["text"] == "still here"
        metrics = served.probe(lambda: served.target.metrics)
        counts = served.probe(lambda: (metrics.admissions, metrics.executions))
        assert counts == (7, 1)  # every admission counted; only the answered call ran
