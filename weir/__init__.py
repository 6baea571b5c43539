"""weir: an MCP-over-HTTP transport, a sans-io core and the Trio server built on it.

Three layers and a second runtime, installed as subpackages:

* :mod:`weir.protocol` -- the sans-io core: bytes in, events and bytes out; no
  sockets, clocks or runtime.  Importing it imports neither Trio nor the server.
* :mod:`weir.app` -- the application API (``App``, ``Context``) and the MCP methods,
  on any event loop.  Importing it imports no Trio either.
* :mod:`weir.engine` -- the Trio server and the stores.
* :mod:`weir.asyncio` -- a second server, on asyncio (``weir serve --runtime
  asyncio``); importing it imports no Trio.

The names below are the everyday public surface, re-exported on first use from
:mod:`weir.app` (``App``, ``Context``, ``McpError``, ``ToolError``: no Trio) or
:mod:`weir.engine` (the server), so that ``import weir`` costs nothing and
``import weir.protocol`` stays free of Trio for embedders of the core alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The version of this checkout (the package's metadata reads it from here).
__version__ = "0.1.0"

if TYPE_CHECKING:
    from weir.app import App, Context, McpError, ToolError
    from weir.engine import JwtVerifier, MemoryStore, Server, ServerConfig, serve

#: Where each name lives: the app API is Trio-free, so ``from weir import App``
#: does not import Trio; the server's names load the engine.
_HOMES = {
    "App": "weir.app",
    "Context": "weir.app",
    "McpError": "weir.app",
    "ToolError": "weir.app",
}

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
        return getattr(importlib.import_module(_HOMES.get(name, "weir.engine")), name)
    raise AttributeError(f"module 'weir' has no attribute {name!r}")
