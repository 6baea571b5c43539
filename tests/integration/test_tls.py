"""TLS in ``weir serve``: real certificates (``tests.integration.tlspki``), real sockets.

* a session-era call and a 2026-07-28 call over https (in-process server, weir's h11
  and raw test clients wrapped in ``trio.SSLStream``);
* client certificates: required with ``ssl_ca_certs`` (none, or one from another CA:
  the handshake is refused and nothing is served; the test CA's: served), on both
  runtimes;
* hostile clients over TLS, on ``weir serve [--runtime asyncio] --ssl-*`` in a
  subprocess: a client that never finishes its handshake, plain HTTP on the TLS port,
  a trickled head, an oversized head;
* drain tracking stays exact: what the server counts acknowledged equals the
  plaintext of the TLS records the peer's TCP has received (measured with a client
  that reads exactly N bytes, then stops);
* the command line: ``https://`` in the served URL; a missing or mismatched key is
  one line and status 1 (on both runtimes);
* an ``http://`` resource identifier with TLS is refused.

The half-open loopback tests run over TLS too (``tls`` axis of
:mod:`tests.integration.test_half_open_loopback`).  Real time throughout: every wait
is bounded (``fail_after``/``move_on_after``, ``range``).
"""

from __future__ import annotations

import array
import fcntl
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives import serialization

from tests.engine.helpers import H11Client
from tests.integration import runtimes
from tests.integration.rawhttp import Client, raw_request
from tests.integration.runtimes import RUNTIMES
from tests.integration.serverproc import REPO_ROOT, WeirProcess
from tests.integration.test_asyncio_driver import Client as AsyncioClient
from tests.integration.tlspki import HOST, client_context, connect_tls, pki, server_ssl_args
from weir.asyncio import AsyncioDriver
from weir.asyncio._tls import TlsWriter as AsyncioTlsWriter
from weir.engine import App, Authorization, Server, ServerConfig, TlsConfigError
from weir.engine import server_ssl_context as make_context
from weir.engine._tls import TlsMeter
from weir.protocol import CreditLimits

LINUX = sys.platform == "linux"
V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}
app = App("tls-test")


@app.tool()
async def echo(text: str) -> str:
    """``text`` back."""
    return text


@app.tool()
async def bulk(size: int) -> str:
    """``size`` bytes of text."""
    return "x" * size


@asynccontextmanager
async def serving(config: ServerConfig) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(Server(app, config).run)
        try:
            yield server
        finally:
            server.shutdown()
            with trio.fail_after(30):
                await server.stopped.wait()


def tls_config(**more: Any) -> ServerConfig:
    require = more.pop("require_client_cert", False)
    return ServerConfig(
        port=0, ssl_context=pki().server_context(require_client_cert=require), **more
    )


def raw_client(stream: trio.abc.Stream) -> Client:
    """weir's raw client over a TLS stream (it uses ``send_all``/``receive_some``/``aclose``)."""
    return Client(stream)  # type: ignore[arg-type]


# ---------------------------------------------------------------- calls over https
async def test_session_era_call_over_https() -> None:
    with trio.fail_after(30):
        async with serving(tls_config()) as server:
            assert server.url == f"https://{HOST}:{server.port}/mcp"
            stream = await connect_tls(server.port)
            assert stream.selected_alpn_protocol() == "http/1.1"
            assert stream.version() in ("TLSv1.2", "TLSv1.3")
            client = H11Client(stream, host=f"{HOST}:{server.port}")
            async with stream:
                await client.initialize()
                reply = await client.call(1, "echo", {"text": "over tls"})
                [message] = await reply.messages()
                assert message["result"]["content"][0]["text"] == "over tls"
                [conn] = server.open_connections
                assert isinstance(conn.meter, TlsMeter)
                assert conn.meter.exact == LINUX


