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

Where it lives
--------------
This module only assembles ``server``; the fixtures are in private modules, each
registering its part in the order above (``tools/list`` keeps it):

* ``_media``: the PNG and WAV fixtures and content-block helpers;
* ``_event_store``: :class:`MemoryEventStore`, for ``__main__``;
* ``_content``: the content tools, the tool error, the JSON Schema 2020-12 tool;
* ``_session``: logging, progress and SSE-closing during a call, sampling, elicitation;
* ``_sessionless``: the ``x-mcp-header`` tool, sessionless diagnostics, list-changed triggers;
* ``_input_required``: the 2026-07-28 input-required tools;
* ``_resources``: resources, prompts, completion, ``logging/setLevel`` and subscriptions.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from . import _content, _input_required, _resources, _session, _sessionless
from ._event_store import MemoryEventStore
from ._media import PNG_1X1, WAV

__all__ = ["PNG_1X1", "WAV", "MemoryEventStore", "server"]

server: MCPServer[Any] = MCPServer(
    "sdk-everything",
    version="0.1.0",
    tools=[_content.schema_tool],
    log_level="WARNING",
)

# The order of these calls is the order of tools/list, resources/list and prompts/list.
_content.register(server)
_session.register(server)
_sessionless.register(server)
_input_required.register(server)
_resources.register(server)
