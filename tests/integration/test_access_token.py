"""A handler sees the verified token of its own request, on both eras and through
the SDK bridge: real JWTs (signed with PyJWT, keys from a loopback JWKS), real sockets.

weir verifies the bearer token of every request; what the verifier vouched for
(principal, scopes, expiry, claims) reaches the handler as ``Context.access_token``,
and an SDK app's ``get_access_token()``.  Each request's handler sees that request's
token, even on one keep-alive connection that carries requests of two principals.
The raw token never reaches a handler (MCP forbids passing it on).  Each test runs
on both runtimes (Trio and asyncio).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import trio

from weir.engine import App, Context, ServerConfig

from .configured import RUNTIMES, serve_configured
from .rawhttp import Client, Reply, call
from .test_auth import authorized_server, open_as, post, token

V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}

native = App("whoami")


@native.tool()
async def whoami(ctx: Context) -> str:
    """What the request's token vouched for, as JSON."""
    access = ctx.access_token
    if access is None:
        return "null"
    claims = {k: access.claims[k] for k in ("sub", "plan") if k in access.claims}
    return json.dumps({"principal": access.principal, "scopes": sorted(access.scopes), **claims})


def text_of(reply: Reply) -> Any:
    assert reply.status == 200, reply
    return json.loads(reply.json()["result"]["content"][0]["text"])


def sessionless_call(rid: int) -> dict[str, Any]:
    params = {"name": "whoami", "arguments": {}, "_meta": META}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def sessionless(client: Client, rid: int, tok: str) -> Reply:
    headers = {
        "authorization": f"Bearer {tok}",
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": "whoami",
    }
    return await client.request("POST", "/mcp", sessionless_call(rid), headers=headers)


@RUNTIMES
async def test_a_session_era_handler_sees_each_requests_own_token(runtime: str) -> None:
    with trio.fail_after(30):
        async with authorized_server(served=native, runtime=runtime) as port:
            sid = await open_as(port, token("alice"))
            first = text_of(await post(port, call(2, "whoami", {}), token("alice", plan="a"), sid))
            assert first == {
                "principal": "https://issuer.test#alice",
                "scopes": ["mcp"],
                "sub": "alice",
                "plan": "a",
            }
            # A refreshed token (same principal, more scope) is what the next call sees.
            refreshed = token("alice", scope="mcp files:read", plan="b")
            second = text_of(await post(port, call(3, "whoami", {}), refreshed, sid))
            assert second["scopes"] == ["files:read", "mcp"] and second["plan"] == "b"


@RUNTIMES
async def test_one_connection_carrying_two_principals_gives_each_handler_its_own(
    runtime: str,
) -> None:
    with trio.fail_after(30):
        async with authorized_server(served=native, runtime=runtime) as port:
            client = await Client.connect(port)
            try:
                seen = [
                    text_of(await sessionless(client, rid, token(sub)))
                    for rid, sub in ((1, "alice"), (2, "bob"), (3, "alice"))
                ]
            finally:
                await client.aclose()
            assert [s["sub"] for s in seen] == ["alice", "bob", "alice"]
            assert seen[1]["principal"] == "https://issuer.test#bob"


@RUNTIMES
async def test_without_authorization_there_is_no_token(runtime: str) -> None:
    with trio.fail_after(30):
        async with serve_configured(runtime, native, ServerConfig(port=0)) as port:
            client = await Client.connect(port)
            try:
                headers = {"mcp-protocol-version": V, "mcp-method": "tools/call"}
                headers["mcp-name"] = "whoami"
                reply = await client.request("POST", "/mcp", sessionless_call(1), headers=headers)
            finally:
                await client.aclose()
            assert text_of(reply) is None


def sdk_app() -> App:
    if os.environ.get("WEIR_REQUIRE_SDK") != "1":
        pytest.importorskip("mcp")
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.mcpserver import MCPServer

    from weir.app.sdk import from_sdk

    server = MCPServer("sdk-whoami")

    @server.tool()
    async def whoami() -> str:
        """What the SDK's own auth context says about the caller."""
        got = get_access_token()
        if got is None:
            return "null"
        return json.dumps(
            {
                "client_id": got.client_id,
                "scopes": got.scopes,
                "subject": got.subject,
                "token": got.token,
                "iss": (got.claims or {}).get("iss"),
            }
        )

    return from_sdk(server)


@RUNTIMES
@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_an_sdk_handler_reads_the_token_weir_verified(era: str, runtime: str) -> None:
    served = sdk_app()
    tok = token("carol", scope="mcp notes:write", client_id="cli-7")
    with trio.fail_after(30):
        async with authorized_server(served=served, runtime=runtime) as port:
            if era == "session":
                sid = await open_as(port, tok)
                reply = await post(port, call(2, "whoami", {}), tok, sid)
            else:
                client = await Client.connect(port)
                try:
                    reply = await sessionless(client, 1, tok)
                finally:
                    await client.aclose()
    assert text_of(reply) == {
        "client_id": "cli-7",
        "scopes": ["mcp", "notes:write"],
        "subject": "carol",
        "token": "",  # never handed on
        "iss": "https://issuer.test",
    }
