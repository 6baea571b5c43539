"""Refused tokens and greedy principals, against a real server with real JWTs.

A refusal never echoes what the client sent: hostile ``alg`` values (44 KB each,
or one that is not latin-1) get a 401 with a fixed description, and the server's
cache of response heads does not grow with them.  One principal filling its share
of sessions leaves room for the others.  Each is checked on both runtimes, but the
head cache's, which is the Trio engine's own.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from weir.app.samples.demo import app
from weir.common._jwt import MAX_SUBJECT
from weir.engine import AccessToken, Authorization, Server, ServerConfig

from .configured import RUNTIMES, serve_configured
from .rawhttp import Client, Reply
from .test_auth import INIT, jwt_authorization, open_as, post, token


@asynccontextmanager
async def jwt_server(max_sessions: int = 10_000) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery)
        config = ServerConfig(port=0, auth=auth, max_sessions=max_sessions)
        server = await nursery.start(Server(app, config).run)
        try:
            yield server
        finally:
            server.shutdown()
            await server.stopped.wait()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def jwt_port(runtime: str, max_sessions: int = 10_000) -> AsyncIterator[int]:
    """The demo app with JWT authorization on ``runtime``; its port."""
    async with trio.open_nursery() as nursery:
        auth = await jwt_authorization(nursery)
        config = ServerConfig(port=0, auth=auth, max_sessions=max_sessions)
        async with serve_configured(runtime, app, config) as port:
            yield port
        nursery.cancel_scope.cancel()


def forged(header: dict[str, object]) -> str:
    """A JWT-shaped token with ``header``, some claims and a junk signature."""

    def part(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    claims = {"iss": "https://issuer.test", "sub": "mallory", "exp": 4102444800}
    return ".".join(
        (part(json.dumps(header).encode()), part(json.dumps(claims).encode()), part(b"sig"))
    )


def cached_heads(server: Server) -> int:
    # The server's shared cache of validated response heads (both of its kinds).
    heads = server._heads
    return len(heads._heads) + len(heads._events)


def assert_fixed_401(reply: Reply) -> None:
    assert reply.status == 401, reply
    assert reply.reason == "unauthorized"
    challenge = reply.headers["www-authenticate"]
    assert 'error="invalid_token", error_description="invalid token"' in challenge
    assert challenge.isascii() and len(challenge) < 300
    assert reply.json()["error"]["message"] == "invalid token"


async def test_many_big_refused_algs_do_not_grow_the_head_cache() -> None:
    with trio.fail_after(120):
        async with jwt_server() as server:
            client = await Client.connect(server.port)
            first = await client.request(
                "POST", "/mcp", INIT, headers={"authorization": f"Bearer {forged({'alg': 'x'})}"}
            )
            assert_fixed_401(first)
            before = cached_heads(server)
            for i in range(800):
                # Distinct values are what would grow the cache; some are 44 KB.
                padding = "A" * (44_000 if i % 40 == 0 else 2_000)
                tok = forged({"alg": f"{i:04d}{padding}", "kid": "rsa-1"})
                reply = await client.request(
                    "POST", "/mcp", INIT, headers={"authorization": f"Bearer {tok}"}
                )
                assert_fixed_401(reply)
            await client.aclose()
            assert cached_heads(server) == before


@RUNTIMES
async def test_malformed_tokens_get_a_401_with_a_valid_head(runtime: str) -> None:
    tokens = [
        forged({"alg": "\u0100", "kid": "rsa-1"}),
        forged({"alg": "RS256\r\nx-injected: 1", "kid": "rsa-1"}),
        forged({"alg": ["RS256"], "kid": {"k": 1}}),
        forged({"alg": "RS256", "kid": "\u0100" * 100}),
        "not-base64!.at-all.",
        "a.b.c",
        "\xff\xfe.\xff.\xff",
        "e30.e30.",  # {} . {}
    ]
    with trio.fail_after(60):
        async with jwt_port(runtime) as port:
            for tok in tokens:
                client = await Client.connect(port)
                reply = await client.request(
                    "POST", "/mcp", INIT, headers={"authorization": f"Bearer {tok}"}
                )
                assert_fixed_401(reply)
                assert "x-injected" not in reply.headers
                # The connection is still good for the next request.
                again = await client.request("POST", "/mcp", INIT)
                assert again.status == 401
                await client.aclose()


@RUNTIMES
async def test_an_expired_token_is_told_so_in_fixed_words(runtime: str) -> None:
    with trio.fail_after(30):
        async with jwt_port(runtime) as port:
            reply = await post(port, INIT, token(exp=1_000_000, iat=999_000))
            assert reply.status == 401
            assert 'error_description="token expired"' in reply.headers["www-authenticate"]


@RUNTIMES
async def test_one_principal_filling_its_share_leaves_room_for_others(runtime: str) -> None:
    # Authorization on, no per-principal option: each principal gets a sixteenth.
    with trio.fail_after(60):
        async with jwt_port(runtime, max_sessions=32) as port:
            for _ in range(2):
                await open_as(port, token("alice"))
            refused = await post(port, INIT, token("alice"))
            assert refused.status == 429, refused
            assert refused.reason == "session_limit"
            data = refused.json()["error"]["data"]
            assert (data["limit"], data["scope"]) == (2, "principal")
            assert "retry-after" in refused.headers
            await open_as(port, token("bob"))


def test_the_per_principal_default_depends_on_authorization() -> None:
    from weir.engine import Authorization, JwtVerifier

    verifier = JwtVerifier(issuer="https://i.test", audience="https://r.test", jwks={"keys": []})
    auth = Authorization(verifier=verifier, resource="https://r.test/mcp")
    assert ServerConfig().principal_session_limit == 10_000
    assert ServerConfig(auth=auth).principal_session_limit == 256
    assert ServerConfig(auth=auth, max_sessions=100).principal_session_limit == 6
    assert ServerConfig(auth=auth, max_sessions=10).principal_session_limit == 1
    explicit = ServerConfig(auth=auth, max_sessions_per_principal=1000)
    assert explicit.principal_session_limit == 1000


class _FlakyVerifier:
    """A verifier whose backend is down for tokens starting ``down``."""

    async def verify(self, token: str) -> AccessToken:
        if token.startswith("down"):
            raise ConnectionError("introspection endpoint refused the connection")
        return AccessToken(principal=f"https://issuer.test#{token}")


@RUNTIMES
async def test_a_failing_verifier_is_a_503_to_retry_not_a_dropped_connection(
    caplog: pytest.LogCaptureFixture, runtime: str
) -> None:
    auth = Authorization(verifier=_FlakyVerifier(), resource="http://127.0.0.1/mcp")
    with trio.fail_after(30):
        async with serve_configured(runtime, app, ServerConfig(port=0, auth=auth)) as port:
            client = await Client.connect(port)
            down = await client.request(
                "POST", "/mcp", INIT, headers={"authorization": "Bearer down-1"}
            )
            assert down.status == 503 and down.reason == "verifier_unavailable", down
            assert "retry-after" in down.headers
            assert "introspection" not in down.body.decode()  # nothing of the cause leaks
            # The same connection still serves the next request.
            up = await client.request("POST", "/mcp", INIT, headers={"authorization": "Bearer ok"})
            assert up.status == 200, up
            await client.aclose()
    failures = [r for r in caplog.records if "verifier failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is None


@pytest.mark.parametrize(
    "exp",
    [10**400, str(4102444800), [4102444800], True],
    ids=["beyond-a-float", "string", "list", "true"],
)
@RUNTIMES
async def test_an_exp_that_is_not_a_numeric_date_is_an_invalid_token(
    exp: object, runtime: str
) -> None:
    # Signed by the issuer's own key, yet not a NumericDate (RFC 7519 section 2): an
    # invalid token (401), not a verifier failure (503) and never accepted.
    with trio.fail_after(30):
        async with jwt_port(runtime) as port:
            assert_fixed_401(await post(port, INIT, token(exp=exp)))


@pytest.mark.parametrize("sub", ["", "s" * (MAX_SUBJECT + 1)], ids=["empty", "too-long"])
@RUNTIMES
async def test_a_subject_that_names_no_one_is_an_invalid_token(sub: str, runtime: str) -> None:
    # Signed by the issuer, yet no principal: an empty sub would make every such token one
    # principal, and a 30,000-character one a principal that long in every key and limit.
    with trio.fail_after(30):
        async with jwt_port(runtime) as port:
            assert_fixed_401(await post(port, INIT, token(sub=sub)))
            assert (await post(port, INIT, token(sub="s" * MAX_SUBJECT))).status == 200
