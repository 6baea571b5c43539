"""Authorization with real JWTs: keys served as a JWKS on loopback, tokens signed with PyJWT.

weir runs in-process on a loopback port (on each runtime, Trio and asyncio) with a
:class:`weir.engine.JwtVerifier` that fetches its keys from a JWKS endpoint on
another loopback port.  Every refusal is
checked for its status, ``error.data.reason`` and ``WWW-Authenticate``; two
principals are checked to be invisible to each other.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jwt
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from weir.app.samples.demo import app
from weir.engine import App, Authorization, JwtVerifier, ServerConfig

from .configured import RUNTIMES, serve_configured
from .rawhttp import INIT_PARAMS, Client, Reply, call, raw_request

ISSUER = "https://issuer.test"
RESOURCE = "http://127.0.0.1/mcp"
SIGNING_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwks() -> dict[str, Any]:
    keys = []
    for kid, key in (("rsa-1", SIGNING_KEY), ("ec-1", EC_KEY)):
        jwk = json.loads(
            jwt.algorithms.get_default_algorithms()[
                "RS256" if kid.startswith("rsa") else "ES256"
            ].to_jwk(key.public_key())
        )
        jwk["kid"] = kid
        keys.append(jwk)
    return {"keys": keys}


def token(
    sub: str = "alice",
    *,
    key: Any = SIGNING_KEY,
    kid: str = "rsa-1",
    alg: str = "RS256",
    scope: str = "mcp",
    **claims: Any,
) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": RESOURCE, "sub": sub, "iat": now, "exp": now + 300}
    body["scope"] = scope
    body.update(claims)
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def unsigned(claims: dict[str, Any]) -> str:
    """A JWT with ``alg: none`` and no signature, built by hand."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


