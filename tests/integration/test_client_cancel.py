"""weir's client, cancelled by its caller mid-request, closes the connection it used.

Found by the cluster simulator, whose clients abandon calls the way users' own
timeouts do: a request cancelled while it waited for the response head left its
connection neither closed nor back in the pool -- the server kept serving a request
nobody would read, and the socket leaked until garbage collection.  Real loopback
sockets here: a server that reads the request and never answers, and that must then
see the client hang up.
"""

from __future__ import annotations

from functools import partial

import trio

from weir.engine._client_http import Pool, _Connection


async def test_a_request_cancelled_before_its_head_closes_its_connection() -> None:
    hung_up = trio.Event()
    got_request = trio.Event()

    async def never_answers(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        got_request.set()
        for _ in range(100):  # the body, then nothing more until the client hangs up
            if await stream.receive_some(65536) == b"":
                hung_up.set()
                return

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            serve = partial(trio.serve_tcp, never_answers, 0, host="127.0.0.1")
            [listener] = await nursery.start(serve)
            port = listener.socket.getsockname()[1]
            pool = Pool(f"http://127.0.0.1:{port}/mcp", timeout=60.0)
            opened: list[_Connection] = []  # (held here, so only a close can close it)
            connect = pool._connect

            async def keep() -> _Connection:
                conn = await connect()
                opened.append(conn)
                return conn

            pool._connect = keep  # type: ignore[method-assign]
            with trio.CancelScope() as scope:
                nursery.start_soon(_cancel_when, got_request, scope)
                await pool.request("POST", [("content-type", "application/json")], b"{}")
            assert scope.cancelled_caught
            await hung_up.wait()  # bounded by fail_after: the connection was closed
            [conn] = opened
            assert isinstance(conn.stream, trio.SocketStream)
            assert conn.stream.socket.fileno() == -1  # closed by the client, not by GC
            assert pool.idle == []  # and not kept for another request
            nursery.cancel_scope.cancel()


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
