"""Authorization: weir as an OAuth 2.1 resource server (MCP ``basic/authorization``).

Theory of operation
-------------------
With an :class:`Authorization` configured, every request to the MCP endpoint (and
to the legacy 2024-11-05 endpoints) must carry ``Authorization: Bearer <token>``.
The token goes to a :class:`TokenVerifier` -- any object with an async
``verify(token) -> AccessToken`` -- which either vouches for it or raises
:class:`InvalidToken`.  weir answers:

* no token, or one the verifier refuses -> **401** with
  ``WWW-Authenticate: Bearer resource_metadata="<url>"`` (plus ``error`` and
  ``scope`` where they apply), so the client can discover the authorization
  server from the protected resource metadata;
* a token without every required scope -> **403** with
  ``error="insufficient_scope", scope="<needed>"``;
* a malformed ``Authorization`` header (not ``Bearer``, or a token with spaces)
  -> **400** ``invalid_request``;
* a verifier that fails with anything but :class:`InvalidToken` (its backend is
  down, a bug) has not judged the token -> **503** ``verifier_unavailable`` with
  ``Retry-After`` and one log line; nothing runs.

Each refusal's ``error_description`` is one of the fixed :data:`DESCRIPTIONS`:
nothing a client sends ever reaches a refusal, so its head is always valid and the
refusal heads the connection layer caches are a handful.

The metadata itself (RFC 9728) is served without a token at
``/.well-known/oauth-protected-resource`` and at that path followed by the
endpoint's path.

The verified token's *principal* (its issuer and subject) owns everything the
request touches: sessions are looked up by ``(principal, session id)``, so a
session of another principal is indistinguishable from one that does not exist
(404).  Without authorization every request has the anonymous principal.
What the verifier returned is also the handler's ``Context.access_token``, passed
through :data:`REQUEST_ACCESS` (the connection sets it per request; the tasks it
starts for that request inherit it); the token string itself is kept nowhere.

:class:`JwtVerifier` is the built-in verifier: signature (RS/PS/ES/EdDSA; never
``none`` or an HMAC with a public key), ``iss``, ``aud`` (the resource),
``exp``/``nbf`` with a small leeway, keys from a static JWKS or a JWKS URL
(refetched at most once a minute when an unknown ``kid`` appears, so a key
rotation is picked up and a flood of made-up ``kid`` values costs nothing).  Only
public keys fit for the accepted algorithms are kept, and the fetch follows no
redirect and finishes within one deadline (:mod:`engine._jwks`).  It uses PyJWT.
Verified tokens are cached (by their SHA-256, until they expire, at most 4096),
so a client that sends one token on every request pays for one signature check.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import jwt
import trio

from weir.app import AccessToken

from ._jwks import Key, fetch_jwks, usable_keys

log = logging.getLogger(__name__)

#: What the verifier vouched for about the token of the request the current task
#: serves.  The connection task sets it per request, after verifying; every task it
#: starts for that request (a handler, a batch entry) inherits it with a copy of its
#: context, so a handler's :attr:`weir.app.Context.access_token` is its own
#: request's token even while the connection goes on to the next request.
REQUEST_ACCESS: ContextVar[AccessToken | None] = ContextVar("weir_request_access", default=None)

#: The principal of every request when no authorization is configured.
ANONYMOUS = "anonymous"
#: Where the protected resource metadata is served (RFC 9728 section 3).
METADATA_PATH = "/.well-known/oauth-protected-resource"
#: The algorithms :class:`JwtVerifier` accepts unless told otherwise.
DEFAULT_ALGORITHMS: tuple[str, ...] = ("RS256", "ES256", "PS256", "EdDSA")
_ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")


class InvalidToken(Exception):
    """The token is not acceptable (bad signature, expired, wrong audience, ...).

    Its message is for the server's logs only: the client is told one of the fixed
    :data:`DESCRIPTIONS` (``invalid token``, or ``token expired`` for
    :class:`TokenExpired`), never anything the token or the verifier said.
    """


class TokenExpired(InvalidToken):
    """The token was acceptable once but has expired (the client is told ``token expired``)."""


#: Every ``error_description`` weir puts in a ``WWW-Authenticate`` challenge.  A fixed
#: set: nothing a client sent is ever echoed in a refusal's head, so the refusal heads
#: (cached by the connection layer) are bounded by these texts and the configuration.
DESCRIPTIONS: frozenset[str] = frozenset(
    {
        "invalid token",
        "token expired",
        "insufficient scope",
        "the Authorization header must be 'Bearer <token>'",
    }
)

# What a challenge's quoted values may hold: visible ASCII and spaces, no quote or
# backslash (RFC 6750 section 3 scope-token characters, plus space and a URL's own).
_QUOTABLE = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]*")
_ERROR_CODE = re.compile(r"[a-z_]{1,40}")


class TokenVerifier(Protocol):
    """Checks a bearer token: return what it vouches for, or raise :class:`InvalidToken`."""

    async def verify(self, token: str) -> AccessToken:
        """Verify ``token``."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Authorization:
    """Weir's side of OAuth: who verifies tokens, and what clients are told.

    Attributes:
        verifier: checks bearer tokens.
        resource: this server's resource identifier (its canonical URL, e.g.
            ``https://mcp.example.com/mcp``): the audience tokens must carry.
        authorization_servers: issuers clients may get tokens from (RFC 9728).
        required_scopes: scopes every request's token must have (403 otherwise).
        scopes_supported: advertised in the metadata (default: the required ones).
        metadata_url: where clients find the metadata (default: derived from
            ``resource``: its origin plus ``/.well-known/oauth-protected-resource``
            plus its path).
    """

    verifier: TokenVerifier
    resource: str
    authorization_servers: tuple[str, ...] = ()
    required_scopes: frozenset[str] = frozenset()
    scopes_supported: tuple[str, ...] = ()
    metadata_url: str | None = None

    def __post_init__(self) -> None:
        for what, value in (
            ("metadata URL", self.metadata_location()),
            ("scope", " ".join(sorted(self.required_scopes))),
        ):
            if _QUOTABLE.fullmatch(value) is None:
                raise ValueError(
                    f"the {what} {value!r} cannot be sent in WWW-Authenticate: "
                    "visible ASCII only, no double quote or backslash"
                )

    def metadata_location(self) -> str:
        """The URL of the protected resource metadata."""
        if self.metadata_url:
            return self.metadata_url
        scheme, _, rest = self.resource.partition("://")
        host, slash, path = rest.partition("/")
        suffix = f"/{path}".rstrip("/") if slash else ""
        return f"{scheme}://{host}{METADATA_PATH}{suffix}"

    def metadata(self) -> bytes:
        """The RFC 9728 document, as JSON."""
        doc: dict[str, Any] = {
            "resource": self.resource,
            "authorization_servers": list(self.authorization_servers),
            "bearer_methods_supported": ["header"],
            "scopes_supported": list(self.scopes_supported or sorted(self.required_scopes)),
        }
        return json.dumps(doc).encode()

    def challenge(self, error: str | None = None, description: str | None = None) -> str:
        """A ``WWW-Authenticate`` value for a 401 (or, with ``insufficient_scope``, 403).

        Built only from the configuration (checked when this object was made) and
        the fixed ``error`` codes and :data:`DESCRIPTIONS`, so it is always a valid
        header value and the set of them is small.

        Raises:
            ValueError: ``description`` is not one of :data:`DESCRIPTIONS`, or
                ``error`` is not a token.
        """
        parts = [f'resource_metadata="{self.metadata_location()}"']
        if error:
            if _ERROR_CODE.fullmatch(error) is None:
                raise ValueError(f"not an OAuth error code: {error!r}")
            parts.append(f'error="{error}"')
        if description:
            if description not in DESCRIPTIONS:
                raise ValueError(f"not one of the fixed descriptions: {description!r}")
            parts.append(f'error_description="{description}"')
        if self.required_scopes:
            parts.append('scope="{}"'.format(" ".join(sorted(self.required_scopes))))
        return "Bearer " + ", ".join(parts)


