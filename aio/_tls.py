"""TLS on the asyncio runtime: an ``SSLObject`` pumped by hand over the TCP streams.

Theory of operation
-------------------
asyncio's own TLS (``start_server(ssl=...)``) hides the ciphertext writes, and drain
tracking needs them: ``SIOCOUTQ`` and the transport's write buffer count
*ciphertext* not yet acknowledged, while drain marks are *plaintext* offsets.  So a
connection of a server given an ``ssl_context`` is served through :class:`TlsWriter`
and :class:`TlsReader`, which drive one ``ssl.SSLObject`` over memory BIOs on the
plain TCP reader and writer (:func:`accept_tls` does the handshake, within the head
timeout).

Each plaintext write is encrypted one record (16 KiB) at a time and the ciphertext
handed to the transport at once; after each record the pair (plaintext written,
ciphertext written) goes to a :class:`weir.common._tls.CipherOffsets`, as on Trio.
:meth:`TlsWriter.unacknowledged` turns the ciphertext not yet acknowledged (the
transport's buffer plus the kernel's send queue) into plaintext: exact at record
boundaries.  Ciphertext the TLS layer writes on its own (session tickets, a key
update's answer) is counted too; it can only delay what counts as acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from weir.common._tls import CipherOffsets, record_plaintexts

log = logging.getLogger("weir.asyncio")
_HANDSHAKE_ROUNDS = 64


class TlsWriter:
    """The writer side of one TLS connection (what :class:`~._connection.Connection`
    uses of an ``asyncio.StreamWriter``, over the TCP one).

    Guarantees: every plaintext byte given to :meth:`write` is in the transport as
    ciphertext when it returns, and :meth:`unacknowledged` never reports a plaintext
    byte acknowledged before every ciphertext byte of its record is.
    """

    def __init__(
        self, tcp: asyncio.StreamWriter, tls: ssl.SSLObject, outgoing: ssl.MemoryBIO
    ) -> None:
        self.tcp, self.tls, self._outgoing = tcp, tls, outgoing
        self.transport = tcp.transport
        #: Ciphertext bytes handed to the transport.
        self.ciphertext_written = 0
        self.offsets = CipherOffsets()
        self._plaintext = 0

    def flush(self) -> None:
        """Hand whatever the TLS layer produced to the transport."""
        data = self._outgoing.read()
        if data:
            self.tcp.write(data)
            self.ciphertext_written += len(data)

    def write(self, data: bytes) -> None:
        """Encrypt ``data`` (one record per 16 KiB) and hand it to the transport."""
        for chunk in record_plaintexts((data,)):
            self.tls.write(chunk)
            self.flush()
            self._plaintext += len(chunk)
            self.offsets.wrote(self._plaintext, self.ciphertext_written)

    def unacknowledged(self, ciphertext_unacknowledged: int) -> int:
        """Plaintext written and not acknowledged, given the ciphertext that is not."""
        acked = self.ciphertext_written - ciphertext_unacknowledged
        return self.offsets.unacknowledged(acked)

    async def drain(self) -> None:
        """As the TCP writer's."""
        await self.tcp.drain()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """As the TCP writer's (``ssl_object``: the TLS connection)."""
        if name == "ssl_object":
            return self.tls
        return self.tcp.get_extra_info(name, default)

    def can_write_eof(self) -> bool:
        """False: TLS has no half-close (a refusal is not lingered over)."""
        return False

    def write_eof(self) -> None:
        """Never called (see :meth:`can_write_eof`)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the TCP connection (no ``close_notify``, as HTTPS servers do)."""
        self.tcp.close()

    async def wait_closed(self) -> None:
        """As the TCP writer's."""
        await self.tcp.wait_closed()


class TlsReader:
    """The reader side of one TLS connection: :meth:`read` returns plaintext."""

    def __init__(
        self, tcp: asyncio.StreamReader, writer: TlsWriter, incoming: ssl.MemoryBIO
    ) -> None:
        self.tcp, self._writer, self._incoming = tcp, writer, incoming

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of plaintext; ``b""`` at the end (or a broken TLS stream)."""
        size = n if n > 0 else 65536
        for _ in range(1_000_000):
            try:
                data = self._writer.tls.read(size)
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            except ssl.SSLError as exc:
                log.debug("TLS connection broken: %s", exc)
                return b""
            else:
                self._writer.flush()  # (a key update may need an answer)
                return data
            self._writer.flush()
            ciphertext = await self.tcp.read(65536)
            if not ciphertext:
                return b""
            self._incoming.write(ciphertext)
        return b""  # (unreachable in practice: each round reads ciphertext)


async def accept_tls(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    context: ssl.SSLContext,
    *,
    timeout: float,
) -> tuple[TlsReader, TlsWriter] | None:
    """The server's handshake within ``timeout`` seconds; None if the client fails it,
    hangs up or takes longer (the caller closes the connection)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    out = TlsWriter(writer, tls, outgoing)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            for _ in range(_HANDSHAKE_ROUNDS):
                try:
                    tls.do_handshake()
                except ssl.SSLWantReadError:
                    out.flush()
                    data = await reader.read(65536)
                    if not data:
                        return None
                    incoming.write(data)
                except (ssl.SSLError, OSError) as exc:
                    log.debug("TLS handshake failed: %s", exc)
                    out.flush()  # (the alert that says why)
                    return None
                else:
                    out.flush()
                    return TlsReader(reader, out, incoming), out
    log.debug("TLS handshake not done within %g s; connection closed", timeout)
    return None
