"""The official MCP SDK client over ``https://``: ``weir serve demo --ssl-*`` in a
subprocess (on both runtimes), the SDK's ``streamable_http_client`` given an ``httpx2`` client that
trusts the test CA (``tests.integration.tlspki``), in both of the SDK's modes (the
2026-07-28 revision, and the session-era handshake).

Needs the ``sdk`` extra; skipped (with the interop tests) when it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("WEIR_REQUIRE_SDK") == "1":  # CI: a missing SDK is a failure
        raise
    pytest.skip(f"the MCP Python SDK is not installed: {exc}", allow_module_level=True)

from tests.integration.serverproc import WeirProcess
from tests.integration.test_sdk_interop import (
    NEGOTIATED_VERSION,
    SESSIONLESS_VERSION,
    TEST_TIMEOUT,
    on_asyncio,
    text_of,
)
from tests.integration.tlspki import HOST, client_context, pki

pytestmark = pytest.mark.interop


@pytest.mark.parametrize("driver", ["trio", "asyncio"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@on_asyncio
async def test_sdk_client_over_https(tmp_path: Path, mode: str, driver: str) -> None:
    p = pki()
    args = ["--ssl-certfile", str(p.server_cert), "--ssl-keyfile", str(p.server_key)]
    with (tmp_path / "out").open("w+b") as out, (tmp_path / "err").open("w+b") as err:
        server = WeirProcess("demo", out, err, args, driver=driver)
        try:
            assert server.url.startswith(f"https://{HOST}:"), server.url
            async with (
                httpx2.AsyncClient(
                    timeout=httpx2.Timeout(TEST_TIMEOUT), verify=client_context()
                ) as hc,
                Client(streamable_http_client(server.url, http_client=hc), mode=mode) as client,
            ):
                expected = SESSIONLESS_VERSION if mode == "auto" else NEGOTIATED_VERSION
                assert client.protocol_version == expected
                result = await client.call_tool("echo", {"text": "over https"})
                assert text_of(result) == "over https"
            # A client that does not trust the test CA gets no answer at all.
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(TEST_TIMEOUT)) as untrusting:
                with pytest.raises(httpx2.ConnectError):
                    await untrusting.get(server.url)
        finally:
            server.stop()