async def test_sessionless_call_over_https_with_tls_1_2() -> None:
    ctx = client_context()
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # the oldest version served
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "echo",
            "arguments": {"text": "sessionless"},
            "_meta": META,
        },
    }
    headers = {"mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": "echo"}
    with trio.fail_after(30):
        async with serving(tls_config()) as server:
            stream = await connect_tls(server.port, ctx)
            assert stream.version() == "TLSv1.2"
            client = raw_client(stream)
            reply = await client.request("POST", "/mcp", message, headers=headers)
            await client.aclose()
    assert reply.status == 200, reply
    assert reply.json()["result"]["content"][0]["text"] == "sessionless"


# ---------------------------------------------------------------- client certificates
async def refused_handshake(port: int, ctx: ssl.SSLContext) -> bool:
    """True if the server refuses a client with ``ctx``: its handshake fails, or (TLS
    1.3: the client's side of the handshake ends before the server checks the
    certificate) its first request is answered with an alert or a close, not HTTP."""
    try:
        stream = await connect_tls(port, ctx)
    except trio.BrokenResourceError:
        return True
    try:
        await stream.send_all(raw_request("POST", "/mcp", body=b"{}"))
        with trio.fail_after(10):
            data = await stream.receive_some(65536)
    except trio.BrokenResourceError:
        return True
    finally:
        with trio.move_on_after(1):
            await stream.aclose()
    return data == b""


@RUNTIMES
async def test_client_certificate_is_required_and_verified(runtime: str) -> None:
    with runtimes.serving(runtime, app, tls=True, client_certs=True) as running:
        with trio.fail_after(30):
            assert await refused_handshake(running.port, client_context())
            assert await refused_handshake(running.port, client_context(stranger=True))
            stream = await connect_tls(running.port, client_context(cert=True))
            client = H11Client(stream, host=f"{HOST}:{running.port}")
            async with stream:
                await client.initialize()
                assert client.session_id is not None
                assert running.has_session(client.session_id)
        assert running.session_count() == 1  # the refused ones made nothing


def test_unusable_files_are_one_clear_error(tmp_path: Path) -> None:
    p = pki()
    key = serialization.load_pem_private_key(p.server_key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        )
    )
    make_context(str(p.server_cert), str(encrypted), password="s3cret")  # served
    cases = {
        "missing": (str(tmp_path / "nope.key"), None, "cannot read the key file"),
        "mismatched": (str(p.client_key), None, "does not belong to the certificate"),
        "not a key": (str(p.ca), None, "not a PEM certificate and its private key"),
        "no password": (str(encrypted), None, "is encrypted: give its password"),
        "wrong password": (str(encrypted), "guess", "is encrypted: its password is wrong"),
    }
    for what, (keyfile, password, expected) in cases.items():
        with pytest.raises(TlsConfigError) as info:  # (never a prompt on the terminal)
            make_context(str(p.server_cert), keyfile, password=password)
        assert expected in str(info.value), (what, str(info.value))
        assert "\n" not in str(info.value)
    with pytest.raises(TlsConfigError, match="cannot load the CA certificates"):
        make_context(str(p.server_cert), str(p.server_key), ca_certs=str(p.server_key))


def test_the_context_is_what_the_options_promise() -> None:
    p = pki()
    plain = make_context(str(p.server_cert), str(p.server_key))
    mutual = make_context(str(p.server_cert), str(p.server_key), ca_certs=str(p.ca))
    for ctx in (plain, mutual):
        assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
        assert ctx.options & ssl.OP_NO_RENEGOTIATION
        assert ctx.options & ssl.OP_NO_COMPRESSION  # (the CLIENT_AUTH defaults)
    assert plain.verify_mode is ssl.CERT_NONE
    assert mutual.verify_mode is ssl.CERT_REQUIRED


def test_http_resource_with_tls_is_refused() -> None:
    class Nobody:
        async def verify(self, token: str) -> Any:
            raise AssertionError

    auth = Authorization(verifier=Nobody(), resource="http://127.0.0.1/mcp")
    with pytest.raises(ValueError, match="must be an https:// URL"):
        tls_config(auth=auth)
    tls_config(auth=Authorization(verifier=Nobody(), resource="https://127.0.0.1/mcp"))


# ---------------------------------------------------------------- drain tracking, exactly
SIOCINQ = 0x541B  # FIONREAD: bytes in a socket's receive queue
SIOCOUTQ = 0x5411
SIOCOUTQNSD = 0x894B


