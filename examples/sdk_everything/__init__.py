"""An "everything" app written with the official MCP Python SDK (``mcp`` 2.3.0) only.

It is our own equivalent of the SDK repository's conformance fixture server, which
is not published on a package registry: one :class:`mcp.server.mcpserver.MCPServer`
(``server``) registering every fixture the official conformance suite's server
scenarios call -- the same names and shapes as weir's own ``conformance`` app
(``app/samples/conformance.py``), each written the way the SDK's documentation
writes it.  It imports nothing from weir, so the same object can be served by the
SDK's Streamable HTTP transport (``python -m examples.sdk_everything``) and by a
bridge into weir, and the two scores compared.

What it registers
-----------------
* **Tools**: content of each kind (text, image, audio, embedded resource, mixed),
  a failing tool (``isError``), logging and progress during a call, sampling and
  elicitation -- form mode (SEP-1034 defaults, SEP-1330 enums) and URL mode
  (SEP-1036) -- as server-to-client requests on the session-era wire, a JSON
  Schema 2020-12 input schema, an ``x-mcp-header`` parameter (SEP-2243), a tool
  that closes its SSE stream mid-call (SEP-1699), the sessionless diagnostics
  (``test_missing_capability``, ``test_logging_tool``, ``test_streaming_elicitation``,
  list-changed triggers published on the ``subscriptions/listen`` bus) and the
  2026-07-28 input-required tools, which return :class:`~mcp.types.InputRequiredResult`
  until the retry carries ``inputResponses`` (the SDK seals the request state).
* **Resources**: static text and binary, a watched resource, a template.
* **Prompts**: plain, with arguments, with an embedded resource, with an image,
  and one that asks for input first (input-required from ``prompts/get``).
* **Completion**, ``logging/setLevel`` and ``resources/(un)subscribe`` (the last
  two have no :class:`MCPServer` decorator, so they go on its low-level server).

The Streamable HTTP app needs an :class:`~mcp.server.streamable_http.EventStore`
for SSE resumability; :class:`MemoryEventStore` is a small in-process one.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import anyio
from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample, UserMessage
from mcp.server.mcpserver.prompts.base import Message
from mcp.server.mcpserver.tools import Tool
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.types import (
    AudioContent,
    Completion,
    CompletionArgument,
    CompletionContext,
    ContentBlock,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    JSONRPCMessage,
    ListRootsRequest,
    ListRootsResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel, Field, JsonValue

__all__ = ["PNG_1X1", "WAV", "MemoryEventStore", "server"]

log = logging.getLogger(__name__)

# A 1x1 transparent PNG.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def _wav(samples: int = 64, rate: int = 8000) -> bytes:
    """A short mono 8-bit WAV of silence."""
    data = bytes(128 for _ in range(samples))
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    chunks = (
        b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


WAV = _wav()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# ---------------------------------------------------------------- event store
class MemoryEventStore(EventStore):
    """Keeps every SSE event in memory so a client can resume with ``Last-Event-ID``.

    Event ids are a process-wide counter; replay sends the events of the same stream
    that came after the given id.  Unbounded: this is a test fixture.
    """

    def __init__(self) -> None:
        self._events: list[tuple[str, JSONRPCMessage | None]] = []  # index + 1 is the id
        self._lock = anyio.Lock()

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        async with self._lock:
            self._events.append((stream_id, message))
            return str(len(self._events))

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        try:
            last = int(last_event_id)
        except ValueError:
            return None
        if not 1 <= last <= len(self._events):
            return None
        stream_id = self._events[last - 1][0]
        for index in range(last, len(self._events)):
            stream, message = self._events[index]
            if stream == stream_id and message is not None:  # None marks a priming event
                await send_callback(EventMessage(message, str(index + 1)))
        return stream_id


# ---------------------------------------------------------------- the server
# Tool whose input schema is written by hand (JSON Schema 2020-12, SEP-1613/2106):
# MCPServer.tool() derives schemas from signatures, so the Tool is built here and
# handed to the constructor with its parameters replaced.
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None) -> str:
    """Tool with JSON Schema 2020-12 features"""
    return f"Received name={name!r}, address={address!r}"


_schema_tool = Tool.from_function(json_schema_2020_12_tool).model_copy(
    update={"parameters": JSON_SCHEMA_2020_12}
)

server: MCPServer[Any] = MCPServer(
    "sdk-everything",
    version="0.1.0",
    tools=[_schema_tool],
    log_level="WARNING",
)


# ---------------------------------------------------------------- content tools
@server.tool()
def test_simple_text() -> str:
    """Returns a simple text content block."""
    return "This is a simple text response for testing."


@server.tool()
def test_image_content() -> list[ImageContent]:
    """Returns an image content block (a 1x1 PNG)."""
    return [ImageContent(type="image", data=_b64(PNG_1X1), mime_type="image/png")]


@server.tool()
def test_audio_content() -> list[AudioContent]:
    """Returns an audio content block (a short WAV)."""
    return [AudioContent(type="audio", data=_b64(WAV), mime_type="audio/wav")]


def _embedded(uri: str, text: str, mime_type: str) -> EmbeddedResource:
    contents = TextResourceContents(uri=uri, text=text, mime_type=mime_type)
    return EmbeddedResource(type="resource", resource=contents)


@server.tool()
def test_embedded_resource() -> list[EmbeddedResource]:
    """Returns an embedded text resource."""
    return [
        _embedded("test://embedded-resource", "This is an embedded resource content.", "text/plain")
    ]


@server.tool()
def test_multiple_content_types() -> list[ContentBlock]:
    """Returns text, image and embedded resource content blocks."""
    return [
        TextContent(type="text", text="Multiple content types test:"),
        ImageContent(type="image", data=_b64(PNG_1X1), mime_type="image/png"),
        _embedded(
            "test://mixed-content-resource", '{"test": "data", "value": 123}', "application/json"
        ),
    ]


@server.tool()
def test_error_handling() -> str:
    """Always fails; the SDK answers with a tool error (isError: true)."""
    raise RuntimeError("This tool intentionally returns an error for testing")


# ---------------------------------------------------------------- during a call
@server.tool()
async def test_tool_with_logging(ctx: Context) -> str:
    """Sends three log notifications during the call."""
    await ctx.info("Tool execution started")
    await anyio.sleep(0.05)
    await ctx.info("Tool processing data")
    await anyio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


@server.tool()
async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50 and 100 of 100 before answering."""
    for step in (0, 50, 100):
        if step:
            await anyio.sleep(0.05)
        await ctx.report_progress(step, 100, f"Completed step {step} of 100")
    return "Progress test completed"


