"""SDK apps that declare their own security, for ``weir serve`` (nothing from weir).

``server`` is an ``MCPServer`` with a token verifier of its own -- it checks RS256
JWTs against the public key in the PEM file ``$SDK_AUTH_APP_KEY`` names, for the
audience :data:`RESOURCE` and the issuer :data:`ISSUER` -- and
``AuthSettings(required_scopes=["mcp"])``, as the SDK's documentation writes a
resource server.  It also declares a custom route (``/health``) and a tool that
uses asyncio itself (``napper``).  ``no_resource`` declares a verifier without a
``resource_server_url``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import jwt
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import PlainTextResponse

ISSUER = "https://issuer.test"
RESOURCE = "http://127.0.0.1/mcp"


class JwtTokenVerifier:
    """The app's own verifier: RS256 JWTs signed by the key in ``$SDK_AUTH_APP_KEY``."""

    async def verify_token(self, token: str) -> AccessToken | None:
        with open(os.environ["SDK_AUTH_APP_KEY"], encoding="ascii") as f:
            key = f.read()
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["RS256"], audience=RESOURCE, issuer=ISSUER
            )
        except jwt.PyJWTError:
            return None
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id", "unknown")),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=int(claims["exp"]),
            resource=RESOURCE,
            subject=str(claims["sub"]),
            claims=claims,
        )


def _settings(resource: str | None) -> AuthSettings:
    return AuthSettings(
        issuer_url=ISSUER,  # type: ignore[arg-type]
        resource_server_url=resource,  # type: ignore[arg-type]
        required_scopes=["mcp"],
        validate_token_resource=resource is not None,
    )


server = MCPServer("sdk-auth", token_verifier=JwtTokenVerifier(), auth=_settings(RESOURCE))


@server.tool()
async def whoami() -> str:
    """Who the SDK says the caller is."""
    got = get_access_token()
    if got is None:
        return "null"
    return json.dumps({"client_id": got.client_id, "subject": got.subject, "scopes": got.scopes})


@server.tool()
async def napper() -> str:
    """Sleep the asyncio way (which needs an asyncio loop)."""
    await asyncio.sleep(0.01)
    return "rested"


@server.custom_route("/health", methods=["GET"])  # type: ignore[untyped-decorator]
async def health(request: Request) -> PlainTextResponse:
    """A route weir does not serve."""
    return PlainTextResponse("ok")


no_resource = MCPServer("sdk-no-resource", token_verifier=JwtTokenVerifier(), auth=_settings(None))