def _ioctl(fd: int, request: int) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(fd, request, buf, True)
    return int(buf[0])


class MeasuringPeer:
    """A TLS client pumped by hand (``SSLObject`` over memory BIOs), so that it knows
    every ciphertext byte it took from its socket and what they decrypt to."""

    def __init__(self, sock: trio.socket.SocketType, ctx: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname=HOST)
        self.ciphertext_in = 0
        self.plaintext = bytearray()

    async def _flush(self) -> None:
        data = memoryview(self.outgoing.read())
        while data:
            data = data[await self.sock.send(data) :]

    async def _feed(self, max_bytes: int) -> None:
        data = await self.sock.recv(max_bytes)
        if not data:
            raise EOFError("the server closed the connection")
        self.ciphertext_in += len(data)
        self.incoming.write(data)

    async def handshake(self) -> None:
        for _ in range(100):
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._feed(65536)
            else:
                await self._flush()
                return
        raise AssertionError("no handshake")

    async def send(self, data: bytes) -> None:
        self.tls.write(data)
        await self._flush()

    def decrypt(self) -> None:
        """Everything the ciphertext taken so far decrypts to (complete records only)."""
        for _ in range(100_000):
            try:
                chunk = self.tls.read(65536)
            except ssl.SSLWantReadError:
                return
            if not chunk:
                return
            self.plaintext += chunk

    async def read_until(self, n: int, *, step: int = 1024) -> None:
        """Take ciphertext ``step`` bytes at a time until ``n`` plaintext bytes are there."""
        for _ in range(100_000):
            self.decrypt()
            if len(self.plaintext) >= n:
                return
            await self._feed(step)
        raise AssertionError("read_until never got there")

    async def take_exactly(self, nbytes: int) -> None:
        """Take exactly ``nbytes`` more ciphertext bytes from the socket."""
        for _ in range(100_000):
            if nbytes <= 0:
                return
            before = self.ciphertext_in
            await self._feed(nbytes)
            nbytes -= self.ciphertext_in - before
        raise AssertionError("take_exactly never got there")


@dataclass
class ServerSide:
    """What one runtime's server knows of the measured connection."""

    settled: bool  # all it transmitted is acknowledged, and its poller counted that
    acked: int  # plaintext it counts acknowledged
    written: int  # plaintext written
    ciphertext_acked: int
    stalled: bool  # its kernel holds bytes it cannot send (the peer's window is shut)


def _trio_side(server: Server) -> ServerSide:
    [conn] = server.open_connections
    meter = conn.meter
    assert isinstance(meter, TlsMeter)
    stream = conn.stream
    assert isinstance(stream, trio.SSLStream)
    out = stream.transport_stream.tcp.socket.fileno()
    tracker = conn.tracker
    return ServerSide(
        _ioctl(out, SIOCOUTQ) == _ioctl(out, SIOCOUTQNSD)
        and tracker.acked == tracker.written - meter.unacknowledged(),
        tracker.acked,
        tracker.written,
        meter.ciphertext_acked(),
        _ioctl(out, SIOCOUTQNSD) > 0,
    )


def _asyncio_side(driver: AsyncioDriver) -> ServerSide:
    [session] = driver.sessions.values()
    [conn] = session.carrying
    writer = conn.writer
    assert isinstance(writer, AsyncioTlsWriter)
    fd = writer.get_extra_info("socket").fileno()
    settled = _ioctl(fd, SIOCOUTQ) == _ioctl(fd, SIOCOUTQNSD)
    unacked = conn._unacknowledged()
    ciphertext_unacked = writer.transport.get_write_buffer_size() + _ioctl(fd, SIOCOUTQ)
    return ServerSide(
        settled and conn.acks.acked == conn.acks.written - unacked,
        conn.acks.acked,
        conn.acks.written,
        writer.ciphertext_written - ciphertext_unacked,
        _ioctl(fd, SIOCOUTQNSD) > 0,
    )