@server.tool()
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


def _said(result: CreateMessageResult) -> str:
    content = result.content
    return content.text if isinstance(content, TextContent) else "(no text)"


@server.tool()
async def test_sampling(
    prompt: str, answer: Annotated[CreateMessageResult, Resolve(_ask_model)]
) -> str:
    """Asks the client's model to answer the prompt (sampling/createMessage)."""
    return f"LLM response: {_said(answer)}"


class Contact(BaseModel):
    """What test_elicitation asks for."""

    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


@server.tool()
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


@server.tool()
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


@server.tool()
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


@server.tool()
async def test_elicitation_sep1036_url(ctx: Context) -> str:
    """Asks the user to visit a URL (elicitation/create, mode "url")."""
    result = await ctx.elicit_url(
        "Please complete authorization", SIGN_IN_URL, _new_elicitation_id()
    )
    return f"URL elicitation action: {result.action}"


@server.tool()
def test_elicitation_sep1036_error() -> str:
    """Refuses until the user has visited a URL (URLElicitationRequiredError, -32042)."""
    params = ElicitRequestURLParams(
        message="Authorization is required first",
        url=SIGN_IN_URL,
        elicitation_id=_new_elicitation_id(),
    )
    raise UrlElicitationRequiredError([params])


@server.tool()
async def test_elicitation_sep1036_complete(ctx: Context) -> str:
    """Asks the user to visit a URL, then announces that the interaction completed."""
    elicitation_id = _new_elicitation_id()
    result = await ctx.elicit_url("Please complete authorization", SIGN_IN_URL, elicitation_id)
    if result.action == "accept":
        await ctx.session.send_elicit_complete(elicitation_id, related_request_id=ctx.request_id)
    return f"URL elicitation action: {result.action}"


@server.tool()
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


