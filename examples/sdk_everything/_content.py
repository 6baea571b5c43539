"""Tools whose answer is the point: each kind of content block, a tool error, and a
hand-written JSON Schema 2020-12 input schema (SEP-1613/2106).

:data:`schema_tool` goes to the :class:`~mcp.server.mcpserver.MCPServer` constructor;
:func:`register` adds the rest.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.types import AudioContent, ContentBlock, EmbeddedResource, ImageContent, TextContent

from ._media import PNG_1X1, WAV, b64, embedded

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


schema_tool = Tool.from_function(json_schema_2020_12_tool).model_copy(
    update={"parameters": JSON_SCHEMA_2020_12}
)


def test_simple_text() -> str:
    """Returns a simple text content block."""
    return "This is a simple text response for testing."


def test_image_content() -> list[ImageContent]:
    """Returns an image content block (a 1x1 PNG)."""
    return [ImageContent(type="image", data=b64(PNG_1X1), mime_type="image/png")]


def test_audio_content() -> list[AudioContent]:
    """Returns an audio content block (a short WAV)."""
    return [AudioContent(type="audio", data=b64(WAV), mime_type="audio/wav")]


def test_embedded_resource() -> list[EmbeddedResource]:
    """Returns an embedded text resource."""
    return [
        embedded("test://embedded-resource", "This is an embedded resource content.", "text/plain")
    ]


def test_multiple_content_types() -> list[ContentBlock]:
    """Returns text, image and embedded resource content blocks."""
    return [
        TextContent(type="text", text="Multiple content types test:"),
        ImageContent(type="image", data=b64(PNG_1X1), mime_type="image/png"),
        embedded(
            "test://mixed-content-resource", '{"test": "data", "value": 123}', "application/json"
        ),
    ]


def test_error_handling() -> str:
    """Always fails; the SDK answers with a tool error (isError: true)."""
    raise RuntimeError("This tool intentionally returns an error for testing")


def register(server: MCPServer[Any]) -> None:
    """Add the content tools to ``server``, in this order."""
    for tool in (
        test_simple_text,
        test_image_content,
        test_audio_content,
        test_embedded_resource,
        test_multiple_content_types,
        test_error_handling,
    ):
        server.tool()(tool)
