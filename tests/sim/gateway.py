"""The simulated gateway: a retrying, redispatching, connection-pooling HTTP balancer.

Theory of operation
-------------------
It behaves as HAProxy does in front of weir with ``retry-on all-retryable-errors``,
``option redispatch`` and ``http-reuse always`` -- the configuration that makes a
transport's exactly-once promise hard:

* each request from a client is read whole, then sent to a replica drawn from the
  seeded random source;
* if that replica refuses the connection, resets it, or sends no response head within
  ``response_timeout``, the *same bytes* go to another replica (up to ``attempts``
  times) -- so a call can arrive twice, on two replicas, while the first still runs;
* once a response head has been forwarded, a failure of the backend resets the
  client's connection (the client resumes or re-sends, as weir's client does);
* a client that hangs up while its request is forwarded takes the backend
  connection with it (as nginx and HAProxy close the upstream on a client abort);
* backend connections are kept and reused for *any* client's next request, so one
  connection to a replica carries many principals' requests in turn;
* it authenticates clients itself (by who dialed, :data:`~tests.sim.net.DIALER`) and
  puts ``Authorization: Bearer tok-<client>`` on each request that has none, as an
  authenticating edge does.

It never reads a real clock; every choice comes from the world's random source.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import h11
import trio

from .net import LinkEnd, Network

RECV = 65536


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's knobs (HAProxy's names in brackets).

    Attributes:
        attempts: sends of one request before giving up [``retries`` + 1].
        response_timeout: wait for a response head before retrying [``timeout server``].
        idle_timeout: a response that sends nothing for this long is cut [``timeout server``].
        pool: keep backend connections and reuse them for any client [``http-reuse always``].
    """

    attempts: int = 3
    response_timeout: float = 10.0
    idle_timeout: float = 60.0
    pool: bool = True


class _Backend:
    """A pooled connection to one replica."""

    def __init__(self, replica: str, stream: trio.abc.Stream) -> None:
        self.replica, self.stream = replica, stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def next_event(self) -> object:
        """The next h11 event of the response (reading as needed)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.stream.receive_some(RECV)
            self.h11.receive_data(bytes(data))


class Gateway:
    """Forwards clients' requests to replicas (see the module docstring).

    Args:
        net: the network it dials replicas on.
        replicas: the names of the replicas it balances over.
        rng: the world's random source.
        config: its knobs.
        note: the world's trace.
    """

    def __init__(
        self,
        net: Network,
        replicas: list[str],
        rng: random.Random,
        config: GatewayConfig,
        note: Callable[[str], None],
    ) -> None:
        self.net, self.replicas, self.rng, self.config, self.note = (
            net,
            replicas,
            rng,
            config,
            note,
        )
        self._idle: list[_Backend] = []
        #: Requests sent to a second replica after the first failed (retries).
        self.redispatched = 0

    async def serve(self, stream: trio.abc.Stream) -> None:
        """Serve one client connection until it closes."""
        who = stream.link.dialer if isinstance(stream, LinkEnd) else ""
        conn = h11.Connection(h11.SERVER)
        while True:
            request = await self._read_request(conn, stream)
            if request is None:
                return
            head, body = request
            headers = [(k, v) for k, v in head.headers if k != b"connection"]
            if who and not any(k == b"authorization" for k, _ in headers):
                headers.append((b"authorization", f"Bearer tok-{who}".encode()))
            events: list[h11.Event] = [
                h11.Request(method=head.method, target=head.target, headers=headers)
            ]
            if body:
                events.append(h11.Data(data=body))
            events.append(h11.EndOfMessage())
            label = f"{who} {head.method.decode()} {len(body)}B"
            with trio.CancelScope() as hang_up:
                async with trio.open_nursery() as watch:
                    watch.start_soon(_watch_for_hang_up, stream, hang_up)
                    kept = await self._forward(events, conn, stream, label)
                    watch.cancel_scope.cancel()
            if hang_up.cancelled_caught:
                self.note(f"gateway: {label}: the client hung up, the backend is closed")
                return
            if not kept:
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read_request(
        self, conn: h11.Connection, stream: trio.abc.Stream
    ) -> tuple[h11.Request, bytes] | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await stream.receive_some(RECV)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                conn.receive_data(bytes(data))
                if not data and head is None:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                return head, bytes(body)
            else:
                return None

    async def _backend(self, exclude: set[str]) -> _Backend | None:
        if self.config.pool:
            for i, b in enumerate(self._idle):
                if b.replica not in exclude:
                    return self._idle.pop(i)
        choices = [r for r in self.replicas if r not in exclude] or list(self.replicas)
        replica = self.rng.choice(choices)
        try:
            return _Backend(replica, await self.net.connect(replica, "gateway"))
        except OSError:
            exclude.add(replica)
            return None

    async def _forward(
        self, request: list[h11.Event], conn: h11.Connection, client: trio.abc.Stream, label: str
    ) -> bool:
        """Send ``request`` until one replica answers; relay its response.  False if the
        client's connection must end."""
        tried: set[str] = set()
        for attempt in range(self.config.attempts):
            backend = await self._backend(tried)
            if backend is None:
                continue
            tried.add(backend.replica)
            self.note(f"gateway: {label} to {backend.replica}")
            if attempt:
                self.redispatched += 1
                self.note(f"gateway: {label} again, to {backend.replica}")
            try:
                head = None
                with trio.move_on_after(self.config.response_timeout):
                    try:
                        for event in request:
                            await _send(backend.stream, backend.h11, event)
                        head = await backend.next_event()
                    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                        head = None
                if not isinstance(head, h11.Response):
                    await backend.stream.aclose()
                    continue
                return await self._relay(backend, head, conn, client)
            except BaseException:
                # The client hung up (or the run ends): the backend connection goes too,
                # as nginx and HAProxy close the upstream when their client aborts.
                await trio.aclose_forcefully(backend.stream)
                raise
        await _send(client, conn, h11.Response(status_code=503, headers=[("content-length", "0")]))
        await _send(client, conn, h11.EndOfMessage())
        return True

    async def _relay(
        self, backend: _Backend, head: h11.Response, conn: h11.Connection, client: trio.abc.Stream
    ) -> bool:
        headers = [(k, v) for k, v in head.headers if k not in (b"connection", b"keep-alive")]
        try:
            await _send(client, conn, h11.Response(status_code=head.status_code, headers=headers))
            while True:
                event: object = None
                with trio.move_on_after(self.config.idle_timeout):
                    event = await backend.next_event()
                if event is None:
                    raise trio.BrokenResourceError("idle")
                if isinstance(event, h11.Data):
                    await _send(client, conn, h11.Data(data=event.data))
                elif isinstance(event, h11.EndOfMessage):
                    await _send(client, conn, h11.EndOfMessage())
                    break
                else:
                    raise trio.BrokenResourceError(f"unexpected {event!r}")
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            await backend.stream.aclose()
            return False
        self._release(backend)
        return True

    def _release(self, backend: _Backend) -> None:
        h = backend.h11
        if self.config.pool and h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            self._idle.append(backend)


async def _watch_for_hang_up(client: trio.abc.Stream, hang_up: trio.CancelScope) -> None:
    """While a request is forwarded, its client sends nothing (no pipelining): an end
    of stream means it hung up, and the request's forwarding is cancelled."""
    try:
        data = await client.receive_some(RECV)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        data = b""
    if not data:
        hang_up.cancel()


async def _send(stream: trio.abc.Stream, conn: h11.Connection, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)
