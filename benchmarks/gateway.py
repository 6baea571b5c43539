"""A small retrying HTTP gateway, like the ones that turn a slow POST into two executions.

Every downstream (client) connection gets its own keep-alive upstream connection.
A request is forwarded upstream; if the upstream's response *headers* do not arrive
within ``--timeout`` seconds (or the upstream cannot be reached), the gateway gives
up on that upstream connection (closes it, as real gateways do) and re-sends the
same request -- same body, same JSON-RPC id -- on a new upstream connection, up to
``--retries`` times, then answers ``504``.  Only POSTs are retried; other methods
are relayed once.  With several ``--upstream`` servers, each new upstream
connection goes to the next one in turn, so a retry lands on another server
(HAProxy's ``option redispatch``).  Responses are
relayed as they arrive (an SSE stream stays a stream), with back-pressure: the
gateway reads upstream only as fast as the client reads from it.

``GET /_gateway/stats`` is answered by the gateway itself (JSON: requests, retries,
``gave_up``, and per relayed status its count and the first and last time it was
seen, on the gateway's clock), never forwarded.

``python -m benchmarks.gateway --upstream http://127.0.0.1:PORT [--upstream ...]
[--retries 2] [--timeout 1.0]`` prints ``gateway: serving http://127.0.0.1:PORT``
first on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from urllib.parse import urlsplit

import h11
import trio

_RECV = 65536
_IDLE = 300.0  # no byte from either side for this long ends the connection
_HOP = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"te",
    b"trailer",
    b"upgrade",
    b"proxy-connection",
    b"content-length",
}


class _Upstream:
    """One upstream connection driven by an h11 client."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.fail_after(_IDLE):
                self.conn.receive_data(await self.stream.receive_some(_RECV))

    async def aclose(self) -> None:
        with trio.move_on_after(1):
            await self.stream.aclose()


