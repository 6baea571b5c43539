"""weir: an MCP-over-HTTP transport, a sans-io core and the Trio server built on it.

Three layers, installed as three subpackages:

* :mod:`weir.protocol` -- the sans-io core: bytes in, events and bytes out; no
  sockets, clocks or runtime.  Importing it imports neither Trio nor the server.
* :mod:`weir.app` -- the application API (``App``, ``Context``) and the MCP methods,
  on any event loop.  Importing it imports no Trio either.
* :mod:`weir.engine` -- the Trio server and the stores.

The names below are the server's public surface, re-exported from
:mod:`weir.engine` on first use, so that ``import weir.protocol`` stays free of
Trio for embedders of the core alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weir.engine import (
        App,
        Context,
        JwtVerifier,
        McpError,
        MemoryStore,
        Server,
        ServerConfig,
        ToolError,
        serve,
    )

__all__ = [
    "App",
    "Context",
    "JwtVerifier",
    "McpError",
    "MemoryStore",
    "Server",
    "ServerConfig",
    "ToolError",
    "serve",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("weir.engine"), name)
    raise AttributeError(f"module 'weir' has no attribute {name!r}")
