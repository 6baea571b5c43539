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
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

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

#: A cut piece is copied only when that lets go of at least this many bytes.
RELEASE_MIN = 64 * 1024

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

        A list is taken over: it is emptied before anything is written, so while a
        slow peer takes the pieces nothing but this write keeps them through it.
        Up to :data:`~weir.engine._socket_io.GATHER_MAX` pieces of at least
        :data:`GATHER_MIN` bytes in all go to a plain TCP socket as gathered writes, and
        under TLS pieces are cut into records without being joined, so a large frame a
        stalled peer is slow to take is not also held as a joined copy; anything else
        (many small frames, a small write) is joined first, one system call rather
        than one per few dozen frames.  On a plain TCP socket a piece that only this
        write holds is cut down to the part the kernel has not taken, once that part
        is no more than what was taken (:func:`untaken`): a stalled JSON answer holds
        its unsent bytes, not all of itself.
        A failed or cancelled write leaves the HTTP core unusable (``send_failed``).
        """
        start = self.tracker.written
        if isinstance(data, list):
            pieces = data.copy()
            data.clear()
        else:
            pieces = [data]
        del data
        try:
            io, meter = self.io, self.meter
            if isinstance(meter, TlsMeter):
                await self._send_records(pieces, meter)
            elif io is None or not meter.exact:
                joined = b"".join(pieces)
                pieces.clear()
                await self.stream.send_all(joined)
                self.tracker.wrote(len(joined))
            else:
                if len(pieces) > GATHER_MAX or (
                    len(pieces) > 1 and sum(map(len, pieces)) < GATHER_MIN
                ):
                    pieces[:] = [b"".join(pieces)]
                await self._send_gathered(io, pieces)
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

    async def _send_gathered(self, io: SocketIO, pieces: list[bytes]) -> None:
        """Write ``pieces`` in order (taking them over: the list is emptied), one
        gathered write at a time, counting what the kernel took."""
        views = [memoryview(piece) for piece in pieces if piece]
        pieces.clear()
        wrote = self.tracker.wrote
        while views:
            n = await io.send(views[0] if len(views) == 1 else views)
            wrote(n)
            done = 0
            while n:  # skip what went out; the first piece left may be cut
                head = views[done]
                if n < len(head):
                    views[done] = untaken(head, n)
                    break
                n -= len(head)
                done += 1
            del views[:done]

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


def untaken(view: memoryview, n: int) -> memoryview:
    """What is left of ``view`` once the kernel took its first ``n`` bytes.

    A slice of a view keeps the whole buffer beneath it alive.  When nothing but
    this write holds that buffer (its only reference is the views' own) and the
    part taken is at least what is left, and at least :data:`RELEASE_MIN`, the rest
    is copied and the buffer let go: a peer that reads slowly or stops costs the
    bytes it has not been sent, not the whole write.  Each copy is at most the size
    of what it lets go, so a write copies at most its own size in all, and only
    when a write is cut part-way -- a peer that keeps up never causes one.  A buffer
    something else keeps (a stream log's frame, replayed on a resumption) is never
    copied: that would hold more, not less.
    """
    rest = view[n:]
    base = cast(bytes, view.obj)
    let_go = len(base) - len(rest)
    # Three references when only the views hold it: theirs, ``base``, the argument.
    if let_go >= len(rest) and let_go >= RELEASE_MIN and sys.getrefcount(base) <= 3:
        return memoryview(bytes(rest))
    return rest
