"""Fetching a JSON Web Key Set on Trio, for :class:`~weir.engine.JwtVerifier`.

Theory of operation
-------------------
Which keys a verifier keeps is :mod:`weir.common`'s (``common/_jwks.py``, shared with
the asyncio runtime; re-exported here).  :func:`fetch_jwks` GETs the URL over weir's
own h11 client: no redirect is followed (any status but 200 is a failure, so an
``https`` URL can never be steered to ``http``), the body is at most
:data:`MAX_JWKS_BYTES`, and the caller bounds the whole exchange -- connect, TLS,
head and body -- with one deadline, so a server that trickles its answer a byte at
a time cannot hold the fetch longer.
"""

from __future__ import annotations

from weir.common._jwks import (
    FAMILY,
    MAX_JWKS_BYTES,
    MAX_KEYS,
    JwksError,
    Key,
    screen_keys,
    usable_keys,
)

from ._client_http import Pool


async def fetch_jwks(url: str, timeout: float) -> bytes:
    """GET ``url`` and return the body of a 200 answer.

    Follows no redirect.  ``timeout`` bounds each wait; the caller bounds the whole
    fetch (see :meth:`JwtVerifier._refresh <weir.engine.JwtVerifier>`).

    Raises:
        JwksError: the connection failed, the answer was not 200, or its body is
            longer than :data:`MAX_JWKS_BYTES`.
    """
    pool = Pool(url, timeout=timeout, max_idle=0)
    try:
        resp = await pool.request("GET", [("accept", "application/json")])
        try:
            if resp.status != 200:
                raise JwksError(f"the JWKS URL answered {resp.status} (redirects are not followed)")
            return await resp.body(MAX_JWKS_BYTES)
        finally:
            await resp.aclose()
    except JwksError:
        raise
    except Exception as exc:
        raise JwksError(f"{type(exc).__name__}: {exc}") from None
    finally:
        await pool.aclose()


__all__ = [
    "FAMILY",
    "MAX_JWKS_BYTES",
    "MAX_KEYS",
    "JwksError",
    "Key",
    "fetch_jwks",
    "screen_keys",
    "usable_keys",
]