async def serve_jwks(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A one-document HTTP server on loopback: the JWKS, for every request."""
    body = json.dumps(jwks()).encode()

    async def handle(stream: trio.SocketStream) -> None:
        with trio.move_on_after(5):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                data += chunk
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            )
            await stream.send_all(head + body)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def jwt_authorization(
    nursery: trio.Nursery, scopes: frozenset[str] = frozenset({"mcp"})
) -> Authorization:
    """Authorization by :class:`JwtVerifier`, its keys served (in ``nursery``) as a
    JWKS on a loopback port; tokens from :func:`token` pass it."""
    jwks_port = await nursery.start(serve_jwks)
    verifier = JwtVerifier(
        issuer=ISSUER, audience=RESOURCE, jwks_url=f"http://127.0.0.1:{jwks_port}/jwks"
    )
    return Authorization(
        verifier=verifier,
        resource=RESOURCE,
        authorization_servers=(ISSUER,),
        required_scopes=scopes,
    )


@asynccontextmanager
async def authorized_server(
    scopes: frozenset[str] = frozenset({"mcp"}), served: App = app, runtime: str = "trio"
) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery, scopes)
        async with serve_configured(runtime, served, ServerConfig(port=0, auth=auth)) as port:
            yield port
        nursery.cancel_scope.cancel()


async def post(port: int, message: Any, tok: str | None, session: str | None = None) -> Reply:
    client = await Client.connect(port)
    try:
        headers = {"authorization": f"Bearer {tok}"} if tok else {}
        return await client.request("POST", "/mcp", message, session=session, headers=headers)
    finally:
        await client.aclose()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT_PARAMS}


async def open_as(port: int, tok: str) -> str:
    reply = await post(port, INIT, tok)
    assert reply.status == 200, reply
    sid = reply.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await post(port, note, tok, sid)).status == 202
    return sid


def challenge(reply: Reply) -> str:
    value = reply.headers.get("www-authenticate", "")
    assert value.startswith("Bearer "), reply
    assert 'resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource/mcp"' in value
    return value


@RUNTIMES
async def test_a_valid_token_is_served_and_metadata_needs_none(runtime: str) -> None:
    with trio.fail_after(30):
        async with authorized_server(runtime=runtime) as port:
            sid = await open_as(port, token())
            reply = await post(port, call(2, "echo", {"text": "hi"}), token(), sid)
            assert reply.json()["result"]["content"][0]["text"] == "hi"
            ec_reply = await post(
                port,
                {"jsonrpc": "2.0", "id": 3, "method": "ping"},
                token(key=EC_KEY, kid="ec-1", alg="ES256"),
                sid,
            )
            assert ec_reply.status == 200
            client = await Client.connect(port)
            meta = await client.request("GET", "/.well-known/oauth-protected-resource/mcp")
            await client.aclose()
            assert meta.status == 200
            assert meta.json() == {
                "resource": RESOURCE,
                "authorization_servers": [ISSUER],
                "bearer_methods_supported": ["header"],
                "scopes_supported": ["mcp"],
            }


@pytest.mark.parametrize(
    ("case", "status", "reason", "error"),
    [
        ("missing", 401, "unauthorized", None),
        ("expired", 401, "unauthorized", "invalid_token"),
        ("wrong-audience", 401, "unauthorized", "invalid_token"),
        ("wrong-issuer", 401, "unauthorized", "invalid_token"),
        ("bad-signature", 401, "unauthorized", "invalid_token"),
        ("unknown-kid", 401, "unauthorized", "invalid_token"),
        ("alg-none", 401, "unauthorized", "invalid_token"),
        ("hs256-with-public-key", 401, "unauthorized", "invalid_token"),
        ("missing-scope", 403, "insufficient_scope", "insufficient_scope"),
        ("not-bearer", 400, "invalid_request", "invalid_request"),
    ],
)
@RUNTIMES
async def test_refused_tokens(
    case: str, status: int, reason: str, error: str | None, runtime: str
) -> None:
    now = int(time.time())
    tokens: dict[str, str | None] = {
        "missing": None,
        "expired": token(exp=now - 3600, iat=now - 7200),
        "wrong-audience": token(aud="https://elsewhere.test/mcp"),
        "wrong-issuer": token(iss="https://evil.test"),
        "bad-signature": token(key=OTHER_KEY),
        "unknown-kid": token(kid="nope"),
        "alg-none": unsigned({"iss": ISSUER, "aud": RESOURCE, "sub": "x", "exp": now + 60}),
        "hs256-with-public-key": jwt.encode(
            {"iss": ISSUER, "aud": RESOURCE, "sub": "x", "exp": now + 60},
            "not-the-key-but-long-enough-for-hs256!",
            algorithm="HS256",
            headers={"kid": "rsa-1"},
        ),
        "missing-scope": token(scope="other"),
    }
    with trio.fail_after(30):
        async with authorized_server(runtime=runtime) as port:
            client = await Client.connect(port)
            if case == "not-bearer":
                headers = {"authorization": "Basic dXNlcjpwYXNz"}
            else:
                tok = tokens[case]
                headers = {"authorization": f"Bearer {tok}"} if tok else {}
            reply = await client.request("POST", "/mcp", INIT, headers=headers)
            await client.aclose()
            assert reply.status == status, reply
            assert reply.reason == reason
            value = challenge(reply)
            if error is None:
                assert "error=" not in value
            else:
                assert f'error="{error}"' in value
            assert 'scope="mcp"' in value


@RUNTIMES
async def test_two_principals_cannot_touch_each_others_sessions(runtime: str) -> None:
    with trio.fail_after(30):
        async with authorized_server(runtime=runtime) as port:
            alice, bob = token("alice"), token("bob")
            sid = await open_as(port, alice)
            attempts = {
                "call": call(5, "increment", {"by": 1}),
                "ping": {"jsonrpc": "2.0", "id": 6, "method": "ping"},
                "rebind": {"jsonrpc": "2.0", "id": 7, "method": "weir/rebind"},
                "cancel": {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": 5},
                },
            }
            for what, msg in attempts.items():
                reply = await post(port, msg, bob, sid)
                assert reply.status == 404, (what, reply)
                assert reply.reason == "session_not_found", what
            client = await Client.connect(port)
            for method in ("GET", "DELETE"):
                headers = {
                    "authorization": f"Bearer {bob}",
                    "mcp-session-id": sid,
                    "accept": "text/event-stream",
                }
                if method == "GET":
                    headers["last-event-id"] = "00000001:0"
                reply = await client.request(method, "/mcp", headers=headers)
                assert reply.status == 404, (method, reply)
            await client.aclose()
            # Alice's session is untouched: nothing ran, nothing was deleted.
            got = await post(port, call(8, "increment", {"by": 1}), alice, sid)
            assert got.status == 200 and "error" not in got.json()


def test_jwt_verifier_refuses_unsafe_configurations() -> None:
    for url in ("http://keys.example.com/jwks", "ftp://127.0.0.1/jwks", "https:///nohost"):
        with pytest.raises(ValueError, match="JWKS URL"):
            JwtVerifier(issuer=ISSUER, audience=RESOURCE, jwks_url=url)
    JwtVerifier(issuer=ISSUER, audience=RESOURCE, jwks_url="http://127.0.0.1:1/jwks")
    with pytest.raises(ValueError, match="asymmetric"):
        JwtVerifier(issuer=ISSUER, audience=RESOURCE, jwks=jwks(), algorithms=("HS256",))
    with pytest.raises(ValueError, match="exactly one"):
        JwtVerifier(issuer=ISSUER, audience=RESOURCE)


@RUNTIMES
async def test_a_legacy_session_needs_a_token_and_is_its_principals(runtime: str) -> None:
    """The 2024-11-05 transport: ``GET /sse`` needs a token; the session it opens is
    its principal's, so another principal's ``POST /messages`` for it is 404 and runs
    nothing, while the owner's is answered on the stream."""
    with trio.fail_after(30):
        async with authorized_server(runtime=runtime) as port:
            anonymous = await Client.connect(port)
            refused = await anonymous.request(
                "GET", "/sse", headers={"accept": "text/event-stream"}
            )
            await anonymous.aclose()
            assert refused.status == 401 and refused.reason == "unauthorized", refused
            challenge(refused)

            stream = await Client.connect(port)
            auth = {"authorization": f"Bearer {token('alice')}"}
            await stream.send_raw(
                raw_request("GET", "/sse", headers={"accept": "text/event-stream", **auth})
            )
            seen = b""
            while b"\n\n" not in seen.partition(b"event: endpoint")[2]:  # the whole event
                chunk = await stream.stream.receive_some(65536)
                assert chunk, seen
                seen += chunk
            assert seen.startswith(b"HTTP/1.1 200"), seen
            target = seen.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
            assert target.startswith("/messages?session_id=")

            async def send(sub: str, message: Any) -> Reply:
                c = await Client.connect(port)
                try:
                    headers = {"authorization": f"Bearer {token(sub)}"}
                    return await c.request("POST", target, message, headers=headers)
                finally:
                    await c.aclose()

            stolen = await send("bob", INIT)
            assert stolen.status == 404 and stolen.reason == "session_not_found", stolen
            taken = await send("alice", INIT)
            assert taken.status == 202, taken
            while b'"serverInfo"' not in seen:
                chunk = await stream.stream.receive_some(65536)
                assert chunk, seen
                seen += chunk
            assert seen.count(b'"result"') == 1  # Bob's initialize never ran
            # A batch (2024-11-05 has them): 202, each answer on the stream.
            pings = [{"jsonrpc": "2.0", "id": f"p{i}", "method": "ping"} for i in (1, 2)]
            assert (await send("alice", pings)).status == 202
            while not (b'"id":"p1"' in seen and b'"id":"p2"' in seen):
                chunk = await stream.stream.receive_some(65536)
                assert chunk, seen
                seen += chunk
            await stream.aclose()
