"""An app written with the official MCP Python SDK only, for the bridge's interop tests.

``weir serve tests.integration.sdk_bridge_app:server`` serves it through
:func:`weir.app.sdk.from_sdk`; nothing here knows about weir.  Each tool exercises
one thing a bridge must carry: the lifespan's state, progress and logs on the
request's stream, elicitation and sampling (server-to-client requests on the
session era, input-required rounds on 2026-07-28, the SDK choosing by revision),
cancellation, per-session teardown (the SDK connection's exit stack), resource
updates on the session's GET stream, list changes on the subscription bus, and a
client notification reaching the SDK's notification handler.
``stats`` reports what the process saw, so a test in another process can check it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import NotificationParams

from tests.integration.sdk_apps import add_asking_tools

#: What this process saw: tool runs, cancellations, sessions whose connection closed.
seen: Counter[str] = Counter()


@asynccontextmanager
async def lifespan(app: MCPServer[Any]) -> AsyncIterator[dict[str, str]]:
    seen["lifespan entered"] += 1
    yield {"db": "open"}


server: MCPServer[Any] = MCPServer("sdk-bridge-test", version="1.2.3", lifespan=lifespan)


@server.tool()
async def state(ctx: Context) -> str:
    """The lifespan's state, as the tool sees it."""
    return str(ctx.request_context.lifespan_context["db"])


@server.tool()
async def steps(n: int, ctx: Context) -> str:
    """Report ``n`` progress steps, logging each; close the session's connection last."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
        await ctx.info(f"did step {i + 1}")
    # mcp 2.3 reaches the per-client Connection (and its exit stack) only this way.
    connection = ctx.request_context.session._connection
    connection.exit_stack.callback(seen.update, ["connection closed"])
    return f"{n} steps"


add_asking_tools(server)  # greet (elicitation) and compute (sampling)


@server.tool()
async def wait(ctx: Context) -> str:
    """Wait until cancelled; count the cancellation."""
    seen["wait started"] += 1
    try:
        await anyio.sleep_forever()
    finally:
        seen["wait cancelled"] += 1
    return "never"


@server.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Tell this session that ``uri`` changed (its GET stream, session era)."""
    await ctx.request_context.session.send_resource_updated(uri)
    return "touched"


@server.tool()
async def change_tools(ctx: Context) -> str:
    """Announce a tools list change on the subscription bus (2026-07-28 listeners)."""
    await ctx.notify_tools_changed()
    return "changed"


@server.tool()
async def stats() -> dict[str, int]:
    """What this process saw so far."""
    return dict(seen)


async def roots_changed(
    ctx: ServerRequestContext[Any, Any], params: NotificationParams | None
) -> None:
    """The client's roots changed (a notification handler on the low-level server)."""
    seen["roots changed"] += 1


server._lowlevel_server.add_notification_handler(
    "notifications/roots/list_changed", NotificationParams, roots_changed
)


@server.resource("note://one")
def note() -> str:
    """A resource to subscribe to."""
    return "one"
