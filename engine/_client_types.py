"""The typed results of weir's client: MCP's result shapes as msgspec Structs.

Theory of operation
-------------------
A server's ``result`` object arrives as JSON; :func:`decode_result` turns it into one
of the Structs below, field by field as the MCP schema names them (camelCase on the
wire, snake_case here: ``isError`` is :attr:`CallToolResult.is_error`; ``_meta`` is
``meta`` everywhere).  Decoding is forward compatible: fields this module does not
know are ignored, and a content block of a type it does not know becomes an
:class:`UnknownContent` that keeps the block as it came.  What the schema requires
and the answer lacks or mistypes (a tool without a ``name``, ``content`` that is not
a list) raises :class:`MalformedResponse` naming the path of the bad field -- never a
raw msgspec error.  An arbitrary method stays reachable through the clients'
``request``, which returns the JSON object as it came.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias, TypeVar

import msgspec

from ._client_common import BadResponse, JsonObject

__all__ = [
    "Annotations",
    "AudioContent",
    "CallToolResult",
    "ContentBlock",
    "EmbeddedResource",
    "GetPromptResult",
    "Icon",
    "ImageContent",
    "ListPromptsResult",
    "ListResourceTemplatesResult",
    "ListResourcesResult",
    "ListToolsResult",
    "MalformedResponse",
    "Page",
    "PaginationError",
    "Prompt",
    "PromptArgument",
    "PromptMessage",
    "ReadResourceResult",
    "Resource",
    "ResourceContents",
    "ResourceLink",
    "ResourceTemplate",
    "TextContent",
    "Tool",
    "ToolAnnotations",
    "UnknownContent",
    "decode_result",
]


class MalformedResponse(BadResponse):
    """The server's result did not have the shape MCP gives it (a required field
    missing, a field of the wrong type); the message names the offending path."""


class PaginationError(BadResponse):
    """A paginated list did not end: the server repeated a ``nextCursor`` (a loop) or
    went past the page limit."""


_META: Final = "_meta"


class _Base(msgspec.Struct, rename="camel", kw_only=True):
    """camelCase on the wire; unknown fields ignored; fields by keyword (each subclass
    says ``kw_only`` again: msgspec applies it per class)."""


class Page(_Base, kw_only=True):
    """What every page of a ``*/list`` answer has: the cursor of the next page (None
    on the last one)."""

    next_cursor: str | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


# ---------------------------------------------------------------------------- small pieces
class Icon(_Base, kw_only=True):
    """An icon of a tool, resource or prompt."""

    src: str
    mime_type: str | None = None
    sizes: list[str] | None = None
    theme: str | None = None


class Annotations(_Base, kw_only=True):
    """Hints about a content block or resource (audience, priority, modification)."""

    audience: list[str] | None = None
    priority: float | None = None
    last_modified: str | None = None


class ResourceContents(_Base, kw_only=True):
    """The contents of one resource: ``text`` or ``blob`` (base64), whichever it has."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


# ---------------------------------------------------------------------------- content blocks
class _Block(_Base, tag_field="type"):
    annotations: Annotations | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class TextContent(_Block, tag="text", kw_only=True):
    """A text block."""

    text: str


class ImageContent(_Block, tag="image", kw_only=True):
    """An image, base64 in ``data``."""

    data: str
    mime_type: str


class AudioContent(_Block, tag="audio", kw_only=True):
    """Audio, base64 in ``data``."""

    data: str
    mime_type: str


class ResourceLink(_Block, tag="resource_link", kw_only=True):
    """A link to a resource the client may read."""

    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    icons: list[Icon] | None = None


class EmbeddedResource(_Block, tag="resource", kw_only=True):
    """A resource's contents, inline."""

    resource: ResourceContents


class UnknownContent(_Block, tag="weir-unknown", kw_only=True):
    """A block of a type this client does not know; ``raw`` is the block as it came
    (so ``raw["type"]`` is its type)."""

    raw: JsonObject


ContentBlock: TypeAlias = (
    TextContent | ImageContent | AudioContent | ResourceLink | EmbeddedResource | UnknownContent
)
_KNOWN_BLOCKS: Final = frozenset({"text", "image", "audio", "resource_link", "resource"})