@pytest.mark.skipif(not LINUX, reason="SIOCOUTQ byte-exact tracking is Linux-only")
@RUNTIMES
async def test_acknowledged_plaintext_is_exactly_what_the_peer_received(runtime: str) -> None:
    """A client reads exactly N plaintext bytes of a large response, then stops.

    Once the server's kernel has every byte it transmitted acknowledged, the server
    counts acknowledged exactly the plaintext of the TLS records the client's TCP
    has received: what it read, plus the whole records waiting in its socket.
    """
    size, n = 400_000, 60_000
    credit = CreditLimits(bytes=1024 * 1024)
    with runtimes.serving(runtime, app, credit=credit, tls=True) as running:
        view = partial(_trio_side if runtime == "trio" else _asyncio_side, running.target)
        with AsyncioClient(running.port) as c:  # a session (blocking, but briefly)
            c.initialize()
        assert c.session_id is not None
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
             "params": {"name": "bulk", "arguments": {"size": size}}}
        ).encode()  # fmt: skip
        headers = {"mcp-session-id": c.session_id, "mcp-protocol-version": c.version}
        with trio.fail_after(30):
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
            await sock.connect((HOST, running.port))
            peer = MeasuringPeer(sock, client_context())
            await peer.handshake()
            await peer.send(raw_request("POST", "/mcp", body=body, headers=headers))
            await peer.read_until(n)
            read_by_app = n  # the application takes n bytes and reads no more
            side = running.probe(view)
            # Until the server is stalled: everything its kernel transmitted is
            # acknowledged and counted, and it holds more it cannot send (the client's
            # window is shut), so nothing moves while the two sides are compared.
            for _ in range(2000):
                if side.settled and side.stalled:
                    break
                await trio.sleep(0.005)
                side = running.probe(view)
            assert side.settled and side.stalled, side
            queued = _ioctl(sock.fileno(), SIOCINQ)
            # Ciphertext: exact to the byte.
            assert side.ciphertext_acked == peer.ciphertext_in + queued, side
            # Plaintext: what those bytes decrypt to, in complete records.
            await peer.take_exactly(queued)
            peer.decrypt()
            received = len(peer.plaintext)
            assert side.acked == received, (side, received)
            assert read_by_app <= received <= side.written
            assert received < size  # (the peer really stopped short of the response)
            print(
                f"\nTLS drain ({runtime}): app read {read_by_app}, peer TCP received "
                f"{received} plaintext ({peer.ciphertext_in} ciphertext), server counts "
                f"{side.acked} acknowledged of {side.written} written"
            )
            # The peer reads the rest: everything is acknowledged, all credit comes back.
            tail = b"\r\n0\r\n\r\n"
            for _ in range(10_000):
                if peer.plaintext.endswith(tail):
                    break
                await peer._feed(65536)
                peer.decrypt()
            assert peer.plaintext.endswith(tail)
            for _ in range(1000):
                if running.credit_of(c.session_id) == (0, 0, 0):
                    break
                await trio.sleep(0.005)
            assert running.credit_of(c.session_id) == (0, 0, 0)
            sock.close()


async def _eventually(condition: Any, *, timeout: float, every: float = 0.005) -> bool:
    with trio.move_on_after(timeout):
        for _ in range(int(timeout / every) + 1):
            if condition():
                return True
            await trio.sleep(every)
    return bool(condition())


# ---------------------------------------------------------------- weir serve --ssl-*


@contextmanager
def weir_tls(tmp_path: Path, *args: str, runtime: str = "trio") -> Iterator[WeirProcess]:
    with (tmp_path / "out").open("w+b") as out, (tmp_path / "err").open("w+b") as err:
        server = WeirProcess("demo", out, err, [*server_ssl_args(), *args], driver=runtime)
        try:
            yield server
        finally:
            server.stop()


