"""``weir serve --workers N`` gives every worker the options it was given.

Each worker is a ``python -m weir`` child; it must get the parent's whole command
line (authorization, limits, ``--app-dir``), not a hand-picked part of it: a worker
started without the ``--auth-*`` options would serve everyone.  Real processes, a
real Valkey store, a JWKS file; every connection a new one, so the kernel spreads
them over both workers.  On both runtimes (``--runtime asyncio`` reaches every
worker too).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import trio

from tests.integration.rawhttp import INIT_PARAMS, Client
from tests.integration.runtimes import RUNTIMES
from tests.integration.serverproc import WeirProcess
from tests.integration.test_auth import ISSUER, RESOURCE, jwks, token

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT_PARAMS}


@RUNTIMES
async def test_every_worker_requires_the_token(
    runtime: str, tmp_path: Path, valkey_url: str
) -> None:
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps(jwks()))
    args = [
        "--workers", "2", "--store", valkey_url,
        "--auth-issuer", ISSUER, "--auth-resource", RESOURCE,
        "--auth-jwks-file", str(keys), "--auth-scope", "mcp",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        server = WeirProcess("demo", out, err, args, driver=runtime)
        try:
            with trio.fail_after(60):
                for _ in range(12):
                    client = await Client.connect(server.port)
                    try:
                        refused = await client.request("POST", "/mcp", INIT)
                        auth = {"authorization": f"Bearer {token()}"}
                        served = await client.request("POST", "/mcp", INIT, headers=auth)
                    finally:
                        await client.aclose()
                    assert refused.status == 401, (refused, server.output())
                    assert served.status == 200, (served, server.output())
        finally:
            server.stop()
