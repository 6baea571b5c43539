"""Authorization on the asyncio runtime: who each request speaks for.

Theory of operation
-------------------
The rules are :mod:`weir.common`'s, shared with the Trio engine: the bearer token,
the 401/403/400/503 refusals with ``WWW-Authenticate`` (:func:`~weir.common.authenticate`),
the RFC 9728 metadata (:func:`~weir.common.metadata_answer`), the principal.  Here
they are applied *per request*: :func:`identify` turns each request into a
:class:`Who` before it is routed, and everything keyed by an identity takes that
value in hand (the session lookup, the sessionless course, its idempotency gate).
Nothing reads an identity off the connection: one keep-alive connection (a pooling
proxy's, say) may carry Alice's request and then Bob's, and Bob's is Bob's.  What
the verifier vouched for is set in :data:`~weir.common.REQUEST_ACCESS` for the
request's own tasks (they copy the context when they start), so a handler's
``Context.access_token`` is its own request's, or None without authorization.

A :class:`~weir.common.JwtVerifier` served here fetches its JWKS URL with asyncio
(:class:`~._jwks.AsyncioWaits`, bound by :func:`bind`), whichever runtime made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from weir.common import (
    ANONYMOUS,
    REQUEST_ACCESS,
    Authorization,
    JwtVerifier,
    authenticate,
    is_metadata_path,
    metadata_answer,
)
from weir.protocol import EndpointConfig, HttpRequest

from ._jwks import AsyncioWaits

#: The ``Retry-After`` of a 503 ``verifier_unavailable`` (milliseconds).
RETRY_MS: Final = 1000


@dataclass(frozen=True, slots=True)
class Who:
    """Who one request speaks for (built per request, never kept on a connection).

    Attributes:
        principal: the verified token's principal with authorization on, else
            ``"anonymous"``.
        authorized: a verified token vouched for :attr:`principal`.
    """

    principal: str
    authorized: bool


#: Every request's :class:`Who` without authorization.
NOBODY: Final = Who(ANONYMOUS, False)


def bind(auth: Authorization | None) -> None:
    """Make ``auth``'s verifier, if it is a :class:`~weir.common.JwtVerifier`, wait
    and fetch with asyncio (one made for Trio would wait with Trio otherwise)."""
    if auth is not None and isinstance(auth.verifier, JwtVerifier):
        auth.verifier.bind(AsyncioWaits())


def is_metadata(auth: Authorization | None, request: HttpRequest, endpoint: EndpointConfig) -> bool:
    """Whether ``request`` asks for the protected resource metadata (no token needed)."""
    return auth is not None and is_metadata_path(request.path, endpoint.path, endpoint.root_path)


def metadata(
    auth: Authorization, request: HttpRequest, endpoint: EndpointConfig
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The answer to a metadata request (see :func:`~weir.common.metadata_answer`)."""
    return metadata_answer(request.path, request.method, endpoint.path, auth, endpoint.root_path)


async def identify(auth: Authorization | None, request: HttpRequest) -> Who:
    """Who ``request`` speaks for; sets :data:`~weir.common.REQUEST_ACCESS` for the
    tasks the current one starts for it.

    Raises:
        RemoteProtocolError: 401, 403, 400 or 503, as :func:`~weir.common.authenticate`.
    """
    REQUEST_ACCESS.set(None)  # (the connection's previous request's is not this one's)
    if auth is None:
        return NOBODY
    access = await authenticate(request.headers.get("authorization"), auth, RETRY_MS)
    REQUEST_ACCESS.set(access)
    return Who(access.principal, True)
