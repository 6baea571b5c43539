"""Serving an app with the authorization it declares itself (an SDK app's own).

An app written with the official SDK may carry its own security
(``MCPServer(token_verifier=..., auth=AuthSettings(...))``, see
:class:`weir.app.sdk.SdkSecurity`).  :func:`declared_authorization` turns that into
weir's :class:`~weir.common.Authorization`: the app's verifier checks every bearer
token (a token it refuses, or one past its ``expires_at``, is a 401), and the app's
``resource_server_url``, ``issuer_url`` and ``required_scopes`` are the protected
resource metadata and the scopes enforced (403).  An app whose declaration weir
cannot enforce is refused with what to pass instead -- never served open.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from weir.app import AccessToken, App

from ._auth import Authorization, InvalidToken, TokenExpired

#: What ``weir serve`` accepts in place of an app's own verifier.
_INSTEAD = "serve it with --auth-issuer, --auth-resource and --auth-jwks-url (or --auth-jwks-file)"


class DeclaredVerifier:
    """A :class:`~weir.common.TokenVerifier` over an app's ``verify(token)``:
    what it vouches for, or :class:`InvalidToken` when it refuses the token or the
    token has expired."""

    def __init__(self, verify: Callable[[str], Awaitable[AccessToken | None]]) -> None:
        self._verify = verify

    async def verify(self, token: str) -> AccessToken:
        """Verify ``token`` with the app's verifier; raises :class:`InvalidToken`."""
        access = await self._verify(token)
        if access is None:
            raise InvalidToken("the app's token verifier refused the token")
        if access.expires_at is not None and access.expires_at < time.time():
            raise TokenExpired("the token has expired")
        return access


def declared_authorization(app: App) -> Authorization | None:
    """The :class:`Authorization` ``app`` declares for itself, or None if it declares
    none (or is not an SDK app).

    Raises:
        ValueError: the app declares authorization weir cannot enforce (no verifier
            it can run, or no ``resource_server_url``); the message names the fix.
    """
    from weir.app.sdk import SdkApp

    security = app.security if isinstance(app, SdkApp) else None
    if security is None:
        return None
    if security.verify is None:
        raise ValueError(
            f"the app {app.name!r} declares authorization weir cannot run (a token "
            f"verifier it does not recognise); {_INSTEAD}"
        )
    if security.resource is None:
        raise ValueError(
            f"the app {app.name!r} declares a token verifier but no "
            "AuthSettings(resource_server_url=...), the resource its tokens are for; "
            f"set it, or {_INSTEAD}"
        )
    return Authorization(
        verifier=DeclaredVerifier(security.verify),
        resource=security.resource,
        authorization_servers=security.authorization_servers,
        required_scopes=security.required_scopes,
    )


__all__ = ["DeclaredVerifier", "declared_authorization"]
