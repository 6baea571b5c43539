"""Session-era tools: work during a call and requests to the client on its session.

Log notifications and progress during a call, a tool that closes its SSE stream
mid-call (SEP-1699), and server-to-client requests: sampling, and elicitation in
form mode (SEP-1034 defaults, SEP-1330 enums) and URL mode (SEP-1036).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.types import CreateMessageResult, ElicitRequestURLParams, SamplingMessage, TextContent
from pydantic import BaseModel, Field, JsonValue

from ._media import said


# ---------------------------------------------------------------- during a call
async def test_tool_with_logging(ctx: Context) -> str:
    """Sends three log notifications during the call."""
    await ctx.info("Tool execution started")
    await anyio.sleep(0.05)
    await ctx.info("Tool processing data")
    await anyio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50 and 100 of 100 before answering."""
    for step in (0, 50, 100):
        if step:
            await anyio.sleep(0.05)
        await ctx.report_progress(step, 100, f"Completed step {step} of 100")
    return "Progress test completed"


async def test_reconnection(ctx: Context) -> str:
    """Closes its SSE stream mid-call; the result arrives after the client reconnects."""
    await anyio.sleep(0.05)
    await ctx.close_sse_stream()
    await anyio.sleep(0.3)
    return "Reconnection test completed successfully"


# ---------------------------------------------------------------- asking the client
def _ask_model(prompt: str) -> Sample:
    """Resolver: ask the client's model to answer ``prompt`` (sampling/createMessage)."""
    content = TextContent(type="text", text=prompt)
    return Sample([SamplingMessage(role="user", content=content)], max_tokens=100)


async def test_sampling(
    prompt: str, answer: Annotated[CreateMessageResult, Resolve(_ask_model)]
) -> str:
    """Asks the client's model to answer the prompt (sampling/createMessage)."""
    return f"LLM response: {said(answer)}"


class Contact(BaseModel):
    """What test_elicitation asks for."""

    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


async def test_elicitation(message: str, ctx: Context) -> str:
    """Asks the user for input (elicitation/create)."""
    result = await ctx.elicit(message, Contact)
    content = result.data.model_dump() if result.action == "accept" else {}
    return f"User response: action={result.action}, content={content}"


class Defaults(BaseModel):
    """A form whose every primitive field has a default (SEP-1034)."""

    name: str = Field("John Doe", description="User name")
    age: int = Field(30, description="User age")
    score: float = Field(95.5, description="User score")
    status: Literal["active", "inactive", "pending"] = Field("active", description="User status")
    verified: bool = Field(True, description="Verification status")


async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    """Elicits a form whose fields carry default values (SEP-1034)."""
    result = await ctx.elicit("Please review and update the form fields with defaults", Defaults)
    content = result.data.model_dump() if result.action == "accept" else {}
    return f"Elicitation completed: action={result.action}, content={content}"


def _titled(options: Mapping[str, str]) -> list[JsonValue]:
    """``[{"const": value, "title": title}, ...]``: enum options with display titles."""
    return [{"const": value, "title": title} for value, title in options.items()]


class EnumForms(BaseModel):
    """Every enum form of SEP-1330, each optional."""

    untitledSingle: Literal["option1", "option2", "option3"] | None = Field(
        None, description="Select one option"
    )
    titledSingle: str | None = Field(
        None,
        description="Select one option with titles",
        json_schema_extra={
            "oneOf": _titled(
                {"value1": "First Option", "value2": "Second Option", "value3": "Third Option"}
            )
        },
    )
    legacyEnum: Literal["opt1", "opt2", "opt3"] | None = Field(
        None,
        description="Select one option (legacy)",
        json_schema_extra={"enumNames": ["Option One", "Option Two", "Option Three"]},
    )
    untitledMulti: list[Literal["option1", "option2", "option3"]] | None = Field(
        None, description="Select multiple options", min_length=1, max_length=3
    )
    titledMulti: list[str] | None = Field(
        None,
        description="Select multiple options with titles",
        min_length=1,
        max_length=3,
        json_schema_extra={
            "items": {
                "anyOf": _titled(
                    {"value1": "First Choice", "value2": "Second Choice", "value3": "Third Choice"}
                )
            }
        },
    )


async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    """Elicits every enum form of SEP-1330."""
    result = await ctx.elicit("Please select options from the enum fields", EnumForms)
    content = result.data.model_dump(exclude_none=True) if result.action == "accept" else {}
    return f"Elicitation completed: action={result.action}, content={content}"


# URL-mode elicitation (SEP-1036).  Neither pinned suite version runs its scenario
# (upstream's ``elicitation-sep1036-url-mode``); the tools follow its names.
SIGN_IN_URL = "https://mcp.example.com/test"


def _new_elicitation_id() -> str:
    return f"sep1036-{uuid.uuid4()}"


async def test_elicitation_sep1036_url(ctx: Context) -> str:
    """Asks the user to visit a URL (elicitation/create, mode "url")."""
    result = await ctx.elicit_url(
        "Please complete authorization", SIGN_IN_URL, _new_elicitation_id()
    )
    return f"URL elicitation action: {result.action}"


def test_elicitation_sep1036_error() -> str:
    """Refuses until the user has visited a URL (URLElicitationRequiredError, -32042)."""
    params = ElicitRequestURLParams(
        message="Authorization is required first",
        url=SIGN_IN_URL,
        elicitation_id=_new_elicitation_id(),
    )
    raise UrlElicitationRequiredError([params])


async def test_elicitation_sep1036_complete(ctx: Context) -> str:
    """Asks the user to visit a URL, then announces that the interaction completed."""
    elicitation_id = _new_elicitation_id()
    result = await ctx.elicit_url("Please complete authorization", SIGN_IN_URL, elicitation_id)
    if result.action == "accept":
        await ctx.session.send_elicit_complete(elicitation_id, related_request_id=ctx.request_id)
    return f"URL elicitation action: {result.action}"


def register(server: MCPServer[Any]) -> None:
    """Add the session-era tools to ``server``, in this order."""
    for tool in (
        test_tool_with_logging,
        test_tool_with_progress,
        test_reconnection,
        test_sampling,
        test_elicitation,
        test_elicitation_sep1034_defaults,
        test_elicitation_sep1330_enums,
        test_elicitation_sep1036_url,
        test_elicitation_sep1036_error,
        test_elicitation_sep1036_complete,
    ):
        server.tool()(tool)
