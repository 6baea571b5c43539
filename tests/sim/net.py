"""The simulated network: in-process byte streams with latency, windows, cuts and stalls.

Theory of operation
-------------------
Every connection in a simulated cluster is a :class:`Link`: two one-way
:class:`_Pipe` s.  A pipe delivers bytes in order, each write becoming readable
``latency`` seconds (virtual) after it was sent, the latency drawn per write from the
world's seeded random source -- so two connections reorder against each other while
each stays in order, as TCP does.  A pipe holds at most ``window`` unread bytes: a
writer whose reader stops reading (a half-open peer) blocks, as a full socket buffer
blocks ``send``.  :meth:`Link.cut` is a reset: both ends fail at once and whatever
was in flight is lost.

:class:`Network` names the endpoints (``replica-a``, ``gateway``, ...), opens links
to them (refused while an endpoint is down) and remembers every link of an endpoint,
so a hard kill cuts them all.  It replaces ``trio.open_tcp_stream`` while a
simulation runs, so weir's own client dials the simulated gateway unchanged; the
task that dials is named by :data:`DIALER` (a context variable), which the gateway
reads to say who the connection belongs to.

Nothing here reads a real clock or a real random source.
"""

from __future__ import annotations

import contextvars
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

#: Who is dialing (set by each simulated client's task): the gateway reads it.
DIALER: contextvars.ContextVar[str] = contextvars.ContextVar("DIALER", default="")


@dataclass(frozen=True)
class NetFaults:
    """How the network misbehaves (all zero: a perfect network).

    Attributes:
        latency: most one-way delay per write (seconds); each write draws in [0, latency].
        window: unread bytes a pipe holds before its writer blocks.
        cut: chance, per write, that the link is reset right after it.
        stall: chance, per link, that its client end stops reading (half-open) for
            ``stall_for`` seconds.
        stall_for: how long a stalled reader stays silent.
    """

    latency: float = 0.0
    window: int = 256 * 1024
    cut: float = 0.0
    stall: float = 0.0
    stall_for: float = 30.0


