"""Idle keep-alive connections parked without a task (real sockets, virtual time).

A connection idle for ``park_idle_after`` leaves its task for the idle lot; its next
request is served on the same connection, by a new task; its keep-alive deadline,
shedding at the connection limit and the server's shutdown still close it, and
its place under the limit comes back each time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from weir.engine import App, Server, ServerConfig
from weir.engine._parking import IdleLot
from weir.engine._socket_io import SocketIO

from .helpers import H11Client, Reply

app = App("parking-test")


@app.tool()
async def echo(text: str) -> str:
    """Echo."""
    return text


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[Server]:
    server = Server(app, ServerConfig(port=0, **options))
    with trio.fail_after(3600):  # (virtual time: a hang fails, it does not stall)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            try:
                yield server
            finally:
                server.shutdown()
                await server.stopped.wait()


async def connect(server: Server) -> H11Client:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    return H11Client(stream, host=f"127.0.0.1:{server.port}")


async def initialized(server: Server) -> H11Client:
    """A new connection with a session initialized on it (then idle)."""
    client = await connect(server)
    await client.initialize()
    return client


def lot_of(server: Server) -> IdleLot:
    lot = server._connections.lot
    assert lot is not None
    return lot


def assert_nothing_held(server: Server) -> None:
    """No parked connection, no open one, every slot back under the limit."""
    assert len(lot_of(server)) == 0
    assert server.gate.parked == 0
    assert server.gate.open == 0
    assert not server.open_connections


async def settle(seconds: float) -> None:
    """Let virtual time pass, then let every task that woke finish its step."""
    await trio.sleep(seconds)
    await trio.testing.wait_all_tasks_blocked()


async def test_an_idle_connection_is_parked_and_its_next_request_served_on_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(park_idle_after=2.0) as server:
        client = await initialized(server)
        await settle(1.0)
        assert len(lot_of(server)) == 0  # not idle long enough yet
        await settle(1.5)
        assert len(lot_of(server)) == 1
        assert server.gate.open == 1  # parked, still counted under the limit
        scrape = await connect(server)
        metrics = await scrape.send("GET", target="/metrics")
        assert metrics.status == 200
        assert isinstance(metrics, Reply)
        assert "\nweir_connections_parked 1\n" in metrics.body.decode()
        await scrape.stream.aclose()
        reply = await client.call(1, "echo", {"text": "hi"})  # the same socket
        [message] = await reply.messages()
        assert message["result"]["content"][0]["text"] == "hi"
        assert len(lot_of(server)) == 0
        assert server.gate.parked == 0  # the gauge follows it out of the lot
        await settle(3.0)  # idle again: parked again
        assert len(lot_of(server)) == 1
        assert server.gate.parked == 1
        ping = await client.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert ping.status == 200


async def test_a_parked_connection_is_closed_at_its_keepalive_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(park_idle_after=2.0, keepalive_timeout=30) as server:
        client = await initialized(server)
        start = trio.current_time()
        assert await client.stream.receive_some(100) == b""  # closed by the server
        # The deadline counts from when it went idle, not from when it was parked.
        assert trio.current_time() - start == pytest.approx(30, abs=0.1)
        await trio.testing.wait_all_tasks_blocked()
        assert_nothing_held(server)


async def test_a_peer_that_closes_while_parked_gives_its_place_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(park_idle_after=2.0) as server:
        client = await initialized(server)
        await settle(3.0)
        assert len(lot_of(server)) == 1
        await client.stream.aclose()
        await settle(0.1)
        assert_nothing_held(server)


async def test_at_the_limit_a_parked_connection_is_shed_for_a_new_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(park_idle_after=2.0, max_connections=1) as server:
        first = await initialized(server)
        await settle(3.0)
        assert len(lot_of(server)) == 1
        second = await connect(server)  # waits in the backlog: the first is shed for it
        await second.initialize()
        assert await first.stream.receive_some(100) == b""
        assert len(lot_of(server)) == 0
        assert server.gate.open == 1
        assert server.gate.shed_total == 1


async def test_shutdown_closes_parked_connections(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clients: list[H11Client] = []
    async with serving(park_idle_after=2.0) as server:
        for _ in range(3):
            client = await initialized(server)
            clients.append(client)
        await settle(3.0)
        assert len(lot_of(server)) == 3
    for client in clients:
        assert await client.stream.receive_some(100) == b""
    assert server.gate.open == 0


async def test_park_idle_after_zero_never_parks(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(park_idle_after=0) as server:
        assert server._connections.lot is None
        client = await initialized(server)
        await settle(10.0)
        ping = await client.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert ping.status == 200


def test_a_negative_park_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="park_idle_after"):
        ServerConfig(park_idle_after=-1)


async def test_a_request_that_arrives_as_the_park_deadline_fires_is_served(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the park has with a request: the read's deadline cancels its scope in
    the same scheduling round in which the bytes are read.  The bytes are already
    taken from the socket, so the connection must serve them (in a fresh scope), not
    park and not close.  Real sockets; the deadline's firing is placed exactly there
    by cancelling the read's scope as the read returns."""
    armed: list[Server] = []
    receive = SocketIO.receive

    async def receive_then_deadline(self: SocketIO, max_bytes: int) -> bytes:
        data = await receive(self, max_bytes)
        if armed and data:
            server = armed.pop()
            [conn] = [c for c in server.open_connections if c.io is self]
            assert conn.scope is not None
            conn.scope.cancel()  # what the park deadline does, in this very round
        return data

    monkeypatch.setattr(SocketIO, "receive", receive_then_deadline)
    async with serving(park_idle_after=2.0) as server:
        client = await initialized(server)
        await settle(1.0)  # idle, its park deadline armed, not yet parked
        armed.append(server)
        reply = await client.call(1, "echo", {"text": "raced"})
        [message] = await reply.messages()
        assert message["result"]["content"][0]["text"] == "raced"
        assert not armed  # the race was run
        assert len(lot_of(server)) == 0
        await settle(3.0)  # and the connection goes on as before: parked when idle
        assert len(lot_of(server)) == 1
        ping = await client.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert ping.status == 200
