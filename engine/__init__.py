"""weir's Trio engine: the server and the stores, driving the core and serving an app.

Everything here is built on the sans-io core in :mod:`weir.protocol`; this is the only
layer that reads the clock or touches a socket.  The application API (:class:`App`,
:class:`Context`, …) is :mod:`weir.app`'s, re-exported here for convenience.  Store
implementers find here the interface (:class:`SessionStore`) and every type it
speaks (records, events, stream info, retention, its exceptions); the gate's
:class:`~weir.protocol.gate.CallStart` and :class:`~weir.protocol.gate.CallOutcome` are the core's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weir.app import (
    App,
    Context,
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
from weir.common._memory import tune_allocator
from weir.common._tls import TlsConfigError, server_ssl_context

from ._auth import (
    AccessToken,
    Authorization,
    InvalidToken,
    JwtVerifier,
    TokenExpired,
    TokenVerifier,
)
from ._declared_auth import declared_authorization
from ._memory_store import MemoryStore
from ._server import Server, ServerConfig, serve
from ._session_store import SessionStore
from ._store_errors import ChannelRejected, SessionGone, StoreUnavailable
from ._store_records import Retention, SessionRecord, StoredEvent, StreamInfo

if TYPE_CHECKING:
    from ._redis_store import RedisStore


def __getattr__(name: str) -> Any:
    # RedisStore pulls in the Redis client library: imported on first use only.
    if name == "RedisStore":
        from ._redis_store import RedisStore

        return RedisStore
    raise AttributeError(f"module 'weir.engine' has no attribute {name!r}")


__all__ = [
    "AccessToken",
    "App",
    "Authorization",
    "ChannelRejected",
    "Context",
    "InvalidToken",
    "JwtVerifier",
    "McpError",
    "MemoryStore",
    "Prompt",
    "RedisStore",
    "Resource",
    "ResourceTemplate",
    "Retention",
    "Server",
    "ServerConfig",
    "SessionGone",
    "SessionRecord",
    "SessionStore",
    "StoreUnavailable",
    "StoredEvent",
    "StreamInfo",
    "TlsConfigError",
    "TokenExpired",
    "TokenVerifier",
    "Tool",
    "ToolError",
    "audio",
    "declared_authorization",
    "embedded_resource",
    "image",
    "serve",
    "server_ssl_context",
    "text",
    "tool_result",
    "tune_allocator",
]