class _Pipe:
    """One direction of a link: in order, delayed, bounded (see the module docstring)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.unread = 0
        self.eof = False
        self.broken = False
        self.changed = trio.Event()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def write(self, data: bytes, delay: float) -> None:
        while self.unread >= self.window and not self.broken:
            await self.changed.wait()
        if self.broken or self.eof:
            raise trio.BrokenResourceError("connection reset")
        self.chunks.append((trio.current_time() + delay, bytes(data)))
        self.unread += len(data)
        self._wake()

    async def read(self, max_bytes: int | None) -> bytes:
        while True:
            if self.broken:
                raise trio.BrokenResourceError("connection reset")
            if self.chunks:
                ready, data = self.chunks[0]
                now = trio.current_time()
                if ready <= now:
                    n = len(data) if max_bytes is None else min(max_bytes, len(data))
                    if n == len(data):
                        self.chunks.popleft()
                    else:
                        self.chunks[0] = (ready, data[n:])
                    self.unread -= n
                    self._wake()
                    return data[:n]
                with trio.move_on_at(ready):
                    await self.changed.wait()
                continue
            if self.eof:
                return b""
            await self.changed.wait()

    def close(self) -> None:
        self.eof = True
        self._wake()

    def reset(self) -> None:
        self.broken = True
        self.chunks.clear()
        self.unread = 0
        self._wake()


class LinkEnd(trio.abc.Stream):
    """One end of a :class:`Link`, a ``trio.abc.Stream``."""

    def __init__(self, link: Link, out: _Pipe, into: _Pipe, name: str) -> None:
        self.link, self._out, self._in, self.name = link, out, into, name
        self._closed = False
        #: While set, this end reads nothing (a half-open peer), until this time.
        self.stalled_until = 0.0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        await trio.lowlevel.checkpoint()
        if data:
            await self._out.write(bytes(data), self.link.delay())
            self.link.after_write()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        self._out.close()
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self.stalled_until > trio.current_time():
            await trio.sleep_until(self.stalled_until)
        return await self._in.read(max_bytes)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._out.close()
            self._in.reset()
        await trio.lowlevel.checkpoint()


class Link:
    """A connection between a dialer and an endpoint (see the module docstring)."""

    def __init__(self, net: Network, label: str, dialer: str) -> None:
        self.net, self.label = net, label
        #: Who opened it (the gateway trusts this as a client's identity).
        self.dialer = dialer
        up, down = _Pipe(net.faults.window), _Pipe(net.faults.window)
        self.client = LinkEnd(self, up, down, f"{label}/client")
        self.server = LinkEnd(self, down, up, f"{label}/server")
        self.dead = False

    def delay(self) -> float:
        faults = self.net.faults
        return self.net.rng.uniform(0.0, faults.latency) if faults.latency else 0.0

    def after_write(self) -> None:
        faults = self.net.faults
        if faults.cut and not self.dead and self.net.rng.random() < faults.cut:
            self.net.note(f"cut {self.label}")
            self.cut()

    def cut(self) -> None:
        """Reset the connection: both ends fail now; bytes in flight are lost."""
        self.dead = True
        self.client._out.reset()
        self.client._in.reset()


#: Host names that reach the gateway (what weir's client dials: ``127.0.0.1:8000``).
GATEWAY_HOSTS = frozenset({"127.0.0.1", "localhost"})

Serve = Callable[[trio.abc.Stream], Awaitable[None]]


@dataclass
class _Endpoint:
    serve: Serve
    nursery: trio.Nursery
    links: list[Link] = field(default_factory=list)
    blocked_until: float = 0.0


class Network:
    """Named endpoints and the links between them (see the module docstring).

    Args:
        rng: the world's random source (every choice the network makes).
        faults: how it misbehaves.
        note: where it reports what it did (the world's trace).
    """

    def __init__(self, rng: random.Random, faults: NetFaults, note: Callable[[str], None]) -> None:
        self.rng, self.faults, self.note = rng, faults, note
        self._endpoints: dict[str, _Endpoint] = {}
        self._count = 0

    def listen(self, name: str, serve: Serve, nursery: trio.Nursery) -> None:
        """Accept connections to ``name``: each is served by ``serve`` in ``nursery``."""
        self._endpoints[name] = _Endpoint(serve, nursery)

    def down(self, name: str) -> None:
        """``name`` stops listening and every link to it is reset (a hard kill)."""
        endpoint = self._endpoints.pop(name, None)
        for link in endpoint.links if endpoint else ():
            link.cut()

    def partition(self, name: str, length: float) -> None:
        """Nobody reaches ``name`` for ``length`` seconds: its links are reset and new
        ones refused, while it keeps running."""
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            return
        endpoint.blocked_until = trio.current_time() + length
        for link in endpoint.links:
            link.cut()

    async def connect(self, name: str, dialer: str = "") -> LinkEnd:
        """A new connection to ``name``; ``OSError`` (refused) while it is down."""
        await trio.sleep(self.rng.uniform(0.0, self.faults.latency) if self.faults.latency else 0)
        endpoint = self._endpoints.get(name)
        if endpoint is None or endpoint.blocked_until > trio.current_time():
            raise OSError(f"connection refused: {name}")
        self._count += 1
        dialer = dialer or DIALER.get()
        link = Link(self, f"{dialer or '?'}>{name}#{self._count}", dialer)
        endpoint.links = [x for x in endpoint.links if not x.dead]
        endpoint.links.append(link)
        if self.faults.stall and self.rng.random() < self.faults.stall:
            link.client.stalled_until = trio.current_time() + self.faults.stall_for
            self.note(f"stall {link.label} for {self.faults.stall_for:g} s")
        endpoint.nursery.start_soon(_serve, endpoint.serve, link.server)
        return link.client

    async def open_tcp_stream(self, host: str | bytes, port: int, **_: object) -> trio.abc.Stream:
        """Stands in for ``trio.open_tcp_stream`` while the simulation runs."""
        name = host.decode() if isinstance(host, bytes) else host
        if name in GATEWAY_HOSTS:
            name = "gateway"
        return await self.connect(name, DIALER.get())


async def _serve(serve: Serve, stream: LinkEnd) -> None:
    try:
        await serve(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()
