"""Resources, prompts, completion, and the session-era handlers MCPServer has no
decorator for (``logging/setLevel``, ``resources/(un)subscribe``).

Resources: static text and binary, a watched resource, a template.  Prompts: plain,
with arguments, with an embedded resource, with an image, and one that asks for
input first (input-required from ``prompts/get``).
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp.server.mcpserver.prompts.base import Message
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    EmptyResult,
    ImageContent,
    InputRequiredResult,
    PromptReference,
    ResourceTemplateReference,
    SetLevelRequestParams,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)
from pydantic import Field

from ._input_required import answer_to, elicit, field
from ._media import PNG_1X1, b64, embedded

log = logging.getLogger(__package__ or __name__)


# ---------------------------------------------------------------- resources
def static_text() -> str:
    return "This is the content of the static text resource."


def static_binary() -> bytes:
    return PNG_1X1


def watched() -> str:
    return "Watched resource content"


def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


# ---------------------------------------------------------------- prompts
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


def test_prompt_with_arguments(
    arg1: Annotated[str, Field(description="First test argument")],
    arg2: Annotated[str, Field(description="Second test argument")],
) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


def test_prompt_with_embedded_resource(
    resourceUri: Annotated[str, Field(description="URI of the resource to embed")],
) -> list[Message]:
    resource = embedded(resourceUri, "Embedded resource content for testing.", "text/plain")
    return [UserMessage(resource), UserMessage("Please process the embedded resource above.")]


def test_prompt_with_image() -> list[Message]:
    image = ImageContent(type="image", data=b64(PNG_1X1), mime_type="image/png")
    return [UserMessage(image), UserMessage("Please analyze the image above.")]


async def test_input_required_result_prompt(ctx: Context) -> list[Message] | InputRequiredResult:
    answer = answer_to(ctx, "user_context")
    if answer is None:
        schema = {"type": "object", "properties": {"context": {"type": "string"}}}
        return InputRequiredResult(input_requests={"user_context": elicit("Any context?", schema)})
    return [UserMessage(f"Prompt with context: {field(answer, 'context', 'none')}")]


# ---------------------------------------------------------------- completion
COMPLETIONS = ("test", "testing", "test-value", "example")


async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion:
    """Suggest values that start with what was typed."""
    values = [v for v in COMPLETIONS if v.startswith(argument.value)]
    return Completion(values=values, total=len(values), has_more=False)


# ---------------------------------------------------------------- logging level, subscriptions
subscribed: set[str] = set()


async def set_level(ctx: ServerRequestContext[Any], params: SetLevelRequestParams) -> EmptyResult:
    log.info("client asked for log level %s", params.level)
    return EmptyResult()


async def subscribe(ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
    subscribed.add(str(params.uri))
    return EmptyResult()


async def unsubscribe(
    ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
) -> EmptyResult:
    subscribed.discard(str(params.uri))
    return EmptyResult()


def register(server: MCPServer[Any]) -> None:
    """Add the resources, prompts, completion and low-level handlers, in this order."""
    server.resource(
        "test://static-text",
        name="Static Text Resource",
        description="A static text resource for testing",
        mime_type="text/plain",
    )(static_text)
    server.resource(
        "test://static-binary",
        name="Static Binary Resource",
        description="A static binary resource (a 1x1 PNG) for testing",
        mime_type="image/png",
    )(static_binary)
    server.resource(
        "test://watched-resource",
        name="Watched Resource",
        description="A resource clients may subscribe to",
        mime_type="text/plain",
    )(watched)
    server.resource(
        "test://template/{id}/data",
        name="Resource Template",
        description="A templated resource for testing",
        mime_type="application/json",
    )(template_data)

    server.prompt(description="A simple prompt without arguments")(test_simple_prompt)
    server.prompt(description="A prompt with required arguments")(test_prompt_with_arguments)
    server.prompt(description="A prompt that embeds a resource")(test_prompt_with_embedded_resource)
    server.prompt(description="A prompt that includes an image")(test_prompt_with_image)
    server.prompt(description="A prompt that asks the user for context first")(
        test_input_required_result_prompt
    )

    server.completion()(complete)  # type: ignore[no-untyped-call]

    # MCPServer has no decorator for these session-era methods; its low-level server does.
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
