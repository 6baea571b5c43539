"""An SDK app's own security, served by ``weir serve``: its verifier, its metadata.

``python -m weir serve tests.integration.sdk_auth_app:server`` (no ``--auth-*``;
on each runtime, ``--runtime trio`` and ``--runtime asyncio``) serves an
``MCPServer`` built with ``token_verifier=`` and ``AuthSettings``: a request
without a token, or with one the app's verifier refuses, is a 401; a token without
the app's required scope a 403; a valid one is answered, and the SDK tool sees who
it speaks for.  The protected resource metadata is the app's.  What weir
does not serve (the app's custom route) is named at start-up, and an SDK tool that
needs asyncio gets the hint naming the fix.  Real JWTs (PyJWT, an RSA key whose
public half the app reads from a file), real sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.integration.configured import RUNTIMES, serve_configured
from tests.integration.rawhttp import Client, Reply, call
from tests.integration.serverproc import REPO_ROOT, WeirProcess
from tests.integration.test_auth import INIT

pytest.importorskip("mcp")

ISSUER = "https://issuer.test"
RESOURCE = "http://127.0.0.1/mcp"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
V = "2026-07-28"
APP = "tests.integration.sdk_auth_app:server"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def token(sub: str = "alice", *, key: Any = KEY, scope: str = "mcp") -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": RESOURCE, "sub": sub, "exp": now + 300, "scope": scope}
    return jwt.encode({**claims, "client_id": "cli-9"}, key, algorithm="RS256")


@pytest.fixture(scope="module", params=["trio", "asyncio"])
def served(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[WeirProcess]:
    """The app served by ``weir serve`` on each runtime (``--runtime``)."""
    pem = tmp_path_factory.mktemp("sdk-auth") / "public.pem"
    pem.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    os.environ["SDK_AUTH_APP_KEY"] = str(pem)  # read by the app in the server process
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = WeirProcess(APP, out, err, driver=request.param)
            try:
                yield proc
            finally:
                proc.stop()
    finally:
        del os.environ["SDK_AUTH_APP_KEY"]


async def sessionless(port: int, name: str, tok: str | None) -> Reply:
    headers = {"mcp-protocol-version": V, "mcp-method": "tools/call", "mcp-name": name}
    if tok is not None:
        headers["authorization"] = f"Bearer {tok}"
    params = {"name": name, "arguments": {}, "_meta": META}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    client = await Client.connect(port)
    try:
        return await client.request("POST", "/mcp", body, headers=headers)
    finally:
        await client.aclose()


def tool_text(reply: Reply) -> str:
    assert reply.status == 200, reply
    text: str = reply.json()["result"]["content"][0]["text"]
    return text


@pytest.mark.parametrize(
    ("case", "status", "error"),
    [
        ("no token", 401, None),
        ("another key", 401, "invalid_token"),
        ("not a jwt", 401, "invalid_token"),
        ("no scope", 403, "insufficient_scope"),
    ],
)
async def test_the_apps_verifier_refuses(
    served: WeirProcess, case: str, status: int, error: str | None
) -> None:
    tok = {
        "no token": None,
        "another key": token(key=OTHER_KEY),
        "not a jwt": "opaque-garbage",
        "no scope": token(scope="other"),
    }[case]
    with trio.fail_after(30):
        reply = await sessionless(served.port, "whoami", tok)
    assert reply.status == status, reply
    challenge = reply.headers["www-authenticate"]
    assert 'resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource/mcp"' in (
        challenge
    )
    assert 'scope="mcp"' in challenge
    if error is not None:
        assert f'error="{error}"' in challenge


async def test_a_token_the_app_accepts_is_answered_with_its_principal(
    served: WeirProcess,
) -> None:
    with trio.fail_after(30):
        got = json.loads(tool_text(await sessionless(served.port, "whoami", token("bob"))))
        assert got == {"client_id": "cli-9", "subject": "bob", "scopes": ["mcp"]}
        # The session era too: a session opened with a token, used with it.
        client = await Client.connect(served.port)
        try:
            auth = {"authorization": f"Bearer {token('carol')}"}
            opened = await client.request("POST", "/mcp", INIT, headers=auth)
            assert opened.status == 200, opened
            sid = opened.headers["mcp-session-id"]
            reply = await client.request(
                "POST", "/mcp", call(2, "whoami", {}), session=sid, headers=auth
            )
            assert json.loads(tool_text(reply))["subject"] == "carol"
            # Another principal's token does not reach carol's session.
            other = {"authorization": f"Bearer {token('mallory')}"}
            stolen = await client.request(
                "POST", "/mcp", call(3, "whoami", {}), session=sid, headers=other
            )
            assert stolen.status == 404, stolen
        finally:
            await client.aclose()


async def test_the_metadata_is_the_apps(served: WeirProcess) -> None:
    with trio.fail_after(30):
        client = await Client.connect(served.port)
        try:
            meta = await client.request("GET", "/.well-known/oauth-protected-resource/mcp")
        finally:
            await client.aclose()
    assert meta.status == 200, meta
    assert meta.json() == {
        "resource": RESOURCE,
        "authorization_servers": [ISSUER],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["mcp"],
    }


def test_the_custom_route_weir_does_not_serve_is_named(served: WeirProcess) -> None:
    lines = [line for line in served.stderr().splitlines() if "/health" in line]
    assert len(lines) == 1, served.output()
    assert "GET,HEAD /health is not served by weir" in lines[0]


async def test_an_sdk_tool_that_needs_asyncio_gets_the_hint(served: WeirProcess) -> None:
    with trio.fail_after(30):
        reply = await sessionless(served.port, "napper", token())
        result = reply.json()["result"]
        if served.driver == "asyncio":  # (its tools run on asyncio: nothing to hint)
            assert result["content"][0]["text"] == "rested", result
            return
        assert result["isError"] is True
        assert result["content"] == [
            {
                "type": "text",
                "text": "tool napper failed: it needs an asyncio event loop; "
                "the server logged the details",
            }
        ]
        # The log line is written before the response; bounded wait for the pipe.
        for _ in range(100):
            if "docs/asyncio-libraries.md" in served.stderr():
                break
            await trio.sleep(0.05)
    log = served.stderr()
    assert "tool napper failed: it used a library written for asyncio" in log, log
    assert "@weir.engine.asyncio_bridge.on_asyncio" in log


def test_the_asyncio_runtime_refuses_security_it_cannot_keep_rather_than_serve_open() -> None:
    app = "tests.integration.sdk_auth_app:no_resource"
    done = subprocess.run(
        [sys.executable, "-m", "weir", "serve", "--runtime", "asyncio", app, "--port", "0"],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "weir: serving" not in done.stdout
    assert "weir: refusing to serve the app open:" in done.stderr, done.stderr
    assert "resource_server_url" in done.stderr and "Traceback" not in done.stderr


class TableVerifier:
    """An app's verifier that looks tokens up (as an introspection cache would); it
    vouches for a stale token too, and for one issued for another resource."""

    def __init__(self) -> None:
        from mcp.server.auth.provider import AccessToken

        now = int(time.time())
        self.table = {
            "fresh": AccessToken(token="fresh", client_id="c1", scopes=["mcp"], resource=RESOURCE),
            "stale": AccessToken(
                token="stale", client_id="c1", scopes=["mcp"], expires_at=now - 60
            ),
            "elsewhere": AccessToken(
                token="elsewhere", client_id="c1", scopes=["mcp"], resource="https://other.test/"
            ),
        }

    async def verify_token(self, token: str) -> Any:
        return self.table.get(token)


@RUNTIMES
@pytest.mark.parametrize(("tok", "status"), [("fresh", 200), ("stale", 401), ("elsewhere", 401)])
async def test_expiry_and_resource_are_checked_whatever_the_verifier_says(
    tok: str, status: int, runtime: str
) -> None:
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer

    from weir.app.sdk import from_sdk
    from weir.engine import ServerConfig
    from weir.engine._declared_auth import declared_authorization

    settings = AuthSettings(
        issuer_url=ISSUER,  # type: ignore[arg-type]
        resource_server_url=RESOURCE,  # type: ignore[arg-type]
        required_scopes=["mcp"],
        validate_token_resource=True,
    )
    sdk = MCPServer("table", token_verifier=TableVerifier(), auth=settings)

    @sdk.tool()
    async def ping() -> str:
        """Answer."""
        return "pong"

    app = from_sdk(sdk)
    auth = declared_authorization(app)
    assert auth is not None
    with trio.fail_after(30):
        async with serve_configured(runtime, app, ServerConfig(port=0, auth=auth)) as port:
            reply = await sessionless(port, "ping", tok)
    assert reply.status == status, reply
    if status == 200:
        assert tool_text(reply) == "pong"


async def test_a_verifier_that_needs_asyncio_refuses_and_names_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer

    from weir.app.sdk import from_sdk
    from weir.engine import Server, ServerConfig, declared_authorization

    class AsyncioVerifier:
        async def verify_token(self, token: str) -> Any:
            await asyncio.sleep(0.01)  # needs an asyncio loop; weir runs it on Trio
            return None

    settings = AuthSettings(
        issuer_url=ISSUER,  # type: ignore[arg-type]
        resource_server_url=RESOURCE,  # type: ignore[arg-type]
        validate_token_resource=False,
    )
    app = from_sdk(MCPServer("aio", token_verifier=AsyncioVerifier(), auth=settings))
    auth = declared_authorization(app)
    assert auth is not None
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(Server(app, ServerConfig(port=0, auth=auth)).run)
            reply = await sessionless(server.port, "anything", "some-token")
            server.shutdown()
    assert reply.status == 401, reply
    hints = [r for r in caplog.records if "docs/asyncio-libraries.md" in r.getMessage()]
    assert len(hints) == 1 and "token verifier" in hints[0].getMessage()


def test_a_fastmcp_auth_provider_is_refused_not_dropped() -> None:
    fastmcp = pytest.importorskip("fastmcp")
    from fastmcp.server.auth.providers.jwt import JWTVerifier, RSAKeyPair

    from weir.app.sdk import from_sdk
    from weir.engine import declared_authorization

    pair = RSAKeyPair.generate()
    verifier = JWTVerifier(public_key=pair.public_key, issuer=ISSUER, audience=RESOURCE)
    app = from_sdk(fastmcp.FastMCP("guarded", auth=verifier))
    with pytest.raises(ValueError, match="--auth-issuer"):
        declared_authorization(app)


@RUNTIMES
async def test_auth_options_replace_the_apps_verifier(tmp_path: Path, runtime: str) -> None:
    from tests.integration import test_auth

    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps(test_auth.jwks()))
    args = [
        "--auth-issuer", test_auth.ISSUER, "--auth-resource", test_auth.RESOURCE,
        "--auth-jwks-file", str(keys),
    ]  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = WeirProcess(APP, out, err, args, driver=runtime)
        try:
            with trio.fail_after(30):
                ours = await sessionless(proc.port, "whoami", test_auth.token("dora"))
                apps = await sessionless(proc.port, "whoami", token("dora"))
        finally:
            proc.stop()
        assert json.loads(tool_text(ours))["subject"] == "dora"
        assert apps.status == 401, apps  # signed with the app's key: not weir's
        assert "the app's own authorization is replaced by the --auth-* options" in (proc.stderr())


@RUNTIMES
async def test_embedding_the_app_by_hand_keeps_its_security_too(runtime: str) -> None:
    """``Server(from_sdk(app), ServerConfig())`` -- no ``auth`` passed -- serves the
    app with its own verifier, as ``weir serve`` does; never open.  So does
    :func:`weir.asyncio.run` (``AsyncioConfig()`` with no ``auth``)."""
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer

    from weir.app.sdk import from_sdk
    from weir.engine import ServerConfig

    settings = AuthSettings(
        issuer_url=ISSUER,  # type: ignore[arg-type]
        resource_server_url=RESOURCE,  # type: ignore[arg-type]
        required_scopes=["mcp"],
    )
    sdk = MCPServer("table", token_verifier=TableVerifier(), auth=settings)

    @sdk.tool()
    async def ping() -> str:
        """Answer."""
        return "pong"

    replies: dict[str | None, Reply] = {}
    with trio.fail_after(30):
        async with serve_configured(runtime, from_sdk(sdk), ServerConfig(port=0)) as port:
            for tok in (None, "unknown", "stale", "fresh"):
                replies[tok] = await sessionless(port, "ping", tok)
    assert replies[None].status == 401 and replies["unknown"].status == 401
    assert "token expired" in replies["stale"].headers["www-authenticate"]
    assert tool_text(replies["fresh"]) == "pong"
