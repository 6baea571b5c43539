"""Binary fixtures and content-block helpers shared by the tools and prompts.

A 1x1 PNG (:data:`PNG_1X1`), a short WAV of silence (:data:`WAV`), base64 encoding,
embedded text resources, and reading the text of a sampling answer.
"""

from __future__ import annotations

import base64
import struct

from mcp.types import CreateMessageResult, EmbeddedResource, TextContent, TextResourceContents

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


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def embedded(uri: str, text: str, mime_type: str) -> EmbeddedResource:
    contents = TextResourceContents(uri=uri, text=text, mime_type=mime_type)
    return EmbeddedResource(type="resource", resource=contents)


def said(result: CreateMessageResult) -> str:
    """The text of a sampling answer, or ``(no text)``."""
    content = result.content
    return content.text if isinstance(content, TextContent) else "(no text)"
