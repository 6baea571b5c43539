"""Channel tokens (fencing) and the rebind handshake, the same on both runtimes.

Every test runs against the Trio engine and the asyncio runtime (``runtime``,
:mod:`tests.integration.runtimes`), each serving in this process on a real
loopback socket with its default (memory) store.  The rules are the core's
(``weir.protocol.binding``); what is checked here is that each runtime performs
them:

* ``initialize`` issues ``Mcp-Channel-Token: 1.<secret>`` and advertises
  ``weir/rebind``; a client that never presents a token is served as before;
* a malformed token, a foreign secret or a generation from the future is 409
  ``channel_unbound`` and nothing runs (a lone ``tools/call`` is checked by its
  claim in the store, other POSTs by the course);
* the first token presented binds the session: from then on its ``DELETE`` and its
  GET streams need the token;
* ``weir/rebind`` needs the current token; it answers generation 2 with a new token
  and the session's finished results; the old token is then 409 ``cursor_stale``
  on POST, GET and DELETE, and the old generation's open stream ends;
* a cursor resumes only under the channel it was issued on (409 ``channel_unbound``
  without its token or with the next generation's, ``cursor_stale`` with its own
  once rebound).

The mixed-cluster cases (a rebind on one runtime fences the other) are in
``test_mixed_replicas``.  Clock: real time; every wait is bounded.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import trio

from weir.engine import App

from .rawhttp import Client, Reply, call, raw_request
from .runtimes import RUNTIMES, serving

TOKEN = "mcp-channel-token"
REBIND = "weir/rebind"
VERSION = "2025-11-25"
HDR = {"mcp-protocol-version": VERSION, "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "chan"}},
}
NOTE = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def make_app() -> tuple[App, list[str]]:
    """An app whose one tool records each run (to see that a refusal ran nothing)."""
    app = App("channels-runtimes")
    ran: list[str] = []

    @app.tool()
    async def tick(label: str) -> str:
        """Record a run."""
        ran.append(label)
        return f"tick {label}"

    return app, ran


@asynccontextmanager
async def session(runtime: str) -> AsyncIterator[tuple[int, str, str, list[str]]]:
    """A server on ``runtime`` and an initialized session: port, session id, token,
    and the runs of ``tick``."""
    app, ran = make_app()
    with serving(runtime, app) as served:
        c = await Client.connect(served.port)
        try:
            init = await c.request("POST", "/mcp", INIT, headers=HDR)
            assert init.status == 200, init
            sid, token = init.headers["mcp-session-id"], init.headers[TOKEN]
            assert (await c.request("POST", "/mcp", NOTE, session=sid, headers=HDR)).status == 202
        finally:
            await c.aclose()
        yield served.port, sid, token, ran


async def send(
    port: int, method: str, sid: str, message: Any = None, token: str | None = None
) -> Reply:
    """One request on a fresh connection, with ``token`` as ``Mcp-Channel-Token``."""
    headers = dict(HDR)
    if token is not None:
        headers[TOKEN] = token
    c = await Client.connect(port)
    try:
        return await c.request(method, "/mcp", message, session=sid, headers=headers)
    finally:
        await c.aclose()


def tick(rid: int, label: str) -> dict[str, Any]:
    return call(rid, "tick", {"label": label})


def rpc(rid: int, method: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method}


def refused(reply: Reply, reason: str) -> None:
    assert reply.status == 409, reply
    assert reply.reason == reason, reply


def ticked(reply: Reply, label: str) -> None:
    assert reply.status == 200, reply
    assert reply.json()["result"]["content"][0]["text"] == f"tick {label}", reply


async def open_stream(port: int, sid: str, token: str | None) -> Client:
    """A GET stream whose head has arrived (the body is left unread)."""
    headers = {**HDR, "mcp-session-id": sid, "accept": "text/event-stream"}
    if token is not None:
        headers[TOKEN] = token
    c = await Client.connect(port)
    await c.send_raw(raw_request("GET", "/mcp", headers=headers))
    c.h11.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    c.h11.send(h11.EndOfMessage())
    with trio.fail_after(10):
        while True:
            event = c.h11.next_event()
            if event is h11.NEED_DATA:
                c.h11.receive_data(bytes(await c.stream.receive_some(65536)))
            elif isinstance(event, h11.Response):
                assert event.status_code == 200, event
                return c


@RUNTIMES
async def test_initialize_issues_a_token_and_tokenless_clients_are_served(runtime: str) -> None:
    app, _ = make_app()
    with serving(runtime, app) as served:
        c = await Client.connect(served.port)
        try:
            init = await c.request("POST", "/mcp", INIT, headers=HDR)
            other = await c.request("POST", "/mcp", {**INIT, "id": 1}, headers=HDR)
        finally:
            await c.aclose()
        token = init.headers[TOKEN]
        assert re.fullmatch(r"1\.[A-Za-z0-9_-]{16,}", token), token
        assert REBIND in init.json()["result"]["capabilities"]["experimental"]
        assert other.headers[TOKEN].startswith("1.") and other.headers[TOKEN] != token
        sid = init.headers["mcp-session-id"]
        # No token at all: served as before (standard SDK clients send none).
        ticked(await send(served.port, "POST", sid, tick(2, "plain")), "plain")
        assert (await send(served.port, "POST", sid, rpc(3, "tools/list"))).status == 200
        stream = await open_stream(served.port, sid, None)
        await stream.aclose()
        assert (await send(served.port, "DELETE", sid)).status == 200


@RUNTIMES
async def test_a_bad_token_is_refused_409_and_nothing_runs(runtime: str) -> None:
    async with session(runtime) as (port, sid, token, ran):
        secret = token.partition(".")[2]
        for bad in ("nonsense", "1.", f"x.{secret}", f"1.{secret}x", f"2.{secret}"):
            refused(await send(port, "POST", sid, tick(1, "bad"), bad), "channel_unbound")
            refused(await send(port, "POST", sid, rpc(2, "tools/list"), bad), "channel_unbound")
        assert ran == []
        ticked(await send(port, "POST", sid, tick(3, "good"), token), "good")
        assert ran == ["good"]


@RUNTIMES
async def test_the_first_token_binds_the_session(runtime: str) -> None:
    async with session(runtime) as (port, sid, token, _):
        # The current token is accepted on every method.
        assert (await send(port, "POST", sid, rpc(1, "tools/list"), token)).status == 200
        stream = await open_stream(port, sid, token)
        await stream.aclose()
        # Bound now: a session id alone no longer reads or ends the session.
        refused(await send(port, "GET", sid), "channel_unbound")
        refused(await send(port, "DELETE", sid), "channel_unbound")
        assert (await send(port, "DELETE", sid, token=token)).status == 200


@RUNTIMES
async def test_a_token_first_presented_on_a_get_binds_the_session(runtime: str) -> None:
    async with session(runtime) as (port, sid, token, _):
        # No POST has shown the token: the GET stream is where the channel is proven.
        stream = await open_stream(port, sid, token)
        await stream.aclose()
        refused(await send(port, "GET", sid), "channel_unbound")
        refused(await send(port, "DELETE", sid), "channel_unbound")
        assert (await send(port, "DELETE", sid, token=token)).status == 200


@RUNTIMES
async def test_rebind_fences_the_old_token_and_its_streams(runtime: str) -> None:
    async with session(runtime) as (port, sid, token, ran):
        ticked(await send(port, "POST", sid, tick(1, "before"), token), "before")
        # Only the current token may rebind (no authorization here).
        refused(await send(port, "POST", sid, rpc(2, REBIND)), "channel_unbound")
        secret = token.partition(".")[2]
        refused(await send(port, "POST", sid, rpc(3, REBIND), f"1.{secret}x"), "channel_unbound")
        old_stream = await open_stream(port, sid, token)

        rebound = await send(port, "POST", sid, rpc(4, REBIND), token)
        assert rebound.status == 200, rebound
        result = rebound.json()["result"]
        new = rebound.headers[TOKEN]
        assert result["generation"] == 2 and result["channelToken"] == new
        assert new.startswith("2.") and new != token
        texts = [r["result"]["content"][0]["text"] for r in result["results"]]
        assert texts == ["tick before"], result

        # The old generation's open stream ends (its body completes).
        ended = await old_stream.read_reply(10, method="GET")
        assert ended.status == 0  # (its head was read before)
        await old_stream.aclose()

        for method, message in (
            ("POST", tick(5, "stale")),
            ("POST", rpc(6, "tools/list")),
            ("POST", rpc(7, REBIND)),
            ("GET", None),
            ("DELETE", None),
        ):
            refused(await send(port, method, sid, message, token), "cursor_stale")
        assert ran == ["before"]
        ticked(await send(port, "POST", sid, tick(8, "after"), new), "after")
        stream = await open_stream(port, sid, new)
        await stream.aclose()
        assert (await send(port, "DELETE", sid, token=new)).status == 200


def event_ids(reply: Reply) -> list[str]:
    """The ``id:`` of every event of an SSE body."""
    assert reply.headers["content-type"] == "text/event-stream", reply
    return [line[3:].strip() for line in reply.body.decode().splitlines() if line.startswith("id:")]


@RUNTIMES
async def test_a_cursor_resumes_only_under_the_channel_it_was_issued_on(runtime: str) -> None:
    async with session(runtime) as (port, sid, token, ran):
        answered = await send(port, "POST", sid, tick(1, "cursor"), token)
        ticked(answered, "cursor")
        cursor = event_ids(answered)[0]

        def resume(token: str | None) -> Any:
            headers = {**HDR, "accept": "text/event-stream", "last-event-id": cursor}
            if token is not None:
                headers[TOKEN] = token

            async def go() -> Reply:
                c = await Client.connect(port)
                try:
                    return await c.request("GET", "/mcp", session=sid, headers=headers)
                finally:
                    await c.aclose()

            return go()

        refused(await resume(None), "channel_unbound")
        refused(await resume(token.partition(".")[0] + ".nope"), "channel_unbound")
        own = await resume(token)  # its own channel: past the channel check
        ticked(own, "cursor")  # the answer again, from the replay history

        rebound = await send(port, "POST", sid, rpc(2, REBIND), token)
        new = rebound.headers[TOKEN]
        refused(await resume(token), "cursor_stale")
        refused(await resume(new), "channel_unbound")  # issued under generation 1
        assert ran == ["cursor"]  # no resumption ran anything again
