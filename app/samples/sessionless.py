"""The conformance app's fixtures for the sessionless revision (2026-07-28).

:func:`register` adds them to an :class:`~weir.app.App`: the diagnostic tools the
suite's stateless scenario calls, a tool whose argument is mirrored in an
``Mcp-Param-Region`` header, and the tools and prompt that ask the client for
input (answered as input-required results on this revision, as server-to-client
requests on the session era).  Each asks with the keys the suite expects.
"""

from __future__ import annotations

from typing import Any

from weir.app import App, Context, text

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
CAPITAL_QUESTION = [
    {"role": "user", "content": {"type": "text", "text": "What is the capital of France?"}}
]
REGION_SCHEMA = {
    "type": "object",
    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
    "required": ["region"],
}


def _field(answer: dict[str, Any], name: str, default: str) -> str:
    content = answer.get("content")
    value = content.get(name) if isinstance(content, dict) else None
    return str(value) if value is not None else default


def _said(answer: dict[str, Any]) -> str:
    content = answer.get("content")
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    return "(no text)"


def register(app: App) -> None:
    """Add the sessionless fixtures to ``app``."""

    @app.tool()
    async def test_missing_capability(ctx: Context) -> str:
        """Asks the client's model; a client without the sampling capability is refused."""
        answer = await ctx.sample(CAPITAL_QUESTION, max_tokens=10, key="sample")
        return _said(answer)

    @app.tool()
    async def test_streaming_elicitation(ctx: Context) -> str:
        """Answers on its response stream with nothing but the result."""
        return "answered without asking"

    @app.tool()
    async def test_logging_tool(ctx: Context) -> str:
        """Logs at info (sent only when the request's _meta set a log level)."""
        await ctx.info("test_logging_tool ran")
        return "logged"

    @app.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """Announces that the tool list changed."""
        ctx.changed("tools")
        return "tools changed"

    @app.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """Announces that the prompt list changed."""
        ctx.changed("prompts")
        return "prompts changed"

    @app.tool(input_schema=REGION_SCHEMA)
    async def test_region_header(region: str) -> str:
        """Echoes its region argument, which clients also send as Mcp-Param-Region."""
        return f"region={region}"

    @app.tool()
    async def test_input_required_result_elicitation(ctx: Context) -> str:
        """Asks the user's name (key user_name), then greets them."""
        answer = await ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
        return f"Hello, {_field(answer, 'name', 'friend')}!"

    @app.tool()
    async def test_input_required_result_sampling(ctx: Context) -> str:
        """Asks the client's model a question (key sample_request)."""
        answer = await ctx.sample(CAPITAL_QUESTION, max_tokens=100, key="sample_request")
        return f"The model said: {_said(answer)}"

    @app.tool()
    async def test_input_required_result_list_roots(ctx: Context) -> str:
        """Asks for the client's roots (key roots_request)."""
        roots = await ctx.list_roots(key="roots_request")
        return "roots: " + ", ".join(str(r.get("uri")) for r in roots if isinstance(r, dict))

    @app.tool()
    async def test_input_required_result_request_state(ctx: Context) -> str:
        """Asks for a confirmation (key confirm); the answer comes back with the state."""
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
        await ctx.elicit("Confirm?", schema, key="confirm")
        return "state-ok"

    @app.tool()
    async def test_input_required_result_multiple_inputs(ctx: Context) -> str:
        """Asks three things at once: a name, a model's greeting, the roots."""
        greeting = [{"role": "user", "content": {"type": "text", "text": "Say hello."}}]
        answers = await ctx.input(
            {
                "user_name": (
                    "elicitation/create",
                    {"message": "What is your name?", "requestedSchema": NAME_SCHEMA},
                ),
                "greeting": ("sampling/createMessage", {"messages": greeting, "maxTokens": 50}),
                "client_roots": ("roots/list", None),
            }
        )
        return f"{_said(answers['greeting'])}, {_field(answers['user_name'], 'name', 'friend')}"

    @app.tool()
    async def test_input_required_result_multi_round(ctx: Context) -> str:
        """Asks in two rounds: a name (key step1), then a colour (key step2)."""
        first = await ctx.elicit("What is your name?", NAME_SCHEMA, key="step1")
        colour = {"type": "object", "properties": {"color": {"type": "string"}}}
        second = await ctx.elicit("Favourite colour?", colour, key="step2")
        return f"{_field(first, 'name', 'friend')} likes {_field(second, 'color', 'no colour')}"

    @app.tool()
    async def test_input_required_result_tampered_state(ctx: Context) -> str:
        """Asks for a confirmation; a tampered request state is refused."""
        await ctx.elicit("Confirm?", {"type": "object", "properties": {}}, key="confirm")
        return "confirmed"

    @app.tool()
    async def test_input_required_result_capabilities(ctx: Context) -> str:
        """Asks only for what the client declared: input from the user, or the model."""
        asks: dict[str, tuple[str, dict[str, Any] | None]] = {}
        if "elicitation" in ctx.client_capabilities:
            params = {"message": "What is your name?", "requestedSchema": NAME_SCHEMA}
            asks["elicit_input"] = ("elicitation/create", params)
        if "sampling" in ctx.client_capabilities:
            asks["sample_input"] = (
                "sampling/createMessage",
                {"messages": CAPITAL_QUESTION, "maxTokens": 20},
            )
        answers = await ctx.input(asks) if asks else {}
        return f"answered: {', '.join(sorted(answers)) or 'nothing to ask'}"

    @app.prompt(description="A prompt that asks the user for context first")
    async def test_input_required_result_prompt(ctx: Context) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {"context": {"type": "string"}}}
        answer = await ctx.elicit("Any context?", schema, key="user_context")
        said = _field(answer, "context", "none")
        return [{"role": "user", "content": text(f"Prompt with context: {said}")}]
