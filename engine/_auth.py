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
  -> **400** ``invalid_request``.

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
rotation is picked up and a flood of made-up ``kid`` values costs nothing).  It
uses PyJWT.  Verified tokens are cached (by their SHA-256, until they expire,
at most 4096), so a client that sends one token on every request pays for one
signature check.
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
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import jwt
import trio

from weir.app import AccessToken

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

    Args:
        issuer: the required ``iss``.
        audience: the required ``aud`` (this server's resource identifier).
        jwks: a static JSON Web Key Set (``{"keys": [...]}``), or
        jwks_url: where to fetch one (``https://``; ``http://`` only for loopback).
        algorithms: accepted signature algorithms (asymmetric only).
        leeway: seconds of clock skew allowed on ``exp``/``nbf``.
        fetch: how to GET the JWKS URL (default: a thread running ``urllib``);
            tests and other runtimes may pass their own.

    Raises:
        ValueError: neither or both of ``jwks`` and ``jwks_url``; an algorithm
            that is not asymmetric.
    """

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        jwks: Mapping[str, Any] | None = None,
        jwks_url: str | None = None,
        algorithms: Sequence[str] = ("RS256", "ES256", "PS256", "EdDSA"),
        leeway: float = 30.0,
        fetch: Any = None,
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
        self.issuer = issuer
        self.audience = audience
        self.algorithms = list(algorithms)
        self.leeway = leeway
        self._url = jwks_url
        self._fetch = fetch or _fetch_url
        self._keys: dict[str, Any] = {}
        self._last_fetch = -math.inf
        self._lock = trio.Lock()
        self._cache: OrderedDict[bytes, AccessToken] = OrderedDict()
        if jwks is not None:
            self._install(jwks)

    def _install(self, jwks: Mapping[str, Any]) -> None:
        keys: dict[str, Any] = {}
        for i, jwk in enumerate(jwks.get("keys", [])):
            try:
                key = jwt.PyJWK(jwk)
            except jwt.PyJWTError as exc:
                log.warning("ignoring JWKS key %d: %s", i, exc)
                continue
            keys[str(jwk.get("kid", ""))] = key
        self._keys = keys

    async def _refresh(self) -> None:
        if self._url is None:
            return
        async with self._lock:
            now = time.monotonic()
            if now - self._last_fetch < 60.0:
                return
            self._last_fetch = now
            try:
                body = await self._fetch(self._url)
                self._install(json.loads(body))
            except Exception as exc:
                log.warning("could not fetch the JWKS: %s", exc)

    async def _key_for(self, kid: str) -> Any:
        key = self._keys.get(kid)
        if key is None:
            await self._refresh()
            key = self._keys.get(kid)
        if key is None and not kid and len(self._keys) == 1:
            key = next(iter(self._keys.values()))
        if key is None:
            raise InvalidToken("the token is signed with an unknown key")
        return key

    async def verify(self, token: str) -> AccessToken:
        """Verify ``token`` (see the class docstring); raises :class:`InvalidToken`."""
        digest = hashlib.sha256(token.encode()).digest()
        hit = self._cache.get(digest)
        if hit is not None and (hit.expires_at is None or hit.expires_at > time.time()):
            self._cache.move_to_end(digest)
            return hit
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"malformed token: {exc}") from None
        if header.get("alg") not in self.algorithms:
            raise InvalidToken(f"algorithm {header.get('alg')!r} is not accepted")
        key = await self._key_for(str(header.get("kid", "")))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenExpired("the token has expired") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(str(exc)) from None
        scope = claims.get("scope", "")
        scopes = frozenset(scope.split()) if isinstance(scope, str) else frozenset()
        if not scopes and isinstance(claims.get("scp"), list):
            scopes = frozenset(str(s) for s in claims["scp"])
        access = AccessToken(
            principal=f"{claims['iss']}#{claims['sub']}",
            scopes=scopes,
            expires_at=float(claims["exp"]),
            claims=claims,
        )
        self._cache[digest] = access
        if len(self._cache) > 4096:
            self._cache.popitem(last=False)
        return access


async def _fetch_url(url: str) -> bytes:
    from urllib.request import urlopen

    def get() -> bytes:
        with urlopen(url, timeout=5) as resp:
            body: bytes = resp.read(1 << 20)
            return body

    return await trio.to_thread.run_sync(get)


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
