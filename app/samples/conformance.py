"""The ``conformance`` app: every fixture the official MCP conformance suite expects.

Run it with ``weir serve conformance`` and point ``@modelcontextprotocol/conformance``
at it (``tests/integration/test_conformance.py`` does exactly that).  Names, shapes
and values follow the suite's server scenarios; nothing here is weir-specific.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from weir.app import App, Context, ToolError, audio, embedded_resource, image, text
from weir.app.samples.sessionless import register as register_sessionless
from weir.app.samples.tasks import register as register_tasks

app = App("weir-conformance", "0.1.0")

# A 1x1 transparent PNG.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def _wav(samples: int = 64, rate: int = 8000) -> bytes:
    data = bytes(128 for _ in range(samples))  # 8-bit silence
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    chunks = (
        b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


WAV = _wav()


# ---------------------------------------------------------------- tools
@app.tool()
async def test_simple_text() -> str:
    """Returns a simple text content block."""
    return "This is a simple text response for testing."


@app.tool()
async def test_image_content() -> list[dict[str, Any]]:
    """Returns an image content block (a 1x1 PNG)."""
    return [image(PNG_1X1, "image/png")]


@app.tool()
async def test_audio_content() -> list[dict[str, Any]]:
    """Returns an audio content block (a short WAV)."""
    return [audio(WAV, "audio/wav")]


@app.tool()
async def test_embedded_resource() -> list[dict[str, Any]]:
    """Returns an embedded text resource."""
    return [
        embedded_resource(
            "test://embedded-resource",
            text="This is an embedded resource content.",
            mime_type="text/plain",
        )
    ]


@app.tool()
async def test_multiple_content_types() -> list[dict[str, Any]]:
    """Returns text, image and embedded resource content blocks."""
    return [
        text("Multiple content types test:"),
        image(PNG_1X1, "image/png"),
        embedded_resource(
            "test://mixed-content-resource",
            text='{"test": "data", "value": 123}',
            mime_type="application/json",
        ),
    ]


@app.tool()
async def test_tool_with_logging(ctx: Context) -> str:
    """Sends three log notifications during the call."""
    await ctx.info("Tool execution started")
    await ctx.sleep(0.05)
    await ctx.info("Tool processing data")
    await ctx.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


@app.tool()
async def test_error_handling() -> str:
    """Always fails with a tool error (isError: true)."""
    raise ToolError("This tool intentionally returns an error for testing")


@app.tool()
async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50 and 100 of 100 before answering."""
    await ctx.report_progress(0, 100, "Completed step 0 of 100")
    await ctx.sleep(0.05)
    await ctx.report_progress(50, 100, "Completed step 50 of 100")
    await ctx.sleep(0.05)
    await ctx.report_progress(100, 100, "Completed step 100 of 100")
    return "Progress test completed"


@app.tool()
async def test_sampling(ctx: Context, prompt: str) -> str:
    """Asks the client's model to answer the prompt (sampling/createMessage)."""
    result = await ctx.sample([{"role": "user", "content": text(prompt)}], max_tokens=100)
    content = result.get("content", {})
    answer = content.get("text", "") if isinstance(content, dict) else str(content)
    return f"LLM response: {answer}"


@app.tool()
async def test_elicitation(ctx: Context, message: str) -> str:
    """Asks the user for input (elicitation/create)."""
    result = await ctx.elicit(
        message,
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    return f"User response: action={result.get('action')}, content={result.get('content', {})}"


@app.tool()
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    """Elicits a form whose fields carry default values (SEP-1034)."""
    result = await ctx.elicit(
        "Please review and update the form fields with defaults",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {
                    "type": "boolean",
                    "description": "Verification status",
                    "default": True,
                },
            },
            "required": [],
        },
    )
    return (
        f"Elicitation completed: action={result.get('action')}, content={result.get('content', {})}"
    )


@app.tool()
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    """Elicits every enum form of SEP-1330."""
    result = await ctx.elicit(
        "Please select options from the enum fields",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {
                    "type": "string",
                    "description": "Select one option",
                    "enum": ["option1", "option2", "option3"],
                },
                "titledSingle": {
                    "type": "string",
                    "description": "Select one option with titles",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Select one option (legacy)",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Select multiple options",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Select multiple options with titles",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
            "required": [],
        },
    )
    return (
        f"Elicitation completed: action={result.get('action')}, content={result.get('content', {})}"
    )


JSON_SCHEMA_2020_12 = {
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


@app.tool(input_schema=JSON_SCHEMA_2020_12)
async def json_schema_2020_12_tool(
    name: str | None = None, address: Any = None, **more: Any
) -> str:
    """Tool with JSON Schema 2020-12 features"""
    return f"Received name={name!r}, address={address!r}"


@app.tool()
async def test_reconnection(ctx: Context) -> str:
    """Closes its SSE stream mid-call; the result arrives after the client reconnects."""
    await ctx.sleep(0.05)
    ctx.close_stream(retry_ms=500)
    await ctx.sleep(0.3)
    return "Reconnection test completed successfully"


# ---------------------------------------------------------------- resources
@app.resource(
    "test://static-text",
    name="Static Text Resource",
    mime_type="text/plain",
    description="A static text resource for testing",
)
def static_text() -> str:
    return "This is the content of the static text resource."


@app.resource(
    "test://static-binary",
    name="Static Binary Resource",
    mime_type="image/png",
    description="A static binary resource (a 1x1 PNG) for testing",
)
def static_binary() -> bytes:
    return PNG_1X1


@app.resource(
    "test://watched-resource",
    name="Watched Resource",
    mime_type="text/plain",
    description="A resource clients may subscribe to",
)
def watched() -> str:
    return "Watched resource content"


@app.resource_template(
    "test://template/{id}/data",
    name="Resource Template",
    mime_type="application/json",
    description="A templated resource for testing",
)
def template_data(id: str) -> str:
    return f'{{"id": "{id}", "templateTest": true, "data": "Data for ID: {id}"}}'


# ---------------------------------------------------------------- prompts
@app.prompt(description="A simple prompt without arguments")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@app.prompt(
    description="A prompt with required arguments",
    arguments={"arg1": "First test argument", "arg2": "Second test argument"},
)
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@app.prompt(
    description="A prompt that embeds a resource",
    arguments={"resourceUri": "URI of the resource to embed"},
)
def test_prompt_with_embedded_resource(resourceUri: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": embedded_resource(
                resourceUri, text="Embedded resource content for testing.", mime_type="text/plain"
            ),
        },
        {"role": "user", "content": text("Please process the embedded resource above.")},
    ]


@app.prompt(description="A prompt that includes an image")
def test_prompt_with_image() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": image(PNG_1X1, "image/png")},
        {"role": "user", "content": text("Please analyze the image above.")},
    ]


@app.completion
def complete(ref: dict[str, Any], argument: str, value: str, context: dict[str, str]) -> list[str]:
    """Suggest values for prompt arguments that start with what was typed."""
    options = ["test", "testing", "test-value", "example"]
    return [o for o in options if o.startswith(value)]


register_sessionless(app)
register_tasks(app)
