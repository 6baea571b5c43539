"""Fetching a JSON Web Key Set on asyncio, for a :class:`weir.common.JwtVerifier`.

Theory of operation
-------------------
Which keys a verifier keeps, when it fetches and how often are
:mod:`weir.common`'s; this module is the asyncio half it waits with
(:class:`AsyncioWaits`, which the asyncio runtime binds to every ``JwtVerifier``
it serves): the loop's clock, ``asyncio.Event``, ``asyncio.timeout`` and
:func:`fetch_jwks`, a one-request HTTP/1.1 client on asyncio streams and h11.  As
on Trio: no redirect is followed (any status but 200 is a failure, so an ``https``
URL can never be steered to ``http``), the body is at most
:data:`~weir.common.MAX_JWKS_BYTES`, and every wait is bounded by ``timeout``
(the verifier bounds the whole fetch with one deadline besides).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable
from urllib.parse import urlsplit

import h11

from weir.common import MAX_JWKS_BYTES, Flag, JwksError

#: The most bytes of an answer's head read.
_MAX_HEAD = 16384


class AsyncioWaits:
    """:class:`~weir.common.Waits` on the running asyncio loop."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def flag(self) -> Flag:
        return asyncio.Event()

    async def wait(self, flag: Flag, seconds: float) -> None:
        assert isinstance(flag, asyncio.Event)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await flag.wait()

    async def within(self, seconds: float, work: Awaitable[bytes]) -> bytes:
        async with asyncio.timeout(seconds):
            return await work

    async def fetch(self, url: str, timeout: float) -> bytes:
        return await fetch_jwks(url, timeout)


async def fetch_jwks(url: str, timeout: float) -> bytes:
    """GET ``url`` and return the body of a 200 answer (each wait within ``timeout``).

    Raises:
        JwksError: the connection failed or timed out, the answer was not 200 or not
            HTTP, or its body is longer than :data:`~weir.common.MAX_JWKS_BYTES`.
    """
    try:
        return await _get(url, timeout)
    except JwksError:
        raise
    except Exception as exc:
        raise JwksError(f"{type(exc).__name__}: {exc}") from None


async def _get(url: str, timeout: float) -> bytes:
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    tls = ssl.create_default_context() if https else None
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if https else None, limit=65536
        )
    try:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        authority = parts.netloc.rpartition("@")[2]
        request = h11.Request(
            method="GET",
            target=target,
            headers=[("host", authority), ("accept", "application/json"), ("connection", "close")],
        )
        writer.write(conn.send(request) + conn.send(h11.EndOfMessage()))
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(timeout):
                    await writer.drain()
                    conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                if event.status_code != 200:
                    raise JwksError(
                        f"the JWKS URL answered {event.status_code} (redirects are not followed)"
                    )
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_JWKS_BYTES:
                    raise JwksError(f"the JWKS body is longer than {MAX_JWKS_BYTES} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise JwksError("the JWKS URL closed the connection before the end")
            # (an InformationalResponse: read on)
    finally:
        writer.transport.abort()
