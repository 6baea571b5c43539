"""JWT access tokens: :class:`JwtVerifier`, weir's built-in token verifier.

Theory of operation
-------------------
Signature (RS/PS/ES/EdDSA; never ``none`` or an HMAC with a public key), ``iss``,
``aud`` (the resource), ``exp``/``nbf`` with a small leeway, keys from a static JWKS
or a JWKS URL (refetched at most once a minute when an unknown ``kid`` appears, so a
key rotation is picked up and a flood of made-up ``kid`` values costs nothing).
Only public keys fit for the accepted algorithms are kept (:mod:`weir.common._jwks`),
and the fetch follows no redirect and finishes within one deadline.  It uses PyJWT.
Verified tokens are cached (by their SHA-256, until they expire, at most 4096), so a
client that sends one token on every request pays for one signature check.

The verifier does not wait on any event loop of its own: what a JWKS URL needs (a
clock, one fetch at a time that others wait for, a deadline, the HTTP GET) comes
from the :class:`Waits` of the runtime serving it -- Trio's
(:class:`weir.engine.JwtVerifier`, the default there) or asyncio's (the asyncio
runtime binds its own at start, whichever class it is given).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import jwt

from weir.app import AccessToken

from ._auth import InvalidToken, TokenExpired
from ._jwks import Key, log, usable_keys

#: The algorithms :class:`JwtVerifier` accepts unless told otherwise.
DEFAULT_ALGORITHMS: tuple[str, ...] = ("RS256", "ES256", "PS256", "EdDSA")
#: Longest ``sub`` a token may carry (characters).
MAX_SUBJECT = 1024
_ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")


class Flag(Protocol):
    """A one-shot event of the serving runtime (``trio.Event``, ``asyncio.Event``)."""

    def set(self) -> None:
        """Wake every waiter, now and later."""
        ...


class Waits(Protocol):
    """What a :class:`JwtVerifier` with a JWKS URL needs of the runtime serving it."""

    def now(self) -> float:
        """The runtime's monotonic clock, in seconds."""
        ...

    def flag(self) -> Flag:
        """A new, unset :class:`Flag`."""
        ...

    async def wait(self, flag: Flag, seconds: float) -> None:
        """Return once ``flag`` is set, or after ``seconds``, whichever is first."""
        ...

    async def within(self, seconds: float, work: Awaitable[bytes]) -> bytes:
        """Await ``work``; raise (any exception) if it takes longer than ``seconds``."""
        ...

    async def fetch(self, url: str, timeout: float) -> bytes:
        """GET ``url`` (no redirects, a bounded body, ``timeout`` on each wait); the
        body of a 200 answer."""
        ...


