"""An app written with FastMCP (4.x, which builds on the official SDK 2.x), nothing else.

``weir serve tests.integration.fastmcp_app:mcp`` serves it through
:func:`weir.app.sdk.from_sdk`, which finds the SDK low-level server FastMCP holds.
"""

from __future__ import annotations

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
