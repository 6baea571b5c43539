"""One client connection: the HTTP core, byte-exact send accounting, and the ack poller.

Theory of operation
-------------------
:class:`Connection` owns a stream and its :class:`weir.protocol.HttpConnection`.  Every
byte goes out through :meth:`Connection.send`, which counts bytes as the kernel
accepts them (on a TCP socket it calls ``send()`` itself, so the count is exact even
while a write is blocked part-way) and records, for each SSE frame in the data, the
offset of the frame's last byte (:class:`weir.protocol.DrainTracker`).  Under TLS
the stream is a ``trio.SSLStream``: it writes one record's plaintext at a time and
its :class:`~weir.engine._tls.TlsMeter` maps the plaintext offsets to ciphertext ones.

:meth:`Connection.check_acks` asks the :class:`~weir.common._sendqueue.KernelSendQueue` how many
of those bytes the peer has acknowledged and hands the result to the core: frames
whose last byte is acknowledged give their session's credit back, and any
acknowledged byte of a pending frame counts as progress for that frame's session
(never bytes of refusals or of other sessions' responses).  After each
write it checks once; while something is still unacknowledged, the server's
:class:`~weir.engine._acks.AckPoller` re-checks on a backoff (10 ms doubling to
250 ms, reset by progress), and so does the next request on the connection.  A stalled
peer therefore shows as "no progress", however the writer is blocked.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from weir.common._sendqueue import KernelSendQueue
from weir.common._tls import record_plaintexts
from weir.protocol import DrainTracker, HeadCache, HttpConnection, HttpLimits

from ._acks import MIN_POLL, AckPoller, kernel_queue
from ._session import JsonCharge
from ._socket_io import GATHER_MAX, SocketIO, socket_io
from ._tls import TlsMeter

#: A write of pieces this large in all is gathered (``writev``) rather than joined:
#: below it the join is cheaper than the extra system-call arguments.
GATHER_MIN = 64 * 1024

if TYPE_CHECKING:
    from ._session import Session, StreamHandle

    #: What a mark in the byte stream stands for: a frame of a stream log (its
    #: handle and seq), or a JSON response's credit.
    Holder = StreamHandle | JsonCharge


class Connection:
    """A client connection (see the module docstring)."""

    __slots__ = (
        "address",
        "closed",
        "http",
        "inbound",
        "io",
        "meter",
        "owners",
        "peer",
        "poll_delay",
        "poll_due",
        "poller",
        "scope",
        "secret",
        "stream",
        "tracker",
    )

    def __init__(
        self,
        stream: trio.abc.Stream,
        limits: HttpLimits,
        *,
        notsent_lowat: int | None,
        heads: HeadCache | None = None,
        poller: AckPoller | None = None,
        meter: TlsMeter | None = None,
        peer: str = "",
    ) -> None:
        self.stream = stream
        #: A plain TCP stream's descriptor, read and written directly (None: TLS or
        #: another kind of stream, used through its own methods).
        self.io: SocketIO | None = socket_io(stream)
        #: The TCP peer's address (``""``: not a socket): the access log's client,
        #: unless a trusted proxy names another.  What a request's forwarding headers
        #: say is worked out per request from it, never kept here.
        self.peer = peer
        #: How the access log names the peer (``host:port``).
        self.address = "-"
        self.http = HttpConnection(limits, heads=heads)
        #: What the peer acknowledged: of the TCP socket, or (TLS, ``stream`` the
        #: ``SSLStream`` over ``meter``'s transport) of its plaintext.
        self.meter: KernelSendQueue | TlsMeter = meter or kernel_queue(stream, notsent_lowat)
        self.tracker: DrainTracker[tuple[Holder, int]] = DrainTracker()
        #: The server's re-checker of acknowledgements (None: nothing re-checks).
        self.poller = poller
        #: Set by the poller: an entry for this connection is in its heap.
        self.poll_due = False
        #: The poller's current wait between re-checks of this connection.
        self.poll_delay = MIN_POLL
        #: The connection is gone (the poller forgets it).
        self.closed = False
        #: The scope its requests are served in (cancelling it ends the connection).
        self.scope: trio.CancelScope | None = None
        #: Bytes received since the last complete request (the server's inbound cap).
        self.inbound = 0
        #: A random id of this connection, never sent: what scopes an anonymous
        #: request (see ``engine._requester``).  Who a request speaks for is never
        #: kept here: it comes with each request.
        self.secret = secrets.token_hex(16)
        #: The sessionless credit owners this connection holds a reference to, by
        #: the scope of the requests that used them, least recently used first (see
        #: ``engine._sessionless``; at most ``MAX_OWNERS`` of them).
        self.owners: dict[tuple[str, str], Session] = {}

    async def receive(self, max_bytes: int) -> bytes | bytearray:
        """Up to ``max_bytes`` from the peer (``b""``: it closed its side)."""
        io = self.io
        if io is not None:
            return await io.receive(max_bytes)
        return await self.stream.receive_some(max_bytes)

    async def send(
        self,
        data: bytes | list[bytes],
        marks: Sequence[tuple[int, tuple[Holder, int]]] | None = None,
    ) -> None:
        """Write ``data`` (or the concatenation of its pieces); ``marks`` are (offset
        within ``data`` just past a frame, token).

        Up to :data:`~weir.engine._socket_io.GATHER_MAX` pieces of at least
        :data:`GATHER_MIN` bytes in all go to a plain TCP socket as gathered writes, and
        under TLS pieces are cut into records without being joined, so a large frame a
        stalled peer is slow to take is not also held as a joined copy; anything else
        (many small frames, a small write) is joined first, one system call rather
        than one per few dozen frames.
        A failed or cancelled write leaves the HTTP core unusable (``send_failed``).
        """
        start = self.tracker.written
        try:
            io, meter = self.io, self.meter
            if isinstance(meter, TlsMeter):
                await self._send_records(data if isinstance(data, list) else [data], meter)
            elif io is None or not meter.exact:
                joined = data if isinstance(data, bytes) else b"".join(data)
                await self.stream.send_all(joined)
                self.tracker.wrote(len(joined))
            elif (
                isinstance(data, list)
                and len(data) <= GATHER_MAX
                and (sum(map(len, data)) >= GATHER_MIN)
            ):
                await self._send_gathered(io, data)
            else:
                view = memoryview(data if isinstance(data, bytes) else b"".join(data))
                while view:
                    n = await io.send(view)
                    self.tracker.wrote(n)
                    view = view[n:]
        except OSError as exc:
            self.http.send_failed()
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
        except BaseException:
            self.http.send_failed()
            raise
        for offset, token in marks or ():
            self.tracker.mark(start + offset, token)
        if self.check_acks() and self.poller is not None:
            self.poller.watch(self)

    async def _send_gathered(self, io: SocketIO, parts: list[bytes]) -> None:
        """Write ``parts`` in order with gathered writes, counting what the kernel took."""
        views = [memoryview(part) for part in parts if part]
        first, wrote = 0, self.tracker.wrote
        while first < len(views):
            n = await io.send(views[first:] if first else views)
            wrote(n)
            while n:  # skip what went out; the first piece left may be cut
                head = views[first]
                if n < len(head):
                    views[first] = head[n:]
                    break
                n -= len(head)
                first += 1

    async def _send_records(self, pieces: list[bytes], meter: TlsMeter) -> None:
        """Under TLS: one record's plaintext at a time (cut from ``pieces`` without
        joining them, :func:`~weir.common._tls.record_plaintexts`), each recorded with
        the ciphertext written so far once it is wholly in the kernel (``engine._tls``).

        Each record is watched by the ACK poller, so a peer reading a long write
        slowly shows progress before the write returns."""
        send_all, tracker, poller = self.stream.send_all, self.tracker, self.poller
        for chunk in record_plaintexts(pieces):
            await send_all(chunk)
            meter.wrote(tracker.wrote(len(chunk)))
            if poller is not None:
                poller.watch(self)

    def check_acks(self) -> bool:
        """Ask the kernel what the peer acknowledged; release drained frames' credit.

        Returns whether bytes are still unacknowledged.
        """
        tracker = self.tracker
        tokens, partial = tracker.settle(self.meter.unacknowledged())
        if partial is not None:
            partial[0].session.progress()
        for holder, seq in tokens:
            holder.drained(seq + 1)
        return bool(tracker.outstanding)

    def abandon(self) -> None:
        """The connection is gone: whatever it wrote and the peer did not acknowledge
        gives its credit back -- nothing will ever acknowledge it on this connection.

        JSON responses cannot be replayed, so nothing is owed any more.  Frames of
        stream logs stay in their log as replay history (a resumption writes them
        again, on a connection of its own); they just stop holding credit, so a
        client that stops reading and hangs up does not starve its session's other
        streams until the liveness teardown.
        """
        for holder, seq in self.tracker.take_pending():
            holder.drained(0 if isinstance(holder, JsonCharge) else seq + 1)