class JwtVerifier:
    """Verifies JWT access tokens against an issuer, an audience and a key set.

    Keys: only public keys fit for ``algorithms`` are kept (see :mod:`engine._jwks`;
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
            weir's HTTP client, no redirects); tests and other runtimes may pass
            their own.  It runs under the same overall deadline.
        fetch_timeout: seconds the whole JWKS fetch may take.

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
        self._fetch = fetch or self._fetch_url
        self._keys: dict[str, Key] = {}
        self._last_fetch = -math.inf
        self._fetching: trio.Event | None = None
        self._cache: OrderedDict[bytes, AccessToken] = OrderedDict()
        if jwks is not None:
            self._keys = usable_keys(jwks, self.algorithms)

    async def _fetch_url(self, url: str) -> bytes:
        return await fetch_jwks(url, self.fetch_timeout)

    async def _refresh(self) -> None:
        """Fetch the key set, or wait for the fetch under way (see the class docstring)."""
        if self._url is None:
            return
        under_way = self._fetching
        if under_way is not None:
            with trio.move_on_after(self.fetch_timeout):
                await under_way.wait()
            return
        if trio.current_time() - self._last_fetch < 60.0:
            return
        done = self._fetching = trio.Event()
        try:
            try:
                with trio.fail_after(self.fetch_timeout):
                    body = await self._fetch(self._url)
                self._keys = usable_keys(json.loads(body), self.algorithms)
            except Exception as exc:
                log.warning("could not fetch the JWKS: %s", str(exc) or type(exc).__name__)
            # Only a fetch that ran its course counts for the once-a-minute limit: one
            # cancelled with its request must not keep a rotated key out for a minute.
            self._last_fetch = trio.current_time()
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
            raise TokenExpired("the token has expired") from None
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise InvalidToken(type(exc).__name__) from None
        if claims.get("iss") != self.issuer or not isinstance(claims.get("sub"), str):
            raise InvalidToken("the token's iss or sub is wrong")  # (exact, whatever PyJWT does)
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


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header; None if absent.

    Raises:
        ValueError: the header is present but not a well-formed bearer token.
    """
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise ValueError("the Authorization header must be 'Bearer <token>'")
    return token


__all__ = [
    "ANONYMOUS",
    "METADATA_PATH",
    "AccessToken",
    "Authorization",
    "InvalidToken",
    "JwtVerifier",
    "TokenExpired",
    "TokenVerifier",
    "bearer_token",
]