# ---------------------------------------------------------------- sessionless diagnostics
def _capital_question() -> Sample:
    """Resolver: ask the client's model a question (needs the sampling capability)."""
    content = TextContent(type="text", text="What is the capital of France?")
    return Sample([SamplingMessage(role="user", content=content)], max_tokens=10)


@server.tool()
async def test_missing_capability(
    answer: Annotated[CreateMessageResult, Resolve(_capital_question)],
) -> str:
    """Asks the client's model; a client without the sampling capability is refused."""
    return _said(answer)


@server.tool()
def test_streaming_elicitation() -> str:
    """Answers on its response stream with nothing but the result."""
    return "answered without asking"


@server.tool()
async def test_logging_tool(ctx: Context) -> str:
    """Logs at info (delivered only when the request asked for a log level)."""
    await ctx.info("test_logging_tool ran")
    return "logged"


def _changing() -> str:
    """Registered and removed again by the list-changed triggers."""
    return "changing"


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


# ---------------------------------------------------------------- input required (2026-07-28)
NAME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


def _elicit(message: str, schema: dict[str, Any] = NAME_SCHEMA) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(
        params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def _answer(ctx: Context, key: str) -> Any:
    """The client's response to input request ``key``, or None on the first round."""
    return (ctx.input_responses or {}).get(key)


def _field(answer: Any, name: str, default: str) -> str:
    if isinstance(answer, ElicitResult) and answer.content and name in answer.content:
        return str(answer.content[name])
    return default


def _model_said(answer: Any) -> str:
    return _said(answer) if isinstance(answer, CreateMessageResult) else "(no text)"


@server.tool()
async def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
    """Asks the user's name (key user_name), then greets them."""
    answer = _answer(ctx, "user_name")
    if answer is None:
        return InputRequiredResult(input_requests={"user_name": _elicit("What is your name?")})
    return f"Hello, {_field(answer, 'name', 'friend')}!"


@server.tool()
async def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
    """Asks the client's model a question (key sample_request)."""
    answer = _answer(ctx, "sample_request")
    if answer is None:
        question = _sample("What is the capital of France?", 100)
        return InputRequiredResult(input_requests={"sample_request": question})
    return f"The model said: {_model_said(answer)}"


@server.tool()
async def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
    """Asks for the client's roots (key roots_request)."""
    answer = _answer(ctx, "roots_request")
    if not isinstance(answer, ListRootsResult):
        return InputRequiredResult(input_requests={"roots_request": ListRootsRequest()})
    return "roots: " + ", ".join(str(root.uri) for root in answer.roots)


CONFIRM_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


@server.tool()
async def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
    """Asks for a confirmation (key confirm) and carries request state across the retry."""
    if _answer(ctx, "confirm") is not None and ctx.request_state == "awaiting-confirmation":
        return "state-ok"
    return InputRequiredResult(
        input_requests={"confirm": _elicit("Confirm?", CONFIRM_SCHEMA)},
        request_state="awaiting-confirmation",
    )


@server.tool()
async def test_input_required_result_multiple_inputs(ctx: Context) -> str | InputRequiredResult:
    """Asks three things at once (a name, a model's greeting, the roots), with request state."""
    wanted: dict[str, InputRequest] = {
        "user_name": _elicit("What is your name?"),
        "greeting": _sample("Say hello.", 50),
        "client_roots": ListRootsRequest(),
    }
    responses = ctx.input_responses or {}
    missing = {key: request for key, request in wanted.items() if key not in responses}
    if missing:
        return InputRequiredResult(input_requests=missing, request_state="gathering-inputs")
    name = _field(responses["user_name"], "name", "friend")
    return f"{_model_said(responses['greeting'])}, {name}"


COLOUR_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"color": {"type": "string"}}}


@server.tool()
async def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
    """Asks in two rounds: a name (key step1), then a colour (key step2).

    The name from round one rides in the request state, which the SDK seals.
    """
    state: dict[str, Any] = json.loads(ctx.request_state) if ctx.request_state else {}
    first, second = _answer(ctx, "step1"), _answer(ctx, "step2")
    if state.get("round") == 2 and second is not None:
        return f"{state.get('name', 'friend')} likes {_field(second, 'color', 'no colour')}"
    if state.get("round") == 1 and first is not None:
        name = _field(first, "name", "friend")
        return InputRequiredResult(
            input_requests={"step2": _elicit("Favourite colour?", COLOUR_SCHEMA)},
            request_state=json.dumps({"round": 2, "name": name}),
        )
    return InputRequiredResult(
        input_requests={"step1": _elicit("What is your name?")},
        request_state=json.dumps({"round": 1}),
    )


