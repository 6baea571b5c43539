"""The JWKS a :class:`weir.engine.JwtVerifier` trusts, and how it fetches one.

Keys are real (``cryptography``), tokens are signed with PyJWT, and every JWKS URL is
served by a real ``http.server`` on 127.0.0.1 in a thread: one that redirects, one
that trickles its answer a byte at a time for as long as the client listens, one
that answers too much.  The fetches are checked on both runtimes' HTTP clients
(Trio's, and asyncio's that the asyncio runtime binds a verifier to).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
import trio

from weir.asyncio._jwks import AsyncioWaits
from weir.common import MAX_JWKS_BYTES
from weir.engine import InvalidToken, JwtVerifier

from .configured import RUNTIMES
from .test_auth import ISSUER, RESOURCE, SIGNING_KEY, jwks, token

HMAC_SECRET = b"a-shared-secret-that-is-long-enough-for-hs256!!"


def oct_jwk(kid: str) -> dict[str, Any]:
    k = base64.urlsafe_b64encode(HMAC_SECRET).rstrip(b"=").decode()
    return {"kty": "oct", "k": k, "kid": kid}


def hs256_token(kid: str, alg: str = "HS256") -> str:
    """A token MACed with :data:`HMAC_SECRET`, its header claiming ``alg``."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": RESOURCE, "sub": "mallory", "exp": now + 300}
    good = jwt.encode(claims, HMAC_SECRET, algorithm="HS256", headers={"kid": kid})
    if alg == "HS256":
        return good
    head = json.dumps({"alg": alg, "kid": kid, "typ": "JWT"}).encode()
    first = base64.urlsafe_b64encode(head).rstrip(b"=").decode()
    hmac_alg = jwt.algorithms.get_default_algorithms()["HS256"]
    body = good.split(".")[1]
    sig = hmac_alg.sign(f"{first}.{body}".encode(), hmac_alg.prepare_key(HMAC_SECRET))
    return f"{first}.{body}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"


