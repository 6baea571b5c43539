"""weir's application API: tools, resources, prompts and completions, on any driver.

An :class:`App` records decorated functions; :func:`dispatch` turns one MCP request
into its result by calling them with a :class:`Context`.  Nothing here does I/O or
depends on an event loop: a handler reaches the client only through its context,
whose :class:`ContextBackend` the driver provides.  The Trio engine
(:mod:`weir.engine`) and the asyncio runtime (:mod:`weir.asyncio`) both serve
the same :class:`App` this way, so an app written once runs on either -- provided
its handlers await only their context (``ctx.sleep``, not ``trio.sleep``); a
handler that awaits asyncio itself needs the asyncio runtime.
"""

from __future__ import annotations

from ._context import (
    LOG_LEVELS,
    NO_LOGS,
    AccessToken,
    Caller,
    Context,
    ContextBackend,
    SessionChannel,
    log_passes,
)
from ._dispatch import (
    call_tool_now,
    capabilities,
    describe,
    dispatch,
    failure,
    id_in_use,
    initialize_result_for,
    inline_tool,
)
from ._foreign import exception_chain
from ._hooks import MAX_NOTES_RUNNING, NOTE_WAIT, SESSION_CLOSE_WAIT
from ._input import BecomeTask, InputRequired
from ._registry import (
    BUILTIN_APPS,
    App,
    McpError,
    Prompt,
    Resource,
    ResourceTemplate,
    StreamGone,
    Tool,
    ToolError,
    audio,
    embedded_resource,
    image,
    load_app,
    never_suspends,
    text,
    tool_result,
)

__all__ = [
    "BUILTIN_APPS",
    "LOG_LEVELS",
    "MAX_NOTES_RUNNING",
    "NOTE_WAIT",
    "NO_LOGS",
    "SESSION_CLOSE_WAIT",
    "AccessToken",
    "App",
    "BecomeTask",
    "Caller",
    "Context",
    "ContextBackend",
    "InputRequired",
    "McpError",
    "Prompt",
    "Resource",
    "ResourceTemplate",
    "SessionChannel",
    "StreamGone",
    "Tool",
    "ToolError",
    "audio",
    "call_tool_now",
    "capabilities",
    "describe",
    "dispatch",
    "embedded_resource",
    "exception_chain",
    "failure",
    "id_in_use",
    "image",
    "initialize_result_for",
    "inline_tool",
    "load_app",
    "log_passes",
    "never_suspends",
    "text",
    "tool_result",
]
