"""Authorization: weir as an OAuth 2.1 resource server (MCP ``basic/authorization``).

Theory of operation
-------------------
What both runtimes do the same way (the Trio engine, :mod:`weir.engine`, and the
asyncio runtime, :mod:`weir.asyncio`); nothing here waits on an event loop.

With an :class:`Authorization` configured, every request to the MCP endpoint (and
to the legacy 2024-11-05 endpoints) must carry ``Authorization: Bearer <token>``.
The token goes to a :class:`TokenVerifier` -- any object with an async
``verify(token) -> AccessToken`` -- which either vouches for it or raises
:class:`InvalidToken`.  :func:`authenticate` answers:

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
endpoint's path (:func:`metadata_answer`).

The verified token's *principal* (its issuer and subject) owns everything the
request touches: sessions are looked up by ``(principal, session id)``, so a
session of another principal is indistinguishable from one that does not exist
(404).  Without authorization every request has the anonymous principal.
What the verifier returned is also the handler's ``Context.access_token``, passed
through :data:`REQUEST_ACCESS` (the connection sets it per request; the tasks it
starts for that request inherit it); the token string itself is kept nowhere.
"""

from __future__ import annotations

import json
import logging
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from weir.app import AccessToken
from weir.protocol import SERVER_ERROR, Reason, RemoteProtocolError

log = logging.getLogger("weir.auth")

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
#: With authorization on, the most sessions one principal holds by default.
PRINCIPAL_SESSIONS_CAP = 256


def principal_session_limit(max_sessions: int, per_principal: int | None, auth: bool) -> int:
    """The most live sessions one principal may hold: ``per_principal`` (at most
    ``max_sessions``), or by default, with authorization on (``auth``), a sixteenth
    of ``max_sessions`` (at least 1, at most :data:`PRINCIPAL_SESSIONS_CAP`) so one
    principal cannot take them all; without it, ``max_sessions`` (every request is
    one principal)."""
    if per_principal is None:
        return min(PRINCIPAL_SESSIONS_CAP, max(1, max_sessions // 16)) if auth else max_sessions
    return min(per_principal, max_sessions)


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


#: The one text a malformed ``Authorization`` header gets.
_BAD_HEADER = "the Authorization header must be 'Bearer <token>'"


async def authenticate(header: str | None, auth: Authorization, retry_ms: int) -> AccessToken:
    """What ``auth``'s verifier vouches for about a request whose ``Authorization``
    header is ``header`` (None: absent).

    Raises:
        RemoteProtocolError: 401 (no token, or a refused one), 403 (a scope is
            missing) or 400 (a malformed header), each with ``WWW-Authenticate``
            pointing at the resource metadata; 503 ``verifier_unavailable`` (with
            ``retry_ms``) when the verifier failed without judging the token.
    """
    # Every refusal text here is fixed: nothing the client sent (nor what the
    # verifier said about it) reaches the response, so its head stays valid and
    # the cached refusal heads are a handful, however many tokens are refused.
    try:
        token = bearer_token(header)
    except ValueError:
        bad = auth_refusal(auth, 400, Reason.INVALID_REQUEST, _BAD_HEADER, "invalid_request")
        raise bad from None
    if token is None:
        raise auth_refusal(auth, 401, Reason.UNAUTHORIZED, "a bearer token is required")
    try:
        access = await auth.verifier.verify(token)
    except InvalidToken as exc:
        text = "token expired" if isinstance(exc, TokenExpired) else "invalid token"
        raise auth_refusal(auth, 401, Reason.UNAUTHORIZED, text, "invalid_token") from None
    except Exception as exc:
        # A verifier that fails (a bug, its backend down) has not judged the token:
        # not a 401, which tells the client to drop a token that may be good, but
        # a 503 to retry, and one log line rather than a dropped connection.
        log.warning("the token verifier failed: %s: %s", type(exc).__name__, exc)
        raise RemoteProtocolError(
            "the token verifier is unavailable; nothing was executed",
            http_status=503,
            reason=Reason.VERIFIER_UNAVAILABLE,
            code=SERVER_ERROR,
            retry_after_ms=retry_ms,
        ) from None
    if not auth.required_scopes <= access.scopes:
        raise auth_refusal(
            auth, 403, Reason.INSUFFICIENT_SCOPE, "insufficient scope", "insufficient_scope"
        )
    return access


def auth_refusal(
    auth: Authorization, status: int, reason: Reason, message: str, error: str | None = None
) -> RemoteProtocolError:
    """A refusal with ``auth``'s challenge (``message`` is one of :data:`DESCRIPTIONS`
    when ``error`` is given)."""
    challenge = auth.challenge(error, message if error else None)
    return RemoteProtocolError(
        message,
        http_status=status,
        reason=reason,
        code=SERVER_ERROR,
        headers=(("www-authenticate", challenge),),
    )


def metadata_paths(endpoint_path: str, root_path: str = "") -> frozenset[str]:
    """Where the metadata is served: :data:`METADATA_PATH`, alone and followed by the
    endpoint's path (``endpoint_path``, which includes ``root_path``); with a
    ``root_path`` (``--root-path``), also both under that prefix, for a proxy that
    forwards only the prefix (``/prefix/.well-known/oauth-protected-resource/mcp``)."""
    paths = {METADATA_PATH, METADATA_PATH + endpoint_path}
    if root_path:
        inner = endpoint_path.removeprefix(root_path)
        paths |= {root_path + METADATA_PATH, root_path + METADATA_PATH + inner}
    return frozenset(paths)


def is_metadata_path(path: str, endpoint_path: str, root_path: str = "") -> bool:
    """Whether ``path`` is under a metadata location (so answered by
    :func:`metadata_answer`, never authenticated): :data:`METADATA_PATH`, or it
    under ``root_path``; never the endpoint itself."""
    if path == endpoint_path:
        return False
    return path.startswith(METADATA_PATH) or bool(
        root_path and path.startswith(root_path + METADATA_PATH)
    )


def metadata_answer(
    path: str, method: str, endpoint_path: str, auth: Authorization, root_path: str = ""
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The answer (status, headers, body) to a request for the RFC 9728 protected
    resource metadata at ``path`` (one of :func:`metadata_paths`; no token needed).

    Raises:
        RemoteProtocolError: 404 for another path under it, 405 for a method but GET.
    """
    if path not in metadata_paths(endpoint_path, root_path):
        raise RemoteProtocolError(
            f"no resource at {path}", http_status=404, reason=Reason.NOT_FOUND
        )
    if method != "GET":
        raise RemoteProtocolError(
            f"method {method} not allowed",
            http_status=405,
            reason=Reason.METHOD_NOT_ALLOWED,
            headers=(("allow", "GET"),),
        )
    headers = [("content-type", "application/json"), ("cache-control", "max-age=300")]
    return 200, headers, auth.metadata()
