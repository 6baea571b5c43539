"""Authorization on Trio: weir as an OAuth 2.1 resource server (MCP ``basic/authorization``).

Theory of operation
-------------------
What a request must carry, the refusals (401/403/400/503 with ``WWW-Authenticate``),
the protected resource metadata and the principal are the same on both runtimes
and live in :mod:`weir.common` (``common/_auth.py``, ``common/_jwt.py``); this
module re-exports them under their :mod:`weir.engine` names and adds the one
thing that waits: :class:`JwtVerifier`, whose JWKS URL is fetched with Trio
(:class:`TrioWaits`: Trio's clock, events and deadlines, and weir's Trio HTTP
client, :func:`engine._jwks.fetch_jwks`).
"""

from __future__ import annotations

from collections.abc import Awaitable

import trio

from weir.app import AccessToken
from weir.common._auth import (
    ANONYMOUS,
    DESCRIPTIONS,
    METADATA_PATH,
    REQUEST_ACCESS,
    Authorization,
    InvalidToken,
    TokenExpired,
    TokenVerifier,
    authenticate,
    bearer_token,
)
from weir.common._jwt import DEFAULT_ALGORITHMS, Flag, Waits
from weir.common._jwt import JwtVerifier as _NeutralJwtVerifier

from ._jwks import fetch_jwks


class TrioWaits:
    """:class:`~weir.common.Waits` on Trio (its clock, so a test's ``MockClock`` counts)."""

    def now(self) -> float:
        return trio.current_time()

    def flag(self) -> Flag:
        return trio.Event()

    async def wait(self, flag: Flag, seconds: float) -> None:
        assert isinstance(flag, trio.Event)
        with trio.move_on_after(seconds):
            await flag.wait()

    async def within(self, seconds: float, work: Awaitable[bytes]) -> bytes:
        with trio.fail_after(seconds):
            return await work

    async def fetch(self, url: str, timeout: float) -> bytes:
        return await fetch_jwks(url, timeout)


class JwtVerifier(_NeutralJwtVerifier):
    """:class:`weir.common.JwtVerifier` that fetches its JWKS URL with Trio unless a
    runtime binds another way (the asyncio runtime does; see :meth:`bind`)."""

    def _default_waits(self) -> Waits | None:
        return TrioWaits()


__all__ = [
    "ANONYMOUS",
    "DEFAULT_ALGORITHMS",
    "DESCRIPTIONS",
    "METADATA_PATH",
    "REQUEST_ACCESS",
    "AccessToken",
    "Authorization",
    "InvalidToken",
    "JwtVerifier",
    "TokenExpired",
    "TokenVerifier",
    "TrioWaits",
    "authenticate",
    "bearer_token",
]