class JwtVerifier:
    r"""Verifies JWT access tokens against an issuer, an audience and a key set.

    Keys: only public keys fit for ``algorithms`` are kept (see :mod:`weir.common._jwks`;
    an ``oct`` key never is).  A JWKS URL is fetched when a token names a ``kid``
    not in the set, at most once a minute; the fetch follows no redirect and the
    whole of it (connect, TLS, answer) must finish within ``fetch_timeout``.
    Requests that need a fetch while one is under way wait for that one (no longer
    than ``fetch_timeout``) instead of starting their own, and a request that knows
    its key never waits for a fetch.

    Args:
        issuer: the required ``iss``.
        audience: the required ``aud`` (this server's resource identifier).
        jwks: a static JSON Web Key Set (``{"keys": [...]}``), or
        jwks_url: where to fetch one (``https://``; ``http://`` only for loopback).
        algorithms: accepted signature algorithms (asymmetric only).
        leeway: seconds of clock skew allowed on ``exp``/``nbf``.
        fetch: how to GET the JWKS URL: an async ``fetch(url) -> bytes`` (default:
            the serving runtime's HTTP client, no redirects); tests may pass their
            own.  It runs under the same overall deadline.
        fetch_timeout: seconds the whole JWKS fetch may take.
        waits: how to wait and fetch on the runtime that serves this verifier
            (default: :meth:`_default_waits`; the asyncio runtime :meth:`bind`\ s
            its own at start).  Only a JWKS URL needs it.

    Raises:
        ValueError: neither or both of ``jwks`` and ``jwks_url``; an algorithm
            that is not asymmetric; a ``fetch_timeout`` that is not positive.
    """

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        jwks: Mapping[str, Any] | None = None,
        jwks_url: str | None = None,
        algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
        leeway: float = 30.0,
        fetch: Callable[[str], Awaitable[bytes]] | None = None,
        fetch_timeout: float = 5.0,
        waits: Waits | None = None,
    ) -> None:
        if (jwks is None) == (jwks_url is None):
            raise ValueError("give exactly one of jwks and jwks_url")
        if jwks_url is not None and not _trusted_url(jwks_url):
            raise ValueError(
                f"the JWKS URL must be https:// (http:// only on loopback), got {jwks_url!r}"
            )
        bad = [a for a in algorithms if a not in _ASYMMETRIC]
        if bad:
            raise ValueError(f"only asymmetric algorithms may verify tokens, not {bad}")
        if not fetch_timeout > 0:
            raise ValueError(f"fetch_timeout must be > 0, got {fetch_timeout!r}")
        self.issuer = issuer
        self.audience = audience
        self.algorithms = list(algorithms)
        self.leeway = leeway
        self.fetch_timeout = fetch_timeout
        self._url = jwks_url
        self._fetch = fetch
        self._waits = waits or self._default_waits()
        self._keys: dict[str, Key] = {}
        self._last_fetch = -math.inf
        self._fetching: Flag | None = None
        self._cache: OrderedDict[bytes, AccessToken] = OrderedDict()
        if jwks is not None:
            self._keys = usable_keys(jwks, self.algorithms)

    def _default_waits(self) -> Waits | None:
        """How this verifier waits when nobody says: not at all (a subclass of a
        runtime supplies its own, e.g. :class:`weir.engine.JwtVerifier`'s Trio)."""
        return None

    def bind(self, waits: Waits) -> None:
        """Wait and fetch with ``waits`` from now on: the runtime that serves this
        verifier calls it before its first request."""
        self._waits = waits
        self._last_fetch = -math.inf  # (a time on another runtime's clock means nothing)

    async def _refresh(self) -> None:
        """Fetch the key set, or wait for the fetch under way (see the class docstring)."""
        waits = self._waits
        if self._url is None:
            return
        if waits is None:
            log.warning("cannot fetch the JWKS: no runtime serves this verifier (bind one)")
            return
        under_way = self._fetching
        if under_way is not None:
            await waits.wait(under_way, self.fetch_timeout)
            return
        if waits.now() - self._last_fetch < 60.0:
            return
        done = self._fetching = waits.flag()
        try:
            try:
                fetch = (
                    self._fetch(self._url)
                    if self._fetch
                    else waits.fetch(self._url, self.fetch_timeout)
                )
                body = await waits.within(self.fetch_timeout, fetch)
                self._keys = usable_keys(json.loads(body), self.algorithms)
            except Exception as exc:
                log.warning("could not fetch the JWKS: %s", str(exc) or type(exc).__name__)
            # Only a fetch that ran its course counts for the once-a-minute limit: one
            # cancelled with its request must not keep a rotated key out for a minute.
            self._last_fetch = waits.now()
        finally:
            self._fetching = None
            done.set()

    async def _key_for(self, kid: str, alg: str) -> Key:
        key = self._keys.get(kid)
        if key is None:
            await self._refresh()
            key = self._keys.get(kid)
        if key is None and not kid and len(self._keys) == 1:
            key = next(iter(self._keys.values()))
        if key is None:
            raise InvalidToken("the token is signed with an unknown key")
        if not key.accepts(alg):
            raise InvalidToken("the token's algorithm does not fit its key")
        return key

    async def verify(self, token: str) -> AccessToken:
        """Verify ``token`` (see the class docstring); raises :class:`InvalidToken`
        (:class:`TokenExpired` for an expired one)."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        hit = self._cache.get(digest)
        if hit is not None and (hit.expires_at is None or hit.expires_at > time.time()):
            self._cache.move_to_end(digest)
            return hit
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, ValueError, TypeError):
            raise InvalidToken("malformed token") from None
        alg, kid = header.get("alg"), header.get("kid", "")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise InvalidToken("the token's algorithm is not accepted")
        if not isinstance(kid, str):
            raise InvalidToken("the token's kid is not a string")
        key = await self._key_for(kid, alg)
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            # (PyJWT takes ``true`` for 1, long ago: a NumericDate it is not.)
            raise _expired_or_invalid(token) from None
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise InvalidToken(type(exc).__name__) from None
        sub = claims.get("sub")
        if claims.get("iss") != self.issuer or not isinstance(sub, str):
            raise InvalidToken("the token's iss or sub is wrong")  # (exact, whatever PyJWT does)
        if not 0 < len(sub) <= MAX_SUBJECT:
            # The subject names a principal, which keys its sessions, gates and limits:
            # none is no one, and one this long is no identifier an issuer hands out.
            raise InvalidToken("the token's sub is empty or too long")
        expires_at = _numeric_date(claims["exp"])
        if expires_at is None:
            # PyJWT takes anything int() takes (a string of digits, an int past a
            # float): RFC 7519 wants a JSON number, and the cache a float.
            raise InvalidToken("the token's exp is not a NumericDate")
        scope = claims.get("scope", "")
        scopes = frozenset(scope.split()) if isinstance(scope, str) else frozenset()
        if not scopes and isinstance(claims.get("scp"), list):
            scopes = frozenset(str(s) for s in claims["scp"])
        access = AccessToken(
            principal=f"{claims['iss']}#{claims['sub']}",
            scopes=scopes,
            expires_at=expires_at,
            claims=claims,
        )
        self._cache[digest] = access
        if len(self._cache) > 4096:
            self._cache.popitem(last=False)
        return access


def _expired_or_invalid(token: str) -> InvalidToken:
    """The refusal of a verified token PyJWT found expired: expired if its ``exp`` is a
    NumericDate, else invalid."""
    claims = jwt.decode(token, options={"verify_signature": False})
    if _numeric_date(claims.get("exp")) is None:
        return InvalidToken("the token's exp is not a NumericDate")
    return TokenExpired("the token has expired")


def _numeric_date(value: object) -> float | None:
    """``value`` as seconds since the epoch if it is a finite JSON number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def _trusted_url(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "https":
        return bool(parts.hostname)
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False
