"""TLS on the Trio runtime: a ciphertext-counting transport under ``trio.SSLStream``.

Theory of operation
-------------------
A connection of a server whose :attr:`ServerConfig.ssl_context` is set is served as
``SSLStream(CountingStream(tcp))`` (:func:`accept_tls`): the handshake must finish
within ``head_timeout`` (a client that connects and says nothing, or trickles its
handshake, is closed then), and a failed handshake -- a client without the required
certificate, plain HTTP on the TLS port -- closes the connection with one debug line.

:class:`CountingStream` writes ciphertext with ``send()`` on the socket itself, so
its count of bytes the kernel accepted is exact even while a write is blocked
part-way.  :class:`TlsMeter` is the :class:`~weir.common._sendqueue.KernelSendQueue` of such a
connection: ``SIOCOUTQ`` gives the ciphertext not yet acknowledged, and
:class:`weir.common._tls.CipherOffsets` turns the ciphertext acknowledged into
plaintext acknowledged, which is what the connection's drain marks are in.  The
connection writes one record's worth of plaintext (16 KiB) at a time and records
each (see ``Connection.send``).
"""

from __future__ import annotations

import logging
import ssl

import trio

from weir.common._tls import CipherOffsets

from ._acks import kernel_queue

log = logging.getLogger(__name__)


class CountingStream(trio.abc.Stream):
    """A transport that counts the bytes written to it (:attr:`sent`).

    Guarantees: on a TCP stream, :attr:`sent` is exactly what ``send()`` on the
    socket accepted, updated as each ``send()`` returns (a cancelled or failed write
    counts what went); on any other stream, what ``send_all`` completed.
    """

    __slots__ = ("sent", "tcp")

    def __init__(self, tcp: trio.abc.Stream) -> None:
        self.tcp = tcp
        #: Ciphertext bytes the kernel (or the stream) accepted.
        self.sent = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data``, counting as the kernel accepts it."""
        if not isinstance(self.tcp, trio.SocketStream):
            await self.tcp.send_all(data)
            self.sent += len(data)
            return
        sock = self.tcp.socket
        view = memoryview(data)
        try:
            while view:
                n = await sock.send(view)
                self.sent += n
                view = view[n:]
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc

    async def wait_send_all_might_not_block(self) -> None:
        """As the TCP stream's."""
        await self.tcp.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """As the TCP stream's."""
        return await self.tcp.receive_some(max_bytes)

    async def aclose(self) -> None:
        """Close the TCP stream."""
        await self.tcp.aclose()


class TlsMeter:
    """The drain meter of a TLS connection: plaintext the peer has not acknowledged.

    Guarantees: :meth:`unacknowledged` never reports a plaintext byte acknowledged
    before the peer acknowledged every ciphertext byte written up to the end of its
    TLS record; it is :attr:`exact` when the TCP meter is (Linux ``SIOCOUTQ``).
    """

    __slots__ = ("_counting", "_tcp", "offsets")

    def __init__(self, counting: CountingStream, *, notsent_lowat: int | None) -> None:
        self._counting = counting
        self._tcp = kernel_queue(counting.tcp, notsent_lowat)
        self.offsets = CipherOffsets()

    @property
    def exact(self) -> bool:
        """True when the kernel's count of unacknowledged ciphertext is available."""
        return self._tcp.exact

    @property
    def ciphertext_sent(self) -> int:
        """Ciphertext bytes the kernel accepted (the handshake's included)."""
        return self._counting.sent

    def ciphertext_acked(self) -> int:
        """Ciphertext bytes the peer acknowledged (all of it accepted when not exact)."""
        return self._counting.sent - self._tcp.unacknowledged()

    def wrote(self, plaintext_end: int) -> None:
        """Plaintext ``[0, plaintext_end)`` is encrypted and wholly in the kernel."""
        self.offsets.wrote(plaintext_end, self._counting.sent)

    def unacknowledged(self) -> int:
        """Plaintext written that the peer has not acknowledged (see the class)."""
        return self.offsets.unacknowledged(self.ciphertext_acked())


async def accept_tls(
    tcp: trio.abc.Stream, context: ssl.SSLContext, *, timeout: float
) -> tuple[trio.SSLStream[CountingStream], CountingStream] | None:
    """Wrap ``tcp`` and complete the server's handshake within ``timeout`` seconds;
    None if the client fails it or takes longer (the caller closes ``tcp``)."""
    counting = CountingStream(tcp)
    tls = trio.SSLStream(counting, context, server_side=True, https_compatible=True)
    with trio.move_on_after(timeout):
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            log.debug("TLS handshake failed: %s", exc.__cause__ or exc)
            return None
        return tls, counting
    log.debug("TLS handshake not done within %g s; connection closed", timeout)
    return None