@RUNTIMES
async def test_hostile_clients_over_tls(tmp_path: Path, runtime: str) -> None:
    args = ("--head-timeout", "1", "--linger-timeout", "0")
    with weir_tls(tmp_path, *args, runtime=runtime) as server:
        assert server.url.startswith(f"https://{HOST}:")
        with trio.fail_after(30):
            # Connects and never starts its handshake: closed at the head timeout.
            silent = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            await silent.connect((HOST, server.port))
            t0 = time.monotonic()
            assert await silent.recv(1024) == b""
            assert 1.0 <= time.monotonic() - t0 < 1.0 + 5
            silent.close()
            # Plain HTTP on the TLS port: no answer in plaintext, closed.
            plain = Client(trio.SocketStream(trio.socket.socket()))
            await plain.socket.connect((HOST, server.port))
            await plain.send_raw(raw_request("GET", "/mcp"))
            assert await plain.closed_by_peer(5)
            await plain.aclose()
            # A trickled head: 408 at the head timeout.
            trickler = raw_client(await connect_tls(server.port))
            await trickler.send_raw(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            for _ in range(3):
                await trio.sleep(0.4)
                await trickler.send_raw(b"x-slow: 1\r\n")
            reply = await trickler.read_reply(5)
            assert reply.status == 408 and reply.reason == "request_timeout"
            assert await trickler.closed_by_peer()
            await trickler.aclose()
            # An oversized head: 431, closed.
            big = raw_client(await connect_tls(server.port))
            await big.send_raw(raw_request("GET", "/mcp", headers={"x-big": "y" * 100_000}))
            reply = await big.read_reply(5)
            assert reply.status == 431
            assert await big.closed_by_peer()
            await big.aclose()
            # And the server still serves.
            polite = H11Client(await connect_tls(server.port), host=f"{HOST}:{server.port}")
            async with polite.stream:
                await polite.initialize()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weir", "serve", "demo", "--port", "0", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_cli_refuses_unusable_tls_files_in_one_line(tmp_path: Path) -> None:
    p = pki()
    missing = run_cli("--ssl-certfile", str(p.server_cert), "--ssl-keyfile", str(tmp_path / "k"))
    mismatched = run_cli("--ssl-certfile", str(p.server_cert), "--ssl-keyfile", str(p.client_key))
    keyless = run_cli("--ssl-keyfile", str(p.server_key))
    on_asyncio = run_cli(
        "--runtime", "asyncio", "--ssl-certfile", str(p.server_cert),
        "--ssl-keyfile", str(tmp_path / "k"),
    )  # fmt: skip
    for done, expected in (
        (missing, "cannot read the key file"),
        (mismatched, "does not belong to the certificate"),
        (keyless, "need --ssl-certfile"),
        (on_asyncio, "cannot read the key file"),
    ):
        assert done.returncode == 1, done
        assert done.stdout == "", done
        assert done.stderr.count("\n") == 1, done.stderr  # one line
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr


async def test_every_worker_serves_tls(tmp_path: Path, valkey_url: str) -> None:
    """``--workers 2``: the parent says ``https://``, and every worker (each connection
    is a new one, so the kernel spreads them) speaks TLS."""
    with weir_tls(tmp_path, "--workers", "2", "--store", valkey_url) as server:
        assert server.url.startswith(f"https://{HOST}:"), server.output()
        with trio.fail_after(60):
            for _ in range(8):
                client = H11Client(await connect_tls(server.port), host=f"{HOST}:{server.port}")
                async with client.stream:
                    await client.initialize()


async def test_asyncio_at_its_connection_limit_closes_a_tls_connection() -> None:
    """No plaintext 503 can be sent before a handshake: past its limit the asyncio
    runtime closes the connection (the one it serves is untouched)."""
    with runtimes.serving("asyncio", app, tls=True, max_connections=1) as running:
        with trio.fail_after(30):
            first = H11Client(await connect_tls(running.port), host=f"{HOST}:{running.port}")
            async with first.stream:
                await first.initialize()
                assert await refused_handshake(running.port, client_context())
                # Closed without a byte: never a plaintext answer on the TLS port.
                raw = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                await raw.connect((HOST, running.port))
                with raw:
                    assert await raw.recv(65536) == b""
                reply = await first.call(1, "echo", {"text": "still served"})
                [message] = await reply.messages()
                assert message["result"]["content"][0]["text"] == "still served"
