"""weir's client behind a proxy that gives up on the server: 502/504 with no answer.

Seen in the cluster failover benchmark: a retrying gateway ran out of tries while the
store failed over and answered 504; weir's client raised it, though the call was keyed
and its re-send would have been answered from the gate.  Now a keyed ``tools/call``
is re-sent under its key (bounded by ``max_reconnects``) and runs once; a request
without a key is not re-sent (it may have run) and raises :class:`GatewayError`.
Both eras, a real weir server behind the benchmarks' gateway, made to answer 504 to
the first ``tools/call`` it sees.
"""

from __future__ import annotations

from functools import partial

import h11
import pytest
import trio

from benchmarks.gateway import Gateway, _send, _Upstream
from weir.engine import App, Server, ServerConfig
from weir.engine.client import CallTrace, GatewayError, RetryPolicy, open_client

app = App("gateway")
runs: list[str] = []


@app.tool(idempotent=False)
async def charge(key: str) -> str:
    """Not idempotent: counts its runs."""
    runs.append(key)
    return f"charged {key}"


class GivesUpOnce(Gateway):
    """Answers 504 to the first ``tools/call`` (after the server ran it), then relays."""

    def __init__(self, port: int, method: bytes) -> None:
        super().__init__([("127.0.0.1", port)], retries=0, timeout=5.0)
        self.method = method
        self.gave_up = 0

    async def _forward(self, up, down, stream, request, body):  # type: ignore[no-untyped-def]
        if self.gave_up == 0 and self.method in body:
            self.gave_up += 1
            # The server gets the request and answers; the answer is thrown away.
            lost = _Upstream(await trio.open_tcp_stream(*self.upstreams[0]))
            head = await self._head(lost, request, body)
            assert head is not None and head.status_code == 200
            while not isinstance(await lost.next_event(), h11.EndOfMessage):
                pass
            await lost.aclose()
            await _send(stream, down, h11.Response(status_code=504, headers=[]))
            await _send(stream, down, h11.EndOfMessage())
            return up
        return await super()._forward(up, down, stream, request, body)


@pytest.mark.parametrize("mode", ["session", "sessionless"])
async def test_a_keyed_call_behind_a_gateway_that_gave_up_is_resent_and_runs_once(
    mode: str,
) -> None:
    runs.clear()
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app, ServerConfig(port=0)).run)
        gateway = GivesUpOnce(server.port, b'"tools/call"')
        listeners = await nursery.start(partial(trio.serve_tcp, gateway.connection, 0))
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/mcp"
        retry = RetryPolicy(base_delay=0.01)
        with trio.fail_after(30):
            async with open_client(url, mode=mode, retry=retry) as client:
                trace = CallTrace()
                result = await client.call_tool("charge", {"key": "k"}, trace=trace)
        assert gateway.gave_up == 1 and trace.reposts == 1
        assert result.text == "charged k"
        assert runs == ["k"]  # the re-send was answered from the gate
        server.shutdown()
        nursery.cancel_scope.cancel()


async def test_a_request_without_a_key_is_not_resent_after_a_504() -> None:
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app, ServerConfig(port=0)).run)
        gateway = GivesUpOnce(server.port, b'"tools/list"')
        listeners = await nursery.start(partial(trio.serve_tcp, gateway.connection, 0))
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/mcp"
        with trio.fail_after(30):
            async with open_client(url, mode="session") as client:
                with pytest.raises(GatewayError) as err:
                    await client.request("tools/list")
        assert err.value.status == 504 and gateway.gave_up == 1
        server.shutdown()
        nursery.cancel_scope.cancel()
