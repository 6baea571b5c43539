"""weir's Trio engine: the server, the application API and the stores.

Everything here is built on the sans-io core in :mod:`weir.protocol`; this is the only
layer that reads the clock or touches a socket.
"""

from __future__ import annotations

from ._app import (
    App,
    McpError,
    Prompt,
    Resource,
    ResourceTemplate,
    Tool,
    ToolError,
    audio,
    embedded_resource,
    image,
    text,
    tool_result,
)
from ._auth import AccessToken, Authorization, InvalidToken, JwtVerifier, TokenVerifier
from ._context import Context
from ._memory import tune_allocator
from ._server import Server, ServerConfig, serve
from ._store import MemoryStore, SessionRecord, SessionStore, StoreUnavailable

__all__ = [
    "AccessToken",
    "App",
    "Authorization",
    "Context",
    "InvalidToken",
    "JwtVerifier",
    "McpError",
    "MemoryStore",
    "Prompt",
    "Resource",
    "ResourceTemplate",
    "Server",
    "ServerConfig",
    "SessionRecord",
    "SessionStore",
    "StoreUnavailable",
    "TokenVerifier",
    "Tool",
    "ToolError",
    "audio",
    "embedded_resource",
    "image",
    "serve",
    "text",
    "tool_result",
    "tune_allocator",
]