@contextmanager
def http_server(
    handle: Callable[[BaseHTTPRequestHandler], None],
) -> Iterator[tuple[int, list[str]]]:
    """A loopback HTTP server in a thread; yields its port and the paths requested."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            handle(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


async def verify_all(runtime: str, verifier: JwtVerifier, tokens: list[str]) -> list[float]:
    """Verify ``tokens`` at once with ``verifier`` served on ``runtime`` (on asyncio:
    bound to asyncio's waits, as the asyncio runtime binds it, in a loop of its own
    in a thread); the seconds each took to be refused (every one must be)."""

    async def trio_one(tok: str, took: list[float]) -> None:
        start = trio.current_time()
        with pytest.raises(InvalidToken):
            await verifier.verify(tok)
        took.append(trio.current_time() - start)

    async def asyncio_one(tok: str) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(InvalidToken):
            await verifier.verify(tok)
        return loop.time() - start

    async def asyncio_all() -> list[float]:
        verifier.bind(AsyncioWaits())
        return list(await asyncio.gather(*(asyncio_one(t) for t in tokens)))

    if runtime == "asyncio":
        return await trio.to_thread.run_sync(lambda: asyncio.run(asyncio_all()))
    took: list[float] = []
    async with trio.open_nursery() as nursery:
        for tok in tokens:
            nursery.start_soon(trio_one, tok, took)
    return took


def send_json(req: BaseHTTPRequestHandler, doc: Any) -> None:
    body = json.dumps(doc).encode()
    req.send_response(200)
    req.send_header("content-type", "application/json")
    req.send_header("content-length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


async def test_an_oct_key_is_dropped_and_never_verifies(caplog: pytest.LogCaptureFixture) -> None:
    rsa_only = jwks()["keys"][0]
    del rsa_only["kid"]  # (a key set of one key, which tokens need not name)
    keys = {"keys": [rsa_only, oct_jwk("h")]}
    with caplog.at_level(logging.WARNING, logger="weir.auth"):
        verifier = JwtVerifier(issuer=ISSUER, audience=RESOURCE, jwks=keys)
    warnings = [r.getMessage() for r in caplog.records if "JWKS" in r.getMessage()]
    assert len(warnings) == 1 and "kty 'oct'" in warnings[0], warnings
    for forged in (hs256_token("h"), hs256_token("h", alg="RS256"), hs256_token("")):
        with pytest.raises(InvalidToken):
            await verifier.verify(forged)
    # The RSA key is the set's one usable key: a token that names no kid uses it.
    no_kid = jwt.encode(
        {"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "exp": int(time.time()) + 60},
        SIGNING_KEY,
        algorithm="RS256",
    )
    assert (await verifier.verify(no_kid)).principal == f"{ISSUER}#alice"


async def test_keys_whose_alg_is_not_allowed_or_does_not_fit_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rsa, ec = jwks()["keys"]
    keys = [
        {**rsa, "kid": "rs512", "alg": "RS512"},  # not in the allowed list
        {**ec, "kid": "ec-as-rsa", "alg": "RS256"},  # alg and kty disagree
        {**rsa, "kid": "enc", "use": "enc"},
        {**rsa, "kid": "ok", "alg": "RS256"},
    ]
    with caplog.at_level(logging.WARNING, logger="weir.auth"):
        verifier = JwtVerifier(
            issuer=ISSUER, audience=RESOURCE, jwks={"keys": keys}, algorithms=("RS256", "ES256")
        )
    warnings = [r.getMessage() for r in caplog.records if "JWKS" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("ignoring 3 of 4 JWKS keys"), warnings
    for kid in ("rs512", "ec-as-rsa", "enc"):
        with pytest.raises(InvalidToken):
            await verifier.verify(token(kid=kid))
    assert (await verifier.verify(token(kid="ok"))).principal == f"{ISSUER}#alice"


@RUNTIMES
async def test_a_redirecting_jwks_url_is_not_followed(runtime: str) -> None:
    def handle(req: BaseHTTPRequestHandler) -> None:
        if req.path == "/jwks":
            req.send_response(302)
            req.send_header("location", "/elsewhere")
            req.send_header("content-length", "0")
            req.end_headers()
        else:
            send_json(req, jwks())

    with http_server(handle) as (port, seen), trio.fail_after(30):
        verifier = JwtVerifier(
            issuer=ISSUER, audience=RESOURCE, jwks_url=f"http://127.0.0.1:{port}/jwks"
        )
        assert len(await verify_all(runtime, verifier, [token()])) == 1
        assert seen == ["/jwks"]


@RUNTIMES
async def test_the_whole_fetch_has_one_deadline_and_concurrent_needs_share_it(
    caplog: pytest.LogCaptureFixture, runtime: str
) -> None:
    """The server sends a byte every 20 ms, forever: no single read ever waits long,
    so only a deadline over the whole fetch ends it -- and the log line says so."""
    stop = threading.Event()

    def handle(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("content-length", "1000000")
        req.end_headers()
        req.wfile.flush()
        for _ in range(3000):  # (60 s at most, should the client never give up)
            if stop.wait(0.02):
                return
            req.wfile.write(b" ")
            req.wfile.flush()

    deadline = 0.5
    with http_server(handle) as (port, seen):
        verifier = JwtVerifier(
            issuer=ISSUER,
            audience=RESOURCE,
            jwks_url=f"http://127.0.0.1:{port}/jwks",
            fetch_timeout=deadline,
        )
        try:
            with (
                caplog.at_level(logging.WARNING, logger="weir.auth"),
                trio.fail_after(deadline * 40),
            ):
                refused = await verify_all(runtime, verifier, [token()] * 10)
        finally:
            stop.set()
    assert len(refused) == 10
    # All ten waited for one fetch, which gave up at its deadline (bounds generous).
    assert seen == ["/jwks"]
    assert max(refused) < deadline * 20
    assert min(refused) >= deadline * 0.9
    # (A deadline's exception has no message: the line names its type, not nothing.)
    slow = {"trio": "TooSlowError", "asyncio": "TimeoutError"}[runtime]
    assert [r.getMessage() for r in caplog.records if "JWKS" in r.getMessage()] == [
        f"could not fetch the JWKS: {slow}"
    ]


@RUNTIMES
async def test_a_jwks_longer_than_the_limit_is_not_read_to_its_end(
    caplog: pytest.LogCaptureFixture, runtime: str
) -> None:
    """A JWKS URL that answers more than ``MAX_JWKS_BYTES`` is a failed fetch (one log
    line), not a key set read into memory whole."""

    def handle(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("content-length", str(MAX_JWKS_BYTES + 65536))
        req.end_headers()
        try:
            for _ in range(MAX_JWKS_BYTES // 65536 + 1):
                req.wfile.write(b" " * 65536)
        except OSError:
            pass  # (the client gave up, as it should)

    with http_server(handle) as (port, seen), trio.fail_after(30):
        verifier = JwtVerifier(
            issuer=ISSUER, audience=RESOURCE, jwks_url=f"http://127.0.0.1:{port}/jwks"
        )
        with caplog.at_level(logging.WARNING, logger="weir.auth"):
            assert len(await verify_all(runtime, verifier, [token()])) == 1
    assert seen == ["/jwks"]
    lines = [r.getMessage() for r in caplog.records if "JWKS" in r.getMessage()]
    assert len(lines) == 1 and "could not fetch the JWKS" in lines[0], lines
    assert f"longer than {MAX_JWKS_BYTES} bytes" in lines[0], lines
