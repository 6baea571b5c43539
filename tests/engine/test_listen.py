"""The accept gate takes every waiting connection at one wake-up (real sockets)."""

from __future__ import annotations

import trio
import trio.testing

from weir.engine._listen import ACCEPT_BATCH, AcceptGate, Slot


async def test_connections_waiting_in_the_backlog_are_accepted_together() -> None:
    # Trio's accept() yields once per connection: one connection per scheduling
    # round.  Clients that connected while the server was busy must all be taken at
    # the next wake-up, so the first handler to run already sees all of them open.
    n = 40
    assert n <= ACCEPT_BATCH
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(n)]
    gate = AcceptGate(limit=1000)
    seen_open: list[int] = []
    done = trio.Event()

    async def handler(stream: trio.SocketStream, slot: Slot) -> None:
        seen_open.append(gate.open)
        if len(seen_open) == n:
            done.set()
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate.serve, listeners[0], handler, nursery)
            await done.wait()
            nursery.cancel_scope.cancel()
    assert seen_open[0] == n
    for c in clients:
        await c.aclose()
    await listeners[0].aclose()


async def test_the_batch_stops_at_the_connection_limit() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(6)]
    gate = AcceptGate(limit=4)
    release = trio.Event()
    four, six = trio.Event(), trio.Event()
    served = 0

    async def handler(stream: trio.SocketStream, slot: Slot) -> None:
        nonlocal served
        served += 1
        if served == 4:
            four.set()
        if served == 6:
            six.set()
        await release.wait()
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate.serve, listeners[0], handler, nursery)
            await four.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert (gate.open, served) == (4, 4)  # two clients still wait in the backlog
            release.set()
            await six.wait()  # and are taken once slots free
            nursery.cancel_scope.cancel()
    for c in clients:
        await c.aclose()
    await listeners[0].aclose()
