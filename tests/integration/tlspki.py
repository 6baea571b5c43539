"""Real certificates for TLS tests: a test CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, all made here with ``cryptography`` (EC P-256, fast).

:func:`pki` makes them once per test process, in a temporary directory it keeps for
the process's lifetime; :func:`client_context` is what a client trusts (the test CA)
and, with ``cert=True``, presents; :func:`connect_tls` opens a TLS connection to
127.0.0.1 as a ``trio.SSLStream``.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from weir.engine import server_ssl_context

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files (and the directory that holds them)."""

    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A certificate for 127.0.0.1 signed by a CA the server does not trust.
    stranger_cert: Path
    stranger_key: Path

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """The server's context, as ``weir serve --ssl-*`` builds it."""
        return server_ssl_context(
            str(self.server_cert),
            str(self.server_key),
            ca_certs=str(self.ca) if require_client_cert else None,
        )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


_KEEP: list[tempfile.TemporaryDirectory[str]] = []


@functools.cache
def pki() -> Pki:
    """The test PKI (made once per process)."""
    holder = tempfile.TemporaryDirectory(prefix="weir-tls-")
    _KEEP.append(holder)
    directory = Path(holder.name)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("weir test CA", ca_key, None, ca=True)
    ca_path, _ = _write(directory, "ca", ca_cert, ca_key)
    issuer = (ca_cert.subject, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _write(
        directory, "server", _issue("127.0.0.1", server_key, issuer, server=True), server_key
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _write(directory, "client", _issue("test client", client_key, issuer), client_key)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = _issue("another CA", other_key, None, ca=True)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _write(
        directory,
        "stranger",
        _issue("stranger", stranger_key, (other_ca.subject, other_key)),
        stranger_key,
    )
    return Pki(directory, ca_path, *server, *client, *stranger)


def client_context(*, cert: bool = False, stranger: bool = False) -> ssl.SSLContext:
    """A client context trusting the test CA (presenting the client certificate with
    ``cert``, or one from an untrusted CA with ``stranger``)."""
    p = pki()
    ctx = ssl.create_default_context(cafile=str(p.ca))
    ctx.set_alpn_protocols(["http/1.1"])
    if cert:
        ctx.load_cert_chain(str(p.client_cert), str(p.client_key))
    elif stranger:
        ctx.load_cert_chain(str(p.stranger_cert), str(p.stranger_key))
    return ctx


async def connect_tls(
    port: int, ctx: ssl.SSLContext | None = None, *, rcvbuf: int | None = None
) -> trio.SSLStream[trio.SocketStream]:
    """A TLS connection to 127.0.0.1:``port`` (handshake done); ``rcvbuf`` shrinks
    ``SO_RCVBUF`` before connecting."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((HOST, port))
    stream = trio.SSLStream(
        trio.SocketStream(sock),
        ctx or client_context(),
        server_hostname=HOST,
        https_compatible=True,  # (as HTTPS clients: a close without close_notify is EOF)
    )
    await stream.do_handshake()
    return stream


def server_ssl_args(**extra: str) -> list[str]:
    """``weir serve`` options serving TLS with the test PKI's server certificate
    (``extra``: more ``--ssl-*`` options, e.g. ``ssl_ca_certs=...``)."""
    p = pki()
    args = ["--ssl-certfile", str(p.server_cert), "--ssl-keyfile", str(p.server_key)]
    for flag, value in extra.items():
        args += [f"--{flag.replace('_', '-')}", value]
    return args