class Gateway:
    """The retrying gateway (see the module docstring)."""

    def __init__(self, upstreams: list[tuple[str, int]], retries: int, timeout: float) -> None:
        self.upstreams = upstreams
        self.retries = retries
        self.timeout = timeout
        self.stats = {"requests": 0, "retries": 0, "gave_up": 0}
        #: Per status relayed: [count, first seen, last seen] (trio.current_time()).
        self.statuses: dict[int, list[float]] = {}
        self._turn = 0

    def _next_upstream(self) -> tuple[str, int]:
        self._turn += 1
        return self.upstreams[self._turn % len(self.upstreams)]

    def _saw(self, status: int) -> None:
        now = trio.current_time()
        seen = self.statuses.setdefault(status, [0, now, now])
        seen[0] += 1
        seen[2] = now

    def report(self) -> dict[str, object]:
        """The stats, with the statuses seen."""
        statuses = {
            str(k): {"count": int(v[0]), "first": v[1], "last": v[2]}
            for k, v in sorted(self.statuses.items())
        }
        return {**self.stats, "statuses": statuses}

    async def _head(self, up: _Upstream, request: h11.Request, body: bytes) -> h11.Response | None:
        """Send the request and wait (bounded) for the response head."""
        headers = [(k, v) for k, v in request.headers if k not in _HOP]
        headers.append((b"content-length", b"%d" % len(body)))
        out = up.conn.send(
            h11.Request(method=request.method, target=request.target, headers=headers)
        )
        out = (out or b"") + (up.conn.send(h11.Data(data=body)) or b"")
        out += up.conn.send(h11.EndOfMessage()) or b""
        await up.stream.send_all(out)
        with trio.move_on_after(self.timeout if request.method == b"POST" else _IDLE):
            while True:
                event = await up.next_event()
                if isinstance(event, h11.Response):
                    return event
                if not isinstance(event, h11.InformationalResponse):
                    raise trio.BrokenResourceError(f"upstream sent {event!r}")
        return None

    async def _forward(
        self,
        up: _Upstream | None,
        down: h11.Connection,
        stream: trio.SocketStream,
        request: h11.Request,
        body: bytes,
    ) -> _Upstream | None:
        """Forward one request (on ``up`` if kept alive); return the upstream to reuse."""
        attempts = 1 + (self.retries if request.method == b"POST" else 0)
        for attempt in range(attempts):
            if attempt:
                self.stats["retries"] += 1
            head = None
            try:
                if up is None:
                    up = _Upstream(await trio.open_tcp_stream(*self._next_upstream()))
                head = await self._head(up, request, body)
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, h11.ProtocolError):
                pass
            if head is not None:
                break
            if up is not None:
                await up.aclose()
                up = None
        else:
            self.stats["gave_up"] += 1
            self._saw(504)
            await _send(stream, down, h11.Response(status_code=504, headers=[], reason=b"Timeout"))
            await _send(stream, down, h11.EndOfMessage())
            return None
        assert up is not None and head is not None
        self._saw(head.status_code)
        headers = [(k, v) for k, v in head.headers if k not in _HOP or k == b"content-length"]
        await _send(stream, down, h11.Response(status_code=head.status_code, headers=headers))
        while True:
            event = await up.next_event()
            if isinstance(event, h11.Data):
                await _send(stream, down, h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await _send(stream, down, h11.EndOfMessage())
                break
            else:
                raise trio.BrokenResourceError(f"upstream sent {event!r}")
        if up.conn.our_state is h11.DONE and up.conn.their_state is h11.DONE:
            up.conn.start_next_cycle()
            return up
        await up.aclose()
        return None

    async def connection(self, stream: trio.SocketStream) -> None:
        """Serve one downstream connection."""
        down = h11.Connection(h11.SERVER)
        up: _Upstream | None = None
        request: h11.Request | None = None
        body = bytearray()
        try:
            while True:
                event = down.next_event()
                if event is h11.NEED_DATA:
                    with trio.move_on_after(_IDLE):
                        down.receive_data(await stream.receive_some(_RECV))
                        continue
                    return
                if isinstance(event, h11.Request):
                    request = event
                    body.clear()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    self.stats["requests"] += 1
                    if request.target == b"/_gateway/stats":
                        data = json.dumps(self.report()).encode()
                        hdrs = [(b"content-type", b"application/json")]
                        hdrs.append((b"content-length", b"%d" % len(data)))
                        await _send(stream, down, h11.Response(status_code=200, headers=hdrs))
                        await _send(stream, down, h11.Data(data=data))
                        await _send(stream, down, h11.EndOfMessage())
                    else:
                        up = await self._forward(up, down, stream, request, bytes(body))
                    if down.our_state is not h11.DONE or down.their_state is not h11.DONE:
                        return
                    down.start_next_cycle()
                else:
                    return
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        except trio.TooSlowError:
            return
        finally:
            if up is not None:
                await up.aclose()
            with trio.move_on_after(1):
                await stream.aclose()


async def _send(stream: trio.SocketStream, conn: h11.Connection, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _main(args: argparse.Namespace) -> None:
    upstreams: list[tuple[str, int]] = []
    for url in args.upstream:
        target = urlsplit(url)
        if target.hostname is None or target.port is None:
            raise SystemExit("gateway: --upstream must be http://HOST:PORT")
        upstreams.append((target.hostname, target.port))
    gateway = Gateway(upstreams, args.retries, args.timeout)
    listeners = await trio.open_tcp_listeners(args.port, host=args.host)
    bound = listeners[0].socket.getsockname()[1]
    print(f"gateway: serving http://{args.host}:{bound}", flush=True)
    await trio.serve_listeners(gateway.connection, listeners)


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.gateway``."""
    p = argparse.ArgumentParser(prog="benchmarks.gateway", description=__doc__.split("\n")[0])
    p.add_argument(
        "--upstream", required=True, action="append", help="http://HOST:PORT (repeatable)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--retries", type=int, default=2, help="re-sends of a POST (default 2)")
    p.add_argument(
        "--timeout", type=float, default=1.0, help="seconds to wait for response headers"
    )
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(_main, args)


if __name__ == "__main__":
    main()
