"""Tools for the sessionless wire that ask nothing of the client.

An ``x-mcp-header`` parameter (SEP-2243) and the sessionless diagnostics: a missing
client capability, a plain streamed answer, request-scoped logging, and the
list-changed triggers published on the ``subscriptions/listen`` bus.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from mcp.types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import Field

from ._media import said


def test_region_header(
    region: Annotated[
        str,
        Field(
            description="Also sent by clients as the Mcp-Param-Region header",
            json_schema_extra={"x-mcp-header": "Region"},
        ),
    ],
) -> str:
    """Echoes its region argument, which clients also send as Mcp-Param-Region (SEP-2243)."""
    return f"region={region}"


def _capital_question() -> Sample:
    """Resolver: ask the client's model a question (needs the sampling capability)."""
    content = TextContent(type="text", text="What is the capital of France?")
    return Sample([SamplingMessage(role="user", content=content)], max_tokens=10)


async def test_missing_capability(
    answer: Annotated[CreateMessageResult, Resolve(_capital_question)],
) -> str:
    """Asks the client's model; a client without the sampling capability is refused."""
    return said(answer)


def test_streaming_elicitation() -> str:
    """Answers on its response stream with nothing but the result."""
    return "answered without asking"


async def test_logging_tool(ctx: Context) -> str:
    """Logs at info (delivered only when the request asked for a log level)."""
    await ctx.info("test_logging_tool ran")
    return "logged"


def _changing() -> str:
    """Registered and removed again by the list-changed triggers."""
    return "changing"


def register(server: MCPServer[Any]) -> None:
    """Add the sessionless tools to ``server``, in this order."""
    for tool in (
        test_region_header,
        test_missing_capability,
        test_streaming_elicitation,
        test_logging_tool,
    ):
        server.tool()(tool)

    # The triggers change ``server`` itself, so they are defined against it here.
    @server.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """Changes the tool list and announces it to subscriptions/listen streams."""
        server.add_tool(_changing, name="test_changing_tool")
        server.remove_tool("test_changing_tool")
        await ctx.notify_tools_changed()
        return "tools changed"

    @server.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """Changes the prompt list and announces it to subscriptions/listen streams."""
        server.prompt(name="test_changing_prompt")(_changing)
        server.remove_prompt("test_changing_prompt")
        await ctx.notify_prompts_changed()
        return "prompts changed"
