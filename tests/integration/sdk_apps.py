"""An app written with the official MCP Python SDK only, for the replica tests.

``server`` is a plain :class:`mcp.server.mcpserver.MCPServer`, written the way the
SDK's documentation writes one (decorators, a ``Context`` parameter, ``anyio`` for
waiting) and importing nothing from weir; the tests serve it through
:func:`weir.app.sdk.from_sdk`, as ``weir serve tests.integration.sdk_apps:server``
would.  Its one tool, ``charge``, is not idempotent: every execution counts in
:data:`executions` (by ``key``), which the tests read -- the replicas they run are
in this process, so a module-level counter sees every replica's executions.
"""

from __future__ import annotations

from collections import Counter

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("sdk-replicas", version="1.0.0", log_level="WARNING")

#: Executions of ``charge`` by key, whichever replica ran them.
executions: Counter[str] = Counter()
#: Keys whose ``charge`` is running right now.
running: set[str] = set()


@server.tool(annotations=ToolAnnotations(idempotent_hint=False, destructive_hint=True))
async def charge(key: str, ctx: Context, ms: int = 0) -> str:
    """Charge ``key`` once (not idempotent: a second execution is a double charge);
    the charge takes ``ms`` milliseconds."""
    executions[key] += 1
    count = executions[key]
    running.add(key)
    try:
        await ctx.report_progress(0, 1, f"charging {key}")
        await anyio.sleep(ms / 1000)
        await ctx.report_progress(1, 1, f"charged {key}")
    finally:
        running.discard(key)
    return f"charged {key} #{count}"
