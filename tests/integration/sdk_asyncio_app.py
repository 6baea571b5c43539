"""An app written with the official MCP Python SDK whose tool needs asyncio itself.

``server`` is a plain :class:`mcp.server.mcpserver.MCPServer` importing nothing from
weir.  Its tool ``crunch`` uses the asyncio API directly -- ``asyncio.get_running_loop``,
``asyncio.Event``, ``loop.call_soon``, ``asyncio.sleep`` and ``loop.run_in_executor``
-- as code written for an asyncio server does, so it runs unchanged only where the
serving loop is asyncio: ``weir serve --runtime asyncio
tests.integration.sdk_asyncio_app:server``.  On the Trio engine the same call fails,
and weir says why.
"""

from __future__ import annotations

import asyncio
import threading

import sniffio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("sdk-asyncio-only", version="1.0.0", log_level="WARNING")


def _square_in_a_thread(n: int) -> tuple[int, str]:
    """Blocking work, as ``run_in_executor`` is for: ``n`` squared, and where it ran."""
    return n * n, threading.current_thread().name


@server.tool()
async def crunch(n: int, ctx: Context) -> str:
    """Square ``n`` in a worker thread, reporting progress; say which loop ran it."""
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    loop.call_soon(woken.set)
    await woken.wait()
    await ctx.report_progress(0, 1, "squaring")
    await asyncio.sleep(0.01)
    squared, where = await loop.run_in_executor(None, _square_in_a_thread, n)
    await ctx.report_progress(1, 1, "squared")
    same_thread = where == threading.current_thread().name
    return f"{squared} on {sniffio.current_async_library()}, executor thread {not same_thread}"
