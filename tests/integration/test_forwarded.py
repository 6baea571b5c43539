"""weir behind trusted proxies, over real sockets, on both runtimes.

``--forwarded-allow-ips`` decides whose ``X-Forwarded-*``/``Forwarded`` headers are
believed, per request; ``--root-path`` moves every served path under a prefix and
puts it in every URL weir sends.  The servers are configured the way ``weir serve``
configures them (``config_from_args``); all traffic comes from 127.0.0.1, so
"trusted" is ``--forwarded-allow-ips 127.0.0.1`` and "untrusted" a list without it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import trio

from weir.app import AccessToken
from weir.app.samples.demo import app
from weir.common import METADATA_PATH, Authorization, InvalidToken
from weir.engine import ServerConfig
from weir.engine.cli import _parser, config_from_args

from .configured import RUNTIMES, serve_configured
from .rawhttp import INIT_PARAMS, Client, raw_request
from .test_cli_startup import one_line_failure, weir

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}
V = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": V,
    "io.modelcontextprotocol/clientCapabilities": {},
}
#: A sessionless (2026-07-28) call, and the headers it travels with.
PING = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
SESSIONLESS = {"mcp-protocol-version": V, "mcp-method": "tools/list"}


def configured(*options: str) -> ServerConfig:
    """The ``ServerConfig`` ``weir serve --port 0 OPTIONS`` builds."""
    return config_from_args(_parser().parse_args(["serve", "--port", "0", *options]))


class _RefuseAll:
    """A verifier that vouches for no token (these tests look only at the challenge)."""

    async def verify(self, token: str) -> AccessToken:
        raise InvalidToken("no token is good here")


@pytest.mark.parametrize("trusted", [False, True])
@RUNTIMES
async def test_forwarded_host_is_believed_only_from_a_trusted_peer(
    runtime: str, trusted: bool
) -> None:
    """The allow-list names ``mcp.example.com``; the "proxy" connects with the
    upstream name ``upstream`` in ``Host`` and the client's in ``X-Forwarded-Host``.
    Untrusted: ignored, the Host check sees ``upstream`` and refuses (403), and a
    spoofed allowed name does not help.  Trusted: the client's host is checked, so
    the request is served, and a forwarded name off the list is refused."""
    allow = "127.0.0.1" if trusted else "10.0.0.0/8,::1"
    config = configured("--allow-host", "mcp.example.com", "--forwarded-allow-ips", allow)
    with trio.fail_after(30):
        async with serve_configured(runtime, app, config) as port:
            c = await Client.connect(port)
            try:
                for xfh, served in (("mcp.example.com", trusted), ("evil.example", False)):
                    head = {"x-forwarded-host": xfh, "x-forwarded-proto": "https"}
                    await c.send_raw(
                        raw_request(
                            "POST", "/mcp", body=_json(INIT), host="upstream:8000", headers=head
                        )
                    )
                    reply = await c.read_reply()
                    if served:
                        assert reply.status == 200, reply
                    else:
                        assert reply.status == 403 and reply.reason == "forbidden_host", reply
                # A malformed forwarded host is ignored, not an error: the Host stands.
                bad = {"x-forwarded-host": "bad host/", "x-forwarded-for": "not an ip"}
                await c.send_raw(
                    raw_request("POST", "/mcp", body=_json(INIT), host="localhost", headers=bad)
                )
                reply = await c.read_reply()
                assert reply.status == 200, reply
                # The RFC 7239 header counts the same.
                forwarded = {**SESSIONLESS, "forwarded": 'for=192.0.2.9;host="mcp.example.com"'}
                await c.send_raw(
                    raw_request(
                        "POST", "/mcp", body=_json(PING), host="upstream", headers=forwarded
                    )
                )
                reply = await c.read_reply()
                assert reply.status == (200 if trusted else 403), reply
            finally:
                await c.aclose()


@RUNTIMES
async def test_each_request_on_one_connection_has_its_own_client(
    runtime: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy's one keep-alive connection carries two users: each request is
    logged with its own client, and a third without forwarding headers as the proxy
    (on the ``weir.requests`` debug log and on the access log alike)."""
    caplog.set_level(logging.INFO, logger="weir.access")
    caplog.set_level(logging.DEBUG, logger="weir.requests")  # (last: the handler's level)
    config = configured("--forwarded-allow-ips", "127.0.0.1")
    with trio.fail_after(30):
        async with serve_configured(runtime, app, config) as port:
            c = await Client.connect(port)
            try:
                for xff in ("198.51.100.1", "203.0.113.2, 127.0.0.1", None):
                    head = {**SESSIONLESS, **({"x-forwarded-for": xff} if xff else {})}
                    reply = await c.request("POST", "/mcp", PING, headers=head)
                    assert reply.status == 200, reply
            finally:
                await c.aclose()
    clients = [
        r.args[2] for r in caplog.records if r.name == "weir.requests" and isinstance(r.args, tuple)
    ]
    assert clients == ["198.51.100.1", "203.0.113.2", "127.0.0.1"], clients
    access = [r.fields.client for r in caplog.records if r.name == "weir.access"]  # type: ignore[attr-defined]
    assert access[:2] == ["198.51.100.1", "203.0.113.2"], access
    assert access[2].startswith("127.0.0.1:"), access  # (the proxy itself: host and port)


