"""TLS for ``weir serve``: the server's SSL context, and plaintext-to-ciphertext offsets.

Theory of operation
-------------------
:func:`server_ssl_context` builds what ``--ssl-*`` ask for: the defaults of
``ssl.create_default_context(Purpose.CLIENT_AUTH)`` (its cipher list and options),
TLS 1.2 at least, no renegotiation, ALPN ``http/1.1``, and -- with ``ca_certs`` --
client certificates required and verified against those authorities.  A missing, unreadable or
mismatched file raises :class:`TlsConfigError` with one line that names it.

:class:`CipherOffsets` keeps drain tracking exact under TLS.  The kernel's
``SIOCOUTQ`` counts *ciphertext* the peer has not acknowledged, while drain marks are
*plaintext* offsets.  After each plaintext write has been encrypted and handed to the
kernel whole, the runtime records the pair (plaintext written so far, ciphertext
written so far).  Every ciphertext byte of plaintext ``[0, p)`` precedes ciphertext
offset ``c`` of the pair ``(p, c)`` recorded after it, so once the peer has
acknowledged ``c`` ciphertext bytes it has received every record of ``[0, p)``:
acknowledged plaintext is the largest recorded ``p`` whose ``c`` is acknowledged.
The runtime writes at most one TLS record per recorded pair
(:func:`record_plaintexts` cuts what it writes into such pieces without joining a
large frame into a copy first), so the count is exact at record boundaries -- and a
TLS peer cannot read any byte of a record before its last byte arrives (the record's
authentication tag), so a record is the smallest unit a peer can have received
anyway.  Pairs are pruned as they are acknowledged;
at most :data:`MAX_PAIRS` are kept (beyond, the newest is merged into the one
before it, which can only delay, never advance, what counts as acknowledged).

:data:`LINGER_QUIET` is how a refused TLS connection lingers: TLS has no half-close,
so instead of sending EOF and reading to the peer's, the runtime reads and discards
until the peer has been quiet that long (or the linger timeout passes), then closes
-- a client that writes its whole refused request before reading gets the refusal,
not a reset.

It imports neither trio nor asyncio.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Final

#: Most (plaintext, ciphertext) pairs one connection keeps unacknowledged.
MAX_PAIRS: Final = 4096
#: Seconds without a byte from the peer after which a refused TLS connection stops
#: lingering and closes (see the module docstring).
LINGER_QUIET: Final = 0.25
#: The most plaintext one TLS record carries (RFC 8446 section 5.1): the runtime
#: writes at most this much per recorded pair.
RECORD_PLAINTEXT: Final = 16384


def record_plaintexts(pieces: Sequence[bytes]) -> Iterator[bytes | memoryview]:
    """The concatenation of ``pieces`` in order, cut into plaintexts of at most
    :data:`RECORD_PLAINTEXT` bytes (one TLS record each).

    A large piece is cut into views of itself, never copied whole; small ones (and a
    large one's ends) are gathered into full records, so a chunk's size line or a
    stream's end does not cost a record of its own.  At most one record per piece
    boundary is a copy (of at most :data:`RECORD_PLAINTEXT` bytes).
    """
    gathered = bytearray()
    for piece in pieces:
        view = memoryview(piece)
        while view:
            if gathered or len(view) < RECORD_PLAINTEXT:
                room = RECORD_PLAINTEXT - len(gathered)
                gathered += view[:room]
                view = view[room:]
                if len(gathered) == RECORD_PLAINTEXT:
                    yield bytes(gathered)
                    gathered.clear()
            else:
                yield view[:RECORD_PLAINTEXT]
                view = view[RECORD_PLAINTEXT:]
    if gathered:
        yield bytes(gathered)


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used; the message is one line."""


def server_ssl_context(
    certfile: str,
    keyfile: str | None = None,
    *,
    password: str | None = None,
    ca_certs: str | None = None,
) -> ssl.SSLContext:
    """A server-side context: ``create_default_context(Purpose.CLIENT_AUTH)``'s
    ciphers and options, TLS >= 1.2 without renegotiation, ALPN ``http/1.1``, the
    certificate chain of ``certfile`` (with ``keyfile``, unless the key is in
    ``certfile``), and with ``ca_certs`` client certificates required and verified
    against it.

    Raises:
        TlsConfigError: a file is missing or unreadable, the key does not match the
            certificate, the password is wrong, or a file holds no usable PEM.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # A TLS 1.2 client may not make the server redo its handshake's work on demand.
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(["http/1.1"])
    for what, path in (("certificate", certfile), ("key", keyfile), ("CA", ca_certs)):
        if path is not None:
            _check_readable(what, path)
    try:
        # Never a prompt on the terminal for an encrypted key without a password.
        ctx.load_cert_chain(certfile, keyfile, password or (lambda: b""))
    except ssl.SSLError as exc:
        raise TlsConfigError(_chain_error(certfile, keyfile, password, exc)) from None
    except OSError as exc:
        raise TlsConfigError(f"cannot load {certfile!r}: {exc.strerror or exc}") from None
    if ca_certs is not None:
        try:
            ctx.load_verify_locations(cafile=ca_certs)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(
                f"cannot load the CA certificates {ca_certs!r}: {_reason(exc)}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _check_readable(what: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TlsConfigError(f"cannot read the {what} file {path!r}: {exc.strerror}") from None


def _chain_error(
    certfile: str, keyfile: str | None, password: str | None, exc: ssl.SSLError
) -> str:
    key = keyfile or certfile
    if "KEY_VALUES_MISMATCH" in str(exc):
        return f"the key {key!r} does not belong to the certificate {certfile!r}"
    try:
        with open(key, "rb") as f:
            encrypted = b"ENCRYPTED" in f.read(1 << 20)
    except OSError:
        encrypted = False
    if encrypted:
        return (
            f"the key {key!r} is encrypted: "
            + ("its password is wrong" if password else "give its password")
            + " (--ssl-keyfile-password)"
        )
    return f"cannot load the certificate {certfile!r} with the key {key!r}: {_reason(exc)}"


def _reason(exc: BaseException) -> str:
    if "PEM lib" in str(exc):
        return "not a PEM certificate and its private key"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).replace("_", " ").lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class CipherOffsets:
    """Which plaintext offsets a peer has acknowledged, from ciphertext acknowledged
    (see the module docstring).

    Guarantees: :meth:`acknowledged` never counts a plaintext byte before every
    ciphertext byte written up to and including it is acknowledged; with one
    record per :meth:`wrote`, it counts every completely acknowledged record.
    """

    __slots__ = ("_pairs", "acked", "written")

    def __init__(self) -> None:
        self._pairs: deque[tuple[int, int]] = deque()
        #: Plaintext bytes written (the last recorded plaintext end).
        self.written = 0
        #: Plaintext bytes known acknowledged.
        self.acked = 0

    def wrote(self, plaintext_end: int, ciphertext_end: int) -> None:
        """Plaintext ``[0, plaintext_end)`` is encrypted and in the kernel, as
        ciphertext ``[0, ciphertext_end)`` (and possibly less)."""
        if plaintext_end < self.written:
            raise ValueError(f"plaintext end {plaintext_end} < {self.written} already written")
        pairs = self._pairs
        if pairs and ciphertext_end < pairs[-1][1]:
            raise ValueError(f"ciphertext end {ciphertext_end} < {pairs[-1][1]}")
        if len(pairs) >= MAX_PAIRS:
            pairs.pop()  # merged into this one: it can only be counted later
        pairs.append((plaintext_end, ciphertext_end))
        self.written = plaintext_end

    def acknowledged(self, ciphertext_acked: int) -> int:
        """The plaintext acknowledged once ``ciphertext_acked`` ciphertext bytes are
        (never less than before); acknowledged pairs are forgotten."""
        pairs = self._pairs
        while pairs and pairs[0][1] <= ciphertext_acked:
            self.acked = pairs.popleft()[0]
        return self.acked

    def unacknowledged(self, ciphertext_acked: int) -> int:
        """Plaintext written and not yet acknowledged."""
        return self.written - self.acknowledged(ciphertext_acked)