@server.tool()
async def test_input_required_result_tampered_state(ctx: Context) -> str | InputRequiredResult:
    """Asks for a confirmation; the SDK refuses a retry whose request state was altered."""
    if ctx.request_state is None:
        return InputRequiredResult(
            input_requests={"confirm": _elicit("Confirm?", {"type": "object", "properties": {}})},
            request_state="asked",
        )
    return "confirmed"


@server.tool()
async def test_input_required_result_capabilities(ctx: Context) -> str | InputRequiredResult:
    """Asks only for what the client declared: input from the user, or the model."""
    caps = ctx.client_capabilities
    asks: dict[str, InputRequest] = {}
    if caps is not None and caps.elicitation is not None:
        asks["elicit_input"] = _elicit("What is your name?")
    if caps is not None and caps.sampling is not None:
        asks["sample_input"] = _sample("What is the capital of France?", 20)
    responses = ctx.input_responses or {}
    if asks and not set(asks) <= set(responses):
        return InputRequiredResult(input_requests=asks)
    return f"answered: {', '.join(sorted(asks)) or 'nothing to ask'}"


# ---------------------------------------------------------------- resources
@server.resource(
    "test://static-text",
    name="Static Text Resource",
    description="A static text resource for testing",
    mime_type="text/plain",
)
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource(
    "test://static-binary",
    name="Static Binary Resource",
    description="A static binary resource (a 1x1 PNG) for testing",
    mime_type="image/png",
)
def static_binary() -> bytes:
    return PNG_1X1


@server.resource(
    "test://watched-resource",
    name="Watched Resource",
    description="A resource clients may subscribe to",
    mime_type="text/plain",
)
def watched() -> str:
    return "Watched resource content"


@server.resource(
    "test://template/{id}/data",
    name="Resource Template",
    description="A templated resource for testing",
    mime_type="application/json",
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


# ---------------------------------------------------------------- prompts
@server.prompt(description="A simple prompt without arguments")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@server.prompt(description="A prompt with required arguments")
def test_prompt_with_arguments(
    arg1: Annotated[str, Field(description="First test argument")],
    arg2: Annotated[str, Field(description="Second test argument")],
) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.prompt(description="A prompt that embeds a resource")
def test_prompt_with_embedded_resource(
    resourceUri: Annotated[str, Field(description="URI of the resource to embed")],
) -> list[Message]:
    resource = _embedded(resourceUri, "Embedded resource content for testing.", "text/plain")
    return [UserMessage(resource), UserMessage("Please process the embedded resource above.")]


@server.prompt(description="A prompt that includes an image")
def test_prompt_with_image() -> list[Message]:
    image = ImageContent(type="image", data=_b64(PNG_1X1), mime_type="image/png")
    return [UserMessage(image), UserMessage("Please analyze the image above.")]


@server.prompt(description="A prompt that asks the user for context first")
async def test_input_required_result_prompt(ctx: Context) -> list[Message] | InputRequiredResult:
    answer = _answer(ctx, "user_context")
    if answer is None:
        schema = {"type": "object", "properties": {"context": {"type": "string"}}}
        return InputRequiredResult(input_requests={"user_context": _elicit("Any context?", schema)})
    return [UserMessage(f"Prompt with context: {_field(answer, 'context', 'none')}")]


# ---------------------------------------------------------------- completion
COMPLETIONS = ("test", "testing", "test-value", "example")


@server.completion()  # type: ignore[no-untyped-call, untyped-decorator]
async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion:
    """Suggest values that start with what was typed."""
    values = [v for v in COMPLETIONS if v.startswith(argument.value)]
    return Completion(values=values, total=len(values), has_more=False)


# ---------------------------------------------------------------- logging level, subscriptions
# MCPServer has no decorator for these session-era methods; its low-level server does.
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


_lowlevel = server._lowlevel_server
_lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
_lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
_lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