# ---------------------------------------------------------------------------- tools
class ToolAnnotations(_Base, kw_only=True):
    """Hints about a tool's behaviour (never to be trusted from an unknown server)."""

    title: str | None = None
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None


class Tool(_Base, kw_only=True):
    """A tool the server offers."""

    name: str
    input_schema: JsonObject
    title: str | None = None
    description: str | None = None
    output_schema: JsonObject | None = None
    annotations: ToolAnnotations | None = None
    icons: list[Icon] | None = None
    execution: JsonObject | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class CallToolResult(_Base, kw_only=True):
    """A tool's result.  A tool that failed answers with ``is_error`` true (and says why
    in ``content``); a failure of the request itself is an error, not a result."""

    content: list[ContentBlock]
    structured_content: Any = None
    is_error: bool = False
    result_type: str | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)

    @property
    def text(self) -> str:
        """The text of the result's text blocks, joined by newlines."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextContent))


class ListToolsResult(Page, kw_only=True):
    """One page of ``tools/list``."""

    tools: list[Tool]


# ---------------------------------------------------------------------------- resources
class Resource(_Base, kw_only=True):
    """A resource the server offers."""

    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    annotations: Annotations | None = None
    icons: list[Icon] | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class ResourceTemplate(_Base, kw_only=True):
    """A family of resources named by an RFC 6570 URI template."""

    uri_template: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    annotations: Annotations | None = None
    icons: list[Icon] | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class ReadResourceResult(_Base, kw_only=True):
    """``resources/read``'s answer: one or more contents."""

    contents: list[ResourceContents]
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class ListResourcesResult(Page, kw_only=True):
    """One page of ``resources/list``."""

    resources: list[Resource]


class ListResourceTemplatesResult(Page, kw_only=True):
    """One page of ``resources/templates/list``."""

    resource_templates: list[ResourceTemplate]


# ---------------------------------------------------------------------------- prompts
class PromptArgument(_Base, kw_only=True):
    """One argument a prompt takes."""

    name: str
    title: str | None = None
    description: str | None = None
    required: bool | None = None


class Prompt(_Base, kw_only=True):
    """A prompt the server offers."""

    name: str
    title: str | None = None
    description: str | None = None
    arguments: list[PromptArgument] | None = None
    icons: list[Icon] | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class PromptMessage(_Base, kw_only=True):
    """One message of a prompt (``role`` is ``user`` or ``assistant``)."""

    role: str
    content: ContentBlock


class GetPromptResult(_Base, kw_only=True):
    """``prompts/get``'s answer."""

    messages: list[PromptMessage]
    description: str | None = None
    meta: JsonObject | None = msgspec.field(default=None, name=_META)


class ListPromptsResult(Page, kw_only=True):
    """One page of ``prompts/list``."""

    prompts: list[Prompt]


# ---------------------------------------------------------------------------- decoding
T = TypeVar("T", bound=_Base)


def _shield_block(block: Any) -> Any:
    """A block of an unknown type, wrapped so the tagged union can hold it."""
    if isinstance(block, dict) and block.get("type") not in _KNOWN_BLOCKS:
        return {"type": "weir-unknown", "raw": block}
    return block


def _shield(result: JsonObject, kind: type[_Base]) -> JsonObject:
    """``result`` with its unknown content blocks wrapped (a shallow copy if any)."""
    if kind is CallToolResult and isinstance(result.get("content"), list):
        return {**result, "content": [_shield_block(b) for b in result["content"]]}
    if kind is GetPromptResult and isinstance(result.get("messages"), list):
        messages = [
            {**m, "content": _shield_block(m.get("content"))} if isinstance(m, dict) else m
            for m in result["messages"]
        ]
        return {**result, "messages": messages}
    return result


def decode_result(kind: type[T], result: JsonObject, method: str) -> T:
    """``result`` (the ``result`` object of ``method``'s answer) as ``kind``.

    Raises:
        MalformedResponse: the result does not have ``kind``'s shape.
    """
    try:
        return msgspec.convert(_shield(result, kind), kind)
    except msgspec.ValidationError as exc:
        raise MalformedResponse(200, None, f"{method}: malformed result: {exc}") from None