@RUNTIMES
async def test_root_path_serves_and_sends_prefixed_urls(runtime: str) -> None:
    """``--root-path /tools``: the endpoint, the legacy stream and its ``endpoint``
    event's URL, ``/metrics``, and the resource metadata (at RFC 9728's location and
    under the prefix) are all under ``/tools``; the bare paths are 404."""
    resource = "https://mcp.example.com/tools/mcp"
    config = configured("--root-path", "/tools")
    auth = Authorization(verifier=_RefuseAll(), resource=resource, authorization_servers=("x",))
    with trio.fail_after(30):
        async with serve_configured(runtime, app, config) as port:
            c = await Client.connect(port)
            try:
                assert (await c.request("POST", "/tools/mcp", INIT)).status == 200
                assert (await c.request("POST", "/mcp", INIT)).status == 404
                metrics = await c.request("GET", "/tools/metrics")
                assert metrics.status == 200 and b"weir_" in metrics.body, metrics
            finally:
                await c.aclose()
            stream = await Client.connect(port)
            try:
                await stream.send_raw(
                    raw_request("GET", "/tools/sse", headers={"accept": "text/event-stream"})
                )
                seen = b""
                while b"\n\n" not in seen.partition(b"event: endpoint")[2]:
                    chunk = await stream.stream.receive_some(65536)
                    assert chunk, seen
                    seen += chunk
                assert seen.startswith(b"HTTP/1.1 200"), seen
                target = seen.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
                assert target.startswith("/tools/messages?session_id="), target
            finally:
                await stream.aclose()
        async with serve_configured(runtime, app, _with(config, auth)) as port:
            c = await Client.connect(port)
            try:
                refused = await c.request("POST", "/tools/mcp", INIT)
                assert refused.status == 401, refused
                where = f"https://mcp.example.com{METADATA_PATH}/tools/mcp"
                assert f'resource_metadata="{where}"' in refused.headers["www-authenticate"]
                for path in (METADATA_PATH + "/tools/mcp", "/tools" + METADATA_PATH + "/mcp"):
                    meta = await c.request("GET", path)
                    assert meta.status == 200 and meta.json()["resource"] == resource, meta
            finally:
                await c.aclose()


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--forwarded-allow-ips", "127.0.0.1,proxy.local", "'proxy.local' is not an IP address"),
        ("--forwarded-allow-ips", "10.0.0.0/40", "'10.0.0.0/40' is not an IP address"),
        ("--root-path", "tools", "--root-path must be empty or /segment"),
        ("--root-path", "/tools/", "--root-path must be empty or /segment"),
        ("--root-path", "/a b", "--root-path must be empty or /segment"),
    ],
)
@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
def test_bad_values_are_refused_at_start_up(
    tmp_path: Path, option: str, value: str, says: str, runtime: str
) -> None:
    done = weir(tmp_path, "serve", "--runtime", runtime, "--port", "0", f"{option}={value}")
    assert done.returncode == 1, done
    assert says in one_line_failure(done)


def _json(message: object) -> bytes:
    return json.dumps(message).encode()


def _with(config: ServerConfig, auth: Authorization) -> ServerConfig:
    return dataclasses.replace(config, auth=auth)


@RUNTIMES
async def test_forwarded_headers_never_change_the_resource_identifier(runtime: str) -> None:
    """The resource identifier is the audience tokens must name: configuration, never
    derived from a request.  A trusted proxy saying another scheme and host changes
    neither the metadata's ``resource`` nor the ``WWW-Authenticate`` pointer."""
    resource = "https://mcp.example.com/mcp"
    allow = ("--allow-host", "mcp.example.com", "--allow-host", "other.example")
    config = configured("--forwarded-allow-ips", "127.0.0.1", *allow)
    config = _with(config, Authorization(verifier=_RefuseAll(), resource=resource))
    proxied = {"x-forwarded-proto": "http", "x-forwarded-host": "other.example:8080"}
    with trio.fail_after(30):
        async with serve_configured(runtime, app, config) as port:
            c = await Client.connect(port)
            try:
                meta = await c.request("GET", METADATA_PATH + "/mcp", headers=proxied)
                assert meta.status == 200 and meta.json()["resource"] == resource, meta
                refused = await c.request("POST", "/mcp", INIT, headers=proxied)
                assert refused.status == 401, refused
                where = f'resource_metadata="https://mcp.example.com{METADATA_PATH}/mcp"'
                assert where in refused.headers["www-authenticate"], refused
            finally:
                await c.aclose()


def test_trusting_everyone_while_reachable_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    """``*`` on a non-loopback address lets any client choose the Host weir checks:
    said at start-up; on loopback (only local peers) it is not."""
    caplog.set_level(logging.WARNING, logger="weir.engine.cli")
    configured("--forwarded-allow-ips", "*")
    assert not caplog.records
    configured("--host", "0.0.0.0", "--forwarded-allow-ips", "*")
    assert [r.getMessage() for r in caplog.records if "'*' on 0.0.0.0" in r.getMessage()]
