"""An app written with the official MCP Python SDK only, for the replica tests.

``server`` is a plain :class:`mcp.server.mcpserver.MCPServer`, written the way the
SDK's documentation writes one (decorators, a ``Context`` parameter, ``anyio`` for
waiting) and importing nothing from weir; the tests serve it through
:func:`weir.app.sdk.from_sdk`, as ``weir serve tests.integration.sdk_apps:server``
would.  Its one tool, ``charge``, is not idempotent: every execution counts in
:data:`executions` (by ``key``), which the tests read -- the replicas they run are
in this process, so a module-level counter sees every replica's executions.
:func:`greeter` builds a fresh server per replica, for input-required rounds and
announced changes.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve, Sample
from mcp.server.request_state import RequestStateSecurity
from mcp.types import CreateMessageResult, SamplingMessage, TextContent, ToolAnnotations
from pydantic import BaseModel

server = MCPServer("sdk-replicas", version="1.0.0", log_level="WARNING")

#: Executions of ``charge`` by key, whichever replica ran them.
executions: Counter[str] = Counter()
#: Keys whose ``charge`` is running right now.
running: set[str] = set()


@server.tool(annotations=ToolAnnotations(idempotent_hint=False, destructive_hint=True))
async def charge(key: str, ctx: Context, ms: int = 0) -> str:
    """Charge ``key`` once (not idempotent: a second execution is a double charge);
    the charge takes ``ms`` milliseconds."""
    executions[key] += 1
    count = executions[key]
    running.add(key)
    try:
        await ctx.report_progress(0, 1, f"charging {key}")
        await anyio.sleep(ms / 1000)
        await ctx.report_progress(1, 1, f"charged {key}")
    finally:
        running.discard(key)
    return f"charged {key} #{count}"


class Person(BaseModel):
    """Who answers an elicitation."""

    name: str


def ask_person() -> Elicit[Person]:
    """Resolver: ask the user who they are (elicitation)."""
    return Elicit("Who are you?", Person)


def ask_model() -> Sample:
    """Resolver: ask the client's model what 2+2 is (sampling)."""
    question = SamplingMessage(role="user", content=TextContent(type="text", text="2+2?"))
    return Sample([question], max_tokens=10)


def add_asking_tools(app: MCPServer[Any]) -> None:
    """Register ``greet`` (asks who is there: elicitation) and ``compute`` (asks the
    client's model: sampling) on ``app``; the SDK asks by server-to-client request on
    the session era and by an input-required round on 2026-07-28."""

    @app.tool()
    async def greet(person: Annotated[Person, Resolve(ask_person)]) -> str:
        """Ask the user who they are (elicitation), then greet them."""
        return f"hello {person.name}"

    @app.tool()
    async def compute(answer: Annotated[CreateMessageResult, Resolve(ask_model)]) -> str:
        """Ask the client's model (sampling)."""
        content = answer.content
        return content.text if isinstance(content, TextContent) else "?"


def greeter(state_key: bytes | None = None) -> MCPServer[Any]:
    """A fresh server whose ``greet`` asks who is there (elicitation: on 2026-07-28 an
    input-required round), as each ``weir serve`` process would build it.  Without
    ``state_key`` the SDK seals its request state with a key of its own, made per
    server; with it, with that key, as a deployment of several instances must."""
    security = RequestStateSecurity(keys=[state_key]) if state_key is not None else None
    app: MCPServer[Any] = MCPServer("sdk-greeter", request_state_security=security)

    add_asking_tools(app)

    @app.tool()
    async def retool(ctx: Context) -> str:
        """Announce that the tools changed (on the SDK's subscription bus)."""
        await ctx.notify_tools_changed()
        return "announced"

    return app
