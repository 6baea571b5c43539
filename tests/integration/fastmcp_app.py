"""An app written with FastMCP (4.x, which builds on the official SDK 2.x), nothing else.

``weir serve tests.integration.fastmcp_app:mcp`` serves it through
:func:`weir.app.sdk.from_sdk`, which finds the SDK low-level server FastMCP holds.
Its tool ``wait_then_hash`` is written for asyncio itself (``asyncio.Queue``,
``loop.call_later``, ``asyncio.wait_for``, ``loop.run_in_executor``): it runs unchanged
on ``weir serve --runtime asyncio``; on the Trio engine weir refuses it with a reason.
"""

from __future__ import annotations

import asyncio
import hashlib

from fastmcp import Context, FastMCP

mcp = FastMCP("fastmcp-test", instructions="adds numbers")


@mcp.tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool
async def count(n: int, ctx: Context) -> str:
    """Count to ``n``, reporting progress."""
    for i in range(n):
        await ctx.report_progress(i + 1, n)
    return f"counted to {n}"


@mcp.resource("fastmcp://motto")
def motto() -> str:
    """A resource."""
    return "small and sharp"


def _digest(text: str) -> str:
    """Blocking work for a worker thread: the first 12 hex digits of SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@mcp.tool
async def wait_then_hash(text: str) -> str:
    """Wait for a timer through an asyncio queue, then hash ``text`` in a thread."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
    loop.call_later(0.01, ready.put_nowait, text)
    got = await asyncio.wait_for(ready.get(), timeout=5)
    return await loop.run_in_executor(None, _digest, got)
